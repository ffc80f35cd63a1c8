# train_parity.sh: data parallelism, every ZeRO stage, tensor parallelism (alone and with dp
# and ZeRO, with and without sequence parallelism), pipeline parallelism (every schedule, and
# composed with dp and tp on 8 ranks) and context parallelism (ring attention, with tp, pp and dp)
# compute what one rank computes. The same
# global batch of 8 sequences is split over 2 and 4 ranks (and over micro-batches): the loss and the
# gradient norm of each of 20 steps must equal the one-rank run's within 1e-5 relative, and the
# parameters after them (the final checkpoint) within 1e-4. AdamW and clipping forgive a gradient
# of the wrong scale (a sum where a mean is due leaves the loss as it is; only the norm shows it),
# so plain SGD without clipping runs under dp and ZeRO 2 and 3 too, where the loss shows it as well.
# ZeRO-1 with the optimizer state in a file, and SGD under ZeRO-3 with the parameters there too, join them. The runs' memory reports must
# follow the ZeRO formulas (fp32: 16P, 8P + 8P/N, 4P + 12P/N, 16P/N bytes) within the padding.
# Reductions must begin while backward is still running (counted per rank; backward slowed by
# CHORUS_TRAIN_BACKWARD_DELAY_MS). Over a slow link (CHORUS_TRAIN_COMM_DELAY_MS) ZeRO-2/3's
# whole-gradient buckets must stay within the in-flight cap: at most inflight + 2 buckets'
# gradients at once, plus 3 gathered units for ZeRO-3.
# The planner (chorus-plan) must predict every layout's bytes per rank: the state within the
# runtime's padding (2%), the activations within 0.1%.
source "$(dirname "$0")/lib.sh"
job="$source_dir/tests/data/jobs/parity.toml"
run() { train_run "$job" "$1" --set run.checkpoint_every=20 "${@:2}"; }  # name, then options
# The runs whose reductions must begin during backward pause backward 2 ms after each unit
# (CHORUS_TRAIN_BACKWARD_DELAY_MS), so that a busy machine's scheduler cannot let backward end
# before the communication thread starts a bucket (4 ranks beside three busy loops: 0 to 7 of a
# rank's 80 reductions began during backward without it).
run one --ranks 1 --set batch.micro=8
run one_accum --ranks 1 --set batch.micro=2 --set batch.accumulate=4
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run dp2 --ranks 2 --set batch.micro=4
# The overlap count's control: one bucket of the whole model is ready only when backward has ended.
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run dp2_one_bucket --ranks 2 --set batch.micro=4 --set parallel.bucket_mb=100
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run dp4 --ranks 4 --set batch.micro=2
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run dp2_accum --ranks 2 --set batch.micro=2 --set batch.accumulate=2
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run zero1 --ranks 4 --zero 1 --set batch.micro=2
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run zero2 --ranks 4 --zero 2 --set batch.micro=2
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run zero3 --ranks 4 --zero 3 --set batch.micro=2
CHORUS_TRAIN_BACKWARD_DELAY_MS=2 run zero3_dp2_accum --ranks 2 --zero 3 --set batch.micro=2 --set batch.accumulate=2
# ZeRO-2 accumulating, backward not slowed: the next micro-batch's backward asks for the tied
# embedding's bucket (the output layer's gradient) while that bucket's reduce-scatter may still be
# in flight, and must not write into its whole gradient.
run zero2_dp2_accum --ranks 2 --zero 2 --set batch.micro=2 --set batch.accumulate=2
run tp2 --ranks 2 --tp 2 --set batch.micro=8
run tp4 --ranks 4 --tp 4 --set batch.micro=8
run dp2_tp2_zero1 --ranks 4 --tp 2 --zero 1 --set batch.micro=4
run dp2_tp2_zero3_accum --ranks 4 --tp 2 --zero 3 --set batch.micro=2 --set batch.accumulate=2
run tp2_sp --ranks 2 --tp 2 --set batch.micro=8 --set parallel.sequence_parallel=true
run dp2_tp2_sp_zero2 --ranks 4 --tp 2 --zero 2 --set batch.micro=4 --set parallel.sequence_parallel=true
# Pipeline parallelism (4 blocks, 4 micro-batches of 2 sequences, or 1 with dp2): every schedule,
# 2 and 4 stages, and the 8-rank compositions (dp, tp, pp) = (2,2,2), (2,1,4), (8,1,1).
l4=(--set model.layers=4 --set batch.accumulate=4)
run one_l4 --ranks 1 --set batch.micro=2 "${l4[@]}"
run pp2 --ranks 2 --pp 2 --set batch.micro=2 "${l4[@]}"
run pp2_gpipe --ranks 2 --pp 2 --set batch.micro=2 --set parallel.schedule='"gpipe"' "${l4[@]}"
run pp2_interleaved --ranks 2 --pp 2 --set batch.micro=2 --set parallel.schedule='"interleaved"' \
  --set parallel.vpp=2 "${l4[@]}"
