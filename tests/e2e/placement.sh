#!/usr/bin/env bash
# Binding and the searched rank order on real ranks (tools/chorusrun, 4 ranks), over a topology
# file describing this machine's two processors as two NUMA nodes on two sockets
# (tests/data/topology/two-node-vm.chorus.xml):
# - CHORUS_BIND=auto binds local ranks in blocks: ranks 0,1 to processor 0, ranks 2,3 to 1; the
#   rank order stays 0..3 (the blocks already cross the sockets only twice);
# - ranks a launcher bound alternately (taskset: 0,2 on processor 0, 1,3 on 1) keep that binding,
#   and the ring is laid socket by socket: order 0,2,1,3, every collective right over it;
# - CHORUS_RANK_ORDER overrides the search; CHORUS_BIND=none binds nothing; a bad CHORUS_BIND
#   fails init naming it.
# Only the searched order's run checks every collective at the large count too; the others, which
# check where the ranks ran, leave it out (CHORUS_TEST_COUNTS=small).
source "$(dirname "$0")/lib.sh"
# The processors this test may use, as the program prints them: unbound ranks keep these.
all=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
[[ ",$all," == *",0,1,"* ]] || { echo "SKIP: needs processors 0 and 1 (has $all)"; exit 77; }
export CHORUS_TOPO_FILE="$source_dir/tests/data/topology/two-node-vm.chorus.xml"
export CHORUS_DEBUG=info
export CHORUS_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
launched="$build/tests/launched_collectives"

# Runs 4 ranks of "$@" (a shell command line, LOCAL_RANK set) into $work/$1.
ranks() {
  local tag=$1; shift
  "$source_dir/tools/chorusrun" -n 4 sh -c "$*" >"$work/$tag" 2>&1 || { cat "$work/$tag"; fail "$tag: exit status"; }
}
# Requires each rank's line to say it ran on the processors given (rank 0's first).
processors() {
  local tag=$1; shift
  for r in 0 1 2 3; do
    grep -q "rank $r of 4: every collective right (transport auto, processors $1)" "$work/$tag" ||
      { cat "$work/$tag"; fail "$tag: rank $r not right on processors $1"; }
    shift
  done
}

CHORUS_TEST_COUNTS=small ranks auto "exec $launched"
processors auto 0 0 1 1
grep -q "local rank 2 of 4 bound to CPU node 1 of 2 (processors 1)" "$work/auto" || fail "auto: no binding line"
if grep -q "rank order from the topology search" "$work/auto"; then fail "auto: the blocks should keep 0..3"; fi
echo "CHORUS_BIND=auto: ranks 0,1 on processor 0, ranks 2,3 on processor 1, order 0..3"

ranks launcher 'exec taskset -c $((LOCAL_RANK % 2)) '"$launched"
processors launcher 0 1 0 1
grep -q "kept the launcher's binding" "$work/launcher" || fail "launcher: binding not kept"
grep -q "rank 0: rank order from the topology search: 0,2,1,3" "$work/launcher" ||
  { cat "$work/launcher"; fail "launcher: no searched order 0,2,1,3"; }
echo "ranks bound alternately by the launcher: order 0,2,1,3 from the search, every collective right"

CHORUS_TEST_COUNTS=small CHORUS_RANK_ORDER=0,1,2,3 ranks given 'exec taskset -c $((LOCAL_RANK % 2)) '"$launched"
processors given 0 1 0 1
if grep -q "rank order from the topology search" "$work/given"; then fail "CHORUS_RANK_ORDER did not win"; fi
echo "CHORUS_RANK_ORDER wins over the search"

CHORUS_TEST_COUNTS=small CHORUS_BIND=none ranks none "exec $launched"
processors none "$all" "$all" "$all" "$all"
grep -q "not bound (CHORUS_BIND=none)" "$work/none" || fail "none: no line saying so"
echo "CHORUS_BIND=none binds nothing"

if CHORUS_BIND=sometimes "$source_dir/tools/chorusrun" -n 2 "$launched" >"$work/bad" 2>&1; then
  fail "CHORUS_BIND=sometimes was accepted"
fi
grep -q "CHORUS_BIND 'sometimes' is not auto or none" "$work/bad" || { cat "$work/bad"; fail "bad CHORUS_BIND message"; }
echo "a bad CHORUS_BIND fails init naming it"
