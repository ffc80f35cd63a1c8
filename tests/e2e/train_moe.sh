# train_moe.sh: a GPT whose blocks' MLPs are mixtures of 4 SwiGLU experts (top-2, aux and z
# losses, no capacity so no token drops) trained by chorus-train under data parallelism (ZeRO 0, 1
# and 3), tensor parallelism (with and without sequence parallelism), pipeline parallelism and
# context parallelism computes what one rank computes: the same global batch of 8 sequences, cut
# into micro-batches of 2 on every layout (the aux loss is a mean over each micro-batch, so the one
# rank accumulates 4 of them), gives the loss of each of 20 steps within 1e-5 relative. Context
# parallelism holds a part of each sequence on each rank, whose aux loss is not the whole's: its
# runs leave the aux loss out. The progress line shows the aux loss, the experts' balance and the
# dropped share; metrics.csv and metrics.json carry them; with a capacity of 1.0 tokens drop.
# Expert parallelism (carved from the data-parallel ranks) gives the same losses alone (ep 2, 4)
# and with dp, ZeRO 1-3, tp with sequence parallelism, pp and cp; a checkpoint written at ep 2
# resumes exactly at ep 2 and within 1e-5 at ep 4 with ZeRO-3 and on one rank. Each run's gradient
# norms match one rank's within 1e-5 as well. Dispatched in
# chunks (their exchanges overlapping the experts), the losses stay those of one rank, and
# metrics.json's profile of the MoE layers says how many chunks overlapped.
source "$(dirname "$0")/lib.sh"
job="$source_dir/tests/data/jobs/parity.toml"
moe=(--set model.experts=4 --set model.top_k=2 --set model.expert_hidden=96 --set model.swiglu=true
  --set model.aux_loss=0.01 --set model.z_loss=0.001 --set batch.micro=2)
run() { train_run "$job" "$1" "${moe[@]}" "${@:2}"; }  # name, then options
run one --ranks 1 --set batch.accumulate=4
run dp2 --ranks 2 --set batch.accumulate=2
run dp4 --ranks 4
run zero1 --ranks 4 --zero 1
run zero3 --ranks 4 --zero 3
run tp2 --ranks 2 --tp 2 --set batch.accumulate=4
run tp2_sp --ranks 2 --tp 2 --set batch.accumulate=4 --set parallel.sequence_parallel=true
run dp2_tp2_zero1 --ranks 4 --tp 2 --zero 1 --set batch.accumulate=2
run pp2 --ranks 2 --pp 2 --set batch.accumulate=4
noaux=(--set model.aux_loss=0 --set batch.accumulate=4)
run one_noaux --ranks 1 "${noaux[@]}"
run cp2 --ranks 2 --cp 2 "${noaux[@]}"
run one_capacity --ranks 1 --set batch.accumulate=4 --set model.capacity_factor=1.0
run ep2 --ranks 2 --ep 2 --set batch.accumulate=2
run ep4 --ranks 4 --ep 4
run dp2_ep2_zero1 --ranks 4 --ep 2 --zero 1
run dp2_ep2_zero2 --ranks 4 --ep 2 --zero 2
# Dispatch in 3 chunks on the ep group's communication thread (each exchange 1 ms late, so the
# next chunk is still in flight when the experts start on one).
CHORUS_TRAIN_COMM_DELAY_MS=1 run ep4_zero3_chunks --ranks 4 --ep 4 --zero 3 --set model.dispatch_chunks=3
run tp2_ep2_sp --ranks 4 --tp 2 --ep 2 --set batch.accumulate=2 --set parallel.sequence_parallel=true
run pp2_ep2 --ranks 4 --pp 2 --ep 2 --zero 1 --set batch.accumulate=2
run cp2_ep2 --ranks 4 --cp 2 --ep 2 --set model.aux_loss=0 --set batch.accumulate=2
# A checkpoint of ep 2, cut at step 15 (the step-10 one stands), resumed under three layouts.
ep2_ckpt=(--ranks 2 --ep 2 --set batch.accumulate=2 --set run.checkpoint_every=5)
if CHORUS_TRAIN_CRASH_IN_SAVE=15 chorus_train "$job" --out "$work/epcut" --set data.dir="\"$work/data\"" "${moe[@]}" \
  "${ep2_ckpt[@]}" >"$work/epcut.log" 2>&1; then
  fail "the ep 2 run meant to die while saving step 15 exited 0"
fi
for resumed in "resume_ep2 --ranks 2 --ep 2 --set batch.accumulate=2" "resume_ep4_zero3 --ranks 4 --ep 4 --zero 3" \
  "resume_one --ranks 1 --set batch.accumulate=4"; do
  read -r -a args <<<"$resumed"
  cp -r "$work/epcut" "$work/${args[0]}"
  run "${args[@]}" --resume
  grep -q "resumed from .* at step 10" "$work/${args[0]}.log" || fail "${args[0]} did not resume at step 10"