run pp4 --ranks 4 --pp 4 --set batch.micro=2 "${l4[@]}"
run tp2_pp2_sp --ranks 4 --tp 2 --pp 2 --set batch.micro=2 --set parallel.sequence_parallel=true "${l4[@]}"
run dp2_tp2_pp2 --ranks 8 --tp 2 --pp 2 --zero 1 --set batch.micro=1 "${l4[@]}"
run dp2_pp4 --ranks 8 --pp 4 --zero 1 --set batch.micro=1 "${l4[@]}"
run dp8 --ranks 8 --zero 1 --set batch.micro=1 "${l4[@]}" --set batch.accumulate=1
# Context parallelism: (dp, tp, pp, cp) = (1,2,1,2) with sequence parallelism, (1,1,2,2), (1,2,2,2)
# on 8 ranks, and (2,1,1,2) with ZeRO-1 (gradients averaged over dp and cp together).
run tp2_cp2_sp --ranks 4 --tp 2 --cp 2 --set batch.micro=2 --set parallel.sequence_parallel=true "${l4[@]}"
run pp2_cp2 --ranks 4 --pp 2 --cp 2 --set batch.micro=2 "${l4[@]}"
run tp2_pp2_cp2 --ranks 8 --tp 2 --pp 2 --cp 2 --set batch.micro=2 "${l4[@]}"
run dp2_cp2 --ranks 4 --cp 2 --zero 1 --set batch.micro=1 "${l4[@]}"
# Activation checkpointing under tensor and pipeline parallelism: the same losses, fewer bytes.
run tp2_sp_full --ranks 2 --tp 2 --set batch.micro=8 --set parallel.sequence_parallel=true \
  --set parallel.recompute='"full"'
run pp2_selective --ranks 2 --pp 2 --set batch.micro=2 --set parallel.recompute='"selective"' "${l4[@]}"
sgd=(--set 'optimizer.name="sgd"' --set optimizer.momentum=0 --set optimizer.lr=0.2 --set optimizer.min_lr=0.02
  --set optimizer.weight_decay=0 --set optimizer.clip=0)
run sgd_one --ranks 1 --set batch.micro=8 "${sgd[@]}"
run sgd_dp4 --ranks 4 --set batch.micro=2 "${sgd[@]}"
run sgd_zero2 --ranks 4 --zero 2 --set batch.micro=2 "${sgd[@]}"
run sgd_zero3 --ranks 4 --zero 3 --set batch.micro=2 "${sgd[@]}"
# The optimizer state (and ZeRO-3's parameters) offloaded to a file, streamed through a small window.
offload=(--offload file --set offload.window_mb=0.05)
run zero1_offload --ranks 4 --zero 1 --set batch.micro=2 "${offload[@]}"
run sgd_zero3_offload --ranks 4 --zero 3 --set batch.micro=2 "${sgd[@]}" "${offload[@]}" --set 'offload.params="file"'
slow=(--ranks 4 --set batch.micro=2 --set model.layers=8 --set run.steps=3 --set parallel.inflight_buckets=1)
CHORUS_TRAIN_COMM_DELAY_MS=20 run zero2_slow --zero 2 "${slow[@]}"
CHORUS_TRAIN_COMM_DELAY_MS=20 run zero3_slow --zero 3 "${slow[@]}"
/usr/bin/python3 - "$work" "$build" "$(dirname "$0")" <<'PY'
import csv, json, struct, sys
import numpy as np
work, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import pipeline_idle
import planned_bytes
def column(name, key):
    return [float(r[key]) for r in csv.DictReader(open(f"{work}/{name}/metrics.csv"))]
def losses(name):
    return column(name, "loss")
def parameters(name):  # the whole model's parameters in the final checkpoint (CHCK, header length, header)
    data = open(f"{work}/{name}/checkpoint.bin", "rb").read()
    length = struct.unpack("<I", data[4:8])[0]
    count = json.loads(data[8:8 + length])["parameters"]
    return np.frombuffer(data, dtype=np.float32, count=count, offset=8 + length)
