#!/usr/bin/python3
"""Draws what bench/peers/side_by_side.py --json wrote: the loss curves of coshard and FSDP2 on one
plot per rank count (parity), or step time per run as bars per model (bench: the rows of every
file given, in order). Debian's matplotlib (/usr/bin/python3), not the peer environment's
interpreter.

usage: plot.py RESULTS.json [MORE.json ...] OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    files, out = sys.argv[1:-1], sys.argv[-1]
    results = json.load(open(files[0]))
    for more in files[1:]:
        if "bench" not in results or "bench" not in json.load(open(more)):
            sys.exit("plot.py: only bench results (not parity) can be drawn from several files")
        results["bench"] += json.load(open(more))["bench"]
    if "parity" in results:
        runs = results["parity"]
        fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
        for ax, run in zip(axes[0], runs):
            steps = range(1, len(run["coshard"]) + 1)
            ax.plot(steps, run["fsdp2"], label="PyTorch FSDP2", linewidth=3, alpha=0.5)
            ax.plot(steps, run["coshard"], label="coshard full_shard", linestyle="--")
            ax.set(title=f"GPT-2 tiny, {run['ranks']} ranks", xlabel="step", ylabel="training loss")
            ax.legend()
    else:
        rows = results["bench"]
        models = sorted({r["model"] for r in rows}, key=[r["model"] for r in rows].index)
        fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4), squeeze=False)
        for ax, model in zip(axes[0], models):
            mine = [r for r in rows if r["model"] == model]
            names = [r["run"] for r in mine]
            med = [r["median_s"] for r in mine]
            err = [[r["median_s"] - r["min_s"] for r in mine], [r["max_s"] - r["median_s"] for r in mine]]
            colors = ["tab:blue" if n.startswith("coshard") else "tab:orange" for n in names]
            ax.bar(range(len(mine)), med, yerr=err, color=colors, capsize=4)
            ax.set_xticks(range(len(mine)), names, rotation=30, ha="right")
            ax.set(title=f"GPT-2 {model}: step time (median, min-max)", ylabel="seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
