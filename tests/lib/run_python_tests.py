"""Runs the Python tests under tests/ (test_*.py) and writes their counts as
JSON for tests/lib/summarize.py. Usage: run_python_tests.py OUT.json [NAME...]"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)


class CountingResult(unittest.TextTestResult):
    """Counts passes as they happen: testsRun minus the failures undercounts
    when a setUpClass fails (an error for the class, no test run)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.passed += 1


def main():
    out = sys.argv[1]
    names = sys.argv[2:]
    loader = unittest.TestLoader()
    if names:
        suite = unittest.TestSuite(loader.loadTestsFromName(n) for n in names)
    else:
        suite = loader.discover(TESTS, pattern="test_*.py", top_level_dir=TESTS)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout,
                                     resultclass=CountingResult).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.passed
    with open(out, "w") as f:
        json.dump({"passed": passed, "failed": failed, "skipped": skipped}, f)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