bad = []
def matches(name, ref):  # each step's loss and gradient norm, and the final parameters, against ref's
    worst = {}
    for key in ["loss", "grad_norm"]:
        got, want = column(name, key), column(ref, key)
        if len(got) != 20:
            bad.append(f"{name}: {len(got)} steps")
        worst[key] = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    params = float(np.abs(parameters(name) - parameters(ref)).max())
    print(f"{name:16s} 20 steps, largest relative difference from {ref}: loss {worst['loss']:.2e}, gradient norm "
          f"{worst['grad_norm']:.2e}; final parameters within {params:.1e}")
    if worst["loss"] > 1e-5 or worst["grad_norm"] > 1e-5 or params > 1e-4:
        bad.append(name)
for name in ["one_accum", "dp2", "dp2_one_bucket", "dp4", "dp2_accum", "zero1", "zero2", "zero3", "zero3_dp2_accum", "zero2_dp2_accum",
             "tp2", "tp4",
             "dp2_tp2_zero1", "dp2_tp2_zero3_accum", "tp2_sp", "dp2_tp2_sp_zero2", "tp2_sp_full", "zero1_offload"]:
    matches(name, "one")
for name in ["sgd_dp4", "sgd_zero2", "sgd_zero3", "sgd_zero3_offload"]:
    matches(name, "sgd_one")
for ref in ["one", "sgd_one"]:
    if losses(ref)[-1] >= losses(ref)[0] or len(losses(ref)) != 20:
        bad.append(f"{ref}: the loss did not fall over 20 steps: {losses(ref)}")
# Tensor parallelism divides the parameters; sequence parallelism the activations outside the
# tensor-parallel layers (so tp2 with it holds fewer activation bytes than tp2 without).
def per_rank(name, key):
    return [mem[key] for mem in json.load(open(f"{work}/{name}/metrics.json"))["memory_per_rank"]]
def below(what, values, limits):  # each rank's value below its limit (one limit: the same for all)
    limits = limits if isinstance(limits, list) else [limits] * len(values)
    if not all(v < l for v, l in zip(values, limits)):
        bad.append(f"{what}: {values} not below {limits}")
one_params, tp_params = per_rank("one", "params_bytes")[0], per_rank("tp2", "params_bytes")
tp_act, sp_act = per_rank("tp2", "activation_bytes"), per_rank("tp2_sp", "activation_bytes")
print(f"params bytes: one rank {one_params}, tp2 {tp_params}; activation bytes tp2 {tp_act}, tp2 + sp {sp_act}")
below("tp2 parameters per rank against 0.6 x one rank's", tp_params, 0.6 * one_params)
below("sequence parallel activations against tp2's", sp_act, tp_act)
# Memory: P parameters, N ranks, padding of at most N - 1 elements per bucket per array.
for name, stage in [("dp4", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)]:
    m = json.load(open(f"{work}/{name}/metrics.json"))
    P, N = m["model"]["parameters"], m["ranks"]
    full, shard = 4 * P, 4 * P / N
    expect = {0: (full, full, 2 * full), 1: (full, full, 2 * shard), 2: (full, shard, 2 * shard),
              3: (shard, shard, 2 * shard)}[stage]
    slack = 4 * (N - 1) * (m["model"]["layers"] + 2) * 2  # per bucket (at most units) per array, m and v
    for r, mem in enumerate(m["memory_per_rank"]):
        got = (mem["params_bytes"], mem["grads_bytes"], mem["optimizer_bytes"])
        total_formula = sum(expect)
        print(f"{name} rank {r}: params {got[0]} grads {got[1]} optimizer {got[2]} = {sum(got)} bytes; formula "
              f"{total_formula:.0f} ({total_formula / P:.2f} bytes/parameter); transient peak {mem['transient_peak_bytes']}")
        for g, e, what in zip(got, expect, ("params", "grads", "optimizer")):
            if not (e <= g <= e + slack):
                bad.append(f"{name} rank {r} {what}: {g} bytes, formula {e:.0f}")
        if (stage >= 2) != (mem["transient_peak_bytes"] > 0):
            bad.append(f"{name} rank {r}: transient buffers {mem['transient_peak_bytes']} for stage {stage}")
