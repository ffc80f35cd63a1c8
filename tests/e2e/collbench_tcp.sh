#!/usr/bin/env bash
# collbench over tcp (forced for every peer) with an odd rank count and sizes past the chunk size.
source "$(dirname "$0")/lib.sh"
CHORUS_TRANSPORT=tcp run_clean "$collbench" -g 3 --op allreduce -b 1K -e 4M -f 16 -n 3 -w 1 -c 1
CHORUS_TRANSPORT=tcp run_clean "$collbench" -g 3 --op allgather -b 1K -e 4M -f 64 -n 3 -w 1 -c 1 -d half
