# train_offload.sh: the optimizer state offloaded to a file. On 2 data-parallel ranks, ZeRO-1 with
# the state streamed through io_uring, and ZeRO-3 with the parameter shard in the file too (on
# threads), must give the losses, gradient norms and final checkpoint (parameters, m and v) of
# the same runs in memory, bit for bit; so must the step during backward ([optimizer] in_backward)
# for ZeRO 0 to 3, in memory and in the file, against the step after backward. On one rank of a wider model (25 MB of AdamW state against
# a 2 MB window) the process's peak resident memory must fall by most of the state, the reported
# optimizer memory stay within the window and the file hold the state. A window too small, and
# parameters in the file without ZeRO-3, are refused by name. The step times are printed beside
# each other (measured, not asserted). The planner (chorus-plan) must predict each rank's bytes.
source "$(dirname "$0")/lib.sh"
job="$source_dir/tests/data/jobs/parity.toml"
run() { train_run "$job" "$1" --set run.checkpoint_every=20 "${@:2}"; }  # name, then options
file=(--offload file --set offload.window_mb=0.05)
run zero1 --ranks 2 --zero 1 --set batch.micro=4
run zero1_file --ranks 2 --zero 1 --set batch.micro=4 "${file[@]}" --set 'offload.io="io_uring"'
run zero3 --ranks 2 --zero 3 --set batch.micro=4
run zero3_file --ranks 2 --zero 3 --set batch.micro=4 "${file[@]}" --set 'offload.params="file"' \
  --set 'offload.io="threads"'
grep -q "optimizer state offloaded to file .*io_uring" "$work/zero1_file.log" || fail "zero1_file: no io_uring banner"
grep -q "optimizer state and parameters offloaded to file .*threads" "$work/zero3_file.log" ||
  fail "zero3_file: no banner naming the parameters and threads"
# The optimizer step during backward ([optimizer] in_backward, no clipping): bucket by bucket as the
# reductions complete, through the state in memory and in the file, the very bits of the step after
# backward, for ZeRO 0 to 3. Backward pauses 5 ms after each unit (CHORUS_TRAIN_BACKWARD_DELAY_MS,
# slow compute): on this small model a busy machine's scheduler may otherwise let backward end
# before a bucket's reduction and step begin, on every step (2 of 80 steps of ZeRO-0 began during
# backward when measured beside three other training tests).
noclip=(--ranks 2 --set batch.micro=4 --set optimizer.clip=0)
ib=(--set optimizer.in_backward=true)
for zero in 0 1 2 3; do run "z${zero}" "${noclip[@]}" --zero $zero; done
CHORUS_TRAIN_BACKWARD_DELAY_MS=5 run z0_ib "${noclip[@]}" --zero 0 "${ib[@]}"
CHORUS_TRAIN_BACKWARD_DELAY_MS=5 run z1_ib_file "${noclip[@]}" --zero 1 "${ib[@]}" "${file[@]}" --set 'offload.io="io_uring"'
CHORUS_TRAIN_BACKWARD_DELAY_MS=5 run z2_ib "${noclip[@]}" --zero 2 "${ib[@]}"
CHORUS_TRAIN_BACKWARD_DELAY_MS=5 run z3_ib_file "${noclip[@]}" --zero 3 "${ib[@]}" "${file[@]}" --set 'offload.io="threads"'
wide=(--ranks 1 --set model.width=256 --set model.layers=4 --set batch.micro=2 --set run.steps=3)
run wide "${wide[@]}"
run wide_file "${wide[@]}" --offload file --set offload.window_mb=2
refused() {  # the reason expected, then options
  local reason=$1
  shift
  if chorus_train "$job" --out "$work/refused" --set data.dir="\"$work/data\"" --ranks 2 --offload file \
    "$@" >"$work/refused.log" 2>&1; then
    fail "offload with $* was accepted"
  fi
  grep -q "$reason" "$work/refused.log" || { cat "$work/refused.log"; fail "no reason given for $*"; }
  tail -n 1 "$work/refused.log"
}
refused "zero = 3" --zero 1 --set 'offload.params="file"'
refused "window of" --set offload.window_mb=0.001
/usr/bin/python3 - "$work" "$build" "$(dirname "$0")" <<'PY'
import csv, json, statistics, sys
work, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import planned_bytes
bad = []
def rows(name):
    return list(csv.DictReader(open(f"{work}/{name}/metrics.csv")))
