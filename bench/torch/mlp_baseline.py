#!/usr/bin/python3
# What a user would pick instead of coshard, for the MLP of bench_fsdp_step: 4 x Linear(H, H) with
# ReLU between, MSE loss, Adam, `batch` rows per rank, `world` processes on 127.0.0.1, gloo:
#   ddp    DistributedDataParallel
#   fsdp2  fully_shard per Linear and at the root (torch >= 2.4: the peer environment's python,
#          scripts/setup --peers; Debian's torch 1.13 has no FSDP on the CPU)
#   zero3  a hand-written ZeRO-3: all_gather for forward and backward, reduce_scatter_tensor for
#          the gradients (all_to_all + sum on torch 1.13, whose gloo has no reduce-scatter)
# Prints:  torch <mode> world=<n> batch=<b> step_ms=<ms> steps_per_s=<x> spread=<(max-min)/median>
# timed as bench_fsdp_step is: 5 rounds of steps/5 steps, the median round's mean step and the
# rounds' spread.
# Usage: bench/torch/mlp_baseline.py ddp|fsdp2|zero3 [world=2] [batch=128] [steps=20] [hidden=2048]
import socket
import os
import sys
import time

# Debian's torch runs its GEMMs through libblas (OpenBLAS), whose threads torch.set_num_threads
# does not govern: without this they ran on every core, beside coshard's one thread. It must be set
# before torch loads the library.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

LAYERS = 4


class GatheredLinear(torch.autograd.Function):
    """y = x W^T + b, W kept as this rank's flat shard: gathered for forward and again for backward;
    the weight gradient is reduce-scattered."""

    @staticmethod
    def gather(shard, world, h):
        full = torch.empty(shard.numel() * world)
        dist.all_gather(list(full.chunk(world)), shard)
        return full.view(h, h)

    @staticmethod
    def forward(ctx, x, shard, bias, world, h):
        ctx.save_for_backward(x, shard)
        ctx.world, ctx.h = world, h
        return torch.addmm(bias, x, GatheredLinear.gather(shard, world, h).t())

    @staticmethod
    def backward(ctx, gy):
        x, shard = ctx.saved_tensors
        w = GatheredLinear.gather(shard, ctx.world, ctx.h)
        gw = (gy.t() @ x).reshape(-1)
        if int(torch.__version__.split(".")[0]) >= 2:
            gshard = torch.empty(gw.numel() // ctx.world)
            dist.reduce_scatter_tensor(gshard, gw)
            gshard.div_(ctx.world)
        else:
            parts = torch.empty_like(gw)
            dist.all_to_all_single(parts, gw)
            gshard = parts.view(ctx.world, -1).sum(0).div_(ctx.world)
        gb = gy.sum(0)
        dist.all_reduce(gb)
        return gy @ w, gshard, gb.div_(ctx.world), None, None


class Zero3(nn.Module):
    def __init__(self, h, rank, world):
        super().__init__()
        self.h, self.world = h, world
        n = h * h // world
        full = [nn.Linear(h, h) for _ in range(LAYERS)]
        self.shards = nn.ParameterList(
            [nn.Parameter(l.weight.detach().reshape(-1)[rank * n:(rank + 1) * n].clone()) for l in full])
        self.biases = nn.ParameterList([nn.Parameter(l.bias.detach().clone()) for l in full])

    def forward(self, x):
        for i in range(LAYERS):
            x = GatheredLinear.apply(x, self.shards[i], self.biases[i], self.world, self.h)
            if i < LAYERS - 1:
                x = F.relu(x)
        return x


def mlp(h):
    layers = []
    for i in range(LAYERS):
        layers.append(nn.Linear(h, h))
        if i < LAYERS - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def run(rank, world, mode, batch, steps, h, port):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(mlp(h))
    elif mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        model = mlp(h)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = Zero3(h, rank, world)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, h), torch.randn(batch, h)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    dist.barrier()
    times, rounds = [], 5
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(max(1, steps // rounds)):
            step()
        times.append((time.perf_counter() - t0) * 1e3 / max(1, steps // rounds))
    dist.barrier()
    times.sort()
    ms = times[len(times) // 2]
    if rank == 0:
        print(f"torch {mode} world={world} batch={batch} step_ms={ms:.1f} steps_per_s={1e3 / ms:.3f} "
              f"spread={(times[-1] - times[0]) / ms:.2f} version={torch.__version__}", flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("ddp", "fsdp2", "zero3"):
        sys.exit("usage: mlp_baseline.py ddp|fsdp2|zero3 [world] [batch] [steps] [hidden]")
    mode = sys.argv[1]
    world, batch, steps, h = (int(a) for a in (sys.argv[2:] + ["2", "128", "20", "2048"][len(sys.argv) - 2:]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(world, mode, batch, steps, h, port), nprocs=world, join=True)


if __name__ == "__main__":
    main()
