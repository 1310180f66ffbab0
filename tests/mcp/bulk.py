"""The parts of the fake upstream's `bulk` tool, made the same way by the
upstream and by the test that checks what was stored."""

import hashlib
import json


def text(mb):
    """NDJSON of about `mb` MB, with quotes, backslashes, tabs and non-ASCII
    (so the wire form is full of escapes)."""
    line = 'row {i}: "quoted" back\\slash\ttab é 中 🎉'
    rows, size, i = [], 0, 0
    while size < mb << 20:
        r = json.dumps({"i": i, "s": line.format(i=i)}, ensure_ascii=False)
        rows.append(r)
        size += len(r.encode()) + 1
        i += 1
    return "\n".join(rows)


def picture():
    """3 MiB of binary."""
    return hashlib.sha256(b"seed").digest() * (3 * (1 << 20) // 32)


def rows(n=40_000):
    return {"rows": [{"id": i, "name": f"row-{i}", "note": "x\"}]"} for i in range(n)]}
