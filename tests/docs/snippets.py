#!/usr/bin/env python3
"""Turns every C++ block of the README and docs/ into a source file that the build compiles, so a
snippet cannot drift from the API.

Blocks are fenced with ``` or ~~~ and tagged cpp, c++, cxx, cc, h or hpp (any case, indented
or not). The line before each fence names what surrounds the block:
    <!-- snippet: CONTEXT -->
CONTEXT is tests/docs/contexts/CONTEXT.cpp, whose line `// @snippet` is replaced by the block
(inside a coroutine with the names the prose assumes), or `file` for a block that is a whole
translation unit. A `#line` directive makes the compiler's errors point at the markdown line.

Usage: snippets.py OUT_DIR DOC.md...   (prints the generated files, ';'-separated; exit 1 with a
message naming the file and line when a block has no context or names an unknown one)
"""
import os
import re
import sys

FENCE = re.compile(r"^(\s*)(```|~~~)\s*(cpp|c\+\+|cxx|cc|h|hpp)(?![\w+]).*$", re.IGNORECASE)
MARK = re.compile(r"^<!--\s*snippet:\s*([\w-]+)\s*-->\s*$")
CONTEXTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "contexts")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blocks(path):
    """(first line number, context name or None, code) for each C++ block of a markdown file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            indent, marker = fence.group(1), fence.group(2)
            mark = MARK.match(lines[i - 1].strip()) if i > 0 else None
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(marker):
                end += 1
            code = [l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:end]]
            yield i + 2, (mark.group(1) if mark else None), "\n".join(code)
            i = end
        i += 1


def render(doc, line, context, code):
    where = f'#line {line} "{doc}"\n{code}\n'
    if context == "file":
        return where
    ctx_path = os.path.join(CONTEXTS, context + ".cpp")
    text = open(ctx_path, encoding="utf-8").read()
    if "// @snippet" not in text:
        raise ValueError(f"{ctx_path} has no '// @snippet' line")
    before, after = text.split("// @snippet", 1)
    after = after.split("\n", 1)[1] if "\n" in after else ""
    resume = before.count("\n") + 2  # the context's line after the marker
    return f"{before}\n{where}#line {resume} \"{ctx_path}\"\n{after}"


def write_if_changed(path, text):
    if os.path.exists(path) and open(path, encoding="utf-8").read() == text:
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv):
    out, docs = argv[1], argv[2:]
    os.makedirs(out, exist_ok=True)
    known = {f[:-4] for f in os.listdir(CONTEXTS) if f.endswith(".cpp")} | {"file"}
    made, errors = [], []
    for doc in docs:
        stem = re.sub(r"\W", "_", os.path.relpath(os.path.abspath(doc), ROOT).rsplit(".", 1)[0])
        for line, context, code in blocks(doc):
            if context not in known:
                why = "has no <!-- snippet: CONTEXT --> line before it" if context is None else \
                    f"names the unknown context '{context}'"
                errors.append(f"{doc}:{line - 1}: this C++ block {why}; every C++ block in the docs is compiled: "
                              f"use one of {sorted(known)} (tests/docs/contexts/, or 'file' for a whole file)")
                continue
            path = os.path.join(out, f"{stem}_{line}.cpp")
            write_if_changed(path, render(os.path.abspath(doc), line, context, code))
            made.append(path)
    for f in os.listdir(out):
        if os.path.join(out, f) not in made and f.endswith(".cpp"):
            os.remove(os.path.join(out, f))
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    print(";".join(made), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
