# train_sync.sh: local SGD and DiLoCo on 4 data-parallel ranks. With plain SGD, local SGD that
# averages the parameters after every step, and DiLoCo with one inner step, an outer learning rate
# of 1 and no outer momentum, are data parallelism by another road: their losses must equal
# every-step data parallelism's within 1e-5 for 20 steps (the logged gradient norm is each rank's
# own gradient's under local steps, so it differs by design). With AdamW and H = 5,
# both must train (a falling loss), send about a fifth of every-step's bytes (one average of the
# parameters per 5 steps against a gradient average per step), and DiLoCo's outer momentum must
# make it differ from local SGD; DiLoCo's delta compressed by bf16 must send about half its bytes.
# Local steps are refused with ZeRO and with checkpoints between syncs, by name.
source "$(dirname "$0")/lib.sh"
job="$source_dir/tests/data/jobs/parity.toml"
run() { train_run "$job" "$1" --ranks 4 --set batch.micro=2 "${@:2}"; }  # name, then options
sgd=(--set 'optimizer.name="sgd"' --set optimizer.momentum=0 --set optimizer.lr=0.2 --set optimizer.min_lr=0.02
  --set optimizer.weight_decay=0 --set optimizer.clip=0)
run sgd_every "${sgd[@]}"
run sgd_local1 "${sgd[@]}" --set 'parallel.sync="local:1"'
run sgd_diloco1 "${sgd[@]}" --set 'parallel.sync="diloco:1"' --set parallel.outer_lr=1 --set parallel.outer_momentum=0
run every
run local5 --set 'parallel.sync="local:5"'
run diloco5 --set 'parallel.sync="diloco:5"'
run diloco5_bf16 --set 'parallel.sync="diloco:5"' --compress bf16
# Checkpoints where the ranks agree (every 10 steps of H = 5): a run killed while saving step 20
# resumes from step 10 with each rank's own AdamW state (and DiLoCo's outer momentum and step
# count) and repeats the uninterrupted run's steps 11..20 bit for bit; a checkpoint between syncs,
# and resuming under another rank count, are refused.
ckpt=(--set run.checkpoint_every=10 --set data.dir="\"$work/data\"")
for mode in local diloco; do
  run "${mode}_whole" --set "parallel.sync=\"$mode:5\"" --set run.checkpoint_every=10
  if CHORUS_TRAIN_CRASH_IN_SAVE=20 chorus_train "$job" --out "$work/${mode}_cut" "${ckpt[@]}" --ranks 4 \
    --set batch.micro=2 --set "parallel.sync=\"$mode:5\"" >"$work/${mode}_cut.log" 2>&1; then
    fail "the $mode:5 run meant to die while saving step 20 exited 0"
  fi
  chorus_train "$job" --out "$work/${mode}_cut" "${ckpt[@]}" --ranks 4 --set batch.micro=2 \
    --set "parallel.sync=\"$mode:5\"" --resume \
    >"$work/${mode}_resume.log" 2>&1 || { cat "$work/${mode}_resume.log"; fail "$mode:5 resume"; }
  grep -q "resumed from .* at step 10" "$work/${mode}_resume.log" || fail "$mode:5 did not resume at step 10"
done
if chorus_train "$job" --out "$work/local_cut" "${ckpt[@]}" --ranks 2 --set batch.micro=4 \
  --set 'parallel.sync="local:5"' --resume >"$work/reranked.log" 2>&1; then
  fail "a local:5 checkpoint of 4 ranks resumed on 2"
fi
grep -q "each of 4 data-parallel ranks' own optimizer state" "$work/reranked.log" ||
  { cat "$work/reranked.log"; fail "no reason given for the other rank count"; }
tail -n 2 "$work/reranked.log" | head -n 1
for refused in "--zero 1" "--set run.checkpoint_every=3"; do
  # shellcheck disable=SC2086
  if chorus_train "$job" --out "$work/refused" --set data.dir="\"$work/data\"" --ranks 4 \
    --set batch.micro=2 --set 'parallel.sync="local:5"' $refused >"$work/refused.log" 2>&1; then
    fail "local:5 with $refused was accepted"
  fi
  grep -q '\[parallel\] sync = "local:5" with' "$work/refused.log" || { cat "$work/refused.log"; fail "no reason given"; }
  head -n 1 "$work/refused.log"
done
grep -q "sync .* ms/step" "$work/local5.log" || { cat "$work/local5.log"; fail "no sync cost on the progress line"; }
/usr/bin/python3 - "$work" "$build" "$(dirname "$0")" <<'PY'
import csv, sys
work, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import planned_bytes
def column(name, key):
    return [float(r[key]) if r[key] else 0.0 for r in csv.DictReader(open(f"{work}/{name}/metrics.csv"))]
bad = []
for name in ["sgd_local1", "sgd_diloco1"]:
    worst = max(abs(a - b) / abs(b) for a, b in zip(column(name, "loss"), column("sgd_every", "loss")))
    print(f"{name}: 20 steps against every-step data parallelism: loss within {worst:.2e}")
    if len(column(name, "loss")) != 20 or worst > 1e-5:
        bad.append(name)
every = sum(column("every", "dp_bytes"))
for name in ["local5", "diloco5"]:
    loss, sent = column(name, "loss"), sum(column(name, "dp_bytes"))
    syncs = sum(1 for x in column(name, "sync_ms") if x > 0)
    print(f"{name}: loss {loss[0]:.4f} -> {loss[-1]:.4f}; {syncs} syncs; data-parallel bytes {sent:.0f} "
          f"({sent / every:.3f} of every-step's {every:.0f})")
    if not loss[-1] < loss[0] - 0.5 or syncs != 4 or not 0.15 < sent / every < 0.25:
        bad.append(name)
# DiLoCo's delta compressed by bf16: half the bytes of the plain delta, and still training.
half, plain = sum(column("diloco5_bf16", "dp_bytes")), sum(column("diloco5", "dp_bytes"))
loss = column("diloco5_bf16", "loss")
print(f"diloco5 with a bf16 delta: loss {loss[0]:.4f} -> {loss[-1]:.4f}; bytes {half / plain:.3f} of the fp32 delta's")
if not 0.45 < half / plain < 0.6 or not loss[-1] < loss[0] - 0.5:
    bad.append("diloco5_bf16")
for mode in ["local", "diloco"]:
    whole = [(r["loss"], r["grad_norm"]) for r in csv.DictReader(open(f"{work}/{mode}_whole/metrics.csv"))]
    cut = [(r["loss"], r["grad_norm"]) for r in csv.DictReader(open(f"{work}/{mode}_cut/metrics.csv"))]
    print(f"{mode}:5 resumed at step 10: steps 11..20 {'equal' if whole == cut else 'DIFFERENT'} to the "
          f"uninterrupted run's")
    if whole != cut or len(cut) != 20:
        bad.append(f"{mode}:5 resumed differs from the uninterrupted run")
if column("diloco5", "loss")[6:] == column("local5", "loss")[6:]:
    bad.append("DiLoCo's outer momentum changed nothing")
# The planner's bytes per rank: DiLoCo's three more copies of the parameters in the optimizer state.
planned_bytes.check(work, build, ["every", "local5", "diloco5"], bad)
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("train_sync: local SGD and DiLoCo at H = 1 are data parallelism; at H = 5 they train on a fifth of the bytes")
PY
