# train_checkpoint.sh: checkpoints are atomic and resume exactly. A run of 20 steps checkpoints
# every 5; a second run is killed (SIGKILL) halfway through writing step 15's checkpoint: the
# step-10 checkpoint must survive whole, and resuming from it must give steps 11..20 the very
# losses of the uninterrupted run. Resuming the same checkpoint under another layout (2 ranks,
# ZeRO-3, the same global batch) must give them within 1e-5.
source "$(dirname "$0")/lib.sh"
train="$build/chorus-train"
job="$source_dir/tests/data/jobs/parity.toml"
common=(--set data.dir="\"$work/data\"" --set run.checkpoint_every=5 --ranks 4 --set batch.micro=2)
"$train" "$job" --out "$work/whole" "${common[@]}" >"$work/whole.log" 2>&1 || { cat "$work/whole.log"; fail "whole run"; }

if CHORUS_TRAIN_CRASH_IN_SAVE=15 "$train" "$job" --out "$work/cut" "${common[@]}" >"$work/cut.log" 2>&1; then
  cat "$work/cut.log"
  fail "the run meant to die while saving step 15 exited 0"
fi
grep -q "rank 0 .*exited with status 137" "$work/cut.log" || { cat "$work/cut.log"; fail "rank 0 was not killed"; }
[ -f "$work/cut/checkpoint.bin.tmp" ] || fail "no half-written checkpoint.bin.tmp beside the checkpoint"
cp -r "$work/cut" "$work/cut2"

"$train" "$job" --out "$work/cut" "${common[@]}" --resume >"$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "resume"; }
grep -q "resumed from .* at step 10" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume at step 10"; }
"$train" "$job" --out "$work/cut2" --set data.dir="\"$work/data\"" --ranks 2 --zero 3 --set batch.micro=4 --resume \
  >"$work/reshard.log" 2>&1 || { cat "$work/reshard.log"; fail "resume on 2 ranks, ZeRO-3"; }

/usr/bin/python3 - "$work" <<'PY'
import csv, sys
work = sys.argv[1]
def losses(name):
    return {int(r["step"]): r["loss"] for r in csv.DictReader(open(f"{work}/{name}/metrics.csv"))}
whole, cut, other = losses("whole"), losses("cut"), losses("cut2")
if sorted(cut) != list(range(1, 21)):
    sys.exit(f"FAIL: the resumed run's metrics hold steps {sorted(cut)}")
for step in range(11, 21):
    print(f"step {step}: uninterrupted {whole[step]} resumed {cut[step]} resumed on 2 ranks ZeRO-3 {other[step]}")
    if whole[step] != cut[step]:
        sys.exit(f"FAIL: step {step} loss {cut[step]} after resuming, {whole[step]} uninterrupted")
    if abs(float(other[step]) - float(whole[step])) > 1e-5 * float(whole[step]):
        sys.exit(f"FAIL: step {step} loss {other[step]} resumed under another layout, {whole[step]} uninterrupted")
print("train_checkpoint: the checkpoint survived the crash and resuming repeats the uninterrupted losses")
PY
