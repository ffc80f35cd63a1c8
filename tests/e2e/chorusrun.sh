#!/usr/bin/env bash
# tools/chorusrun starts N ranks with the environment bootstrap; it returns the first failing
# rank's exit status and stops the others.
source "$(dirname "$0")/lib.sh"
run="$source_dir/tools/chorusrun"
run_clean "$run" -n 3 "$collbench" --op allreduce -b 8 -e 1M -f 16 -n 2 -w 1 -c 1
run_clean "$run" -n 2 --transport tcp "$collbench" --op reducescatter -b 1K -e 64K -f 8 -n 2 -w 1 -c 1
set +e
"$run" -n 3 bash -c 'if [ "$RANK" = 1 ]; then exit 7; fi; sleep 60' 2>"$work/err.txt"
code=$?
set -e
[ "$code" = 7 ] || { cat "$work/err.txt"; fail "chorusrun returned $code, expected rank 1's 7"; }
grep -q "rank 1" "$work/err.txt" || fail "chorusrun did not name the failing rank"
out=$("$run" -n 4 bash -c 'echo "$RANK/$WORLD_SIZE/$LOCAL_RANK"' | sort | tr '\n' ' ')
[ "$out" = "0/4/0 1/4/1 2/4/2 3/4/3 " ] || fail "environment per rank: '$out'"
# SIGTERM to chorusrun reaches every rank.
"$run" -n 3 bash -c 'trap "echo got-term > '"$work"'/term.\$RANK; exit 0" TERM; touch '"$work"'/up.$RANK; for i in $(seq 600); do sleep 0.1; done' &
launcher=$!
for i in $(seq 200); do [ "$(ls "$work"/up.* 2>/dev/null | wc -l)" = 3 ] && break; sleep 0.05; done
kill -TERM "$launcher"
wait "$launcher" || true
for r in 0 1 2; do [ -f "$work/term.$r" ] || fail "rank $r did not receive the forwarded SIGTERM"; done
echo "chorusrun ok"
