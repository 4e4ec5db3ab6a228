#!/usr/bin/env python3
"""Checks that layers point down only (docs/architecture.md):

    kernels < core < device < launch < {transport, ops} < fsdp < metrics < models < apps (tools, examples)

A file of a layer may include coshard headers of its own layer and of the layers below it, never
of a layer above or beside it (transport and ops are side by side: neither includes the other).
The runtime folder holds two layers, each in a folder of its own: runtime/core (tasks, scheduler,
errors, telemetry) and runtime/device (devices, streams, memory, tensors, the Runtime that owns
them); a header's layer is the folder that holds it, so core never includes device.
A library's CMake target links only targets of lower layers, and no library file reaches into
another folder with a relative include.

Usage: scripts/checks/layers.py [ROOT]   (exit code 1 on a violation)
"""
import os
import re
import sys

ORDER = ["kernels", "core", "device", "launch", "transport", "ops", "fsdp", "metrics", "models", "apps"]
SIDE_BY_SIDE = {frozenset({"transport", "ops"})}
# Each layer's folders; a library's public headers lie under <folder>/include/coshard/<name>/ (the
# runtime's two layers share <coshard/runtime/...>, so a header's layer is the folder that holds it).
FOLDERS = {"kernels": "kernels", "runtime/core": "core", "runtime/device": "device", "launch": "launch",
           "transport": "transport", "ops": "ops", "fsdp": "fsdp", "metrics": "metrics", "models": "models",
           "examples": "apps", "tools": "apps"}
TARGET_LAYER = {"kernels": "kernels", "core": "core", "runtime": "device", "launch": "launch", "transport": "transport",
                "ops": "ops", "fsdp": "fsdp", "metrics": "metrics", "models": "models", "gpt2": "models",
                "llama": "models", "coshard": "apps"}
EXTS = (".cpp", ".hpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def library_folders(root):
    """(directory, layer) of every folder a layer's files lie in, tests left out."""
    for folder, layer in FOLDERS.items():
        for dirpath, dirs, names in os.walk(os.path.join(root, folder)):
            dirs[:] = [d for d in dirs if d != "tests"]
            yield dirpath, dirs, names, os.path.join(root, folder), layer


def header_layers(root):
    """'coshard/<name>/<file>' -> the layer of the folder whose include/ holds it."""
    found = {}
    for dirpath, _, names, _, layer in library_folders(root):
        parts = os.path.relpath(dirpath, root).split(os.sep)
        if "include" in parts and parts[-2:-1] == ["coshard"]:
            for nm in names:
                found[f"coshard/{parts[-1]}/{nm}"] = layer
    return found


def allowed(own, other):
    if own == other:
        return True
    if frozenset({own, other}) in SIDE_BY_SIDE:
        return False
    return ORDER.index(other) < ORDER.index(own)


def check_includes(root):
    found = []
    headers = header_layers(root)
    for dirpath, _, names, base, own in library_folders(root):
        for nm in sorted(names):
            if not nm.endswith(EXTS):
                continue
            path = os.path.join(dirpath, nm)
            rel = os.path.relpath(path, root)
            text = open(path, encoding="utf-8", errors="replace").read()
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                line = text.count("\n", 0, m.start()) + 1
                target = os.path.normpath(os.path.join(dirpath, inc))
                if (inc.startswith("../") or "/../" in inc) and not target.startswith(base + os.sep):
                    found.append(f"{rel}:{line}: includes '{inc}' by a relative path out of its folder; include "
                                 "the public header <coshard/...> of a lower layer instead")
                    continue
                other = headers.get(inc)
                if other and not allowed(own, other):
                    found.append(f"{rel}:{line}: the {own} layer includes '{inc}' of the {other} layer, which is "
                                 f"{'beside' if frozenset({own, other}) in SIDE_BY_SIDE else 'above'} it; move "
                                 "what both need to a lower layer (kernels, core or device)")
    return found


def check_links(root):
    found = []
    for dirpath, _, names, _, own in library_folders(root):  # a layer's libraries may nest (models/*)
        if own == "apps" or "CMakeLists.txt" not in names:
            continue
        cm = os.path.join(dirpath, "CMakeLists.txt")
        text = re.sub(r"#.*", "", open(cm).read())
        for m in re.finditer(r"target_link_libraries\(\s*(coshard_\w+)([^)]*)\)", text):
            for dep in re.findall(r"coshard::(\w+)", m.group(2)):
                other = TARGET_LAYER.get(dep)
                if other and not allowed(own, other):
                    found.append(f"{os.path.relpath(cm, root)}: {m.group(1)} links coshard::{dep} of the {other} "
                                 f"layer, which is not below the {own} layer")
    return found


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    found = check_includes(root) + check_links(root)
    for f in found:
        print(f, file=sys.stderr)
    if found:
        print(f"layers: {len(found)} dependency(ies) point up or sideways; the order is " + " < ".join(ORDER),
              file=sys.stderr)
        return 1
    print("layers: every include and link points down (" + " < ".join(ORDER) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
