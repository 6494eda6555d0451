"""The end-to-end Python tests' entry: skip (exit 77, CTest's SKIP code)
when what a test needs is missing, else run its unittest cases."""
import importlib
import os
import sys
import unittest


def main_or_skip(files=(), programs=(), modules=()):
    """Runs unittest.main() when every path in files exists, every value in
    programs is set (FERRUMCTL and the like) and every module imports;
    otherwise prints why and exits 77."""
    for path in files:
        if not (path and os.path.exists(path)):
            print("SKIP: %s missing" % (path or "a file the test needs"))
            sys.exit(77)
    if not all(programs):
        print("SKIP: a program the test needs is not set (FERRUMCTL?)")
        sys.exit(77)
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            print("SKIP: %s" % e)
            sys.exit(77)
    unittest.main(verbosity=2)
