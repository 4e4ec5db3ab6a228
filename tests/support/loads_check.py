#!/usr/bin/env python3
"""Fails naming every test of a build that does not say what it takes of the machine.

scripts/test runs ctest -j4 with tests/resources.json, which only bounds the tests that carry
RESOURCE_GROUPS: one registered without (tests/CMakeLists.txt, coshard_test's LOAD) would run beside
any number of others. Usage: loads_check.py CTEST BUILD_DIR

The listing runs on a copy of the build's CTestTestfile.cmake tree: even --show-only rewrites
Testing/Temporary/LastTest.log of the folder it runs in, and this test runs inside the ctest run
whose log that is (it emptied the log scripts/test read the fuzzers' figures from).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ctest, build = sys.argv[1:3]
with tempfile.TemporaryDirectory(prefix="coshard-loads-") as copy:
    for folder, _, files in os.walk(build):
        if "CTestTestfile.cmake" in files:
            into = os.path.join(copy, os.path.relpath(folder, build))
            os.makedirs(into, exist_ok=True)
            shutil.copy(os.path.join(folder, "CTestTestfile.cmake"), into)
    listing = subprocess.run([ctest, "--test-dir", copy, "--show-only=json-v1"], check=True,
                             capture_output=True, text=True).stdout
tests = json.loads(listing)["tests"]
# A program of a label this build leaves out of `all` is listed as <name>_NOT_BUILT, no properties.
missing = [t["name"] for t in tests if not t["name"].endswith("_NOT_BUILT")
           and not any(p["name"] == "RESOURCE_GROUPS" for p in t.get("properties", []))]
for name in missing:
    print(f"{name}: no RESOURCE_GROUPS; register it with coshard_test (LOAD) or add "
          "${COSHARD_LOAD_computes} to its set_tests_properties", file=sys.stderr)
print(f"{len(tests) - len(missing)} of {len(tests)} tests say what they take")
sys.exit(1 if missing else 0)
