# train_parity_cuda.sh: chorus-train on a CUDA device follows the CPU: the parity job (the tiny
# model) for 10 steps on one GPU, its layouts on 2 ranks sharing that GPU (data parallelism, every
# ZeRO stage, ZeRO-2 and 3 accumulating over micro-batches too, tensor parallelism with and without
# sequence parallelism, context parallelism, a pipeline of 2 stages, 1F1B and interleaved, the
# optimizer state offloaded to host memory and to a file, ZeRO-3's parameters in the file too, the
# step during backward) and a pipeline of 3 stages on 3, one rank with bf16 compute, ZeRO-2 with
# gradients reduced in bf16, MoE blocks (alone and with 2 expert-parallel ranks, exchanging in one
# chunk and in two), DiLoCo and PowerSGD on 2 ranks, each against the same job on the CPU (one
# rank; the same layout for the bf16 reduction, expert parallelism, DiLoCo and PowerSGD).
# The GPU sums in other orders than the CPU, so the runs agree to rounding, not to the bit: each
# step's loss and gradient norm within 1e-3 relative of the CPU's (fp32; bf16: the loss within 2e-2),
# and under SGD (where a parameter moves as far as its gradient says) the final parameters within
# 1e-3. A reduction that summed where it should average, missed a rank or left a ZeRO gather undone
# moves the gradient norm or the parameters by far more. Exits 77 (skipped) without a device.
# With CHORUS_TRAIN naming tests/chorus-train-emulated (e2e_train_parity_emulated) the device is
# CUDA emulated on the host: the same layouts' device path, their device collectives through chorus's
# device engine on the emulated CUDA runtime.
source "$(dirname "$0")/lib.sh"
job="$source_dir/tests/data/jobs/parity.toml"
# No fortunes on a GPU machine: the checkout's training sources are the text (chorus_train declares
# the GEMM peak: none is measured).
# CHORUS_PARITY_STEPS (default 10) shortens the run where each step is slow (the emulated device:
# 6 steps still take DiLoCo's outer step at 5 and a step after it).
steps=${CHORUS_PARITY_STEPS:-10}
common=(--set run.steps=$steps --set run.checkpoint_every=$steps --set "data.corpus=\"$source_dir/src/training\"")
run() { train_run "$job" "$1" "${common[@]}" "${@:2}"; }  # name, then options
if ! chorus_train "$job" --device cuda --out "$work/probe" --set data.dir="\"$work/data\"" \
  "${common[@]}" --set run.steps=1 >"$work/probe.log" 2>&1; then
  if grep -q "no usable CUDA device\|this build has no CUDA" "$work/probe.log"; then
    echo "skipped: $(grep -o 'device "cuda": .*' "$work/probe.log" | head -n 1)"
    exit 77
  fi
  cat "$work/probe.log"
  fail "chorus-train --device cuda"
fi
cuda=(--device cuda)
l4=(--set model.layers=4 --set batch.accumulate=4)
sgd=(--set 'optimizer.name="sgd"' --set optimizer.momentum=0 --set optimizer.lr=0.2 --set optimizer.min_lr=0.02
  --set optimizer.weight_decay=0 --set optimizer.clip=0)
