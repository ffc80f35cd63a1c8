#!/usr/bin/env bash
# Every collbench op over every type and reduction, 4 local ranks (shm), results checked.
source "$(dirname "$0")/lib.sh"
for op in allreduce allgather reducescatter broadcast reduce sendrecv; do
  run_clean "$collbench" -g 4 --op "$op" -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all -r 3
done
for op in alltoall alltoallv gather scatter barrier; do
  run_clean "$collbench" -g 3 --op "$op" -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -r 2
done
# All-to-all(v) also made of grouped sends and receives (as NCCL users write it): a row each, checked.
run_clean "$collbench" -g 3 --op alltoall,alltoallv --grouped -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all | tee "$work/grouped.txt"
[ "$(grep -cE '^ +[0-9].* grouped ' "$work/grouped.txt")" = "$(grep -cE '^ +[0-9].* default ' "$work/grouped.txt")" ] ||
  fail "--grouped did not give a grouped row beside each default row"
grep -qE '^ +[0-9].* grouped ' "$work/grouped.txt" || fail "no grouped rows"
# Every algorithm of a collective, side by side, with the check.
for op in allreduce allgather reducescatter broadcast reduce alltoall; do
  run_clean "$collbench" -g 3 --op "$op" -b 8 -e 1M -f 128 -n 2 -w 1 -c 1 --algo all | tee "$work/algo.txt"
  # Three sizes (8 B, 1 KiB, 128 KiB... capped at 1 MiB) times the number of distinct algorithms.
  sizes=$(grep -E '^ +[0-9]' "$work/algo.txt" | awk '{print $1}' | sort -u | wc -l)
  algos=$(grep -E '^ +[0-9]' "$work/algo.txt" | awk '{print $6}' | sort -u | wc -l)
  rows=$(grep -cE '^ +[0-9]' "$work/algo.txt")
  [ "$algos" -ge 2 ] || fail "--algo all ran $algos algorithm(s) for $op"
  [ "$rows" = $((sizes * algos)) ] || fail "--algo all printed $rows rows for $sizes sizes x $algos algorithms"
done
# Timed in turns: the same rows, every result still checked, the turns recorded.
run_clean "$collbench" -g 3 --op allreduce -b 1K -e 64K -f 64 -n 6 -w 1 -c 1 --algo all --turns 3 \
  --json "$work/turns.json" | tee "$work/turns.txt"
python3 - "$work/turns.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
algos = {r["algo"] for r in rows}
assert len(algos) >= 4 and len(rows) == 2 * len(algos), (algos, len(rows))
assert all(r["out_of_place"]["time_us"] > 0 and r["in_place"]["time_us"] > 0 for r in rows), rows
assert all(r["out_of_place"]["wrong"] == 0 and r["in_place"]["wrong"] == 0 for r in rows), rows
# Each turn's time per call (2 of the 6 calls each): their mean is the row's time.
for r in rows:
    for side in ("out_of_place", "in_place"):
        turns = r[side]["turn_time_us"]
        assert len(turns) == 3 and min(turns) > 0, r
        assert abs(sum(turns) / 3 - r[side]["time_us"]) <= 1e-6 * r[side]["time_us"], r
print("turns ok:", sorted(algos))
PY
grep -q '"turns": 3' "$work/turns.json" || fail "--turns not recorded in the JSON"
if "$collbench" -g 2 --op allgather --algo tree >/dev/null 2>&1; then fail "an inapplicable --algo was accepted"; fi
