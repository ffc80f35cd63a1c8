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
