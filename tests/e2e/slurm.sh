#!/usr/bin/env bash
# srun starts chorus ranks: a one-node Slurm cluster (Debian's slurm-wlm, authenticated by its own
# munge daemon), all in a private directory with its own ports, runs `srun -n 4 collbench ...`
# (each task one rank, meeting through Slurm's environment alone) and `srun --mpi=pmi2 -n 3` (through
# Slurm's PMI), and checks the results. Skipped (exit 77), saying why, only where Slurm cannot run.
source "$(dirname "$0")/lib.sh"
skip() { echo "SKIPPED: $*"; exit 77; }
for tool in slurmctld slurmd srun sinfo munged; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (tools/setup installs slurm-wlm and munge)"
done
[ "$(id -u)" -eq 0 ] || skip "the test cluster's daemons run as root here, and this is not root"

cluster="$work/slurm"
mkdir -p "$cluster/state" "$cluster/spool" "$cluster/munge"
chmod 700 "$cluster/munge"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=$(free_port)
node=$(hostname -s)
cpus=$(nproc)

# munge: a key of our own, a socket of our own.
dd if=/dev/urandom of="$cluster/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$cluster/munge/munge.key"
munged --force --key-file="$cluster/munge/munge.key" --socket="$cluster/munge/munge.socket" \
  --pid-file="$cluster/munge/munged.pid" --log-file="$cluster/munge/munged.log" \
  --seed-file="$cluster/munge/munged.seed" || skip "munged does not start here: $(tail -n 3 "$cluster/munge/munged.log" 2>/dev/null)"

cat >"$cluster/slurm.conf" <<EOF
ClusterName=chorustest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$cluster/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/slurmctld.log
SlurmdLogFile=$cluster/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=chorus Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$cluster/slurm.conf"
# The daemons write their state as they stop: wait (up to 10 s each) until they are gone before the
# directory is removed, or the removal races their last writes.
stop_cluster() {
  local status=$? pid
  for file in "$cluster/slurmd.pid" "$cluster/slurmctld.pid" "$cluster/munge/munged.pid"; do
    [ -s "$file" ] || continue
    pid=$(cat "$file")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work" || true; }
  exit "$status"
}
trap stop_cluster EXIT
slurmctld -f "$SLURM_CONF" -i || skip "slurmctld does not start here: $(tail -n 3 "$cluster/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" -N "$node" || skip "slurmd does not start here: $(tail -n 3 "$cluster/slurmd.log" 2>/dev/null)"
for _ in $(seq 60); do
  sinfo -h -o "%t" 2>/dev/null | grep -qE "idle|mix" && break
  sleep 0.5
done
sinfo -h -o "%t" | grep -qE "idle|mix" || skip "the node never came up: $(sinfo -h 2>&1; tail -n 5 "$cluster/slurmd.log")"

# Four tasks on this node's CPUs (--overcommit: more tasks than cores), each one rank.
out="$work/srun.txt"
if ! timeout 300 srun --overcommit -n 4 "$collbench" --op allreduce -b 8 -e 1M -f 16 -n 5 -w 1 >"$out" 2>&1; then
  cat "$out"; fail "srun -n 4 collbench failed"
fi
cat "$out"
grep -q "nranks: 4" "$out" || fail "collbench did not see 4 ranks"
[ "$(grep -c "^#  Rank" "$out")" = 4 ] || fail "not one rank line per task"
grep -q "Out of bounds values : 0 OK" "$out" || fail "wrong values under srun"
# Slurm's PMI (srun --mpi=pmi2 speaks the PMI-1 wire protocol to PMI-1 clients).
if srun --mpi=list 2>&1 | grep -q pmi2; then
  if ! timeout 300 srun --overcommit --mpi=pmi2 -n 3 "$collbench" --op allgather -b 1K -e 64K -f 8 -n 3 -w 1 >"$out" 2>&1; then
    cat "$out"; fail "srun --mpi=pmi2 -n 3 collbench failed"
  fi
  grep -q "nranks: 3" "$out" && grep -q "Out of bounds values : 0 OK" "$out" || { cat "$out"; fail "srun --mpi=pmi2 run wrong"; }
  echo "srun --mpi=pmi2: 3 ranks ok"
fi
echo "srun starts chorus ranks"
