#!/usr/bin/python3
# PyTorch eager beside bench_kernels: forward + backward (autograd) of the same ops at the same
# shapes, printed in the same format:  op=<name> shape=<dims> ms=<median> spread=<(max-min)/median>
# Attention is what GPT-2 in eager PyTorch runs (Hugging Face's eager path, nanoGPT without
# flash): q k^T, mask, softmax, @ v, with the [T, T] matrix materialised. Where
# scaled_dot_product_attention exists (torch >= 2.0) it is timed too, as op=attention_sdpa.
# Usage: python bench/torch/kernels_baseline.py [threads=1] [only=OP] [min_seconds=0.5]
import math
import os
import sys
import time

# Debian's torch runs its GEMMs through libblas (OpenBLAS), whose threads torch.set_num_threads
# does not govern: without this they ran on every core, beside coshard's one thread. It must be set
# before torch loads the library.
os.environ["OPENBLAS_NUM_THREADS"] = dict(a.split("=", 1) for a in sys.argv[1:]).get("threads", "1")

import torch
import torch.nn.functional as F


def timed(op, shape, fn, only, min_seconds):
    if only and only != op:
        return
    fn()
    t = []
    start = time.perf_counter()
    while len(t) < 5 or time.perf_counter() - start < min_seconds:
        a = time.perf_counter()
        fn()
        t.append((time.perf_counter() - a) * 1e3)
    t.sort()
    med = t[len(t) // 2]
    print(f"op={op} shape={shape} ms={med:.3f} spread={(t[-1] - t[0]) / med:.3f}", flush=True)


def attention(B, T, C, NH, sdpa):
    hs = C // NH
    qkv = (torch.rand(B, T, 3 * C) - 0.5).mul(2.0).requires_grad_(True)
    dout = torch.rand(B, T, C) - 0.5
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def run():
        qkv.grad = None
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        if sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y.transpose(1, 2).reshape(B, T, C).backward(dout)

    return run


def elementwise(fn, x, *params):
    x = x.requires_grad_(True)
    dy = torch.rand_like(x) - 0.5

    def run():
        x.grad = None
        for p in params:
            p.grad = None
        fn(x).backward(dy)

    return run


def cross_entropy(N, V):
    logits = (torch.rand(N, V) - 0.5).mul(8.0).requires_grad_(True)
    targets = (torch.arange(N) * 7919) % V

    def run():
        logits.grad = None
        F.cross_entropy(logits, targets).backward()

    return run


def adamw(n):
    p = torch.nn.Parameter(torch.rand(n) - 0.5)
    p.grad = (torch.rand(n) - 0.5) * 0.01
    opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return opt.step


def main():
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    torch.set_num_threads(int(args.get("threads", 1)))
    only, ms = args.get("only", ""), float(args.get("min_seconds", 0.5))
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s)", flush=True)
    torch.manual_seed(0)
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    for B, T, C, NH in [(4, 256, 384, 6), (1, 1024, 768, 12), (1, 4096, 768, 12)]:
        shape = f"B{B}xT{T}xC{C}xNH{NH}"
        timed("attention", shape, attention(B, T, C, NH, False), only, ms)
        if has_sdpa:
            timed("attention_sdpa", shape, attention(B, T, C, NH, True), only, ms)
    for rows, n in [(1024, 1536), (1024, 3072)]:
        x = (torch.rand(rows, n) - 0.5) * 6.0
        timed("gelu", f"{rows}x{n}", elementwise(lambda t: F.gelu(t, approximate="tanh"), x), only, ms)
    for rows, C in [(1024, 384), (1024, 768)]:
        w, b = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
        x = (torch.rand(rows, C) - 0.5) * 4.0
        timed("layernorm", f"{rows}x{C}", elementwise(lambda t: F.layer_norm(t, (C,), w, b, 1e-5), x, w, b), only, ms)
    for N, V in [(1024, 256), (1024, 50257)]:
        timed("cross_entropy", f"{N}x{V}", cross_entropy(N, V), only, ms)
    timed("adamw", "10838016", adamw(10_838_016), only, ms)


if __name__ == "__main__":
    main()
