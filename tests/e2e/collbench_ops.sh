#!/usr/bin/env bash
# Every collbench op over every type and reduction, 4 local ranks (shm), results checked.
source "$(dirname "$0")/lib.sh"
for op in allreduce allgather reducescatter broadcast reduce sendrecv; do
  run_clean "$collbench" -g 4 --op "$op" -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all -r 3
done
