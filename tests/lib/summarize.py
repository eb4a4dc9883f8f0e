"""Counts test cases (not Bazel targets) across the whole suite and prints
the closing line "N passed, N failed[, N skipped]".

Inputs: the `bazel test --test_summary=short` log (target -> status), the
per-target gtest XML under bazel-testlogs/, and JSON counts written by the
other runners (Python tests, fuzzing). A target that failed to build, timed
out or crashed without reporting its cases counts as one failed case."""

import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE|SKIPPED)")


def xml_counts(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("status") == "notrun" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main():
    root, bazel_log = sys.argv[1], sys.argv[2]
    extra = sys.argv[3:]
    passed = failed = skipped = 0
    problems = []
    with open(bazel_log, errors="replace") as f:
        statuses = {}
        for line in f:
            m = STATUS.match(line.strip())
            if m:
                statuses[m.group(1)] = m.group(2)
    for label, status in sorted(statuses.items()):
        pkg, _, name = label[2:].partition(":")
        xml = os.path.join(root, "bazel-testlogs", pkg, name, "test.xml")
        p = f = s = 0
        if status in ("PASSED", "FLAKY", "FAILED") and os.path.exists(xml):
            try:
                p, f, s = xml_counts(xml)
            except ET.ParseError:
                p = f = s = 0
        if status in ("PASSED", "FLAKY") and p + f + s == 0:
            p = 1  # a test binary that reports no cases: count the target
        if status not in ("PASSED", "FLAKY") and f == 0:
            f = 1
            problems.append(f"{label}: {status}")
        passed, failed, skipped = passed + p, failed + f, skipped + s
    for path in extra:
        try:
            with open(path) as fh:
                counts = json.load(fh)
        except (OSError, ValueError):
            failed += 1
            problems.append(f"{path}: runner wrote no result")
            continue
        passed += counts.get("passed", 0)
        failed += counts.get("failed", 0)
        skipped += counts.get("skipped", 0)
    for p in problems:
        print(f"  not passed: {p}")
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
