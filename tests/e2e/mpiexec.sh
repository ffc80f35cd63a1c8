#!/usr/bin/env bash
# Under MPICH's mpiexec every process is a rank; chorus meets through PMI with no set-up.
source "$(dirname "$0")/lib.sh"
mpiexec=$(command -v mpiexec.hydra || command -v mpiexec)
run_clean "$mpiexec" -n 3 "$collbench" --op allreduce -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
run_clean "$mpiexec" -n 2 "$collbench" --op broadcast -b 8 -e 1M -f 32 -c 1 -n 2 -w 1 -r 1
