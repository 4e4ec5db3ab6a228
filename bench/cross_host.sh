#!/bin/bash
# Across hosts on a shaped link (docs/benchmarks.md, "Across hosts"): a namespace cluster of 2 hosts
# x 2 ranks (scripts/cluster) whose links are shaped to RATE each way, then
#   collectives  busbw of coshard's flat ring (COSHARD_UCX_HIERARCHY=0 COSHARD_UCX_MESH_MAX_BYTES=0,
#                as a runtime blind to hosts and sizes runs it), two-level schedule with its
#                phases one after another (COSHARD_UCX_HIERARCHY_CHUNK_BYTES=0, "2l-seq"), without
#                the mesh for small operations (COSHARD_UCX_MESH_MAX_BYTES=0, "no-mesh") and as
#                it runs by default (mesh, overlapped chunks), beside Open MPI over TCP (mpirun
#                inside a Slurm allocation), 1 KiB .. MAX, and
#                the share of the link bound: each host's link carries (H-1)/H of an all-gather or
#                reduce-scatter buffer and 2(H-1)/H of an all-reduce buffer, so with nccl-tests'
#                busbw the bound is RATE x H/(H-1) x (n-1)/n for all three (1.5 x RATE here).
#   pairs        coshard's default beside Open MPI, 1 .. 16 KiB, in N alternating runs (--pairs N,
#                10 by default): per cell the median time of each and the median of the per-run
#                ratios. One run of a cell spreads by 30-50% at these sizes on 2 cores, so the single
#                table above cannot say which is ahead there; the paired runs can.
#   gpt2         GPT-2 10M steps/s and exposed communication per strategy: full_shard (on the flat
#                ring and on the two-level schedule), hybrid_shard (shard group = host) and no_shard.
# Needs root (namespaces), Slurm and Open MPI (scripts/setup installs both).
# Usage: bench/cross_host.sh BUILD_DIR [--rate 1gbit] [--max BYTES] [--pairs N] [--only collectives|pairs|gpt2]
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1
shift
rate=1gbit max=$((64 << 20)) pairs=10 only=all
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift ;;
    --max) max=$2; shift ;;
    --pairs) pairs=$2; shift ;;
    --only) only=$2; shift ;;
    *) echo "bench/cross_host.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ $pairs =~ ^[0-9]+$ ]] || { echo "bench/cross_host.sh: --pairs takes a count of runs, not '$pairs'" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "bench/cross_host.sh: needs root (network namespaces)" >&2; exit 2; }
build=$(cd "$build" && pwd)
name=xb$$
out=$(mktemp -d)
trap 'scripts/cluster down --name "$name" >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
scripts/cluster up --name "$name" --nodes 2 --rate "$rate" >/dev/null
on() { local host=$1; shift; scripts/cluster exec --name "$name" "$host" -- "$@"; }
run=$build/tools/coshard-run/coshard-run

# coshard-run by hand on both hosts; rank 0's lines (on node1) on stdout.
two_hosts() {  # ENV... -- PROGRAM ARGS...
  local env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  local common=(--nnodes 2 --nproc-per-node 2 --master node1:29650 --token "$name$RANDOM" -- "$@")
  on node2 env "${env[@]}" "$run" --node-rank 1 "${common[@]}" >"$out/node2.log" 2>&1 &
  on node1 env "${env[@]}" "$run" --node-rank 0 "${common[@]}" 2>&1 | sed -n 's/^\[rank 0\] //p'
  wait $! || { echo "node2 failed:"; cat "$out/node2.log"; return 1; }
}

# Open MPI's collectives, 1 KiB .. $1, on the same hosts (lines "mpi OP BYTES TIME_US ...").
open_mpi() {
  # Slurm grants more CPUs than the machine has, so Open MPI would busy-poll 4 ranks on 2 cores
  # (5 ms per small operation): yield_when_idle is what it picks itself when it knows it is
  # oversubscribed.
  on login salloc -N2 --ntasks-per-node=2 mpirun --allow-run-as-root --mca mpi_yield_when_idle 1 \
    --mca btl tcp,self,vader \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    "$build/bench/bench_mpi_collectives" --min 1024 --max "$1" 2>/dev/null
}

# The values of a JSON field in the step records from step 3 on (the first two warm up).
field() { grep '^{"step"' | tail -n +3 | grep -o "\"$1\":[0-9.e+-]*" | cut -d: -f2; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

bits_per_s() {  # 1gbit, 250mbit, 10kbit -> bits/s
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : (u == "bit") ? 1 : -1
    if (m < 0) { print "bad rate " r > "/dev/stderr"; exit 1 } print n * m }'
}

