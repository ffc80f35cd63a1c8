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
echo "chorusrun ok"
