#!/usr/bin/env bash
# chorus-tune writes a tuning file the tuner reads through CHORUS_TUNING_FILE: the base model and
# a measured correction for every algorithm of every collective with a choice (`collbench
# --calibrate` hands its command line to chorus-tune); a bad
# tuning file stops init with the file and line named; CHORUS_DEBUG=INFO shows the choices.
# collbench --bind core pins the forked ranks round robin over the CPUs it may use.
source "$(dirname "$0")/lib.sh"
file="$work/tuning.txt"
# Up to 1 KiB (8 sizes): under CI's load the full range (64 MiB) took 7.5 minutes at 3 ranks; up
# to 1 MiB it took 9-10 minutes beside other tests (108 s alone on CI), so ctest runs it alone, and
# on a short range: what this checks (the file's form, its use, its refusals) does not depend on
# the range, and alone on 2 cores 256 KiB took 74 s, 4 KiB 45-52 s, 1 KiB 32 s.
"$build/bench/chorus-tune" -g 3 --bind core --calibrate "$file" --calibrate-up-to 1K | tee "$work/cal.txt"
# collbench --calibrate is chorus-tune (its refusal of one rank says so).
if "$collbench" -g 1 --calibrate "$work/one.txt" >"$work/one.log" 2>&1; then fail "a calibration of one rank ran"; fi
grep -q "^chorus-tune: the calibration needs at least 2 ranks" "$work/one.log" || { cat "$work/one.log"; fail "collbench --calibrate did not run chorus-tune"; }
grep -qE '^shm alpha_us=[0-9.]+ beta_GBps=[0-9.]+ gamma_GBps=[0-9.]+ copy_GBps=[0-9.]+ overhead_us=[0-9.]+$' "$file" || { cat "$file"; fail "no shm line"; }
python3 - "$file" <<'PY'
import sys
expected = {"allreduce": 4, "allgather": 3, "reducescatter": 2, "alltoall": 2, "broadcast": 3, "reduce": 3}
seen = {}
for line in open(sys.argv[1]):
    words = line.split("#")[0].split()
    if len(words) < 2 or "=" in words[1]:
        continue
    op, algo = words[1].split(":")
    keys = dict(w.split("=") for w in words[2:])
    assert keys["ranks"] == "3", line
    sizes = [int(b) for b in keys["bytes"].split(",")]
    factors = [float(f) for f in keys["factors"].split(",")]
    assert len(sizes) == len(factors) >= 6 and sizes == sorted(sizes), line
    assert (1 << 9) < sizes[-1] <= (1 << 10), f"--calibrate-up-to 1K: {line}"
    assert sizes[0] <= 16, f"from 8 B (16 B where 8 B is less than a float per rank): {line}"
    assert all(0 < f < 1e6 for f in factors), line  # positive and finite: the reader needs no more
    seen.setdefault(op, set()).add(algo)
for op, count in expected.items():
    assert len(seen.get(op, ())) == count, f"{op}: corrections for {sorted(seen.get(op, ()))}"
print("corrections for", sum(len(v) for v in seen.values()), "algorithms")
PY
alpha=$(grep -oE 'alpha_us=[0-9.]+' "$file" | tail -1 | cut -d= -f2)
CHORUS_TUNING_FILE="$file" CHORUS_DEBUG=INFO "$collbench" -g 3 -b 8 -e 8 -n 1 -w 0 2>"$work/log.txt" >/dev/null
grep -q "tuner model (shm): alpha ${alpha:0:4}" "$work/log.txt" || { grep tuner "$work/log.txt"; fail "the tuning file was not used (alpha $alpha)"; }
grep -q "measured corrections for 17 algorithms at 3 ranks" "$work/log.txt" || { grep tuner "$work/log.txt"; fail "the corrections were not loaded"; }
grep -q "allreduce of 8 bytes uses" "$work/log.txt" || fail "CHORUS_DEBUG=INFO did not log the choice"
# At another rank count the corrections do not apply.
CHORUS_TUNING_FILE="$file" CHORUS_DEBUG=INFO "$collbench" -g 2 -b 8 -e 8 -n 1 -w 0 2>"$work/log2.txt" >/dev/null
grep -q "measured corrections for 0 algorithms at 2 ranks" "$work/log2.txt" || { grep tuner "$work/log2.txt"; fail "corrections for 3 ranks applied to 2"; }
printf 'shm alpha_us=3\nshm speed=fast\n' > "$work/bad.txt"
if CHORUS_TUNING_FILE="$work/bad.txt" "$collbench" -g 2 -b 8 -e 8 >"$work/out.txt" 2>&1; then fail "a bad tuning file was accepted"; fi
grep -q "bad.txt:2" "$work/out.txt" || { cat "$work/out.txt"; fail "the bad line was not named"; }
printf 'shm alpha_us=3\n\nshm allreduce:ring ranks=2 bytes=8,64 factors=1\n' > "$work/bad2.txt"
if CHORUS_TUNING_FILE="$work/bad2.txt" "$collbench" -g 2 -b 8 -e 8 >"$work/out2.txt" 2>&1; then fail "a short factor list was accepted"; fi
grep -q "bad2.txt:3: allreduce:ring needs ranks=N, bytes= in ascending order and as many factors= (2 sizes, 1 factors)" "$work/out2.txt" || { cat "$work/out2.txt"; fail "the bad correction was not named"; }
# Binding: rank r on the r-th CPU this shell may use, round robin.
"$collbench" -g 3 --bind core -b 8 -e 8 -n 1 -w 0 > "$work/bind.txt"
cpus=($(python3 -c "import os; print(*sorted(os.sched_getaffinity(0)))"))
for r in 0 1 2; do
  cpu=${cpus[$((r % ${#cpus[@]}))]}
  grep -qE "Rank +$r Pid +[0-9]+ on +[^ ]+ cpus $cpu " "$work/bind.txt" || { cat "$work/bind.txt"; fail "rank $r is not on CPU $cpu"; }
done
echo "tuner files ok"
