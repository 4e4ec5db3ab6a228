"""The PyTorch peer of gpt2-train: the same GPT-2 or Llama, data order, AdamW, schedule and
clipping, trained with FSDP2 (`fully_shard` per block and at the root) or DDP on the CPU over gloo.
Started by torchrun from the peer environment (scripts/setup --peers); bench/peers/side_by_side.py
drives both sides. GPT-2 is this file's own module; Llama is transformers' LlamaForCausalLM (SDPA
attention), read from the Hugging Face directory that gpt2-train's --init reads too.

    torchrun --nproc-per-node 2 bench/peers/gpt2_torch.py --mode fsdp2 --model tiny \\
        --data tokens.txt --init init.safetensors --steps 50 --log-json -

    python bench/peers/gpt2_torch.py --write-init init.safetensors --model tiny --seed 1
    python bench/peers/gpt2_torch.py --write-init init-dir --model llama-150M --seed 1

What must match gpt2-train for the losses to agree (docs/benchmarks.md, "FSDP2 side by side"):
- weights: both load the same --init file (Hugging Face names; c_attn etc. are [in, out] as
  transformers' Conv1D stores them); GPT-2's LM head is tied to wte; a Llama's --init is the
  directory transformers' save_pretrained wrote (config.json and model.safetensors);
- data: a .bin file is llm.c tokens, anything else bytes; sequences of T+1 tokens start every T
  tokens, and rank r of step s takes global positions s*W*B + r*B + i (gpt2::DataLoader, no
  shuffle), wrapping at the end; every token is training data;
- AdamW betas 0.9/0.95, eps 1e-8, decay on 2-D parameters only; gpt2-train's warmup and cosine
  schedule; clip_grad_norm_ on the global L2 norm (coef = max / (norm + 1e-6), at most 1);
- the loss of a step is the mean over ranks of each rank's mean cross-entropy, as gpt2-train logs.
"""
import argparse
import gc
import json
import math
import os
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

NAMED = {
    "tiny": dict(layers=2, heads=4, width=96, vocab=256, context=64),
    "10M": dict(layers=6, heads=6, width=384, vocab=256, context=256),
    "124M": dict(layers=12, heads=12, width=768, vocab=50257, context=1024),
}
# coshard's named Llama shapes (models/llama/src/config.cpp) as transformers' LlamaConfig keys.
LLAMA_COMMON = dict(rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                    mlp_bias=False)
LLAMA = {
    "llama-tiny": dict(vocab_size=256, max_position_embeddings=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, hidden_size=64, intermediate_size=176, head_dim=16),
    "llama-150M": dict(vocab_size=32000, max_position_embeddings=1024, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=4, hidden_size=768, intermediate_size=2816, head_dim=64),
}


def is_llama(spec):
    return spec.startswith("llama")


def parse_model(spec):
    """gpt2-train's --model: a name, a name with overrides, or every key."""
    parts = spec.split(",")
    c = dict(NAMED[parts[0]]) if "=" not in parts[0] else {}
    for item in parts[1 if c else 0:]:
        k, v = item.split("=")
        if k == "tie_head":
            if v not in ("true", "1"):
                sys.exit("gpt2_torch.py: only tied heads are supported (tie_head=true)")
            continue
        c[k] = int(v)
    missing = {"layers", "heads", "width", "vocab", "context"} - c.keys()
    if missing:
        sys.exit(f"gpt2_torch.py: --model {spec} lacks {sorted(missing)}")
    return c


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        # Conv1D layout ([in, out]) so the names and shapes are Hugging Face's.
        self.c_attn_w, self.c_attn_b = nn.Parameter(torch.empty(C, 3 * C)), nn.Parameter(torch.zeros(3 * C))
        self.c_proj_w, self.c_proj_b = nn.Parameter(torch.empty(C, C)), nn.Parameter(torch.zeros(C))
        self.fc_w, self.fc_b = nn.Parameter(torch.empty(C, 4 * C)), nn.Parameter(torch.zeros(4 * C))
        self.mlp_proj_w, self.mlp_proj_b = nn.Parameter(torch.empty(4 * C, C)), nn.Parameter(torch.zeros(C))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = torch.addmm(self.c_attn_b, self.ln_1(x).view(-1, C), self.c_attn_w).view(B, T, 3 * C).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(-1, C)
        x = x + torch.addmm(self.c_proj_b, y, self.c_proj_w).view(B, T, C)
        h = F.gelu(torch.addmm(self.fc_b, self.ln_2(x).view(-1, C), self.fc_w), approximate="tanh")
        return x + torch.addmm(self.mlp_proj_b, h, self.mlp_proj_w).view(B, T, C)

    # Hugging Face names of this block's parameters, relative to "h.N.".
    HF = {"ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias", "ln_2.weight": "ln_2.weight",
          "ln_2.bias": "ln_2.bias", "attn.c_attn.weight": "c_attn_w", "attn.c_attn.bias": "c_attn_b",
          "attn.c_proj.weight": "c_proj_w", "attn.c_proj.bias": "c_proj_b", "mlp.c_fc.weight": "fc_w",
          "mlp.c_fc.bias": "fc_b", "mlp.c_proj.weight": "mlp_proj_w", "mlp.c_proj.bias": "mlp_proj_b"}


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["width"])
        self.wpe = nn.Embedding(c["context"], c["width"])
        self.h = nn.ModuleList(Block(c["width"], c["heads"]) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["width"], eps=1e-5)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x).view(B * T, -1) @ self.wte.weight.t()
        return F.cross_entropy(logits, targets.reshape(-1))

    def hf_names(self):
        """Hugging Face name -> parameter."""
        out = {"wte.weight": self.wte.weight, "wpe.weight": self.wpe.weight,
               "ln_f.weight": self.ln_f.weight, "ln_f.bias": self.ln_f.bias}
        for i, b in enumerate(self.h):
            for hf, attr in Block.HF.items():
                mod, _, leaf = attr.rpartition(".")
                out[f"h.{i}.{hf}"] = getattr(getattr(b, mod) if mod else b, leaf)
        return out


