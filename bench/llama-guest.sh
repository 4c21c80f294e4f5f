#!/usr/bin/env bash
# llama-guest.sh: llama.cpp's llama-bench in a macOS guest, stock and then unlocked
# through metalift, printed in the shape of the published results (stock,
# unlocked, speedup), with metalift-probe's answers before and after.
#
# For a Mac owner, inside a macOS VM (Virtualization.framework: Tart, Anka, UTM,
# Lume...), with metalift installed (the .pkg) or built, and llama.cpp built with Metal.
#
#   bench/llama-guest.sh MODEL.gguf
#   bench/llama-guest.sh --installed MODEL.gguf          # use the installed metaliftd
#   bench/llama-guest.sh --bare-metal-pp 4871.99 --bare-metal-tg 212.5 MODEL.gguf
#
# Needs bash (macOS's /bin/bash 3.2 is enough) and the tools every macOS has.
#
# Options:
#   --llama-bench PATH   llama-bench to run (default: the one on $PATH)
#   --metalift-bin DIR   directory holding metalift, metaliftd, metalift-probe
#                        (default: /usr/local/metalift/bin, else next to `metalift` on $PATH)
#   --shim PATH          libmetalift.dylib (default: what `metalift exec` finds)
#   --installed          ask the installed daemon: a root-owned drop-in
#                        /etc/metalift/policy.d/zz-llama-guest-bench.toml (sudo) unlocks
#                        llama-bench and the probe for the run and is removed at exit.
#                        Set METALIFT_SOCKET if the shim cannot reach the daemon's
#                        default socket (see the admin guide, "Agent reachability").
#   --reps N             llama-bench repetitions (default 5)
#   -p N / -n N          prompt and generation lengths (default 512 / 128)
#   --bare-metal-pp X    the host's bare-metal pp tok/s, to print "% of bare metal"
#   --bare-metal-tg X    the same for tg
#
# Without --installed (the default) the script starts a throw-away metaliftd on a
# temporary socket, policy and audit log, like `metalift demo`. That policy file is
# the user's own, so that daemon runs with --allow-insecure-owner, a development
# flag: a real install keeps /etc/metalift/policy.toml root-owned. Nothing on the
# machine changes, and no sudo is needed.
#
# What the published results looked like (M1 Ultra host, TinyLlama 1.1B Q4_0):
# pp512 431.86 -> 4786.70 tok/s (98.25% of 4871.99 bare metal), tg128 12.63 -> 206.60.
set -euo pipefail

die() { printf 'llama-guest.sh: %s\n' "$*" >&2; exit 2; }
say() { printf '%s\n' "$*" >&2; }

llama_bench=""
bin_dir=""
shim=""
installed=0
reps=5
n_prompt=512
n_gen=128
bare_pp=""
bare_tg=""
model=""

while [ $# -gt 0 ]; do
  case "$1" in
    --llama-bench) llama_bench=${2:?}; shift 2 ;;
    --metalift-bin) bin_dir=${2:?}; shift 2 ;;
    --shim) shim=${2:?}; shift 2 ;;
    --installed) installed=1; shift ;;
    --reps) reps=${2:?}; shift 2 ;;
    -p) n_prompt=${2:?}; shift 2 ;;
    -n) n_gen=${2:?}; shift 2 ;;
    --bare-metal-pp) bare_pp=${2:?}; shift 2 ;;
    --bare-metal-tg) bare_tg=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; model=${1:-}; break ;;
    -*) die "unknown option $1 (try --help)" ;;
    *) model=$1; shift ;;
  esac
done

[ -n "$model" ] || die "usage: llama-guest.sh [options] MODEL.gguf (try --help)"
[ -r "$model" ] || die "cannot read the model $model"
[ "$(uname -s)" = Darwin ] || die "run this in a macOS guest (it measures the real Metal)"

if [ -z "$llama_bench" ]; then
  llama_bench=$(command -v llama-bench) || die "llama-bench is not on \$PATH; pass --llama-bench PATH"