if [[ $only == all || $only == collectives ]]; then
  echo "== coshard, flat ring"
  two_hosts COSHARD_UCX_HIERARCHY=0 COSHARD_UCX_MESH_MAX_BYTES=0 -- "$build/bench/bench_collectives" --min 1024 \
    --max "$max" | tee "$out/flat"
  echo "== coshard, two-level, phases one after another"
  two_hosts COSHARD_UCX_HIERARCHY=1 COSHARD_UCX_HIERARCHY_CHUNK_BYTES=0 -- "$build/bench/bench_collectives" \
    --min 1024 --max "$max" | tee "$out/seq"
  echo "== coshard, two-level, no mesh for small operations"
  two_hosts COSHARD_UCX_HIERARCHY=1 COSHARD_UCX_MESH_MAX_BYTES=0 -- "$build/bench/bench_collectives" \
    --min 1024 --max "$max" | tee "$out/nomesh"
  echo "== coshard, default: mesh for small operations, two-level (phases overlapped in chunks from 8 MiB)"
  two_hosts COSHARD_UCX_HIERARCHY=1 -- "$build/bench/bench_collectives" --min 1024 --max "$max" | tee "$out/hier"
  echo "== Open MPI over TCP (mpirun in salloc -N2 --ntasks-per-node=2, yield when idle)"
  open_mpi "$max" | tee "$out/mpi"
  bound=$(awk -v b="$(bits_per_s "$rate")" 'BEGIN { printf "%.4f", b / 8 / 1e9 * 1.5 }')
  echo
  echo "busbw GB/s on 2 hosts x 2 ranks, links shaped to $rate (bound $bound GB/s)"
  awk -v bound="$bound" '
    FNR == 1 { file++ }
    $1 != "coshard" && $1 != "mpi" { next }
    { key = $2 " " $3 }
    file == 1 { flat[key] = $6; order[++k] = key }
    file == 2 { seq[key] = $6 }
    file == 3 { nomesh[key] = $6 }
    file == 4 { hier[key] = $6 }
    file == 5 { mpi[key] = $6 }
    END {
      printf "%-15s %10s %7s %7s %7s %7s %7s %9s %8s %6s\n", "op", "bytes", "flat", "2l-seq", "no-mesh", "default",
             "openmpi", "dflt/flat", "dflt/mpi", "bound"
      for (i = 1; i <= k; i++) {
        key = order[i]; split(key, a, " ")
        vs_flat = (flat[key] > 0) ? hier[key] / flat[key] : 0
        vs_mpi = (mpi[key] > 0) ? hier[key] / mpi[key] : 0
        printf "%-15s %10s %7.3f %7.3f %7.3f %7.3f %7.3f %8.2fx %7.2fx %5.0f%%\n", a[1], a[2], flat[key], seq[key],
               nomesh[key], hier[key], mpi[key], vs_flat, vs_mpi, 100 * hier[key] / bound
      }
    }' "$out/flat" "$out/seq" "$out/nomesh" "$out/hier" "$out/mpi"
fi

if [[ $only == all || $only == pairs ]] && ((pairs > 0)); then
  echo
  echo "coshard's default beside Open MPI, $pairs alternating runs, 2 hosts x 2 ranks, links shaped to $rate"
  small=$((16 << 10))
  ((small > max)) && small=$max
  for ((i = 1; i <= pairs; i++)); do
    open_mpi "$small" | awk -v i="$i" '$1 == "mpi" { print i, $0 }'
    two_hosts COSHARD_UCX_HIERARCHY=1 -- "$build/bench/bench_collectives" --min 1024 --max "$small" |
      awk -v i="$i" '$1 == "coshard" { print i, $0 }'
  done >"$out/pairs"
  # Ratio = Open MPI's time / coshard's in the same pair: above 1, coshard was ahead.
  awk -v n="$pairs" '
    function median(list,   a, k, i, j, v) {
      k = split(list, a, " ")
      for (i = 2; i <= k; i++) { v = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    { key = $3 " " $4; t[$2, key, $1] = $5; if (!(key in seen)) { seen[key] = 1; order[++cells] = key } }
    END {
      printf "%-15s %8s %12s %12s %12s %8s\n", "op", "bytes", "coshard_us", "openmpi_us", "mpi/coshard", "ahead"
      for (c = 1; c <= cells; c++) {
        key = order[c]; cs = ms = rs = ""; ahead = pairs = 0
        for (i = 1; i <= n; i++) {
          if (!(("coshard", key, i) in t) || !(("mpi", key, i) in t)) continue
          cs = cs " " t["coshard", key, i]; ms = ms " " t["mpi", key, i]
          r = t["mpi", key, i] / t["coshard", key, i]; rs = rs " " r; pairs++; if (r >= 1) ahead++
        }
        if (!pairs) continue
        split(key, a, " ")
        printf "%-15s %8s %12.1f %12.1f %11.2fx %5d/%d\n", a[1], a[2], median(cs), median(ms), median(rs), ahead, pairs
      }
    }' "$out/pairs"
fi

if [[ $only == all || $only == gpt2 ]]; then
  echo
  echo "GPT-2 10M on 2 hosts x 2 ranks, links shaped to $rate: median of steps 3..8"
  printf "%-19s %9s %9s %12s\n" strategy steps/s step_s exposed_s
  # full_shard also on the flat ring, as a topology-blind runtime runs it: each op then crosses
  # the hosts' link with 3/4 of its bytes instead of 1/2.
  for variant in full_shard:flat full_shard:2-level hybrid_shard:2-level no_shard:2-level; do
    strategy=${variant%%:*} schedule=${variant#*:} label=$strategy
    [[ $schedule == flat ]] && label="$strategy (flat)"
    hierarchy=1
    [[ $schedule == flat ]] && hierarchy=0
    two_hosts COSHARD_UCX_HIERARCHY=$hierarchy -- "$build/tools/train/gpt2-train" --model 10M --seq 128 \
      --steps 8 --samples 0 --log-json - --metrics-port 0 --strategy "$strategy" >"$out/$variant"
    steps=$(grep -c '^{"step"' "$out/$variant" || true)
    ((steps == 8)) || { echo "$label: $steps of 8 steps ran:"; cat "$out/$variant"; exit 1; }
    step_s=$(field step_s <"$out/$variant" | median)
    exposed=$(field exposed_comm_s <"$out/$variant" | median)
    awk -v s="$label" -v t="$step_s" -v e="$exposed" 'BEGIN { printf "%-19s %9.3f %9.3f %12.3f\n", s, 1 / t, t, e }'
  done
fi
