#!/usr/bin/env bash
# GPT-2 124M trained by gpt2-train on CUDA (docs/gpu.md): one GPU, then every visible GPU under
# full_shard (one rank each, NCCL), each beside its bound. Per run: the median of steps 3..N of
# tokens/s, step time and exposed communication (the compute stream's waits on all-gathers and
# reductions), and the model FLOPs utilisation against --peak-tflops per GPU: 6 N + 12 L C T FLOPs
# per token (N parameters, L layers, width C, sequence T: PaLM's count with attention). f32 compute
# (cuBLAS without TF32), so the peak to give is the GPU's FP32 one (H100/H200 SXM: 67 TFLOPS).
#   bench/gpu_gpt2.sh BUILD [--batch 8] [--seq 1024] [--steps 12] [--peak-tflops F]
set -euo pipefail
build=${1:?usage: bench/gpu_gpt2.sh BUILD [--batch B] [--seq T] [--steps N] [--peak-tflops F]}
shift
batch=8 seq=1024 steps=12 peak=${COSHARD_GPU_PEAK_TFLOPS:-67}
while (($#)); do
  case "$1" in
    --batch) batch=$2; shift ;;
    --seq) seq=$2; shift ;;
    --steps) steps=$2; shift ;;
    --peak-tflops) peak=$2; shift ;;
    *) echo "bench/gpu_gpt2.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
run=$build/tools/coshard-run/coshard-run train=$build/examples/gpt2/train/gpt2-train
gpus=1
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L | grep -c '^GPU ' || echo 1)
((gpus > 0)) || { echo "bench/gpu_gpt2.sh: no GPU visible (nvidia-smi -L lists none)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== GPT-2 124M on CUDA: --batch $batch --seq $seq, $steps steps, f32; MFU against $peak TFLOPS per GPU"
printf '%-6s %12s %10s %10s %12s %8s\n' GPUs "tokens/s" "step s" "exposed s" "per GPU" MFU
for n in $(printf '%s\n' 1 "$gpus" | sort -un); do
  timeout 1200 "$run" --nproc-per-node "$n" -- "$train" --device cuda --model 124M --batch "$batch" --seq "$seq" \
    --steps "$steps" --strategy full_shard --samples 0 --metrics-port 0 --log-json - >"$out/run.$n" 2>&1 \
    || { tail -20 "$out/run.$n"; echo "bench/gpu_gpt2.sh: the $n-GPU run failed (above)" >&2; exit 1; }
  python3 - "$out/run.$n" "$n" "$batch" "$seq" "$peak" <<'PY'
import json, statistics, sys
path, n, batch, seq, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
steps = []
for line in open(path):
    line = line.strip()
    if line.startswith("[rank 0] "):
        line = line[len("[rank 0] "):]
    if line.startswith("{") and '"tokens_per_s"' in line:
        steps.append(json.loads(line))
late = [s for s in steps if s["step"] >= 3] or steps
med = lambda k: statistics.median(s[k] for s in late)
L, C, N = 12, 768, 124439808
flops_per_token = 6 * N + 12 * L * C * seq
tok = med("tokens_per_s")
mfu = flops_per_token * tok / (n * peak * 1e12)
print(f"{n:<6} {tok:12.0f} {med('step_s'):10.3f} {med('exposed_comm_s'):10.3f} {tok / n:12.0f} {100 * mfu:7.1f}%")
PY
done
