"""Runs the Python tests under tests/ (test_*.py) and writes their counts as
JSON for tests/lib/summarize.py. Usage: run_python_tests.py OUT.json [NAME...]"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)


def main():
    out = sys.argv[1]
    names = sys.argv[2:]
    loader = unittest.TestLoader()
    if names:
        suite = unittest.TestSuite(loader.loadTestsFromName(n) for n in names)
    else:
        suite = loader.discover(TESTS, pattern="test_*.py", top_level_dir=TESTS)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    with open(out, "w") as f:
        json.dump({"passed": passed, "failed": failed, "skipped": skipped}, f)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
