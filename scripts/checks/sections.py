#!/usr/bin/env python3
"""Checks the FSDP engine's one-writer rule (fsdp/src/unit_state.hpp): each section of a unit's
state is written only by the collaborator that owns it; the others read it.

    shard      ShardedState creates it, ShardOptimizer updates it, checkpoints load it
    unsharded  Unsharder (the unit's residency, its all-gathered parameters)
    grads      GradientReducer
    progress   Engine

A write is an assignment, an increment or a mutating call (clear, push_back, record, reset, ...)
on `<unit>.<section>.<field>`, or a non-const reference taken to a section's struct. Reads, and
writes into the tensors a section holds (kernels write memory, not the section), are anyone's.

Usage: scripts/checks/sections.py [ROOT]   (exit code 1 on a violation)
"""
import os
import re
import sys

from cxx import report, strip

OWNERS = {
    "shard": {"sharded_state.cpp", "shard_optimizer.cpp", "sharded_checkpoint.cpp"},
    "unsharded": {"unsharder.cpp"},
    "grads": {"gradient_reducer.cpp"},
    "progress": {"engine.cpp"},
}
STRUCTS = {"ShardTensors": "shard", "Unsharded": "unsharded", "Gradients": "grads", "Progress": "progress"}
SECTION = r"\.(shard|unsharded|grads|progress)\.(\w+)"
MUTATORS = r"clear|push_back|emplace_back|emplace|record|reset|assign|insert|erase|resize|swap"
WRITES = [
    re.compile(SECTION + r"(?:\.\w+|\[[^\]]*\])*\s*(?:=(?!=)|\+=|-=|\*=|/=|\|=|&=|\+\+|--)"),
    re.compile(r"(?:\+\+|--)\s*[\w\[\]]+(?:\.|->)?" + SECTION[2:]),
    re.compile(SECTION + r"\s*(?:\.|->)\s*(?:" + MUTATORS + r")\s*\("),
]
MUTABLE_REF = re.compile(r"(?<![\w:])(?:detail::)?(" + "|".join(STRUCTS) + r")\s*&\s*\w+\s*=")


def check(path, rel):
    name = os.path.basename(path)
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    found = []
    for rx in WRITES:
        for m in rx.finditer(text):
            section = m.group(1)
            if name not in OWNERS[section]:
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{rel}:{line}: writes the '{section}' section ({section}.{m.group(2)}), which only "
                             f"{' and '.join(sorted(OWNERS[section]))} may write; ask its owner to do it")
    for m in MUTABLE_REF.finditer(text):
        section = STRUCTS[m.group(1)]
        if name not in OWNERS[section]:
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel}:{line}: takes a mutable reference to the '{section}' section ({m.group(1)}&), which "
                         f"only {' and '.join(sorted(OWNERS[section]))} may write; take it const")
    return sorted(set(found))


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    src = os.path.join(root, "fsdp", "src")
    found = []
    for nm in sorted(os.listdir(src)):
        if nm.endswith((".cpp", ".hpp")) and nm != "unit_state.hpp":
            found += check(os.path.join(src, nm), os.path.relpath(os.path.join(src, nm), root))
    return report(found, "sections: {count} write(s) of a unit's state by a collaborator that does not own the "
                  "section; see fsdp/src/unit_state.hpp",
                  "sections: each section of a unit's state is written by its owner only")


if __name__ == "__main__":
    sys.exit(main())
