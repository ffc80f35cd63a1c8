// search.h: rings and trees laid over a topology, NCCL-style. Ranks sit on devices (a CPU node or
// a GPU); a ring visits the ranks host by host, and within a host in the device order that gives
// the ring the most bandwidth, where a link crossed k times in one direction gives each crossing
// 1/k of its bandwidth. Among equally wide rings the one crossing the slowest kinds of link
// (inter-socket, host bridge, PCIe switch) the fewest times wins, then the one of least latency.
// Across hosts, ring c enters and leaves every host through the same NIC, the host's c-th (mod
// their number), and the search puts next to it the device nearest to it: GPU i with NIC i on
// every host, so each ring's traffic stays on one rail. Further rings (channels) are searched on
// what the earlier ones left of every link, as long as they reach the first ring's bandwidth.
// Trees follow NCCL too: a chain within each host in the ring's order, and across hosts two
// complementary binary trees of the hosts (a host interior in one is a leaf in the other).
#pragma once

#include <string>
#include <vector>

#include "src/topology/topology.h"

namespace chorus::topology {

struct Ring {
  std::vector<int> order;  // ranks, in the order the ring visits them
  std::vector<int> nics;   // per host the ring visits (in order): the NIC node it passes, or -1
  double bandwidth = 0;    // GB/s per direction the ring gets on its narrowest link
};

struct Tree {
  std::vector<std::vector<int>> chains;  // per host (in the ring's host order): its ranks, head first
  // Per host position in `chains`: the parent position in each of the two binary trees, -1 at
  // the root (position 0 in the first tree, the last position in the second).
  std::vector<int> parentA;
  std::vector<int> parentB;
};

struct Plan {
  std::vector<Ring> rings;  // one per channel
  std::vector<Tree> trees;  // one per channel
};

struct SearchOptions {
  int maxChannels = 16;
  // Hosts with more distinct devices than this are ordered by their place in the machine's tree
  // (package, NUMA node, PCI bus) instead of by exhaustive search.
  int exactDevices = 10;
};

// rankNode[r]: the node (CPU or GPU) rank r runs on. Throws std::invalid_argument naming the rank
// when a node is not a CPU or GPU, or when ranks span hosts one of which has no NIC.
Plan search(const Topology& topology, const std::vector<int>& rankNode, const SearchOptions& options = {});

// The plan as text: each ring with its bandwidth, NICs and the devices it visits; each tree.
std::string describe(const Topology& topology, const std::vector<int>& rankNode, const Plan& plan);

}  // namespace chorus::topology

namespace chorus::topology {

// The rank order for a communicator: hostTopologies[h] describes its host h (host 0 of each; the
// hosts are joined through their network nodes), rank r runs on host hostOfRank[r] at the node of
// id nodeOfRank[r] ("cpu1", "gpu3"). Returns the first ring's order. Throws std::invalid_argument
// as search() does, and naming a rank whose node its host does not have.
std::vector<int> searchRankOrder(const std::vector<Topology>& hostTopologies, const std::vector<int>& hostOfRank,
                                 const std::vector<std::string>& nodeOfRank);

// The ring order for ranks on the GPUs of one host (its host 0), each given by its GPU's PCI bus
// id as CUDA writes it (any case; several ranks may share a GPU): the first ring searched over
// them, position -> rank, so the device path's ring follows NVLink where there is some. Throws
// std::invalid_argument naming a rank whose bus id is none of the host's GPUs.
std::vector<int> gpuRingOrder(const Topology& host, const std::vector<std::string>& busIdOfRank);

}  // namespace chorus::topology
