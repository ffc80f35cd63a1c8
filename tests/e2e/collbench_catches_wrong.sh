#!/usr/bin/env bash
# A wrong value makes collbench say FAILED and exit non-zero (the check can fail); bad
# arguments are refused with a non-zero exit.
source "$(dirname "$0")/lib.sh"
for op in allreduce reduce broadcast sendrecv alltoallv; do
  if "$collbench" -g 3 --op "$op" -b 64 -e 64 -n 1 -w 0 -r 1 --inject-wrong >"$work/out.txt" 2>&1; then
    cat "$work/out.txt"; fail "$op: collbench exited 0 with a spoiled value"
  fi
  grep -q "FAILED" "$work/out.txt" || { cat "$work/out.txt"; fail "$op: no FAILED footer"; }
done
if "$collbench" -g 2 --op broadcast -r 5 -b 8 -e 8 >"$work/out.txt" 2>&1; then fail "root 5 of 2 ranks accepted"; fi
grep -q "root 5" "$work/out.txt" || { cat "$work/out.txt"; fail "no message naming the root"; }
if "$collbench" --op nosuchop >/dev/null 2>&1; then fail "unknown op accepted"; fi
echo "wrong values and bad arguments are caught"
