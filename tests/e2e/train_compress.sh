# train_compress.sh: gradient compression in data-parallel training (the tiny job, 4 ranks, 200
# steps, the first 30 uncompressed; the runs checked for their bytes only stop after 40). Against
# the fp32 all-reduce run:
#  - bytes: every compressor's measured bytes per step (what the transports sent on the
#    data-parallel communicator, headers included) are within 5% of its payload formula
#    (chorusCompressorGetInfo), the fp32 run's within 5% of the ring's 2 (n-1)/n x 4 bytes per
#    parameter, the warm-up steps send fp32's bytes, bf16 sends half and rank-4 PowerSGD at
#    least 20x less;
#  - convergence: bf16 ends within 2% of the fp32 run's final validation loss. Under plain SGD (the setting of PowerSGD's and error feedback's
#    papers), rank-4 PowerSGD ends within 2% of fp32, and top-k at 0.1% ends within 2% of fp32 with
#    its error feedback and at least 5% higher without (sign's pair is not run: see the end).
source "$(dirname "$0")/lib.sh"
run() {  # name, steps, then chorus-train options
  local name=$1 steps=$2
  shift 2
  chorus_train "$source_dir/jobs/tiny.toml" --out "$work/$name" --steps $steps --set data.dir="\"$work/data\"" \
    --set run.eval_every=0 --set run.checkpoint_every=0 --set run.log_every=100 --set compress.warmup_steps=30 \
    "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "chorus-train $*"; }
  tail -n 2 "$work/$name.log"
}
run none 200
run bf16 200 --compress bf16
# Bytes only: 30 warm-up steps and 10 compressed ones.
run powersgd4 40 --compress powersgd:4
run topk 40 --compress topk:0.01
run sign 40 --compress sign
# Error feedback, switched on and off, under plain SGD (no momentum: the setting of the error
# feedback papers; with momentum or AdamW the fed-back error arrives late and amplified).
# At lr 0.5 the fp32 run trains steadily; at 1.0 its loss spiked (to 10.5 at step 121 on a Xeon
# with OpenBLAS's SkylakeX kernels) and which compressed run ended lower turned on the machine's
# float paths.
sgd=(--set 'optimizer.name="sgd"' --set optimizer.momentum=0 --set optimizer.lr=0.5 --set optimizer.min_lr=0.05
  --set optimizer.weight_decay=0)
run sgd-none 200 "${sgd[@]}"
run sgd-powersgd4 200 "${sgd[@]}" --compress powersgd:4
# Top-k keeps 0.1% of the gradient: without error feedback the other 99.9% is lost for good.
run sgd-topk 200 "${sgd[@]}" --compress topk:0.001
run sgd-topk-noef 200 "${sgd[@]}" --compress topk:0.001,ef=0
/usr/bin/python3 - "$work" <<'PY' || fail "compressed training"
import json, sys
work = sys.argv[1]
m = {n: json.load(open(f"{work}/{n}/metrics.json"))
     for n in ["none", "powersgd4", "bf16", "topk", "sign", "sgd-none", "sgd-powersgd4", "sgd-topk", "sgd-topk-noef"]}
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok = ok and cond
params = m["none"]["model"]["parameters"]
plain = m["none"]["compress"]["dp_bytes_per_uncompressed_step"]
ring = 2 * 3 / 4 * 4 * params
check(ring <= plain <= 1.05 * ring, f"fp32 all-reduce: {plain:.0f} bytes per step, ring formula {ring:.0f}")
val = {n: j["final_val_loss"] for n, j in m.items()}
for n, j in m.items():
    if n == "none" or n.startswith("sgd"):
        continue
    c = j["compress"]
    sent, formula = c["dp_bytes_per_step"], c["payload_bytes_per_step"]
    check(formula <= sent <= 1.05 * formula,
          f"{n}: {sent:.0f} bytes per compressed step, payload formula {formula:.0f} (ratio {plain / sent:.1f}x)")
    check(c["dp_bytes_per_uncompressed_step"] >= 0.95 * plain, f"{n}: the 30 warm-up steps send fp32's bytes")
check(1.9 <= plain / m["bf16"]["compress"]["dp_bytes_per_step"] <= 2.05, "bf16 sends half the bytes")
psgd = plain / m["powersgd4"]["compress"]["dp_bytes_per_step"]
check(psgd >= 20, f"powersgd:4 sends {psgd:.1f}x fewer bytes per step than the fp32 all-reduce (at least 20x)")
check(abs(val["bf16"] / val["none"] - 1) <= 0.02,
      f"bf16: final val loss {val['bf16']:.4f} within 2% of fp32's {val['none']:.4f}")
check(abs(val["sgd-powersgd4"] / val["sgd-none"] - 1) <= 0.02,
      f"plain SGD: powersgd:4 final val loss {val['sgd-powersgd4']:.4f} within 2% of fp32's {val['sgd-none']:.4f}")
on, off = val["sgd-topk"], val["sgd-topk-noef"]
# Measured on one Xeon with OpenBLAS's Prescott, Haswell and SkylakeX kernels: at 300 steps
# (2026-11-28) fp32 2.7096-2.7097, top-k 2.7200-2.7292 with error feedback, 3.1044-3.1306 without;
# at 200 (2026-12-02) fp32 2.7756-2.7768, top-k 2.8014-2.8038 (within 0.97%), 3.2052 without.
check(abs(on / val["sgd-none"] - 1) <= 0.02,
      f"plain SGD: topk:0.001 final val loss {on:.4f} within 2% of fp32's {val['sgd-none']:.4f}")
check(off >= 1.05 * on, f"sgd-topk: without error feedback {off:.4f}, at least 5% above {on:.4f} with it")
# Sign's error feedback is not run: at lr 1.0 it ended 2.8917 without error feedback and 2.9083
# with it on an AMD EPYC machine (2026-11-27) where another machine had the order reversed by more
# than 2%; within this job's 200-300 steps its effect on 1-bit sign depends on the machine's float paths.
sys.exit(0 if ok else 1)
PY