moe=(--set model.experts=4)
# DiLoCo checkpoints where its ranks agree: after an outer step.
diloco=(--set 'parallel.sync="diloco:5"' --set run.checkpoint_every=5)
# The CPU references run beside the GPU runs (the GPU machines have cores to spare).
cpu_refs() {
  run cpu_one --ranks 1 --set batch.micro=8
  run cpu_one_l4 --ranks 1 --set batch.micro=2 "${l4[@]}"
  run cpu_sgd --ranks 1 --set batch.micro=8 "${sgd[@]}"
  run cpu_bf16 --ranks 1 --set batch.micro=8 --precision bf16
  run cpu_reduce_bf16 --ranks 2 --zero 2 --set batch.micro=4 --set 'precision.reduce="bf16"'
  run cpu_diloco --ranks 2 --set batch.micro=4 "${diloco[@]}"
  run cpu_powersgd --ranks 2 --set batch.micro=4 --compress powersgd:4
  run cpu_diloco_bf16 --ranks 2 --set batch.micro=4 "${diloco[@]}" --compress bf16
  run cpu_moe --ranks 1 --set batch.micro=8 "${moe[@]}"
  run cpu_moe_ep2 --ranks 2 --ep 2 --set batch.micro=4 "${moe[@]}"
}
cpu_refs >"$work/cpu_refs.log" 2>&1 &
refs=$!
run one --ranks 1 --set batch.micro=8 "${cuda[@]}"
run dp2 --ranks 2 --set batch.micro=4 "${cuda[@]}"
run zero1 --ranks 2 --zero 1 --set batch.micro=4 "${cuda[@]}"
run zero2 --ranks 2 --zero 2 --set batch.micro=4 "${cuda[@]}"
run zero3 --ranks 2 --zero 3 --set batch.micro=4 "${cuda[@]}"
# ZeRO-2/3 accumulating over 2 micro-batches: each one's whole gradient reduced before the next
# one's backward writes into that bucket again.
run zero2_accum --ranks 2 --zero 2 --set batch.micro=2 --set batch.accumulate=2 "${cuda[@]}"
run zero3_accum --ranks 2 --zero 3 --set batch.micro=2 --set batch.accumulate=2 "${cuda[@]}"
run tp2 --ranks 2 --tp 2 --set batch.micro=8 "${cuda[@]}"
run tp2_sp --ranks 2 --tp 2 --set batch.micro=8 --set parallel.sequence_parallel=true "${cuda[@]}"
run cp2 --ranks 2 --cp 2 --set batch.micro=2 "${l4[@]}" "${cuda[@]}"
run pp2 --ranks 2 --pp 2 --set batch.micro=2 "${l4[@]}" "${cuda[@]}"
# The interleaved schedule (its stages a ring: each sends before it receives) and a ring of 3.
run pp2_interleaved --ranks 2 --pp 2 --set batch.micro=2 "${l4[@]}" --set parallel.vpp=2 \
  --set 'parallel.schedule="interleaved"' "${cuda[@]}"
run pp3 --ranks 3 --pp 3 --set batch.micro=2 "${l4[@]}" "${cuda[@]}"
run sgd_zero2 --ranks 2 --zero 2 --set batch.micro=4 "${sgd[@]}" "${cuda[@]}"
run sgd_zero3 --ranks 2 --zero 3 --set batch.micro=4 "${sgd[@]}" "${cuda[@]}"
# The step during backward (each bucket's behind its reduction, between backward's kernels), with
# backward slowed after each unit (CHORUS_TRAIN_BACKWARD_DELAY_MS) so that some begin before it ends.
CHORUS_TRAIN_BACKWARD_DELAY_MS=5 run sgd_zero2_ib --ranks 2 --zero 2 --set batch.micro=4 "${sgd[@]}" \
  --set optimizer.in_backward=true "${cuda[@]}"
run bf16 --ranks 1 --set batch.micro=8 --precision bf16 "${cuda[@]}"
run reduce_bf16 --ranks 2 --zero 2 --set batch.micro=4 --set 'precision.reduce="bf16"' "${cuda[@]}"
run moe --ranks 1 --set batch.micro=8 "${moe[@]}" "${cuda[@]}"
run moe_ep2 --ranks 2 --ep 2 --set batch.micro=4 "${moe[@]}" "${cuda[@]}"
# The exchanges in 2 chunks, enqueued by the ep group's communication thread.
run moe_ep2_chunks --ranks 2 --ep 2 --set batch.micro=4 "${moe[@]}" --set model.dispatch_chunks=2 "${cuda[@]}"
# The optimizer state offloaded from the device: to host memory (ZeRO-1) and to a file streamed
# through a small window (ZeRO-2); the step runs on the host.
run diloco --ranks 2 --set batch.micro=4 "${diloco[@]}" "${cuda[@]}"
run powersgd --ranks 2 --set batch.micro=4 --compress powersgd:4 "${cuda[@]}"
run diloco_bf16 --ranks 2 --set batch.micro=4 "${diloco[@]}" --compress bf16 "${cuda[@]}"
run zero1_offload --ranks 2 --zero 1 --set batch.micro=4 --offload host "${cuda[@]}"
run zero2_offload_file --ranks 2 --zero 2 --set batch.micro=4 --offload file --set offload.window_mb=0.05 "${cuda[@]}"
# ZeRO-3 with its parameter shard in the file too: each gather reads the shard and copies it up.
run sgd_zero3_params_file --ranks 2 --zero 3 --set batch.micro=4 "${sgd[@]}" --offload file \
  --set offload.window_mb=0.05 --set 'offload.params="file"' "${cuda[@]}"
wait "$refs" || { cat "$work/cpu_refs.log"; fail "the CPU references"; }
/usr/bin/env python3 - "$work" "$steps" "$(dirname "$0")" <<'PY'
import csv, json, struct, sys
work, steps = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
import pipeline_idle
def column(name, key):
    return [float(r[key]) for r in csv.DictReader(open(f"{work}/{name}/metrics.csv"))]
