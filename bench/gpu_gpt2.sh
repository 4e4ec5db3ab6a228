#!/usr/bin/env bash
# GPT-2 124M trained by gpt2-train on CUDA (docs/gpu.md): one GPU, then every visible GPU under
# full_shard (one rank each, NCCL), in f32 and under bf16 mixed precision, each beside its bound.
# Per run: the median of steps 3..N of tokens/s, step time and exposed communication (the compute
# stream's waits on all-gathers and reductions), and the model FLOPs utilisation against the GPU's
# peak for that precision: 6 N + 12 L C T FLOPs per token (N parameters, L layers, width C,
# sequence T: PaLM's count with attention). f32 GEMMs are cuBLAS's without TF32, so their peak is
# the FP32 one (H100/H200 SXM: 67 TFLOPS); bf16 GEMMs take the dense BF16 one (989).
#   bench/gpu_gpt2.sh BUILD [--batch 8] [--seq 1024] [--steps 12] [--peak-f32 TFLOPS] [--peak-bf16 TFLOPS]
set -euo pipefail
build=${1:?usage: bench/gpu_gpt2.sh BUILD [--batch B] [--seq T] [--steps N] [--peak-f32 F] [--peak-bf16 F]}
shift
batch=8 seq=1024 steps=12 peak_f32=${COSHARD_GPU_PEAK_F32_TFLOPS:-67} peak_bf16=${COSHARD_GPU_PEAK_BF16_TFLOPS:-989}
while (($#)); do
  case "$1" in
    --batch) batch=$2; shift ;;
    --seq) seq=$2; shift ;;
    --steps) steps=$2; shift ;;
    --peak-f32) peak_f32=$2; shift ;;
    --peak-bf16) peak_bf16=$2; shift ;;
    *) echo "bench/gpu_gpt2.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
run=$build/tools/coshard-run/coshard-run train=$build/tools/train/gpt2-train
gpus=1
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
((gpus > 0)) || { echo "bench/gpu_gpt2.sh: no GPU visible (nvidia-smi -L lists none)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== GPT-2 124M on CUDA: --batch $batch --seq $seq per GPU, $steps steps, full_shard"
echo "   MFU against $peak_f32 TFLOPS (f32) and $peak_bf16 TFLOPS (bf16) per GPU; medians of steps 3..$steps"
printf '%-6s %-6s %12s %10s %10s %12s %8s\n' GPUs dtype "tokens/s" "step s" "exposed s" "per GPU" MFU
for n in $(printf '%s\n' 1 "$gpus" | sort -un); do
  for dtype in f32 bf16; do
    mp=none peak=$peak_f32
    [[ $dtype == bf16 ]] && mp=bf16 peak=$peak_bf16
    log=$out/run.$n.$dtype
    timeout 1200 "$run" --nproc-per-node "$n" -- "$train" --device cuda --model 124M --batch "$batch" --seq "$seq" \
      --steps "$steps" --strategy full_shard --mixed-precision "$mp" --samples 0 --metrics-port 0 --log-json - \
      >"$log" 2>&1 || { tail -20 "$log"; echo "bench/gpu_gpt2.sh: the $n-GPU $dtype run failed (above)" >&2; exit 1; }
    python3 - "$log" "$n" "$dtype" "$seq" "$peak" <<'PY'
import json, statistics, sys
path, n, dtype, seq, peak = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
steps = []
for line in open(path):
    line = line.strip()
    if line.startswith("[rank 0] "):
        line = line[len("[rank 0] "):]
    if line.startswith("{") and '"tokens_per_s"' in line:
        steps.append(json.loads(line))
if not steps:
    sys.exit(f"bench/gpu_gpt2.sh: no step records in {path}")
late = [s for s in steps if s["step"] >= 3] or steps
med = lambda k: statistics.median(s[k] for s in late)
L, C, N = 12, 768, 124439808
tok = med("tokens_per_s")
mfu = (6 * N + 12 * L * C * seq) * tok / (n * peak * 1e12)
print(f"{n:<6} {dtype:<6} {tok:12.0f} {med('step_s'):10.3f} {med('exposed_comm_s'):10.3f} {tok / n:12.0f} {100 * mfu:7.1f}%")
PY
  done
done
