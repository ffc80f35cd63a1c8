#!/usr/bin/env bash
# chorus-sim (`collbench --simulate` runs it) predicts rows without starting ranks: a closed-form
# case on a given model, 16384 ranks across hosts (log-depth algorithms with every rank simulated;
# the ring with one host's ranks standing for all), and a clear refusal where a schedule set is too
# large to hold and its ranks are not shifted copies of one host's.
source "$(dirname "$0")/lib.sh"
# One message of 1 MiB each way between 2 ranks: alpha + bytes * beta (reduce and copy made free).
printf 'shm alpha_us=10 beta_GBps=1 gamma_GBps=1000000 copy_GBps=1000000\n' > "$work/model.txt"
CHORUS_TUNING_FILE="$work/model.txt" "$build/bench/chorus-sim" -g 2 --op allreduce -b 1M -e 1M \
  --algo recursive_doubling --json "$work/two.json" | tee "$work/two.txt"
python3 - "$work/two.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 1, rows
t = rows[0]["out_of_place"]["time_us"]
expected = 10 + 1048576 * 1e-3
assert abs(t - expected) < 0.01 * expected, (t, expected)
# The row carries the algorithm's closed form (the tuner's cost) beside the simulated time.
assert abs(rows[0]["closed_form_us"] - expected) < 0.01 * expected, rows[0]
print("closed form ok:", t)
PY
"$collbench" --simulate -g 16384 --ranks-per-host 8 --op allreduce --algo recursive_doubling,tree,ring,default \
  -b 64K -e 4M -f 64 --json "$work/big.json" | tee "$work/big.txt"
python3 - "$work/big.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
assert doc["simulated"] and doc["nranks"] == 16384, doc
assert len(rows) == 4 * 2, len(rows)
for r in rows:
    assert r["out_of_place"]["time_us"] > 0 and r["messages"] >= 16384, r
for algo in ("recursive_doubling", "tree", "ring"):
    times = [r["out_of_place"]["time_us"] for r in rows if r["algo"] == algo]
    assert times[0] < times[1], (algo, times)
for r in rows:
    # The ring's 2(n-1) steps per rank: one host of 8 stands for all, every message counted.
    expected = 8 if r["algo"] == "ring" else 16384
    assert r["simulated_ranks"] == expected, r
    if r["algo"] == "ring":
        assert r["messages"] == 16384 * 2 * 16383, r
assert all(r["algo"].startswith("default:") for r in rows if r["algo"] not in ("recursive_doubling", "tree", "ring"))
print("16384 ranks ok")
PY
grep -q "one host's ranks simulated, standing for all" "$work/big.txt" || fail "stand-in rows not footnoted"
# 4 KiB over 16384 ranks leaves most of the ring's blocks empty: the ranks differ, so no host can
# stand for all, and the set is too large to hold.
if "$collbench" --simulate -g 16384 --op allreduce --algo ring -b 4K -e 4K >"$work/ring.txt" 2>&1; then
  fail "a schedule set too large to hold was not reported"
fi
grep -q "not simulated: .*more than the simulator holds.*is not rank 0's shifted" "$work/ring.txt" ||
  { cat "$work/ring.txt"; fail "no reason given"; }
# alltoallv's counts are the call's: the simulator refuses it by name rather than run without them.
if "$collbench" --simulate -g 8 --op alltoallv -b 1K -e 1K >"$work/v.txt" 2>&1; then fail "alltoallv simulated"; fi
grep -q "sendrecv and alltoallv are not simulated" "$work/v.txt" || { cat "$work/v.txt"; fail "no reason given"; }
echo "simulate ok"