def parameters(name):  # the whole model's parameters in the final checkpoint (CHCK, header length, header)
    data = open(f"{work}/{name}/checkpoint.bin", "rb").read()
    length = struct.unpack("<I", data[4:8])[0]
    count = json.loads(data[8:8 + length])["parameters"]
    return struct.unpack_from(f"<{count}f", data, 8 + length)
bad = []
def matches(name, ref, loss_bound=1e-3, norm_bound=1e-3, param_bound=None):
    worst = {}
    for key in ["loss", "grad_norm"]:
        got, want = column(name, key), column(ref, key)
        if len(got) != steps or len(want) != steps:
            bad.append(f"{name}: {len(got)} steps")
        worst[key] = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    text = f"{name:10s} against {ref:10s}: loss {worst['loss']:.2e}, gradient norm {worst['grad_norm']:.2e}"
    ok = worst["loss"] <= loss_bound and worst["grad_norm"] <= norm_bound
    if param_bound is not None:
        params = max(abs(a - b) for a, b in zip(parameters(name), parameters(ref)))
        text += f", final parameters within {params:.1e}"
        ok = ok and params <= param_bound
    print(text)
    if not ok:
        bad.append(name)
for name in ["one", "dp2", "zero1", "zero2", "zero3", "zero2_accum", "zero3_accum", "tp2", "tp2_sp", "zero1_offload", "zero2_offload_file"]:
    matches(name, "cpu_one")
for name in ["cp2", "pp2", "pp2_interleaved", "pp3"]:
    matches(name, "cpu_one_l4")
for name in ["sgd_zero2", "sgd_zero3", "sgd_zero2_ib", "sgd_zero3_params_file"]:
    matches(name, "cpu_sgd", param_bound=1e-3)
# The step during backward takes the step after backward's arithmetic on the device: the same
# losses, norms and final parameters to the bit; every bucket of every step stepped so, some while
# backward still ran.
if any(column("sgd_zero2_ib", k) != column("sgd_zero2", k) for k in ["loss", "grad_norm"]) or \
        parameters("sgd_zero2_ib") != parameters("sgd_zero2"):
    bad.append("sgd_zero2_ib: not the bits of sgd_zero2")
during = json.load(open(f"{work}/sgd_zero2_ib/metrics.json"))
counts = [(c["steps_begun_during_backward"], c["bucket_steps"]) for c in during["reductions_per_rank"]]
print(f"sgd_zero2_ib: {during['buckets']['count']} buckets x {steps} steps; bucket steps begun during backward / all, "
      f"per rank: {counts}")
if any(n != steps * during["buckets"]["count"] for _, n in counts) or sum(b for b, _ in counts) == 0:
    bad.append(f"sgd_zero2_ib: bucket steps {counts}")
matches("bf16", "cpu_bf16", loss_bound=2e-2, norm_bound=5e-2)
# Gradients reduced in bf16 (ZeRO-2, 2 ranks): rounded at the same points on both devices.
matches("reduce_bf16", "cpu_reduce_bf16", loss_bound=1e-2, norm_bound=1e-2)
# MoE blocks (4 experts, top-2), alone and with expert parallelism over the 2 ranks: the routing
# is decided on the host from the device's logits; a near tie could send a token elsewhere, hence
# a looser bound.
matches("moe", "cpu_moe", loss_bound=5e-3, norm_bound=5e-3)
matches("moe_ep2", "cpu_moe_ep2", loss_bound=5e-3, norm_bound=5e-3)
matches("moe_ep2_chunks", "cpu_moe_ep2", loss_bound=5e-3, norm_bound=5e-3)
# DiLoCo (2 ranks, 5 inner steps, then the outer Nesterov step on the averaged delta: twice in 10
# steps, once in 6).
matches("diloco", "cpu_diloco")
# Gradients compressed by rank-4 PowerSGD (the compressors work on the host: each bucket comes over
# and goes back).
matches("powersgd", "cpu_powersgd", loss_bound=5e-3, norm_bound=5e-3)
# DiLoCo's delta through a bf16 compressor at the outer step (a compressed all-reduce of device
# buffers, staged by chorus): the delta's rounding to bf16 may land either side on each device.
matches("diloco_bf16", "cpu_diloco_bf16", loss_bound=5e-3, norm_bound=5e-3)
# Each stage's compute queue waited for messages for part of its steps (the pipeline's bubble, at
# least the first stage's forward for the second stage), measured on the device's clock.
pipeline_idle.check(work, ["pp2", "pp2_interleaved", "pp3"], bad)
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("train_parity_cuda: every layout on the GPU follows the CPU")
PY
