#!/usr/bin/python3
"""GPT-2 in plain PyTorch ops (no transformers library), the reference for coshard's `ref` tests.

Reads the weights from a safetensors file (parsed here with json + struct + torch.frombuffer:
F32, BF16 and F16; a "transformer." prefix is accepted) and the batch from an llm.c token file
holding B*T inputs followed by B*T targets. Computes the mean cross-entropy loss and the gradient
of every parameter, and writes them to a safetensors file (F32): "loss" [1], "param.<name>" (the
values as read, converted to F32) and "grad.<name>".

usage: gpt2_ref.py --config layers=2,heads=4,width=96,vocab=256,context=64[,tie_head=false]
                   --weights w.safetensors --tokens t.bin --batch B --seq T --out out.safetensors
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common", "ref"))
from ref_io import run_reference  # noqa: E402


def parse_config(spec):
    c = {"tie_head": True}
    for item in spec.split(","):
        k, v = item.split("=")
        c[k] = v not in ("false", "0") if k == "tie_head" else int(v)
    return c


def loss_of(p, c, idx, tgt, sdpa=False):
    """sdpa: attention by F.scaled_dot_product_attention (torch >= 2.0, fused) instead of plain ops."""
    B, T = idx.shape
    C, NH = c["width"], c["heads"]
    hs = C // NH
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(c["layers"]):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        if sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        a = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(a @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    head = p["wte.weight"] if c["tie_head"] else p["lm_head.weight"]
    logits = x @ head.t()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.reshape(-1))


def main():
    run_reference(parse_config, loss_of, torch.float32, "float32")


if __name__ == "__main__":
    main()
