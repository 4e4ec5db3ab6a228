#!/usr/bin/env python3
"""Checks coroutine signatures: a function or lambda returning Task<...> takes no default arguments
and no parameters by const& or && reference.

Why: a Task is lazy. A const& or && parameter can bind a temporary that dies at the end of the
full expression that created the task, before the task first runs, so the frame keeps a dangling
reference; and GCC 12 destroys default-argument temporaries of coroutines twice. Non-const lvalue
references are allowed: they name objects the caller owns and keeps alive until it has awaited
the task (the Runtime, a ProcessGroup, a Scope). Take values by value and move them in.

Usage: scripts/checks/coroutines.py [ROOT]   (exit code 1 on a violation)
"""
import os
import re
import sys

from cxx import report, strip

DIRS = ["runtime", "kernels", "launch", "transport", "ops", "fsdp", "metrics", "models", "examples", "tools", "tests", "bench"]
EXTS = (".cpp", ".hpp", ".h", ".cu", ".cuh")
TASK = re.compile(r"(?<![\w:<,])(?:coshard::)?Task<")
# A lambda's trailing return type: `[...](params) mutable noexcept -> Task<`.
LAMBDA_TASK = re.compile(r"\)\s*(?:(?:mutable|constexpr|noexcept|static)\s*)*->\s*(?:coshard::)?Task<")


def balanced(text, i, open_c, close_c):
    """Index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def top_level(text):
    """The characters of `text` outside any bracket pair, with their index."""
    depth = 0
    for i, c in enumerate(text):
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth -= 1
        elif depth == 0:
            yield i, c


def split_params(params):
    cuts = [i for i, c in top_level(params) if c == ","]
    parts = [params[a + 1:b] for a, b in zip([-1] + cuts, cuts + [len(params)])]
    return [p.strip() for p in parts if p.strip()]


def opening(text, close):
    """Index of the '(' that the ')' at text[close] closes."""
    depth = 0
    for j in range(close, -1, -1):
        if text[j] == ")":
            depth += 1
        elif text[j] == "(":
            depth -= 1
            if depth == 0:
                return j
    return -1


def problems(param):
    p = re.sub(r"\s+", " ", param)
    # A default argument is an '=' at the top level of the parameter (not inside <...> or (...)).
    if any(c == "=" for _, c in top_level(p)):
        return "a default argument"
    if "&&" in p and not re.search(r"\bauto\s*&&|\bF\s*&&|\bFn\s*&&", p):
        return "an rvalue reference (take it by value)"
    if re.search(r"\bconst\b[^&]*&(?!&)", p) or re.search(r"&\s*const\b", p):
        return "a const reference (take it by value)"
    return None


def check(path, rel):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    found = []
    for m in TASK.finditer(text):
        end = balanced(text, m.end() - 1, "<", ">")
        if end < 0:
            continue
        after = re.match(r"\s*([~\w:]+)\s*\(", text[end:])
        if not after or after.group(1) in ("co_await", "return", "co_return"):
            continue
        open_paren = end + after.end() - 1
        close = balanced(text, open_paren, "(", ")")
        if close < 0:
            continue
        line = text.count("\n", 0, m.start()) + 1
        for param in split_params(text[open_paren + 1:close - 1]):
            why = problems(param)
            if why:
                found.append(f"{rel}:{line}: coroutine {after.group(1)} takes '{param}': {why}")
    for m in LAMBDA_TASK.finditer(text):
        open_paren = opening(text, m.start())
        if open_paren < 0 or not text[:open_paren].rstrip().endswith("]"):
            continue
        line = text.count("\n", 0, open_paren) + 1
        for param in split_params(text[open_paren + 1:m.start()]):
            why = problems(param)
            if why:
                found.append(f"{rel}:{line}: coroutine lambda takes '{param}': {why}")
    return found


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    found = []
    for d in DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, d)):
            for nm in sorted(names):
                if nm.endswith(EXTS):
                    p = os.path.join(dirpath, nm)
                    found += check(p, os.path.relpath(p, root))
    return report(found, "coroutines: {count} coroutine parameter(s) may dangle or be destroyed twice across a "
                  "suspension; see the top of scripts/checks/coroutines.py for the rule",
                  "coroutines: every Task-returning function takes its parameters by value or by non-const reference")


if __name__ == "__main__":
    sys.exit(main())
