#!/usr/bin/env python3
"""Says why each test of the last ctest run skipped, which ctest's own summary hides.

A test that skips passes ctest, so a machine that lacks a tool (root, Slurm, a GPU, Debian's
python3-torch) passes with part of the suite not run; scripts/test prints this after ctest so the
log says what did not run, and why. Reads the JUnit file of that ctest run (ctest --output-junit
FILE; not Testing/Temporary/LastTest.log, which a later `ctest --show-only` of a test rewrites);
prints one line per reason: how many tests, a few of their names, and the reason GoogleTest's
GTEST_SKIP gave.

Usage: tests/support/skip_reasons.py JUNIT_XML
"""
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def skipped(path):
    """(test name, reason) of every skipped test in a ctest JUnit file."""
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is None:
            continue
        out = case.findtext("system-out") or ""
        # GoogleTest's GTEST_SKIP, or a script's own "skip: why" line (tests/peers).
        reason = re.search(r": Skipped\n(.*)", out) or re.search(r"^skip: (.*)", out, re.M)
        yield case.get("name"), (reason.group(1).strip() if reason and reason.group(1).strip() else "(no reason given)")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    if not os.path.isfile(sys.argv[1]):
        return 0
    by_reason = defaultdict(list)
    for name, reason in skipped(sys.argv[1]):
        by_reason[reason].append(name)
    total = sum(len(v) for v in by_reason.values())
    if total:
        print(f"  skipped: {total} test(s), for {len(by_reason)} reason(s):")
    for reason, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        print(f"  skipped: {len(names)} ({shown}): {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
