# train_checkpoint.sh: checkpoints are atomic and resume exactly. A run of 20 steps checkpoints
# every 5; a second run is killed (SIGKILL) halfway through writing step 15's checkpoint: the
# step-10 checkpoint must survive whole, and resuming from it must give steps 11..20 the very
# losses of the uninterrupted run. Resuming the same checkpoint under other layouts (2 ranks
# ZeRO-3; dp2 x tp2; tp4; pp2 x dp2: the same global batch) must give them within 1e-5, and so must a
# checkpoint written by a tp2 x dp2 run, resumed on 4 data-parallel ranks and as pp2 x dp2, and one
# written by pp2 x tp2 resumed on 4 data-parallel ranks; the dp4 checkpoint resumes as cp2 x dp2, and
# one written by tp2 x cp2 as dp4: checkpoints hold the whole model, whatever layout wrote them.
# Resumed on 2 ranks ZeRO-3 with the optimizer state and parameters offloaded to a file, the losses
# must be those of the same resumption in memory, bit for bit.
source "$(dirname "$0")/lib.sh"
job="$source_dir/tests/data/jobs/parity.toml"
common=(--set data.dir="\"$work/data\"" --set run.checkpoint_every=5 --ranks 4 --set batch.micro=2)
chorus_train "$job" --out "$work/whole" "${common[@]}" >"$work/whole.log" 2>&1 || { cat "$work/whole.log"; fail "whole run"; }

if CHORUS_TRAIN_CRASH_IN_SAVE=15 chorus_train "$job" --out "$work/cut" "${common[@]}" >"$work/cut.log" 2>&1; then
  cat "$work/cut.log"
  fail "the run meant to die while saving step 15 exited 0"
fi
grep -q "rank 0 .*exited with status 137" "$work/cut.log" || { cat "$work/cut.log"; fail "rank 0 was not killed"; }
[ -f "$work/cut/checkpoint.bin.tmp" ] || fail "no half-written checkpoint.bin.tmp beside the checkpoint"
cp -r "$work/cut" "$work/cut2"

chorus_train "$job" --out "$work/cut" "${common[@]}" --resume >"$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "resume"; }
grep -q "resumed from .* at step 10" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume at step 10"; }
chorus_train "$job" --out "$work/cut2" --set data.dir="\"$work/data\"" --ranks 2 --zero 3 --set batch.micro=4 --resume \
  >"$work/reshard.log" 2>&1 || { cat "$work/reshard.log"; fail "resume on 2 ranks, ZeRO-3"; }

resume_as() {  # name, copy of the cut run to resume, then options
  local name=$1 from=$2
  shift 2
  cp -r "$work/$from" "$work/$name"
  chorus_train "$job" --out "$work/$name" --set data.dir="\"$work/data\"" --resume "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "resume as $name"; }
  grep -q "resumed from .* at step 10" "$work/$name.log" || { cat "$work/$name.log"; fail "$name did not resume at step 10"; }
}
resume_as dp2tp2 cut2 --ranks 4 --tp 2 --set batch.micro=4 --zero 1
resume_as tp4 cut2 --ranks 4 --tp 4 --set batch.micro=8
# Into a file: ZeRO-3 with the optimizer state and the parameter shard offloaded.
resume_as offload cut2 --ranks 2 --zero 3 --set batch.micro=4 --offload file --set 'offload.params="file"' \
  --set offload.window_mb=0.05
# Written by tp2 x dp2, resumed as dp4.
tp_layout=(--ranks 4 --tp 2 --set batch.micro=4 --set run.checkpoint_every=5 --set data.dir="\"$work/data\"")
if CHORUS_TRAIN_CRASH_IN_SAVE=15 chorus_train "$job" --out "$work/tpcut" "${tp_layout[@]}" >"$work/tpcut.log" 2>&1; then
  fail "the tp2 x dp2 run meant to die while saving step 15 exited 0"
fi
resume_as from_tp tpcut --ranks 4 --set batch.micro=2
# Pipeline stages: the dp4 checkpoint and the tp2 x dp2 one resumed as pp2 x dp2 (two micro-batches
# through the pipeline), and one written by pp2 x tp2 resumed as dp4.
resume_as pp2 cut2 --ranks 4 --pp 2 --zero 1 --set batch.micro=2 --set batch.accumulate=2
resume_as tp_to_pp tpcut --ranks 4 --pp 2 --set batch.micro=2 --set batch.accumulate=2
pp_layout=(--ranks 4 --tp 2 --pp 2 --set batch.micro=4 --set batch.accumulate=2 --set run.checkpoint_every=5
  --set data.dir="\"$work/data\"")
if CHORUS_TRAIN_CRASH_IN_SAVE=15 chorus_train "$job" --out "$work/ppcut" "${pp_layout[@]}" >"$work/ppcut.log" 2>&1; then
  fail "the pp2 x tp2 run meant to die while saving step 15 exited 0"
fi
resume_as from_pp ppcut --ranks 4 --set batch.micro=2
# Context parallel: the dp4 checkpoint resumed as cp2 x dp2, and one written by tp2 x cp2 as dp4.
resume_as cp2 cut2 --ranks 4 --cp 2 --zero 1 --set batch.micro=4
cp_layout=(--ranks 4 --tp 2 --cp 2 --set batch.micro=8 --set run.checkpoint_every=5 --set data.dir="\"$work/data\"")
if CHORUS_TRAIN_CRASH_IN_SAVE=15 chorus_train "$job" --out "$work/cpcut" "${cp_layout[@]}" >"$work/cpcut.log" 2>&1; then
  fail "the tp2 x cp2 run meant to die while saving step 15 exited 0"
fi
resume_as from_cp cpcut --ranks 4 --set batch.micro=2

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
    if losses("offload")[step] != other[step]:  # the same layout as cut2's resumption, the state in a file
        sys.exit(f"FAIL: step {step} loss {losses('offload')[step]} resumed into a file, {other[step]} in memory")
    for name in ["dp2tp2", "tp4", "from_tp", "pp2", "tp_to_pp", "from_pp", "cp2", "from_cp"]:
        got = losses(name)[step]
        if abs(float(got) - float(whole[step])) > 1e-5 * float(whole[step]):
            sys.exit(f"FAIL: step {step} loss {got} resumed as {name}, {whole[step]} uninterrupted")
print("resharded: resumed as dp2 x tp2, as tp4, as pp2 x dp2; a tp2 x dp2 checkpoint as dp4 and as pp2 x dp2; "
      "a pp2 x tp2 checkpoint as dp4; the dp4 one as cp2 x dp2, a tp2 x cp2 one as dp4; all within 1e-5")
print("train_checkpoint: the checkpoint survived the crash and resuming repeats the uninterrupted losses")
PY
