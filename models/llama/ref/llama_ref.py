#!/usr/bin/python3
"""Llama in plain PyTorch ops, in float64 (no transformers library): the reference for coshard's
`ref` tests, written from Hugging Face's LlamaForCausalLM: RMSNorm (f32 statistics there, float64
here), rotary embeddings with rotate_half (and the llama3 frequency scaling), grouped-query
attention by repeat_kv, the SwiGLU MLP, an untied or tied head and the mean cross-entropy.

Reads the weights from a safetensors file and the batch from an llm.c token file holding B*T
inputs followed by B*T targets; writes the loss and every parameter's gradient (float64 computed,
F32 stored) to a safetensors file: "loss" [1], "param.<name>" and "grad.<name>".

usage: llama_ref.py --config layers=2,heads=4,kv_heads=2,...(llama::Config::to_string())
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
    c = {"tie_head": False, "rope_scaling": None}
    for item in spec.split(","):
        k, v = item.split("=")
        if k == "tie_head":
            c[k] = v in ("true", "1")
        elif k in ("rms_eps", "rope_theta"):
            c[k] = float(v)
        elif k == "rope_scaling":
            kind, *nums = v.split(":")
            assert kind == "llama3", v
            c[k] = [float(n) for n in nums]
        else:
            c[k] = int(v)
    return c


def inv_freq(c):
    hd = c["head_dim"]
    f = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if c["rope_scaling"]:
        factor, low, high, old = c["rope_scaling"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / low, f / factor, f)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        f = torch.where(medium, smoothed, scaled)
    return f


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def loss_of(p, c, idx, tgt):
    B, T = idx.shape
    NH, NKV, hd = c["heads"], c["kv_heads"], c["head_dim"]
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(c))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = p["model.embed_tokens.weight"][idx]
    for l in range(c["layers"]):
        h = f"model.layers.{l}."
        n = rms_norm(x, p[h + "input_layernorm.weight"], c["rms_eps"])
        q = (n @ p[h + "self_attn.q_proj.weight"].t()).view(B, T, NH, hd).transpose(1, 2)
        k = (n @ p[h + "self_attn.k_proj.weight"].t()).view(B, T, NKV, hd).transpose(1, 2)
        v = (n @ p[h + "self_attn.v_proj.weight"].t()).view(B, T, NKV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # repeat_kv
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, NH * hd) @ p[h + "self_attn.o_proj.weight"].t()
        n = rms_norm(x, p[h + "post_attention_layernorm.weight"], c["rms_eps"])
        gate = n @ p[h + "mlp.gate_proj.weight"].t()
        up = n @ p[h + "mlp.up_proj.weight"].t()
        x = x + (F.silu(gate) * up) @ p[h + "mlp.down_proj.weight"].t()
    x = rms_norm(x, p["model.norm.weight"], c["rms_eps"])
    head = p["model.embed_tokens.weight"] if c["tie_head"] else p["lm_head.weight"]
    logits = x @ head.t()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.reshape(-1))


def main():
    run_reference(parse_config, loss_of, torch.float64, "float64")


if __name__ == "__main__":
    main()
