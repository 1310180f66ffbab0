#!/usr/bin/env python3
"""Verify a Spillway audit export with nothing but the standard library.

Usage: verify_audit.py [FILE]    (stdin without FILE, or with "-")

Prints "ok N" (N events verified) and exits 0, or "bad at seq N" (the first
seq that is missing, altered or out of place) and exits 1.

The chain, as api.md ("Audit") defines it: each line is one event as JSON.
Its canonical bytes are the event without "hash", keys sorted, compact, UTF-8,
only the escapes JSON requires; hash = hex(sha256(prev_hash + canonical));
the first prev_hash is 64 zeros; seq runs 1, 2, 3, ... without gaps.
"""
import hashlib
import json
import sys


def verify(lines):
    prev, seq = "0" * 64, 1
    for raw in lines:  # binary lines: split on b"\n" only, so U+2028 is safe
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
            claimed = event.pop("hash")
            canonical = json.dumps(
                event, sort_keys=True, separators=(",", ":"), ensure_ascii=False
            )
            digest = hashlib.sha256((prev + canonical).encode("utf-8")).hexdigest()
            good = (
                type(event["seq"]) is int
                and event["seq"] == seq
                and event["prev_hash"] == prev
                and claimed == digest
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            good = False
        if not good:
            return False, seq
        prev, seq = claimed, seq + 1
    return True, seq - 1


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "-"
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    with stream:
        ok, seq = verify(stream)
    print(("ok %d" if ok else "bad at seq %d") % seq)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
