#!/usr/bin/env python3
"""Fails when a build uses a file that scripts/setup does not install.

A machine that has been used before may hold packages installed by hand; a build that finds and
uses one passes there and fails on a fresh machine (libopenmpi-dev hid that way for days). After a
build, this lists what it used from outside the source and build trees:
  - every header a compile read (ninja's dependency log),
  - every include directory, library and library directory on the compile and link lines
    (build.ninja),
  - every file and directory that CMake's find_* calls and package configs recorded (CMakeCache.txt),
and finds the Debian package of each (dpkg's file lists). Each must come from a package of
scripts/packages/debian.txt or from one that those pull in (Depends, Pre-Depends, as installed
here; the Essential and required-priority base of every Debian root counts too), or from the CUDA
toolkit under /usr/local/cuda, which the machine image provides.

Usage: scripts/checks/packages.py BUILD_DIR [--packages FILE]
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DPKG = "/var/lib/dpkg"
CUDA_LINK = "/usr/local/cuda"


def listed_packages(path):
    names = []
    with open(path) as f:
        for line in f:
            names += line.split("#", 1)[0].split()
    return names


def dpkg_status():
    """Installed packages: name -> fields (Depends, Pre-Depends, Provides, Essential, Priority)."""
    installed = {}
    with open(os.path.join(DPKG, "status"), encoding="utf-8", errors="replace") as f:
        for para in f.read().split("\n\n"):
            fields, key = {}, None
            for line in para.splitlines():
                if line[:1] in (" ", "\t") and key:
                    fields[key] += " " + line.strip()
                elif ":" in line:
                    key, value = line.split(":", 1)
                    fields[key] = value.strip()
            if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
                installed[fields["Package"]] = fields
    return installed


def relation_names(text):
    """'a (>= 1) | b:any, c' -> [['a', 'b'], ['c']]"""
    clauses = []
    for clause in filter(None, (c.strip() for c in text.split(","))):
        clauses.append([re.split(r"[\s(:\[]", alt.strip(), maxsplit=1)[0] for alt in clause.split("|")])
    return clauses


def allowed_packages(roots, installed):
    """The roots and what they pull in, as installed here, plus the base of every Debian root."""
    provides = defaultdict(set)
    for name, fields in installed.items():
        for clause in relation_names(fields.get("Provides", "")):
            provides[clause[0]].add(name)
    start = list(roots) + [n for n, f in installed.items()
                           if f.get("Essential") == "yes" or f.get("Priority") == "required"]
    seen, todo = set(), [n for n in start if n in installed]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        fields = installed[name]
        for key in ("Pre-Depends", "Depends"):
            for clause in relation_names(fields.get(key, "")):
                for alt in clause:  # any alternative installed here may be the one that came
                    todo += [p for p in {alt} | provides.get(alt, set()) if p in installed]
    return seen


def file_owners():
    owners = defaultdict(set)
    info = os.path.join(DPKG, "info")
    for entry in os.listdir(info):
        if entry.endswith(".list"):
            pkg = entry[:-len(".list")].split(":", 1)[0]
            with open(os.path.join(info, entry), encoding="utf-8", errors="replace") as f:
                for line in f:
                    owners[line.rstrip("\n")].add(pkg)
    return owners


def spellings(path):
    """The names dpkg may know a path by: as given, resolved, and across the merged /usr."""
    out = []
    for p in (os.path.normpath(path), os.path.realpath(path)):
        out.append(p)
        for a, b in (("/usr/lib/", "/lib/"), ("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
            if p.startswith(a):
                out.append(b + p[len(a):])
            elif p.startswith(b):
                out.append(a + p[len(b):])
    return out


def ninja_deps(build):
    """Headers each object read, from ninja's deps log: (header, object) pairs."""
    r = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"packages: ninja -t deps failed in {build}: {r.stderr.strip()}")
    obj = None
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            obj = line.split(":", 1)[0]
        elif line.strip().startswith("/"):
            yield line.strip(), "a header of " + obj


