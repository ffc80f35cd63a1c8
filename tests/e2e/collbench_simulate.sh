#!/usr/bin/env bash
# collbench --simulate predicts rows without starting ranks: a closed-form case on a given model,
# 16384 ranks across hosts for log-depth algorithms, and a clear refusal where a schedule set is
# too large to hold.
source "$(dirname "$0")/lib.sh"
# One message of 1 MiB each way between 2 ranks: alpha + bytes * beta (reduce and copy made free).
printf 'shm alpha_us=10 beta_GBps=1 gamma_GBps=1000000 copy_GBps=1000000\n' > "$work/model.txt"
CHORUS_TUNING_FILE="$work/model.txt" "$collbench" --simulate -g 2 --op allreduce -b 1M -e 1M \
  --algo recursive_doubling --json "$work/two.json" | tee "$work/two.txt"
python3 - "$work/two.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 1, rows
t = rows[0]["out_of_place"]["time_us"]
expected = 10 + 1048576 * 1e-3
assert abs(t - expected) < 0.01 * expected, (t, expected)
print("closed form ok:", t)
PY
"$collbench" --simulate -g 16384 --ranks-per-host 8 --op allreduce --algo recursive_doubling,tree,default \
  -b 64K -e 4M -f 64 --json "$work/big.json" | tee "$work/big.txt"
python3 - "$work/big.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
assert doc["simulated"] and doc["nranks"] == 16384, doc
assert len(rows) == 3 * 2, len(rows)
for r in rows:
    assert r["out_of_place"]["time_us"] > 0 and r["messages"] >= 16384, r
for algo in ("recursive_doubling", "tree"):
    times = [r["out_of_place"]["time_us"] for r in rows if r["algo"] == algo]
    assert times[0] < times[1], (algo, times)
assert all(r["algo"].startswith("default:") for r in rows if r["algo"] not in ("recursive_doubling", "tree"))
print("16384 ranks ok")
PY
if "$collbench" --simulate -g 16384 --op allreduce --algo ring -b 64K -e 64K >"$work/ring.txt" 2>&1; then
  fail "a schedule set too large to hold was not reported"
fi
grep -q "not simulated: .*more than the simulator holds" "$work/ring.txt" || { cat "$work/ring.txt"; fail "no reason given"; }
echo "simulate ok"
