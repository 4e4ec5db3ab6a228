#!/usr/bin/python3
# GPT-2 in PyTorch eager beside bench_gpt2: the same model (models/gpt2/ref/gpt2_ref.py's
# loss_of, plain ops with the unfused attention that eager GPT-2 runs), the same shapes and batch,
# forward + backward + AdamW per step, one process. attention=sdpa (torch >= 2.0) runs attention as
# F.scaled_dot_product_attention instead, as nanoGPT does where it exists.
# Prints:  torch <version> attention=<a> threads=<n> step_ms=<median> (forward <f>, backward <b>, AdamW <a>)
#          spread=<(max - min) / median of the steps>
# Usage: python bench/torch/gpt2_eager.py config=layers=6,heads=6,width=384,vocab=256,context=256
#                                         [batch=4] [seq=256] [steps=5] [threads=1] [attention=eager|sdpa]
import os
import statistics
import sys
import time

# Debian's torch runs its GEMMs through libblas (OpenBLAS), whose threads torch.set_num_threads
# does not govern: without this they ran on every core, beside coshard's one thread. It must be set
# before torch loads the library.
os.environ["OPENBLAS_NUM_THREADS"] = dict(a.split("=", 1) for a in sys.argv[1:]).get("threads", "1")

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gpt2", "ref"))
from gpt2_ref import loss_of, parse_config  # noqa: E402


def params(c):
    C, V, P = c["width"], c["vocab"], c["context"]
    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(c["layers"]):
        h = f"h.{l}."
        shapes.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C),
                       h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                       h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (C, 4 * C),
                       h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    if not c["tie_head"]:
        shapes["lm_head.weight"] = (V, C)
    return {k: (torch.randn(s) * 0.02).requires_grad_(True) for k, s in shapes.items()}


def main():
    a = dict(x.split("=", 1) for x in sys.argv[1:])
    torch.set_num_threads(int(a.get("threads", 1)))
    c = parse_config(a["config"])
    B, T, steps = int(a.get("batch", 4)), int(a.get("seq", 256)), int(a.get("steps", 5))
    attention = a.get("attention", "eager")
    if attention not in ("eager", "sdpa"):
        sys.exit(f"gpt2_eager.py: attention={attention}: use eager or sdpa")
    torch.manual_seed(0)
    p = params(c)
    opt = torch.optim.AdamW(p.values(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    idx = torch.randint(0, c["vocab"], (B, T))
    tgt = torch.randint(0, c["vocab"], (B, T))
    fwd, bwd, adam = [], [], []
    for s in range(steps + 1):  # step 0 warms up
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(p, c, idx, tgt, sdpa=attention == "sdpa")
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if s:
            fwd.append(t1 - t0), bwd.append(t2 - t1), adam.append(t3 - t2)
    med = statistics.median
    steps_s = [f + b + o for f, b, o in zip(fwd, bwd, adam)]
    step = med(steps_s)
    print(f"torch {torch.__version__} attention={attention} threads={torch.get_num_threads()} step_ms={step * 1e3:.1f} "
          f"(forward {med(fwd) * 1e3:.1f}, backward {med(bwd) * 1e3:.1f}, AdamW {med(adam) * 1e3:.1f}) "
          f"spread={(max(steps_s) - min(steps_s)) / step:.2f}")


if __name__ == "__main__":
    main()