def ninja_lines(build):
    """Include and library paths on the compile and link lines of build.ninja."""
    path_flags = ("-I", "-isystem", "-L", "-iquote", "-idirafter")
    with open(os.path.join(build, "build.ninja"), encoding="utf-8", errors="replace") as f:
        target = None
        for line in f:
            if line.startswith("build "):
                target = line.split(":", 1)[0][len("build "):].split(" ")[0]
                continue
            m = re.match(r"\s+(INCLUDES|LINK_LIBRARIES|LINK_PATH|FLAGS) = (.*)", line)
            if not m:
                continue
            try:
                words = shlex.split(m.group(2))
            except ValueError:
                words = m.group(2).split()
            for i, w in enumerate(words):
                for flag in path_flags:
                    if w == flag and i + 1 < len(words):
                        yield words[i + 1], f"{flag} for {target}"
                    elif w.startswith(flag) and len(w) > len(flag) and w[len(flag)] == "/":
                        yield w[len(flag):], f"{flag} for {target}"
                if m.group(1) == "LINK_LIBRARIES" and w.startswith("/"):
                    yield w, f"linked into {target}"


def cache_paths(build):
    """Files and directories recorded by find_* calls and package configs."""
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"([A-Za-z0-9_.+-]+):(FILEPATH|PATH)=(.*)", line.rstrip("\n"))
            if m and not m.group(1).startswith("CMAKE_INSTALL_"):
                for value in m.group(3).split(";"):
                    if value.startswith("/"):
                        yield value, "CMakeCache.txt " + m.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--packages", default=os.path.join(ROOT, "scripts", "packages", "debian.txt"))
    args = ap.parse_args()
    build = os.path.realpath(args.build)
    if not os.path.isfile(os.path.join(build, "build.ninja")):
        sys.exit(f"packages: {args.build} is not a Ninja build folder (no build.ninja): configure it first")
    if not os.path.isdir(os.path.join(DPKG, "info")):
        print("packages: skipped: not a Debian system (no /var/lib/dpkg)")
        return 0

    roots = listed_packages(args.packages)
    installed = dpkg_status()
    not_installed = [p for p in roots if p not in installed]
    allowed = allowed_packages(roots, installed)
    owners = file_owners()
    trees = [os.path.realpath(ROOT), build]
    cuda = [CUDA_LINK, os.path.realpath(CUDA_LINK)] if os.path.exists(CUDA_LINK) else []

    uses = defaultdict(set)  # path -> why
    for source in (cache_paths(build), ninja_lines(build), ninja_deps(build)):
        for path, why in source:
            if os.path.isabs(path) and os.path.exists(path):
                if len(uses[path]) < 3:
                    uses[path].add(why)

    bad = defaultdict(list)  # package (or None) -> [(path, why)]
    used_packages, files = set(), 0
    for path in sorted(uses):
        real = os.path.realpath(path)
        if any(real == t or real.startswith(t + "/") for t in trees):
            continue
        if any(p == c or p.startswith(c + "/") for p in (path, real) for c in cuda):
            continue
        files += 1
        found = set()
        for name in spellings(path):
            found |= owners.get(name, set())
        if not found:
            bad[None].append((path, uses[path]))
        elif not found & allowed:
            for pkg in sorted(found):
                bad[pkg].append((path, uses[path]))
        else:
            used_packages |= found & allowed

    if not_installed:  # their files cannot be in use; what they would pull in is not known here
        print("packages: note: scripts/setup lists packages not installed here: " + " ".join(not_installed))
    for pkg in sorted(bad, key=lambda p: (p is None, p or "")):
        items = bad[pkg]
        head = (f"packages: {len(items)} file(s) the build uses belong to no Debian package (installed by hand?): "
                "make the build find them in a package that scripts/packages/debian.txt lists"
                if pkg is None else
                f"packages: the build uses {len(items)} file(s) of {pkg}, which scripts/setup does not install: "
                f"add {pkg} to scripts/packages/debian.txt, or make the build not react to it")
        print(head)
        for path, why in items[:3]:
            print(f"    {path} ({'; '.join(sorted(why))})")
            stale = [w.split()[-1] for w in why if w.startswith("CMakeCache.txt ")]
            if stale and len(stale) == len(why):  # a cache entry outlives the configure that made it
                print(f"      (if no CMake file looks for it any more: cmake -U {stale[0]} {args.build})")
        if len(items) > 3:
            print(f"    ... and {len(items) - 3} more")
    if bad:
        return 1
    print(f"packages: the build uses {files} file(s) from {len(used_packages)} Debian package(s), each one that "
          f"scripts/setup installs or pulls in" + (", and the CUDA toolkit under " + CUDA_LINK if cuda else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
