#!/usr/bin/env python3
"""Says why each test of the last ctest run skipped, which ctest's own summary hides.

A test that skips passes ctest, so a machine that lacks a tool (root, Slurm, a GPU, Debian's
python3-torch) passes with part of the suite not run; scripts/test prints this after ctest so the
log says what did not run, and why. Reads BUILD/Testing/Temporary/LastTest.log; prints one line
per reason: how many tests, a few of their names, and the reason GoogleTest's GTEST_SKIP gave.

Usage: tests/support/skip_reasons.py BUILD_DIR
"""
import os
import re
import sys
from collections import defaultdict


def skipped(log):
    """(test name, reason) of every skipped test in a LastTest.log."""
    for block in re.split(r"\n(?=\d+/\d+ Testing: )", log):
        m = re.match(r"\d+/\d+ Testing: (\S+)", block)
        if not m or "[  SKIPPED ]" not in block:
            continue
        reason = re.search(r": Skipped\n(.*)", block)
        yield m.group(1), (reason.group(1).strip() if reason and reason.group(1).strip() else "(no reason given)")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    path = os.path.join(sys.argv[1], "Testing", "Temporary", "LastTest.log")
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8", errors="replace") as f:
        log = f.read()
    by_reason = defaultdict(list)
    for name, reason in skipped(log):
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
