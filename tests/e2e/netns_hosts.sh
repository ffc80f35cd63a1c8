#!/usr/bin/env bash
# Ranks on separate hosts, made on this machine by tools/netns-hosts (2 network namespaces x 2
# ranks): every collective checked over auto, tcp and ucx, ranks on the other host reached by the
# transport named and ranks on the same host by shm (auto) or the forced transport; the
# hierarchical all-reduce, all-gather, reduce-scatter, broadcast and reduce checked over tcp and
# ucx; the rank order searched over unlike hosts' topologies; then collbench across the hosts, flat,
# hierarchical and the tuner's choice. Skips (exit 77) where namespaces cannot be made (no root, no
# `ip`).
source "$(dirname "$0")/lib.sh"
hosts="$source_dir/tools/netns-hosts"
export CHORUS_NETNS_NAME="chorus-e2e-$$"
if ! "$hosts" check; then echo "SKIP: namespace hosts cannot be made here (see above)"; exit 77; fi
trap '"$hosts" down; rm -rf "$work"' EXIT
"$hosts" up 2
export CHORUS_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
# Below Linux's ephemeral range (32768 and up): the ranks' own listeners take ports from that range,
# and one of them could hold the next root port before the root binds it.
port=$((20000 + $$ % 10000))

# Runs "$@" as 2 ranks on each of the 2 hosts; each host's output goes to $work/$tag.hN.
across() {
  local tag=$1; shift
  port=$((port + 1))
  local pids=()
  for h in 0 1; do
    "$hosts" exec $h "$source_dir/tools/chorusrun" -n 2 --nnodes 2 --node-rank $h --master-addr 10.77.0.1 \
      --master-port $port "$@" >"$work/$tag.h$h" 2>&1 &
    pids+=($!)
  done
  local status=0
  for p in "${pids[@]}"; do wait "$p" || status=$?; done
  if [ "$status" != 0 ]; then cat "$work/$tag.h0" "$work/$tag.h1"; fail "$tag: exit status $status"; fi
}

for transport in auto tcp ucx; do
  CHORUS_TRANSPORT=$transport CHORUS_DEBUG=info across "check-$transport" "$build/tests/launched_collectives"
  for h in 0 1; do
    out="$work/check-$transport.h$h"
    [ "$(grep -c "every collective right" "$out")" = 2 ] || { cat "$out"; fail "$transport: host $h's ranks"; }
  done
  # Host 0 has ranks 0 and 1, host 1 ranks 2 and 3: rank 0's peers 1 (same host), 2 and 3.
  line=$(grep -m1 "rank 0 of 4 ready" "$work/check-$transport.h0") || fail "$transport: no transport line"
  case $transport in
    auto) want=" 0:self 1:shm 2:ucx 3:ucx" ;;
    *) want=" 0:self 1:$transport 2:$transport 3:$transport" ;;
  esac
  [[ $line == *"peer:$want" ]] || fail "$transport: rank 0's transports: '$line', expected '$want'"
  echo "every collective right across 2 namespace hosts x 2 ranks, CHORUS_TRANSPORT=$transport"
done

# The hierarchical collectives on real ranks: within each host and along rails across hosts.
hierarchical=allreduce:hierarchical,allgather:hierarchical,reducescatter:hierarchical,broadcast:hierarchical
hierarchical+=,reduce:hierarchical
for transport in tcp ucx; do
  CHORUS_TRANSPORT=$transport CHORUS_ALGO=$hierarchical across "hier-$transport" "$build/tests/launched_collectives"
  for h in 0 1; do
    [ "$(grep -c "every collective right" "$work/hier-$transport.h$h")" = 2 ] ||
      { cat "$work/hier-$transport.h$h"; fail "hierarchical over $transport: host $h's ranks"; }
  done
  echo "every collective right with the hierarchical algorithms, CHORUS_TRANSPORT=$transport"
done

# Unlike hosts: with a file of two (host i of the communicator takes the file's host i), ranks
# must send each other their host's topology. Host 1 has two sockets, and its launcher binds its
# ranks in reverse (rank 2 to processor 1, rank 3 to 0): the ring enters host 1 beside its NIC, at
# rank 3's socket, so rank 0 can only find the order 0,1,3,2 from host 1's topology.
CHORUS_TOPO_FILE="$source_dir/tests/data/topology/unlike-pair.chorus.xml" CHORUS_DEBUG=info across unlike \
  sh -c 'exec taskset -c $((1 - LOCAL_RANK)) "$0" "$@"' "$collbench" -b 64K -e 64K -n 2 -w 1
grep -q "rank 0: rank order from the topology search: 0,1,3,2" "$work/unlike.h0" ||
  { cat "$work/unlike.h0"; fail "unlike hosts: rank 0 did not search the order 0,1,3,2"; }
grep -q "Out of bounds values : 0 OK" "$work/unlike.h0" || fail "collbench over the searched order"
echo "unlike hosts sent their topologies: order 0,1,3,2"

for transport in tcp ucx; do
  CHORUS_TRANSPORT=$transport CHORUS_DEBUG=info across "bench-$transport" "$collbench" --op allreduce -b 4K -e 4M \
    -f 32 -n 3 -w 1 --algo ring,hierarchical,default
  grep -v "^chorus" "$work/bench-$transport.h0"
  grep "tuner: allreduce" "$work/bench-$transport.h0" || fail "no tuner line from rank 0 over $transport"
  grep -q "(2 host(s))" "$work/bench-$transport.h0" || fail "the tuner did not see 2 hosts over $transport"
  grep -q "Out of bounds values : 0 OK" "$work/bench-$transport.h0" || fail "collbench over $transport"
done
for collective in allgather reducescatter broadcast reduce; do
  CHORUS_TRANSPORT=ucx CHORUS_DEBUG=info across "bench-$collective" "$collbench" --op $collective -b 64K -e 4M \
    -f 64 -n 3 -w 1 --algo hierarchical,default
  grep -v "^chorus" "$work/bench-$collective.h0"
  grep -q "(2 host(s))" "$work/bench-$collective.h0" || fail "the tuner did not see 2 hosts for $collective"
  grep -q "Out of bounds values : 0 OK" "$work/bench-$collective.h0" || fail "collbench $collective over ucx"
done
