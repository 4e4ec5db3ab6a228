# A fresh Debian root to prove commands in, for scripts/fresh-check and scripts/gpu-check --proof.
# Sourced, not run. The root is made by mmdebstrap (minbase, from this machine's own apt sources);
# commands run in it, as the root of mount, PID and UTS namespaces of their own (and, if asked, an
# empty network namespace), so every mount dies with them and the root is plain files afterwards,
# removed on exit, failure or interrupt. The machine image's CUDA toolkit is bind-mounted read-only
# where the image has it.

fresh_fail() { echo "${fresh_name:-fresh}: $*" >&2; exit 2; }

# Root, the tools, and the disk a root needs (GB) in the folder that holds it.
fresh_require() {
  local need_gb=$1 tool free_gb
  ((EUID == 0)) || fresh_fail "needs root: it makes a Debian root with mmdebstrap, mounts into it and runs" \
    "commands in namespaces of their own; run it as root (sudo $0)"
  for tool in mmdebstrap unshare chroot findmnt ip; do
    if ! command -v "$tool" >/dev/null; then
      case $tool in
        mmdebstrap) fresh_fail "needs Debian's mmdebstrap, which makes the root: apt-get install mmdebstrap" ;;
        ip) fresh_fail "needs ip (Debian's iproute2): apt-get install iproute2" ;;
        *) fresh_fail "needs $tool (Debian's util-linux or coreutils)" ;;
      esac
    fi
  done
  fresh_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $fresh_suite ]] || fresh_fail "cannot tell this machine's Debian release (no VERSION_CODENAME in /etc/os-release)"
  fresh_sources=()
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -s $f ]] && fresh_sources+=("$f")
  done
  ((${#fresh_sources[@]})) || fresh_fail "this machine has no apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d)" \
    "to make the root from"
  fresh_parent=${COSHARD_FRESH_DIR:-/var/tmp}
  [[ -d $fresh_parent ]] || fresh_fail "COSHARD_FRESH_DIR=$fresh_parent is not a folder"
  free_gb=$(($(df -Pk "$fresh_parent" | awk 'NR == 2 {print $4}') / 1024 / 1024))
  ((free_gb >= need_gb)) || fresh_fail "needs about $need_gb GB free in $fresh_parent for the root and its builds;" \
    "it has $free_gb GB: free some, or set COSHARD_FRESH_DIR to a folder on a larger disk"
}

# Makes the work folder and the trap that removes it: fresh_work, fresh_root.
fresh_start() {
  fresh_work=$(mktemp -d "$fresh_parent/coshard-fresh.XXXXXX")
  fresh_root=$fresh_work/root
  fresh_ns_pid=
  trap fresh_cleanup EXIT
  trap 'echo "$fresh_name: interrupted" >&2; exit 130' INT TERM HUP
}

fresh_cleanup() {
  local rc=$? left
  trap - EXIT INT TERM HUP
  # The namespaces hold every mount: when unshare goes, its child (PID 1 there) is killed and
  # every process of the namespace with it.
  if [[ -n ${fresh_ns_pid:-} ]]; then
    kill -TERM "$fresh_ns_pid" 2>/dev/null || true
    wait "$fresh_ns_pid" 2>/dev/null || true
  fi
  left=$(findmnt -rn -o TARGET | grep -F "$fresh_work" || true)
  if [[ -n $left ]]; then  # not expected: the mounts stay in the namespaces. Never remove through one.
    echo "$fresh_name: unmounting what is left under $fresh_work: $left" >&2
    echo "$left" | sort -r | xargs -r umount -l 2>/dev/null || true
  fi
  if [[ -z $(findmnt -rn -o TARGET | grep -F "$fresh_work" || true) ]]; then
    rm -rf --one-file-system "$fresh_work"
    echo "$fresh_name: removed the root ($fresh_work)"
  else
    echo "$fresh_name: left $fresh_work in place: something is still mounted under it" >&2
  fi
  exit "$rc"
}

fresh_elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# mmdebstrap minbase [with the packages of a comma list], plus what a Debian install writes that
# minbase leaves out (hosts, hostname, resolv.conf), and the CUDA toolkit's mount point.
fresh_make_root() {
  local log=$1 include=${2:-} t0=$SECONDS
  echo "$fresh_name: making a Debian $fresh_suite minbase root${include:+ with $include} in $fresh_root"
  unshare --mount --propagation private mmdebstrap --variant=minbase --mode=root ${include:+--include="$include"} \
    "$fresh_suite" "$fresh_root" "${fresh_sources[@]}" >"$log" 2>&1 \
    || { tail -20 "$log"; fresh_fail "mmdebstrap failed (above; $log)"; }
  echo "$fresh_name: root made in $(fresh_elapsed $((SECONDS - t0)))"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\tcoshard-fresh\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    >"$fresh_root/etc/hosts"
  echo coshard-fresh >"$fresh_root/etc/hostname"
  cp -L /etc/resolv.conf "$fresh_root/etc/resolv.conf"
  fresh_cuda=
  if [[ -e /usr/local/cuda ]]; then
    fresh_cuda=$(realpath /usr/local/cuda)
    mkdir -p "$fresh_root$fresh_cuda"
    [[ $fresh_cuda == /usr/local/cuda ]] || ln -s "$fresh_cuda" "$fresh_root/usr/local/cuda"
    echo "$fresh_name: the CUDA toolkit $fresh_cuda, read-only in the root"
  else
    echo "$fresh_name: no CUDA toolkit under /usr/local/cuda: the root has none, as such a machine"
  fi
}

# Runs each command (a bash line, in FOLDER of the root) inside the root, in the namespaces, each
# with a deadline and a log LOGS/<name>.log; writes "command|exit code|seconds|name" lines to
# RESULTS. The root becomes the mount namespace's own root (pivot_root), not a chroot: a process
# that enters a mount namespace made inside it (nsenter -m, as scripts/cluster's hosts do) gets that
# namespace's root, which under a chroot would be this machine's.
# fresh_run [--no-network] FOLDER LOGS RESULTS DEADLINE_S COMMAND...
fresh_run() {
  local net=()
  [[ $1 == --no-network ]] && { net=(--net); shift; }
  local folder=$1 logs=$2 results=$3 deadline=$4
  shift 4
  cat >"$fresh_work/inner.sh" <<'EOF'
set -uo pipefail
root=$1 cuda=$2 folder=$3 deadline=$4
shift 4
hostname coshard-fresh
ip link set lo up 2>/dev/null || true  # an empty network namespace still has its loopback
# The root a mount of its own, as / is on any machine (mount --make-rslave / and unshare's
# propagation change fail with EINVAL on a plain folder), then the namespace's root.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
if [[ -n $cuda ]]; then
  mount --bind "$cuda" "$root$cuda" && mount -o remount,bind,ro "$root$cuda"
fi
mkdir -p "$root/.host"
cd "$root" && pivot_root . .host && cd / || { echo "pivot_root into $root failed" >&2; exit 1; }
umount -l /.host && rmdir /.host  # nothing of this machine's files is left in view
out=/var/log/coshard-fresh
mkdir -p "$out"
for cmd in "$@"; do
  name=$(echo "$cmd" | sed -E 's/^scripts\///; s/ --?/_/g; s/[^A-Za-z0-9_.-]+/_/g' | cut -c1-60)
  start=$SECONDS
  timeout --kill-after=30 "$deadline" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -lc "cd $folder && $cmd" \
    >"$out/$name.log" 2>&1
  echo "$cmd|$?|$((SECONDS - start))|$name" >>"$out/results"
done
EOF
  unshare --mount --propagation private --pid --fork --kill-child=SIGKILL --uts "${net[@]}" \
    bash "$fresh_work/inner.sh" "$fresh_root" "$fresh_cuda" "$folder" "$deadline" "$@" &
  fresh_ns_pid=$!
  wait "$fresh_ns_pid" || true
  fresh_ns_pid=
  # The logs were written inside the root, which is plain files again here.
  cp "$fresh_root"/var/log/coshard-fresh/*.log "$logs/" 2>/dev/null || true
  cp "$fresh_root/var/log/coshard-fresh/results" "$results" 2>/dev/null || : >"$results"
}