fi
[ -x "$llama_bench" ] || die "$llama_bench is not executable"
# Rules match the kernel's view of the executable: the resolved path, no symlinks.
llama_bench=$(cd "$(dirname "$llama_bench")" && pwd -P)/$(basename "$llama_bench")
if [ -L "$llama_bench" ]; then
  target=$(readlink "$llama_bench")
  case "$target" in
    /*) llama_bench=$target ;;
    *) llama_bench=$(cd "$(dirname "$llama_bench")" && cd "$(dirname "$target")" && pwd -P)/$(basename "$target") ;;
  esac
fi

if [ -z "$bin_dir" ]; then
  if [ -x /usr/local/metalift/bin/metalift ]; then
    bin_dir=/usr/local/metalift/bin
  elif command -v metalift >/dev/null; then
    bin_dir=$(dirname "$(command -v metalift)")
  else
    die "metalift not found; install the .pkg or pass --metalift-bin DIR"
  fi
fi
metalift=$bin_dir/metalift
metaliftd=$bin_dir/metaliftd
probe=$bin_dir/metalift-probe
for tool in "$metalift" "$probe"; do
  [ -x "$tool" ] || die "$tool is missing"
done
probe=$(cd "$(dirname "$probe")" && pwd -P)/$(basename "$probe")

exec_args=()
if [ -n "$shim" ]; then
  exec_args=(--shim "$shim")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-guest.XXXXXX")
daemon_pid=""
dropin=/etc/metalift/policy.d/zz-llama-guest-bench.toml
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  if [ "$installed" = 1 ] && [ -e "$dropin" ]; then
    sudo rm -f "$dropin" || say "could not remove $dropin: remove it by hand"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

rules() {
  cat <<EOF
[[rule]]
id = "llama-guest-bench"
path = "$llama_bench"
unlock = "llama-guest-apple7"

[[rule]]
id = "llama-guest-probe"
path = "$probe"
unlock = "llama-guest-apple7"
EOF
}

if [ "$installed" = 1 ]; then
  # A drop-in cannot declare a profile the main policy already has, so it brings
  # its own, named so it cannot collide.
  {
    printf '[profile.llama-guest-apple7]\napple_family_max = 7\nmax_threadgroup_memory = 32768\n\n'
    rules
  } > "$work/dropin.toml"
  say "installing $dropin (sudo): unlocks $llama_bench and $probe for this run"
  sudo install -o root -g wheel -m 0644 "$work/dropin.toml" "$dropin"
  # metaliftd reloads on change (debounced 50 ms); give it a moment.
  sleep 1
  "$metalift" status 2>/dev/null | sed -n '1,8p' >&2 || say "(metalift status could not reach the daemon)"
else
  [ -x "$metaliftd" ] || die "$metaliftd is missing (or use --installed)"
  {
    printf 'version = 1\nmode = "enforce"\n\n[profile.llama-guest-apple7]\napple_family_max = 7\nmax_threadgroup_memory = 32768\n\n'
    rules
  } > "$work/policy.toml"
  export METALIFT_SOCKET="$work/metalift.sock"
  "$metaliftd" --policy "$work/policy.toml" --socket "$METALIFT_SOCKET" \
    --audit-log "$work/audit.jsonl" --allow-insecure-owner 2>"$work/metaliftd.log" &
  daemon_pid=$!
  for _ in $(seq 1 100); do
    [ -S "$METALIFT_SOCKET" ] && break
    sleep 0.1
  done
  [ -S "$METALIFT_SOCKET" ] || die "metaliftd did not start: $(cat "$work/metaliftd.log")"
fi

say "== metalift-probe, stock"
"$probe" > "$work/probe-stock.txt"
say "== metalift-probe, through metalift exec"
"$metalift" exec ${exec_args[@]+"${exec_args[@]}"} "$probe" > "$work/probe-unlocked.txt"
if ! grep -Eq '^ *Apple7 +yes' "$work/probe-unlocked.txt"; then
  say "warning: the probe is not unlocked through metalift exec: the policy did not"
  say "unlock it or the shim could not reach the daemon, so llama-bench will not be either."
  say "Check 'metalift status', 'metalift audit' and METALIFT_SOCKET."
fi

bench() {
  "$@" -m "$model" -p "$n_prompt" -n "$n_gen" -r "$reps" -o jsonl
}
say "== llama-bench, stock"
bench "$llama_bench" > "$work/stock.jsonl"
say "== llama-bench, through metalift exec"
bench "$metalift" exec ${exec_args[@]+"${exec_args[@]}"} "$llama_bench" > "$work/unlocked.jsonl"

# avg_ts of the line for test pp<n_prompt> (n_gen 0) or tg<n_gen> (n_prompt 0).
tokens_per_second() {
  local file=$1 want_prompt=$2 want_gen=$3 line
  while IFS= read -r line; do
    local np ng ts
    np=$(printf '%s' "$line" | sed -n 's/.*"n_prompt": *\([0-9]*\).*/\1/p')
    ng=$(printf '%s' "$line" | sed -n 's/.*"n_gen": *\([0-9]*\).*/\1/p')
    ts=$(printf '%s' "$line" | sed -n 's/.*"avg_ts": *\([0-9.eE+-]*\).*/\1/p')
    if [ "$np" = "$want_prompt" ] && [ "$ng" = "$want_gen" ]; then
      printf '%s\n' "$ts"
      return 0
    fi
  done < "$file"
  printf 'n/a\n'
}

row() {
  local name=$1 stock=$2 unlocked=$3 bare=$4
  awk -v name="$name" -v s="$stock" -v u="$unlocked" -v b="$bare" 'BEGIN {
    speed = (s > 0 && u > 0) ? sprintf("%.2fx", u / s) : "n/a";
    pct = (b != "" && b > 0 && u > 0) ? sprintf("%.2f%%", 100 * u / b) : "";
    printf "| %-6s | %12.2f | %14.2f | %7s | %s\n", name, s, u, speed, pct
  }'
}

pp_stock=$(tokens_per_second "$work/stock.jsonl" "$n_prompt" 0)
pp_unlocked=$(tokens_per_second "$work/unlocked.jsonl" "$n_prompt" 0)
tg_stock=$(tokens_per_second "$work/stock.jsonl" 0 "$n_gen")
tg_unlocked=$(tokens_per_second "$work/unlocked.jsonl" 0 "$n_gen")

echo
echo "model: $model"
echo "llama-bench: $llama_bench (-p $n_prompt -n $n_gen -r $reps)"
echo
echo "| test   | stock tok/s  | unlocked tok/s | speedup | % of bare metal"
echo "|--------|--------------|----------------|---------|----------------"
row "pp$n_prompt" "$pp_stock" "$pp_unlocked" "$bare_pp"
row "tg$n_gen" "$tg_stock" "$tg_unlocked" "$bare_tg"
echo
echo "metalift-probe, stock:"
sed 's/^/    /' "$work/probe-stock.txt"
echo "metalift-probe, through metalift exec:"
sed 's/^/    /' "$work/probe-unlocked.txt"
if [ "$installed" = 0 ]; then
  echo
  echo "audit records (throw-away daemon):"
  grep -E '"kind":"(decision|outcome)"' "$work/audit.jsonl" | sed 's/^/    /' || true
fi
