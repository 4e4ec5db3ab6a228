"""Lexical helpers shared by the source checks: C++ text with comments, string and character
literals and preprocessor lines blanked out (newlines kept, so line numbers stay right), and how a
check reports what it found."""
import re
import sys


def report(found, failed, passed):
    """Prints each finding and `failed` (given their count) to stderr, or `passed` when there are
    none; returns the check's exit code."""
    for f in found:
        print(f, file=sys.stderr)
    if found:
        print(failed.format(count=len(found)), file=sys.stderr)
        return 1
    print(passed)
    return 0


def strip(text):
    """Blanks comments, string and char literals and preprocessor lines, keeping newlines."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "R" and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                end = n if end < 0 else end + len(m.group(1)) + 2
                out.append('""' + "\n" * text.count("\n", i, end))
                i = end
                continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out)
