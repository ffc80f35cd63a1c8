// placement.h: where the ranks of a communicator run, decided at init. This process is bound to
// a CPU node of its host (CHORUS_BIND), once per process; every rank tells the others its node
// and its host's topology (discovered, or CHORUS_TOPO_FILE's); and the topology search
// (src/topology/search.h) lays the ring the rank order follows. Collective: every rank of the
// communicator calls it once the peers are known. Not thread-safe against itself.
#pragma once

#include <string>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/topology/topology.h"
#include "src/transport/transport.h"

namespace chorus {

// Binds this process (the first time), exchanges places and returns the searched rank order
// (position -> rank), or an empty vector when it is 0..n-1 or cannot be searched (the log says
// why at CHORUS_DEBUG=info). hostOfRank numbers the hosts by their lowest rank. Throws
// chorusInvalidArgument for a bad CHORUS_BIND or CHORUS_TOPO_FILE, chorusTimeout or
// chorusRemoteError when the exchange fails.
std::vector<int> placeRanks(Bootstrap& bootstrap, int rank, const std::vector<PeerInfo>& peers,
                            const std::vector<int>& hostOfRank, Deadline deadline);

// This process's host out of the machine's topology (discovered, or CHORUS_TOPO_FILE's), read
// once per process; an empty topology where discovery failed.
topology::Topology thisHostTopology();

}  // namespace chorus
