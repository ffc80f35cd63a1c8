#!/usr/bin/env bash
# --compare gloo,mpi times Gloo and MPI on the same calls and checks their results as chorus's;
# --bound prints each row's share of the copy-bandwidth bound. The JSON's numbers agree with the
# formulas docs/collbench.md states.
source "$(dirname "$0")/lib.sh"
run_clean "$collbench" -g 2 --op allreduce -b 1K -e 256K -f 16 -n 3 -w 1 --compare gloo,mpi --bound \
  --json "$work/allreduce.json"
grep -q "x gloo" "$work/out.txt" || fail "no x gloo column"
grep -q "%bound" "$work/out.txt" || fail "no %bound column"
# Gloo's halving-doubling reduce-scatter at a rank count that is not a power of two; chorus and
# the peers timed in turns.
run_clean "$collbench" -g 3 --op reducescatter -b 3K -e 48K -f 16 -n 3 -w 1 -d int32 -o max --compare gloo,mpi \
  --turns 3 --json "$work/reducescatter.json"
# The all-to-all and the all-to-allv of Zipf counts (--zipf 1.2) in one run, beside Gloo and MPI.
run_clean "$collbench" -g 3 --op alltoall,alltoallv --zipf 1.2 -b 3K -e 48K -f 16 -n 3 -w 1 --compare gloo,mpi \
  --json "$work/alltoallv.json"
[ "$(grep -c "Out of bounds values : 0 OK" "$work/out.txt")" = 2 ] || fail "not one footer per op"
run_clean "$collbench" -g 4 --op alltoallv --zipf 0 -b 64 -e 64K -f 32 -n 2 -w 1 -d int8 --json "$work/even.json"
# bfloat16: Gloo has no such type, so its columns say N/A and the run still passes.
run_clean "$collbench" -g 2 --op alltoall -b 1K -e 1K -n 2 -w 1 -d bfloat16 --compare gloo --json "$work/bf16.json"
grep -q "N/A" "$work/out.txt" || fail "no N/A for gloo bfloat16"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
doc = json.load(open(work + "/allreduce.json"))
assert doc["peers"] == ["gloo", "mpi"], doc["peers"]
copy = doc["copy_GBps"]
assert copy > 0, copy
assert [r["size_bytes"] for r in doc["rows"]] == [1024, 16384, 262144]
for r in doc["rows"]:
    ours = r["out_of_place"]
    # The share of the bound: algbw * copies / copy bandwidth, copies = n = 2 for an all-reduce.
    assert abs(r["bound_pct"] - 100 * ours["algbw_GBps"] * 2 / copy) < 1e-6 * r["bound_pct"], r
    for name in ("gloo", "mpi"):
        peer = r["peers"][name]
        assert peer["wrong"] == 0 and peer["time_us"] > 0 and peer["busbw_GBps"] > 0, (name, r)
        assert abs(peer["chorus_over_peer"] - peer["time_us"] / ours["time_us"]) < 1e-9 * peer["chorus_over_peer"]
    # Every Gloo all-reduce algorithm was timed, and the fastest reported.
    algos = r["peers"]["gloo"]["algorithms_busbw_GBps"]
    assert sorted(algos) == ["bcube", "halving_doubling", "ring"], algos
    assert r["peers"]["gloo"]["busbw_GBps"] == max(algos.values()), algos
doc = json.load(open(work + "/reducescatter.json"))
assert doc["nranks"] == 3 and len(doc["rows"]) == 2 and doc["turns"] == 3
for r in doc["rows"]:
    assert r["out_of_place"]["wrong"] == 0 and r["in_place"]["wrong"] == 0
    # Three turns each, one call per turn: the row's time is the mean of its turns.
    for side in (r["out_of_place"], r["peers"]["gloo"], r["peers"]["mpi"]):
        turns = side["turn_time_us"]
        assert len(turns) == 3 and abs(sum(turns) / 3 - side["time_us"]) < 1e-6 * side["time_us"], (side, r)
    for name in ("gloo", "mpi"):
        assert r["peers"][name]["wrong"] == 0 and r["peers"][name]["algo"], (name, r)
# alltoall then alltoallv rows, each size; the counts are the closed form: floor(n count w_p) with
# w_p = (p + 1)^-1.2 / sum, the rest one each to the first peers; busbw = size / time (n-1)/n.
doc = json.load(open(work + "/alltoallv.json"))
assert doc["op"] == "alltoall,alltoallv" and doc["peers"] == ["gloo", "mpi"], doc["op"]
assert [r["op"] for r in doc["rows"]] == ["alltoall"] * 2 + ["alltoallv"] * 2, [r["op"] for r in doc["rows"]]
def zipf(count, n, s):
    w = [(p + 1) ** -s for p in range(n)]
    counts = [int(count * n * x / sum(w)) for x in w]
    for p in range(count * n - sum(counts)):
        counts[p % n] += 1
    return counts
for r in doc["rows"]:
    ours = r["out_of_place"]
    assert ours["wrong"] == 0 and r["size_bytes"] == r["count"] * 3 * 4, r
    assert abs(ours["busbw_GBps"] - r["size_bytes"] / 1e3 / ours["time_us"] * 2 / 3) < 1e-6 * ours["busbw_GBps"], r
    for name in ("gloo", "mpi"):
        assert r["peers"][name]["wrong"] == 0 and r["peers"][name]["busbw_GBps"] > 0, (name, r)
    if r["op"] == "alltoallv":
        assert r["zipf"] == 1.2 and r["send_counts"] == zipf(r["count"], 3, 1.2), r
        assert r["send_counts"][0] > r["send_counts"][1] > r["send_counts"][2], r
for r in json.load(open(work + "/even.json"))["rows"]:
    assert r["send_counts"] == [r["count"]] * 4, r
doc = json.load(open(work + "/bf16.json"))
assert doc["rows"][0]["peers"] == {}, doc["rows"][0]
print("compare ok")
PY
# An unknown peer is refused by name.
if "$collbench" -g 2 --compare nccl >"$work/bad.txt" 2>&1; then fail "--compare nccl accepted"; fi
grep -q "unknown peer" "$work/bad.txt" || { cat "$work/bad.txt"; fail "no 'unknown peer' message"; }
echo "collbench --compare ok"
