"""The whole standard library, importable at run time.

componentize-py preopens the standard library (/python) only while it
pre-initializes the component at build time: in the built component, only
modules imported by then (in the snapshot) exist, and `import difflib` fails.
So, at build time, `embed()` compiles every other standard-library module
and keeps its code, marshalled and compressed, in memory (the snapshot); at
run time a meta path finder serves imports from there.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import zlib

STDLIB = "/python"
# Directories and modules not worth carrying: GUI, tests, installers, REPL,
# and the 600 KB of pydoc topics.
SKIP_DIRS = {"__pycache__", "test", "tests", "idle_test", "site-packages", "config-3.14-wasm32-wasi"}
SKIP_TOP = {
    "idlelib", "tkinter", "turtledemo", "turtle", "ensurepip", "venv", "__phello__",
    "_pyrepl", "pydoc_data", "curses", "antigravity", "__hello__",
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, table):
        self.table = table  # name -> (is_package, origin, compressed marshalled code)

    def find_spec(self, name, path=None, target=None):
        entry = self.table.get(name)
        if entry is None:
            return None
        is_pkg, origin, _ = entry
        spec = importlib.machinery.ModuleSpec(name, self, origin=origin, is_package=is_pkg)
        if is_pkg:
            spec.submodule_search_locations = []
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        _, origin, blob = self.table[module.__spec__.name]
        module.__file__ = origin
        exec(marshal.loads(zlib.decompress(blob)), module.__dict__)


def embed():
    """Compile the standard library not loaded yet into a finder; install it."""
    table = {}
    for dirpath, dirnames, filenames in os.walk(STDLIB):
        rel = os.path.relpath(dirpath, STDLIB)
        parts = [] if rel == "." else rel.split(os.sep)
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in SKIP_DIRS and not (not parts and d in SKIP_TOP)
            and os.path.exists(os.path.join(dirpath, d, "__init__.py"))
        )
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            stem = f[:-3]
            if not parts and stem in SKIP_TOP:
                continue
            is_pkg = stem == "__init__"
            name = ".".join(parts if is_pkg else parts + [stem])
            if not name or name in sys.modules:
                continue
            origin = os.path.join(dirpath, f)
            with open(origin, "rb") as fh:
                source = fh.read()
            try:
                code = compile(source, origin, "exec", dont_inherit=True)
            except SyntaxError:
                continue
            table[name] = (is_pkg, origin, zlib.compress(marshal.dumps(code), 6))
    finder = _Finder(table)
    # before the path finder: the standard library's directory is gone at run time
    for i, f in enumerate(sys.meta_path):
        if f is importlib.machinery.PathFinder:
            sys.meta_path.insert(i, finder)
            break
    else:
        sys.meta_path.append(finder)
    return finder