def metrics(name):
    return json.load(open(f"{work}/{name}/metrics.json"))
for ref, name in [("zero1", "zero1_file"), ("zero3", "zero3_file"), ("z0", "z0_ib"), ("z1", "z1_ib_file"),
                  ("z2", "z2_ib"), ("z3", "z3_ib_file")]:
    a, b = rows(ref), rows(name)
    same = [(x["loss"], x["grad_norm"]) for x in a] == [(x["loss"], x["grad_norm"]) for x in b] and len(a) == 20
    ckpt = open(f"{work}/{ref}/checkpoint.bin", "rb").read() == open(f"{work}/{name}/checkpoint.bin", "rb").read()
    t_ref = statistics.median(float(x["seconds"]) for x in a[2:])
    t_file = statistics.median(float(x["seconds"]) for x in b[2:])
    print(f"{name}: 20 steps' losses and norms {'equal' if same else 'DIFFERENT'}, checkpoint "
          f"{'identical' if ckpt else 'DIFFERENT'} to {ref}'s; median step {1e3 * t_file:.1f} ms against "
          f"{1e3 * t_ref:.1f} ms ({t_file / t_ref:.2f}x{', backward paused by the test hook' if '_ib' in name else ''})")
    if not same or not ckpt:
        bad.append(f"{name} differs from {ref}")
    if "file" not in name:
        continue
    for r, mem in enumerate(metrics(name)["memory_per_rank"]):
        window = metrics(name)["offload"]["window_bytes"]
        if not mem["optimizer_bytes"] <= window or mem["offloaded_bytes"] == 0:
            bad.append(f"{name} rank {r}: optimizer {mem['optimizer_bytes']} bytes in memory (window {window}), "
                       f"{mem['offloaded_bytes']} in the file")
# Every bucket of every step was stepped on the step thread; some began while backward still ran
# (the first buckets' reductions complete while backward computes the earlier layers).
for name in ["z0_ib", "z1_ib_file", "z2_ib", "z3_ib_file"]:
    j = metrics(name)
    counts = [(c["steps_begun_during_backward"], c["bucket_steps"]) for c in j["reductions_per_rank"]]
    print(f"{name}: {j['buckets']['count']} buckets x 20 steps; bucket steps begun during backward / all, per "
          f"rank: {counts}")
    if any(n != 20 * j["buckets"]["count"] for _, n in counts) or sum(b for b, _ in counts) == 0:
        bad.append(f"{name}: bucket steps {counts}")
if any(c["bucket_steps"] for c in metrics("z0")["reductions_per_rank"]):
    bad.append("z0: bucket steps counted without in_backward")
m, f = metrics("wide"), metrics("wide_file")
state = 8 * m["model"]["parameters"]  # AdamW's m and v
window = f["offload"]["window_bytes"]
rss, rss_file = m["memory_per_rank"][0]["resident_peak_bytes"], f["memory_per_rank"][0]["resident_peak_bytes"]
mem = f["memory_per_rank"][0]
print(f"wide: {m['model']['parameters']} parameters, {state} bytes of AdamW state, window {window}: peak resident "
      f"{rss} bytes in memory, {rss_file} offloaded ({rss - rss_file} fewer); optimizer {mem['optimizer_bytes']} "
      f"bytes in memory, {mem['offloaded_bytes']} in the file")
if not rss - rss_file >= 0.6 * (state - window):
    bad.append(f"wide: peak resident fell by {rss - rss_file} bytes, not most of {state - window}")
if not mem["optimizer_bytes"] <= window or not mem["offloaded_bytes"] >= state:
    bad.append(f"wide: optimizer memory {mem['optimizer_bytes']} (window {window}), file {mem['offloaded_bytes']}")
if [x["loss"] for x in rows("wide")] != [x["loss"] for x in rows("wide_file")]:
    bad.append("wide: the offloaded run's losses differ")
# The planner's bytes per rank with the state offloaded: the window's share where the runtime counts it.
planned_bytes.check(work, build, ["zero1_file", "zero3_file", "wide_file"], bad)
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("train_offload: the state in a file gives the bits of the state in memory, in a window's memory")
PY
