#!/usr/bin/env bash
# tools/plot busbw: a collbench --json run with two algorithms (and Gloo beside, where built) and
# a torch_allreduce.py run become one PNG of bus bandwidth against size, one line each; bad input
# is refused by name.
source "$(dirname "$0")/lib.sh"
plot="$source_dir/tools/plot"
run_clean "$collbench" -g 2 --op allreduce --algo ring,recursive_doubling -b 1K -e 1M -f 32 -n 3 -w 1 \
  --json "$work/collbench.json"
cat >"$work/torch.json" <<'JSON'
[{"size_bytes": 4096, "nranks": 2, "chorus": {"busbw_GBps": 0.16}, "gloo": {"busbw_GBps": 0.01}, "gloo_over_chorus": 16},
 {"size_bytes": 65536, "nranks": 2, "chorus": {"busbw_GBps": 3.7}, "gloo": {"busbw_GBps": 0.08}, "gloo_over_chorus": 45}]
JSON
/usr/bin/python3 "$plot" busbw "$work/collbench.json" "$work/torch.json" -o "$work/busbw.png" | tee "$work/plot.txt"
grep -q "4 lines (chorus ring (allreduce, 2 ranks); chorus recursive_doubling (allreduce, 2 ranks); torch chorus (2 processes); torch gloo (2 processes))" "$work/plot.txt" ||
  fail "plot drew other lines than the runs hold"
/usr/bin/python3 - "$work/busbw.png" <<'PY'
import sys
import matplotlib.image as image
png = image.imread(sys.argv[1])
assert png.shape[0] > 300 and png.shape[1] > 600, png.shape
assert png[..., :3].std() > 0.05, "a blank image"
PY
echo '{"tool": "other"}' >"$work/bad.json"
if /usr/bin/python3 "$plot" busbw "$work/bad.json" -o "$work/bad.png" 2>"$work/err.txt"; then fail "bad input accepted"; fi
grep -q "neither collbench --json output" "$work/err.txt" || fail "no message naming the bad file"
echo "plot ok"