class Llama(nn.Module):
    """transformers' LlamaForCausalLM with the loss gpt2-train computes: the mean cross-entropy of
    every position against the next token (the batch gives the targets, as for GPT-2)."""

    def __init__(self, directory):
        super().__init__()
        from transformers import LlamaForCausalLM
        self.m = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa")
        self.h = self.m.model.layers  # the blocks fully_shard wraps one by one
        self.vocab = self.m.config.vocab_size

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx).logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def write_llama_init(directory, spec, seed):
    """transformers' own initialisation of a named shape, saved as a Hugging Face directory."""
    from transformers import LlamaConfig, LlamaForCausalLM
    if spec not in LLAMA:
        sys.exit(f"gpt2_torch.py: --model {spec}: known Llama shapes are {', '.join(LLAMA)}")
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**LLAMA[spec], **LLAMA_COMMON)).save_pretrained(directory)


def write_init(path, c, seed):
    """GPT-2's initialisation (normal 0.02, residual projections 0.02/sqrt(2L), zero biases, unit
    layernorms), written with Hugging Face names."""
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    m = GPT2(c)
    std_proj = 0.02 / math.sqrt(2 * c["layers"])
    with torch.no_grad():
        for name, p in m.hf_names().items():
            if name.endswith("bias"):
                p.zero_()
            elif "ln_" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std_proj if name.endswith("c_proj.weight") else 0.02)
    save_file({k: v.detach().contiguous() for k, v in m.hf_names().items()}, path)


def load_init(m, path):
    from safetensors.torch import load_file
    state = {k.removeprefix("transformer."): v for k, v in load_file(path).items()}
    state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    state.pop("lm_head.weight", None)  # tied to wte
    params = m.hf_names()
    if state.keys() != params.keys():
        sys.exit(f"gpt2_torch.py: --init {path}: tensors {sorted(state.keys() ^ params.keys())[:5]} do not match the model")
    with torch.no_grad():
        for k, p in params.items():
            if tuple(state[k].shape) != tuple(p.shape):
                sys.exit(f"gpt2_torch.py: --init {path}: {k} is {tuple(state[k].shape)}, the model wants {tuple(p.shape)}")
            p.copy_(state[k].float())


def read_tokens(path, vocab):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".bin"):
        magic, version, count = struct.unpack("<3i", data[:12])
        formats = {(20240520, 1): "<u2", (20240801, 7): "<u4"}  # llm.c's GPT-2 and Llama 3 files
        if (magic, version) not in formats:
            sys.exit(f"gpt2_torch.py: {path} is not an llm.c token file")
        dtype = np.dtype(formats[(magic, version)])
        toks = np.frombuffer(data[1024:1024 + dtype.itemsize * count], dtype=dtype).astype(np.int64)
    else:
        toks = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if toks.max(initial=0) >= vocab:
        sys.exit(f"gpt2_torch.py: {path} holds token {toks.max()}, outside the vocabulary {vocab}")
    return torch.from_numpy(toks)


def batch(toks, step, rank, world, B, T):
    """gpt2::DataLoader::batch without shuffling."""
    nseq = (toks.numel() - 1) // T
    starts = [((step * world * B + rank * B + i) % nseq) * T for i in range(B)]
    rows = torch.stack([toks[s:s + T + 1] for s in starts])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def learning_rate(a, step):
    """gpt2-train's learning_rate(): linear warmup, then constant or cosine to 10%."""
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    if a.lr_schedule == "constant":
        return a.lr
    progress = min(1.0, (step - a.warmup_steps) / max(1, a.steps - a.warmup_steps))
    return 0.1 * a.lr + 0.5 * (a.lr - 0.1 * a.lr) * (1.0 + math.cos(math.pi * progress))


