# lib.sh: helpers for the end-to-end scripts. Sourced; $1 of each script is the build dir.
set -euo pipefail
build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
collbench="$build/bench/collbench"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs collbench (arguments as given), prints its output, and requires exit 0 and "0 OK".
run_clean() {
  local out="$work/out.txt"
  if ! "$@" >"$out" 2>&1; then cat "$out"; fail "exit status non-zero: $*"; fi
  cat "$out"
  grep -q "Out of bounds values : 0 OK" "$out" || fail "no '0 OK' footer: $*"
}

# chorus-train as the end-to-end scripts run it: with a declared GEMM peak and no loss curve, each
# of which costs a run about half a second of both cores (a measured SGEMM, matplotlib); the
# scripts check neither (train_peak.sh and install.sh check them, calling chorus-train themselves).
# $CHORUS_TRAIN, where set, is the binary run instead of the build's chorus-train (the emulated
# device's: tests/CMakeLists.txt's chorus-train-emulated).
chorus_train_binary=${CHORUS_TRAIN:-$build/chorus-train}
chorus_train() { "$chorus_train_binary" "$@" --peak-tflops 1 --no-plot; }

# Trains the job file $1 as run $2 (output in $work/$2, log in $work/$2.log; the prepared data shared
# in $work/data) with chorus-train options $3...; prints the last two lines, or the log and fails.
train_run() {
  local job=$1 name=$2
  shift 2
  chorus_train "$job" --out "$work/$name" --set data.dir="\"$work/data\"" "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "chorus-train $*"; }
  tail -n 2 "$work/$name.log"
}