for name in ["pp2", "pp2_gpipe", "pp2_interleaved", "pp4", "tp2_pp2_sp", "dp2_tp2_pp2", "dp2_pp4", "dp8",
             "pp2_selective", "tp2_cp2_sp", "pp2_cp2", "tp2_pp2_cp2", "dp2_cp2"]:
    matches(name, "one_l4")
# Pipeline memory: each stage holds part of the parameters; 1F1B keeps at most (stages - stage)
# micro-batches' activations where GPipe keeps all 4, so each stage holds fewer bytes under 1F1B.
pp_params, one_params4 = per_rank("pp2", "params_bytes"), per_rank("one_l4", "params_bytes")[0]
act_1f1b, act_gpipe = per_rank("pp2", "activation_bytes"), per_rank("pp2_gpipe", "activation_bytes")
print(f"pp2 params bytes {pp_params} (one rank {one_params4}); activation bytes 1F1B {act_1f1b}, GPipe {act_gpipe}")
below("pp2 parameters per rank against 0.6 x one rank's", pp_params, 0.6 * one_params4)
below("1F1B activations against GPipe's", act_1f1b, act_gpipe)
below("selective recompute's activations against none's (pp2)", per_rank("pp2_selective", "activation_bytes"), act_1f1b)
below("full recompute's activations against none's (tp2 + sp)", per_rank("tp2_sp_full", "activation_bytes"), sp_act)
# Context parallelism holds half of each sequence per rank: fewer activation bytes than pp2 alone.
act_cp = per_rank("pp2_cp2", "activation_bytes")
print(f"activation bytes pp2 {act_1f1b}, pp2 x cp2 {act_cp}")
below("pp2 x cp2 activations against pp2's (ranks: stage 0's two cp ranks, then stage 1's)", act_cp,
      [a for a in act_1f1b for _ in range(2)])
pipeline_idle.check(work, ["pp2", "pp2_gpipe", "pp2_interleaved", "pp4"], bad)
# The planner (chorus-plan) predicts each rank's bytes: parameters, gradients and optimizer state
# as ZeRO counts them (the runtime pads shards a little), activations to the byte.
planned_bytes.check(work, build, ["dp4", "zero1", "zero2", "zero3", "tp2", "tp2_sp", "tp2_sp_full", "pp2",
                                   "pp2_gpipe", "pp2_interleaved", "pp4", "tp2_pp2_sp", "dp2_tp2_pp2", "pp2_selective",
                                   "tp2_cp2_sp", "pp2_cp2", "tp2_pp2_cp2", "dp2_cp2"], bad)
# Overlap: some bucket reductions of every layout began before their backward had finished.
def overlap(name):  # the buckets, and per rank (reductions begun during backward, all reductions)
    m = json.load(open(f"{work}/{name}/metrics.json"))
    counts = [(c["begun_during_backward"], c["reductions"]) for c in m["reductions_per_rank"]]
    print(f"{name}: {m['buckets']['count']} buckets; reductions begun during backward / all, per rank: {counts}")
    return m["buckets"]["count"], counts
for name in ["dp2", "dp4", "dp2_accum", "zero1", "zero2", "zero3", "zero3_dp2_accum"]:
    _, counts = overlap(name)
    if sum(b for b, _ in counts) == 0 or any(n == 0 for _, n in counts):
        bad.append(f"{name}: no reduction overlapped backward ({counts})")
buckets, counts = overlap("dp2_one_bucket")
if buckets != 1 or any(b != 0 or n != 20 for b, n in counts):
    bad.append(f"dp2_one_bucket: one bucket's 20 reductions cannot begin during backward ({counts})")
# The in-flight cap over a slow link.
for name, stage in [("zero2_slow", 2), ("zero3_slow", 3)]:
    m = json.load(open(f"{work}/{name}/metrics.json"))
    largest, k = m["buckets"]["largest_bytes"], m["buckets"]["inflight"]
    bound = (k + 2) * largest + (3 * largest if stage == 3 else 0)
    whole = 4 * m["model"]["parameters"]
    for r, mem in enumerate(m["memory_per_rank"]):
        peak = mem["transient_peak_bytes"]
        print(f"{name} rank {r}: transient peak {peak} bytes, cap {bound} (whole gradient {whole})")
        if not 0 < peak <= bound < whole:
            bad.append(f"{name} rank {r}: transient peak {peak} bytes, cap {bound}, whole gradient {whole}")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("train_parity: every layout matches one rank; memory follows the ZeRO formulas")
PY
