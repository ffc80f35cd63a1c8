#!/usr/bin/env bash
# --json writes every row with its numbers; the file parses and agrees with the run.
source "$(dirname "$0")/lib.sh"
run_clean "$collbench" -g 2 --op allreduce -b 8 -e 8K -f 4 -n 2 -w 0 -c 1 -d float -o all --json "$work/rows.json"
python3 - "$work/rows.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
assert doc["nranks"] == 2 and doc["op"] == "allreduce", doc
assert len(rows) == 6 * 5, len(rows)  # 8 B .. 8 KiB by 4 = 6 sizes, 5 reductions
sizes = sorted({r["size_bytes"] for r in rows})
assert sizes == [8, 32, 128, 512, 2048, 8192], sizes
for r in rows:
    for side in ("out_of_place", "in_place"):
        assert r[side]["wrong"] == 0, r
        assert r[side]["time_us"] > 0, r
        assert abs(r[side]["busbw_GBps"] - r[side]["algbw_GBps"]) < 1e-12, r  # factor 2(n-1)/n = 1 for n = 2
assert doc["wrong_total"] == 0
print("json ok:", len(rows), "rows")
PY
