#!/usr/bin/env python3
"""Lists the longest functions and source files of the library and tools (tests excluded).

A function is a brace block at namespace or class level whose opening follows a parameter list;
lambdas and local classes count toward the function that holds them. The parse is lexical
(comments, strings and preprocessor lines are skipped), which is exact for this code base's style.

Usage: scripts/checks/sizes.py [--max-function N] [--max-file N] [--top K] [ROOT]
Exit code 1 when a function or file is over its limit (0 limits: report only).
"""
import argparse
import os
import re
import sys

from cxx import strip

SOURCE_DIRS = ["runtime", "transport", "ops", "kernels", "fsdp", "metrics", "models", "examples", "tools"]
EXTS = (".cpp", ".hpp", ".h", ".cu", ".cuh")


def is_test(path):
    parts = path.split(os.sep)
    return "tests" in parts or os.path.basename(path).endswith(("_test.cpp", "_check.cpp"))


HEAD = re.compile(r"\)\s*(const|noexcept(\([^)]*\))?|override|final|mutable|&|&&|\s|->\s*[\w:<>,\s*&]+)*$")


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []  # (kind, start_line, name)
    line = 1
    last = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            before = text[last:i]
            inside_fn = any(k == "fn" for k, _, _ in stack)
            kind = "block"
            name = ""
            word = re.search(r"(\w+)\s*$", text[max(0, i - 200):i])
            brace_init = word is not None and word.group(1) not in ("const", "noexcept", "override", "final", "mutable",
                                                                    "try")
            if not inside_fn and not brace_init:
                head = text[max(0, i - 2000):i]
                # Constructor initialiser lists: look back past ": a(b), c{d}" to the parameter list.
                if HEAD.search(head) or re.search(r"\)\s*:\s*[\w:]+[({]", head.rsplit(";", 1)[-1]) or re.search(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?$", head):
                    kind = "fn"
                    stmt = head.rsplit(";", 1)[-1]
                    m = re.search(r"([~\w:]+)\s*\([^;{}]*\)\s*:[^;]*$", stmt) or \
                        re.search(r"([~\w:]+(operator\S*)?)\s*\([^;{}]*$", stmt.rsplit("}", 1)[-1])
                    name = m.group(1) if m else "?"
                    if name in ("if", "for", "while", "switch", "catch", "return"):
                        kind = "block"
            stack.append((kind, line, name))
            last = i + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "fn":
                    found.append((line - start + 1, name, start))
            last = i + 1
        elif c == ";":
            last = i + 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-function", type=int, default=0)
    ap.add_argument("--max-file", type=int, default=0)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    files, fns = [], []
    for d in SOURCE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, d)):
            for nm in names:
                p = os.path.join(dirpath, nm)
                rel = os.path.relpath(p, root)
                if not nm.endswith(EXTS) or is_test(rel):
                    continue
                n = sum(1 for _ in open(p, encoding="utf-8", errors="replace"))
                files.append((n, rel))
                for length, name, start in functions(p):
                    fns.append((length, f"{rel}:{start}", name))
    files.sort(reverse=True)
    fns.sort(reverse=True)
    print(f"largest files (limit {a.max_file or 'none'}):")
    for n, rel in files[: a.top]:
        print(f"  {n:5d}  {rel}")
    print(f"longest functions (limit {a.max_function or 'none'}):")
    for n, where, name in fns[: a.top]:
        print(f"  {n:5d}  {name}  ({where})")
    bad = [f for f in files if a.max_file and f[0] > a.max_file]
    bad_fn = [f for f in fns if a.max_function and f[0] > a.max_function]
    for n, rel in bad:
        print(f"sizes: {rel} has {n} lines, over the limit of {a.max_file}: split it by what it holds", file=sys.stderr)
    for n, where, name in bad_fn:
        print(f"sizes: {name} ({where}) has {n} lines, over the limit of {a.max_function}: make it a few named steps",
              file=sys.stderr)
    return 1 if bad or bad_fn else 0


if __name__ == "__main__":
    sys.exit(main())
