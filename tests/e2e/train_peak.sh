# train_peak.sh: the GEMM peak behind MFU, from the command line. chorus-train --calibrate keeps
# this machine's fp32 peak in the calibration file; a run then takes it (the banner and
# metrics.json say "calibrated" and carry its value); a declared peak (--peak-tflops) comes
# before it, and one far below the machine's makes MFU print over 100% with the reason; without
# either, the peak is measured at start and the banner says so. A run draws its loss curve
# (OUT/loss.png) at the end unless told not to (--no-plot, [run] plot = false).
source "$(dirname "$0")/lib.sh"
train="$build/chorus-train"
job="$source_dir/tests/data/jobs/parity.toml"
export CHORUS_CALIBRATION="$work/calibration/peaks.json"
"$train" --calibrate >"$work/calibrate.log" 2>&1 || { cat "$work/calibrate.log"; fail "chorus-train --calibrate"; }
cat "$work/calibrate.log"
run() {  # name, then chorus-train options
  local name=$1
  shift
  "$train" "$job" --out "$work/$name" --set data.dir="\"$work/data\"" --ranks 1 --steps 3 --set run.log_every=1 \
    "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "chorus-train $*"; }
  grep "GEMM peak" "$work/$name.log"
}
run calibrated
run declared --peak-tflops 0.0001 --no-plot
CHORUS_CALIBRATION="$work/none.json" run measured
grep -q "GEMM peak for MFU: .*, calibrated ($CHORUS_CALIBRATION" "$work/calibrated.log" || fail "no calibrated peak"
grep -q "GEMM peak for MFU: 0.1 GFLOP/s, declared" "$work/declared.log" || fail "no declared peak"
grep -q "MFU [0-9.]*% (over 100%: the declared peak is below this machine's)" "$work/declared.log" ||
  fail "an MFU over 100% without its reason"
grep -q "GEMM peak for MFU: .*, measured now" "$work/measured.log" || fail "no measured peak"
[ -s "$work/calibrated/loss.png" ] || fail "no loss curve from a run with the plot left on"
[ ! -e "$work/declared/loss.png" ] || fail "--no-plot drew the loss curve"
grep -q "^chorus-train: metrics in $work/declared/metrics.csv and metrics.json$" "$work/declared.log" ||
  fail "--no-plot: no line naming the metrics"
# The BLAS kernels: the launcher measures its peak with the ones the ranks run. Where OpenBLAS took
# this CPU for a pre-AVX2 one (it does with a CPU model it does not know), they are the kernels
# the CPU's AVX2 or AVX-512 allow; OPENBLAS_CORETYPE or [run] blas_coretype, where given, is kept.
OPENBLAS_CORETYPE=Haswell CHORUS_CALIBRATION="$work/none.json" run haswell
CHORUS_CALIBRATION="$work/none.json" run declared_core --set run.blas_coretype='"Haswell"'
/usr/bin/python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
def cores(name):
    launcher = re.search(r"GEMM peak for MFU: .*\(\d+ threads, (.*)\)$", open(f"{work}/{name}.log").read(), re.M)
    assert launcher, f"{name}: no BLAS in the peak line"
    return launcher.group(1), json.load(open(f"{work}/{name}/metrics.json"))["blas"]
launcher, ranks = cores("measured")
assert launcher == ranks, f"the launcher measured its peak with {launcher}, the ranks ran {ranks}"
core = ranks.split()[-1].lower()
if {"avx2", "fma"} <= flags:
    avx2_cores = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}
    assert core in avx2_cores, f"an AVX2 CPU runs OpenBLAS's {ranks} kernels"
for name in ("haswell", "declared_core"):
    launcher, ranks = cores(name)
    assert launcher == ranks and ranks.endswith("Haswell"), (name, launcher, ranks)
print(f"BLAS kernels: {ranks} as asked; {core} chosen for this CPU, the launcher's and the ranks' alike")
PY
if chorus_out=$("$train" 2>&1); then fail "chorus-train without a job exited 0"; fi
grep -q "a job file is needed" <<<"$chorus_out" || fail "no clear error without a job: $chorus_out"
/usr/bin/python3 - "$work" "$CHORUS_CALIBRATION" <<'PY'
import json, sys
work, file = sys.argv[1], sys.argv[2]
kept = json.load(open(file))
assert len(kept) == 1, kept
(machine, entry), = kept.items()
gflops = entry["fp32"]["gflops"]
assert gflops > 0, kept
m = json.load(open(f"{work}/calibrated/metrics.json"))
assert abs(m["peak_gflops"] - gflops) <= 1e-3 * gflops, (m["peak_gflops"], gflops)
assert m["peak_source"].startswith("calibrated"), m["peak_source"]
d = json.load(open(f"{work}/declared/metrics.json"))
assert d["peak_gflops"] == 0.1 and d["peak_source"].startswith("declared"), (d["peak_gflops"], d["peak_source"])
assert d["mean_mfu"] > 1, d["mean_mfu"]
print(f"calibrated {gflops:.1f} GFLOP/s for {machine}; the run took it; a declared 0.1 GFLOP/s gave MFU "
      f"{100 * d['mean_mfu']:.0f}%")
PY
echo "train_peak: declared, calibrated and measured peaks each said and used; the loss curve drawn or left out"