class ExposedComm:
    """Time the training thread spends blocked on a collective, as coshard's exposed_comm_s counts
    the compute stream's waits: a synchronous call for its whole duration, an asynchronous one for
    its Work.wait(). FSDP2 calls the torch.distributed functions through the module at call time,
    so wrapping them there sees every all-gather, reduce-scatter and all-reduce it issues. DDP's
    reducer issues its all-reduces from C++, out of sight: its figure is left out."""

    NAMES = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor", "all_reduce")

    def __init__(self):
        self.seconds = 0.0
        for name in self.NAMES:
            if hasattr(dist, name):
                setattr(dist, name, self._timed(getattr(dist, name)))

    def _timed(self, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            work = fn(*args, **kwargs)
            if work is None or not kwargs.get("async_op", False):
                self.seconds += time.perf_counter() - t0
                return work
            return self._Waited(work, self)
        return call

    class _Waited:
        def __init__(self, work, owner):
            self._work, self._owner = work, owner

        def wait(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return self._work.wait(*args, **kwargs)
            finally:
                self._owner.seconds += time.perf_counter() - t0

        def __getattr__(self, name):
            return getattr(self._work, name)


def wrap(m, mode, precision):
    if mode == "ddp":
        if precision != "none":
            sys.exit("gpt2_torch.py: DDP has no mixed-precision policy; use --mode fsdp2 or fsdp2-noreshard")
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(m)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # bf16: FSDP2's MixedPrecisionPolicy(param_dtype=bf16), reductions in bf16 too (reduce_dtype
    # None), as coshard's --mixed-precision bf16.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if precision == "bf16" else MixedPrecisionPolicy()
    reshard = mode == "fsdp2"
    for block in m.h:
        fully_shard(block, reshard_after_forward=reshard, mp_policy=policy)
    return fully_shard(m, reshard_after_forward=reshard, mp_policy=policy)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["fsdp2", "fsdp2-noreshard", "ddp"], default="fsdp2",
                    help="fsdp2: reshard_after_forward=True (FULL_SHARD); fsdp2-noreshard: False (SHARD_GRAD_OP); ddp")
    ap.add_argument("--model", default="tiny", help="a GPT-2 shape, or llama-*: the Llama in the --init directory")
    ap.add_argument("--write-init", metavar="PATH", help="write the model's initialisation to PATH and exit "
                    "(GPT-2: a safetensors file; Llama: a Hugging Face directory)")
    ap.add_argument("--init", help="start from this safetensors file (GPT-2, Hugging Face names) or directory (Llama)")
    ap.add_argument("--data")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--mixed-precision", choices=["none", "bf16"], default="none",
                    help="FSDP2's param_dtype (bf16 compute and reductions; master weights stay f32)")
    ap.add_argument("--log-json", help="one JSON object per step from rank 0, to FILE or -")
    return ap.parse_args()


def build_model(a):
    """The model and its vocabulary and context, from --model (GPT-2) or the --init directory (Llama)."""
    if is_llama(a.model):
        m = Llama(a.init)
        return m, m.vocab, m.m.config.max_position_embeddings
    c = parse_model(a.model)
    m = GPT2(c)
    load_init(m, a.init)
    return m, c["vocab"], c["context"]


def main():
    a = parse_args()
    if a.write_init:
        if is_llama(a.model):
            write_llama_init(a.write_init, a.model, a.seed)
        else:
            write_init(a.write_init, parse_model(a.model), a.seed)
        return
    if not a.init or not a.data:
        sys.exit("gpt2_torch.py: give --init FILE and --data FILE (or --write-init PATH)")
    torch.set_num_threads(a.threads)
    m, vocab, context = build_model(a)
    if a.seq > context:
        sys.exit(f"gpt2_torch.py: --seq {a.seq} is longer than the context {context}")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    exposed = ExposedComm() if a.mode != "ddp" else None
    model = wrap(m, a.mode, a.mixed_precision)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    toks = read_tokens(a.data, vocab)
    log = None
    if rank == 0 and a.log_json:
        log = sys.stdout if a.log_json == "-" else open(a.log_json, "w")
    tokens_per_step = world * a.batch * a.seq
    for step in range(a.steps):
        t0 = time.perf_counter()
        waited = exposed.seconds if exposed else 0.0
        for g in opt.param_groups:
            g["lr"] = learning_rate(a, step)
        x, y = batch(toks, step, rank, world, a.batch, a.seq)
        loss = model(x, y)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        waited = exposed.seconds - waited if exposed else None  # FSDP's own collectives only
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # gloo has no AVG; in the step's time, as gpt2-train's is
        mean /= world
        dt = time.perf_counter() - t0
        if log:
            log.write(json.dumps({"step": step + 1, "loss": mean.item(), "lr": learning_rate(a, step),
                                  "step_s": dt, "tokens_per_s": tokens_per_step / dt,
                                  "exposed_comm_s": waited}) + "\n")
            log.flush()
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0], dtype=torch.float64)
    peaks = [torch.zeros_like(rss) for _ in range(world)]
    dist.all_gather(peaks, rss)
    if rank == 0:
        print(json.dumps({"peer": f"torch {torch.__version__} {a.mode}", "ranks": world, "threads": a.threads,
                          "peak_rss_bytes": [int(p.item()) for p in peaks]}))
    # DDP's reducer must go before its process group: torch 2.15 on gloo otherwise aborts at exit
    # about one run in four ("terminate called without an active exception").
    del opt, model, m
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
