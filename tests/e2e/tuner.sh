#!/usr/bin/env bash
# collbench --calibrate writes a tuning file the tuner reads through CHORUS_TUNING_FILE; a bad
# tuning file stops init with the file and line named; CHORUS_DEBUG=INFO shows the choices.
source "$(dirname "$0")/lib.sh"
file="$work/tuning.txt"
"$collbench" -g 2 --calibrate "$file" | tee "$work/cal.txt"
grep -qE '^shm alpha_us=[0-9.]+ beta_GBps=[0-9.]+ gamma_GBps=[0-9.]+ copy_GBps=[0-9.]+ overhead_us=[0-9.]+$' "$file" || { cat "$file"; fail "no shm line"; }
alpha=$(grep -oE 'alpha_us=[0-9.]+' "$file" | tail -1 | cut -d= -f2)
CHORUS_TUNING_FILE="$file" CHORUS_DEBUG=INFO "$collbench" -g 2 -b 8 -e 8 -n 1 -w 0 2>"$work/log.txt" >/dev/null
grep -q "tuner model (shm): alpha ${alpha:0:4}" "$work/log.txt" || { grep tuner "$work/log.txt"; fail "the tuning file was not used (alpha $alpha)"; }
grep -q "allreduce of 8 bytes uses" "$work/log.txt" || fail "CHORUS_DEBUG=INFO did not log the choice"
printf 'shm alpha_us=3\nshm speed=fast\n' > "$work/bad.txt"
if CHORUS_TUNING_FILE="$work/bad.txt" "$collbench" -g 2 -b 8 -e 8 >"$work/out.txt" 2>&1; then fail "a bad tuning file was accepted"; fi
grep -q "bad.txt:2" "$work/out.txt" || { cat "$work/out.txt"; fail "the bad line was not named"; }
echo "tuner files ok"
