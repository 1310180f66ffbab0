"""Spillway's python image: runs /spillway/script as __main__.

componentize-py pre-initializes this module at build time: everything at the
top level (the imports below) is done once, in the snapshot, and each run
starts from there. What must be fresh per run (arguments, the random seed)
is set in `Run.run`; the environment is emptied at build time, and
`spillway.payloads` is read on first use.

Exit codes (through wasi:cli/exit exit-with-code): 0 success, 1 uncaught
exception, 3 the script does not compile, n for SystemExit(n).
"""

import builtins
import os
import sys
import traceback
import types

# Commonly used modules, imported into the snapshot so scripts start fast.
import base64  # noqa: F401
import bisect  # noqa: F401
import collections  # noqa: F401
import csv  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import functools  # noqa: F401
import gzip  # noqa: F401
import hashlib  # noqa: F401
import heapq  # noqa: F401
import io
import itertools  # noqa: F401
import json  # noqa: F401
import math  # noqa: F401
import operator  # noqa: F401
import pathlib  # noqa: F401
import random
import re  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import textwrap  # noqa: F401
import typing  # noqa: F401
import urllib.parse  # noqa: F401

import spillway
import spillway_stdlib
from wit_world import exports
from wit_world.imports import environment
from wit_world.imports import exit as wasi_exit

SCRIPT = "/spillway/script"

# componentize-py pre-initializes with PYTHONUNBUFFERED=1, which the snapshot keeps:
# stdout would be a raw FileIO with write_through, one host call per write.
# Buffer it (64 KiB; the runner flushes it at exit). Made here, in the
# snapshot: it holds only the descriptor number, and building it per run
# cost 0.15 ms.
sys.stdout = io.TextIOWrapper(
    io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16),
    encoding="utf-8",
    errors="backslashreplace",
)

# No environment: the snapshot keeps none of the build machine's, and the
# host gives a run none (clearing it per run instead cost 0.2 ms of every
# exec, touching os.environ's pages for nothing).
os.environ.clear()

# build time: the rest of the standard library, compiled into the snapshot
_STDLIB = spillway_stdlib.embed()


def _flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__):
        try:
            stream.flush()
        except Exception:
            pass


def _exit(code):
    """Leave with `code`: 0 returns normally, anything else through exit-with-code."""
    _flush()
    if code != 0:
        wasi_exit.exit_with_code(code)


def _exit_code(e):
    """The exit status for SystemExit(e.code), as CPython computes it."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code if 0 <= code <= 255 else 1
    # a message: printed to stderr, status 1
    print(code, file=sys.stderr)
    return 1


def _main():
    args = environment.get_arguments()
    # Fresh randomness per run, not the snapshot's seed.
    random.seed()

    try:
        source = bytes(spillway._read_bytes(SCRIPT))
    except OSError as e:
        print(f"python: cannot read {SCRIPT}: {e}", file=sys.stderr)
        return 1

    try:
        code = compile(source, SCRIPT, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        sys.stderr.write("".join(traceback.format_exception_only(type(e), e)))
        return 3

    main = types.ModuleType("__main__")
    main.__file__ = SCRIPT
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = ["script", *args[1:]]
    sys.path[0:0] = ["/spillway"]

    try:
        exec(code, main.__dict__)
    except SystemExit as e:
        return _exit_code(e)
    except BaseException as e:
        # the traceback without this runner's frame
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        sys.stderr.write("".join(traceback.format_exception(type(e), e, tb)))
        return 1
    return 0


class Run(exports.Run):
    def run(self) -> None:
        try:
            code = _main()
        except BaseException:
            traceback.print_exc()
            code = 1
        _exit(code)