done
# ep must divide the data-parallel ranks and the experts.
if chorus_train "$job" --out "$work/bad" --set data.dir="\"$work/data\"" "${moe[@]}" --ranks 4 --ep 3 >"$work/bad.log" 2>&1; then
  fail "ep 3 of 4 ranks was accepted"
fi
grep -q "ep = 3 does not divide the 4 data-parallel ranks" "$work/bad.log" || { cat "$work/bad.log"; fail "no clear ep error"; }
grep -Eq "aux [0-9.]+ \| balance [0-9.]+ \| dropped 0.0%" "$work/one.log" || fail "no MoE statistics in the progress line"
/usr/bin/python3 - "$work" <<'PY'
import csv, json, sys
work = sys.argv[1]
def rows(name):
    return list(csv.DictReader(open(f"{work}/{name}/metrics.csv")))
def losses(name):
    return [float(r["loss"]) for r in rows(name)]
def norms(name):
    return [float(r["grad_norm"]) for r in rows(name)]
bad = []
for ref, names in [("one", ["dp2", "dp4", "zero1", "zero3", "tp2", "tp2_sp", "dp2_tp2_zero1", "pp2", "ep2", "ep4",
                           "dp2_ep2_zero1", "dp2_ep2_zero2", "ep4_zero3_chunks", "tp2_ep2_sp", "pp2_ep2",
                           "resume_ep4_zero3", "resume_one"]),
                   ("one_noaux", ["cp2", "cp2_ep2"])]:
    want = losses(ref)
    if len(want) != 20 or want[-1] >= want[0]:
        bad.append(f"{ref}: the loss did not fall over 20 steps: {want}")
    for name in names:
        got = losses(name)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        # The gradient norm too: a gradient of the wrong scale (experts averaged over the wrong
        # group) leaves AdamW's clipped steps, and so the loss, nearly as they are.
        norm = max(abs(a - b) / abs(b) for a, b in zip(norms(name), norms(ref)))
        print(f"{name:14s} 20 steps, largest relative difference from one rank: loss {worst:.2e}, gradient norm "
              f"{norm:.2e}")
        if len(got) != 20 or worst > 1e-5 or norm > 1e-5:
            bad.append(name)
# The MoE columns: the aux loss near 1 (balanced) and at least 1/k... up to E; balance >= 1; no drops
# without capacity, some with capacity 1.0.
for name in ["one", "dp4", "pp2"]:
    for r in rows(name):
        aux, balance, dropped = float(r["aux_loss"]), float(r["expert_balance"]), float(r["dropped"])
        if not (0.5 < aux < 4 and 1 <= balance <= 4 and dropped == 0):
            bad.append(f"{name} step {r['step']}: aux {aux} balance {balance} dropped {dropped}")
# The same layout resumed: the very losses of the uninterrupted run.
if losses("resume_ep2") != losses("ep2"):
    bad.append(f"ep 2 resumed at ep 2: {losses('resume_ep2')} vs {losses('ep2')}")
drops = [float(r["dropped"]) for r in rows("one_capacity")]
print(f"capacity 1.0: dropped share per step from {drops[0]:.3f} to {drops[-1]:.3f}")
if not all(0 < d < 0.5 for d in drops):
    bad.append(f"capacity 1.0 dropped shares {drops}")
m = json.load(open(f"{work}/one/metrics.json"))
if m["model"]["moe"]["experts"] != 4 or len(m["moe"]["per_step"]) != 20:
    bad.append(f"metrics.json moe: {m['model'].get('moe')}, {len(m.get('moe', {}).get('per_step', []))} steps")
# The MoE layers' profile: every rank's phases; chunked, the experts ran on chunks while the next
# was in flight (3 chunks per exchange: at most 2 of 3 can overlap).
for name, chunked in [("one", False), ("ep4", False), ("ep4_zero3_chunks", True)]:
    phases = json.load(open(f"{work}/{name}/metrics.json"))["moe"]["phases_per_rank"]
    ranks = 1 if name == "one" else 4
    if len(phases) != ranks or any(p["experts_ms"] <= 0 or p["route_ms"] <= 0 for p in phases):
        bad.append(f"{name}: MoE phases {phases}")
    for p in phases:
        overlapped, chunks = p["chunks_overlapped"], p["chunks"]
        if (chunked and not 0 < overlapped <= 2 * chunks // 3) or (not chunked and overlapped != 0):
            bad.append(f"{name}: {overlapped} of {chunks} chunks overlapped")
    print(f"{name}: rank 0's MoE phases per step {phases[0]}")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("OK")
PY
