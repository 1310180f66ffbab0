"""Spillway's helpers for Python scripts in the sandbox.

    import spillway
    for p in spillway.payloads:              # dicts: id, name, path, size, content_type
        for line in spillway.read_lines(p["path"]):
            ...
    data = spillway.read_json("/payloads/data.json")
    spillway.write_out("result.csv", text)    # -> /out/result.csv
"""

import errno as _errno
import json as _json
import os as _os
import stat as _stat

__all__ = ["payloads", "read_text", "read_json", "read_lines", "write_out"]

PAYLOADS_JSON = "/spillway/payloads.json"
OUT_DIR = "/out"

# `payloads`, the input payloads in order (dicts with the keys id, name,
# path, size and content_type), is read from /spillway/payloads.json on
# first use (see `__getattr__`): a script that never asks pays nothing.


def _read_bytes(path):
    """The whole file, by positioned reads (a bytearray).

    A positioned read is one host call. `open().read()` reads through a
    WASI stream instead, whose host side hands every read of at most 64 KiB
    to another thread and back: about 50 us a call, so two small files at
    every start cost about 100 us more that way.
    """
    fd = _os.open(path, _os.O_RDONLY)
    try:
        out = bytearray()
        while True:
            chunk = _os.pread(fd, 1 << 20, len(out))
            if not chunk:
                return out
            out += chunk
    finally:
        _os.close(fd)


def __getattr__(name):
    """`spillway.payloads`, read once, on first use."""
    if name == "payloads":
        try:
            value = _load_payloads()
        except (OSError, ValueError) as e:
            raise OSError(f"spillway: cannot read {PAYLOADS_JSON}: {e}") from e
        globals()["payloads"] = value
        return value
    raise AttributeError(f"module 'spillway' has no attribute {name!r}")


def _load_payloads():
    items = _json.loads(_read_bytes(PAYLOADS_JSON))
    return [
        {
            "id": p.get("id"),
            "name": p.get("name"),
            "path": p.get("path"),
            "size": p.get("size"),
            "content_type": p.get("contentType"),
        }
        for p in items
    ]


def read_text(path):
    """The whole file as a string (UTF-8; invalid bytes become U+FFFD)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def read_json(path):
    """The file parsed as one JSON document."""
    return _json.loads(_read_bytes(path))


#: Bytes read per positioned read by `read_lines` (a line longer than this
#: is gathered from several).
_LINES_CHUNK = 1 << 20


def read_lines(path):
    """A lazy iterator over the lines of the file, without their "\\n" or "\\r\\n".

    The file is read a chunk at a time, so this works on files far larger
    than memory. It is opened right away (a missing file raises here).
    """
    fd = _os.open(path, _os.O_RDONLY)
    try:
        if _stat.S_ISDIR(_os.fstat(fd).st_mode):
            raise IsADirectoryError(_errno.EISDIR, _os.strerror(_errno.EISDIR), path)
    except BaseException:
        _os.close(fd)
        raise
    return _lines(fd)


def _lines(fd):
    # 1 MiB positioned reads (one host call each, where a buffered file's
    # reads go through a WASI stream at 64 KiB a hop), and each chunk's
    # complete lines decoded and split at once: the per-line work left in
    # Python is one `endswith`. Splitting on b"\n" before decoding keeps
    # every multi-byte character whole (no UTF-8 sequence holds 0x0A).
    try:
        pending = []  # the pieces of a line not ended yet
        offset = 0
        while True:
            chunk = _os.pread(fd, _LINES_CHUNK, offset)
            if not chunk:
                break
            offset += len(chunk)
            end = chunk.rfind(b"\n")
            if end < 0:
                pending.append(chunk)
                continue
            pending.append(chunk[:end])
            text = b"".join(pending).decode("utf-8", "replace")
            pending = [chunk[end + 1 :]] if end + 1 < len(chunk) else []
            for line in text.split("\n"):
                yield line[:-1] if line.endswith("\r") else line
        if pending:
            yield b"".join(pending).decode("utf-8", "replace")
    finally:
        _os.close(fd)


def write_out(name, data):
    """Write /out/<name> (kept as a new payload); returns its path.

    data: str (written as UTF-8), bytes, or anything else (written as JSON).
    The name is a plain file name: no "/" and no "..".
    """
    name = str(name)
    if not name or "/" in name or ".." in name or "\0" in name:
        raise ValueError(f"write_out: invalid name {name!r}: a plain file name, without '/' or '..'")
    path = f"{OUT_DIR}/{name}"
    if isinstance(data, (bytes, bytearray, memoryview)):
        with open(path, "wb") as f:
            f.write(data)
    else:
        if not isinstance(data, str):
            data = _json.dumps(data)
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
    return path
