// launch.h: how collbench's ranks start, shared with chorus-tune: forked by -g N, or one per
// process under chorusrun, torchrun, srun or mpiexec, and the peers --compare names.
#pragma once

#include <chorus/chorus.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/options.h"
#include "bench/peers.h"

namespace chorus::bench {

// Runs perRank(comm) on every rank and returns the exit code: under a launcher (this process is
// one rank; under mpiexec with --compare mpi, over MPI), or else on -g ranks forked here, waiting
// for them all (when one fails, the others get 10 s to finish, then are killed). perRank must
// destroy its communicator.
int runRanks(const Options& o, int* argc, char*** argv, const std::function<int(chorusComm_t)>& perRank);

// The peers --compare names, started on every rank; false (the reason on stderr) when one fails
// on any rank.
bool startPeers(const Options& o, chorusComm_t comm, std::vector<std::unique_ptr<Peer>>* peers);

// The CPUs this process may run on, as text: "0-3", "0,2", "5".
std::string allowedCpus();

}  // namespace chorus::bench
