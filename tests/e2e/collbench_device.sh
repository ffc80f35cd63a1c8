#!/usr/bin/env bash
# collbench --mem device: every collective (and sendrecv, a group of device sends and receives) on CUDA buffers, 2 and 4 ranks sharing the machine's
# GPUs (rank % devices), over the three device paths (direct, ipc, staged), sizes from the LL protocol's
# to the bulk one's, each checked (#wrong 0), and a spoiled value still caught. Without a usable
# device collbench must refuse by saying so; then the test is skipped (exit 77).
# CHORUS_COLLBENCH names another collbench (tests/collbench-emulated: e2e_collbench_device_emulated,
# the device CUDA emulated on the host), CHORUS_DEVICE_TOP the largest size of the sweeps (default
# 8M) and CHORUS_DEVICE_BOUND the size of the bound's row (default 64M): the emulated device copies
# at host speed and runs kernels on one thread.
source "$(dirname "$0")/lib.sh"
collbench=${CHORUS_COLLBENCH:-$collbench}
largest=${CHORUS_DEVICE_TOP:-8M}
bound=${CHORUS_DEVICE_BOUND:-64M}
if "$collbench" -g 2 --mem device --compare gloo >"$work/out.txt" 2>&1; then fail "--compare accepted with --mem device"; fi
grep -q "cannot be used with --mem device" "$work/out.txt" || { cat "$work/out.txt"; fail "no message naming --mem device"; }
if ! "$collbench" -g 1 --mem device -b 8 -e 8 -n 1 -w 0 >"$work/probe.txt" 2>&1; then
  cat "$work/probe.txt"
  grep -qE "no usable CUDA device here|has no CUDA" "$work/probe.txt" || fail "--mem device failed without saying why"
  echo "SKIPPED: needs a CUDA device; run on a GPU machine"
  exit 77
fi
for ranks in 2 4; do
  for transport in direct ipc staged; do
    export CHORUS_DEVICE_TRANSPORT=$transport
    # The ipc ring's kernels wait on each other across processes: on one GPU without MPS every
    # step waits for a time slice (milliseconds), so that path goes to 256 KiB here (its bulk
    # protocol starts below that).
    top=$largest
    [ "$transport" = ipc ] && [ "$largest" = 8M ] && top=256K
    for op in allreduce allgather reducescatter broadcast reduce alltoall gather scatter sendrecv; do
      run_clean "$collbench" -g "$ranks" --mem device --op "$op" -b 4 -e "$top" -f 16 -n 3 -w 1
    done
    run_clean "$collbench" -g "$ranks" --mem device --op allreduce -d all -o all -b 1K -e "$top" -f 1024 -n 2 -w 1
    run_clean "$collbench" -g "$ranks" --mem device --op allreduce -b 4K -e "$top" -f 1024 -n 20 -w 2 -z 0
    run_clean "$collbench" -g "$ranks" --mem device --op barrier -n 5 -w 1
    # Compressed all-reduces of device buffers (staged through the host by chorus): every rank
    # gets the same bits.
    "$collbench" -g "$ranks" --mem device --op allreduce -o avg --compress topk:0.05 --compress bf16 \
      --compress powersgd:2 -b 16K -e 64K -f 4 -n 2 -w 1 >"$work/out.txt" 2>&1 ||
      { cat "$work/out.txt"; fail "--compress on device buffers ($transport, $ranks ranks)"; }
    cat "$work/out.txt"
    grep -q "Ranks that disagreed : 0 OK" "$work/out.txt" || fail "--compress: ranks disagreed ($transport, $ranks ranks)"
    # The fp32 all-reduce crosses the host's transports on the staged path only: there a row gives
    # a ratio of wire bytes, on the direct and ipc paths "-".
    ratios=$(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^(topk|bf16|powersgd)/ { print ($8 == "-" ? "-" : "number") }' "$work/out.txt" | sort -u)
    want=-
    [ "$transport" = staged ] && want=number
    [ "$ratios" = "$want" ] || fail "--compress over $transport ($ranks ranks): ratio column reads '$ratios', not '$want'"
  done
done
# The direct all-reduce read in place at every size, by every rank and by rank 0 alone.
for reducers in all one; do
  for ranks in 2 4; do
    CHORUS_DEVICE_TRANSPORT=direct CHORUS_DEVICE_DIRECT_INPLACE_BYTES=1 CHORUS_DEVICE_DIRECT_REDUCERS=$reducers \
      run_clean "$collbench" -g "$ranks" --mem device --op allreduce -d all -o all -b 1K -e "$largest" -f 1024 -n 2 -w 1
  done
done
unset CHORUS_DEVICE_TRANSPORT
run_clean "$collbench" -g 2 --mem device --op allreduce -b "$bound" -e "$bound" -n 5 -w 1 --bound --json "$work/device.json"
# The bound counts each GPU once: as many as the rank lines name (host and device), so 2 ranks
# sharing one GPU copy on one.
/usr/bin/python3 - "$work/device.json" "$work/out.txt" <<'PY'
import json, re, sys
doc = json.load(open(sys.argv[1]))
gpus = set(re.findall(r"^#  Rank +\d+ Pid +\d+ on +(\S+) .* device (\d+) \(", open(sys.argv[2]).read(), re.M))
assert doc["mem"] == "device", doc["mem"]
assert doc["copy_GBps"] > 0, doc
assert len(gpus) >= 1, "no rank line names its device"
assert doc["copy_devices"] == len(gpus), f"copy bound over {doc['copy_devices']} GPUs; the ranks are on {sorted(gpus)}"
assert doc["rows"][0]["out_of_place"]["wrong"] == 0
PY
for op in allreduce broadcast reduce sendrecv; do
  if "$collbench" -g 2 --mem device --op "$op" -b 64 -e 64 -n 1 -w 0 -r 1 --inject-wrong >"$work/out.txt" 2>&1; then
    cat "$work/out.txt"; fail "$op: a spoiled device result was not caught"
  fi
  grep -q "FAILED" "$work/out.txt" || { cat "$work/out.txt"; fail "$op: no FAILED footer"; }
done
echo "collbench on device buffers: every collective checked"
