"""The reference scripts' file I/O: safetensors (json + struct + torch.frombuffer: F32, BF16 and
F16; a "transformer." prefix is dropped) and llm.c token files (uint16 or uint32 tokens), in plain
Python and Debian's torch; and their one command line (run_reference).
"""
import argparse
import json
import struct

import numpy as np
import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = bytearray(data[base + b:base + end])
        t = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[e["dtype"]])
        if name.startswith("transformer."):
            name = name[len("transformer."):]
        out[name] = t.reshape(e["shape"]).float()
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().float().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    formats = {(20240520, 1): "<u2", (20240801, 7): "<u4"}  # llm.c's GPT-2 and Llama 3 files
    assert (magic, version) in formats, "not an llm.c token file"
    dtype = np.dtype(formats[(magic, version)])
    return torch.from_numpy(np.frombuffer(data[1024:1024 + dtype.itemsize * count], dtype=dtype).astype(np.int64))


def run_reference(parse_config, loss_of, dtype, label):
    """The reference scripts' main: --config, --weights, --tokens (B*T inputs, then B*T targets),
    --batch, --seq, --out. Computes loss_of(params, config, inputs, targets) in `dtype` and writes
    "loss", "param.<name>" and "grad.<name>" (F32) to --out."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    c = parse_config(a.config)
    params = read_safetensors(a.weights)
    toks = read_tokens(a.tokens)
    n = a.batch * a.seq
    idx, tgt = toks[:n].view(a.batch, a.seq), toks[n:2 * n].view(a.batch, a.seq)
    p = {k: v.to(dtype).clone().requires_grad_(True) for k, v in params.items()}
    loss = loss_of(p, c, idx, tgt)
    loss.backward()
    out = {"loss": loss.detach().reshape(1)}
    for k, v in params.items():
        out["param." + k] = v
        out["grad." + k] = p[k].grad if p[k].grad is not None else torch.zeros_like(v)
    write_safetensors(a.out, out)
    print(f"torch {torch.__version__} ({label}): loss {loss.item():.9f}")
