// placement.cc: binding this process, exchanging places and searching the rank order.
#include "src/core/placement.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/topology/bind.h"
#include "src/topology/discover.h"
#include "src/topology/search.h"

namespace chorus {
namespace {

using topology::NodeKind;
using topology::Topology;

// What every rank tells the others: the node it runs on and a fingerprint of its host's
// topology (hosts alike in every detail send their topology once, as one).
struct Place {
  char node[32] = {};
  uint64_t topologyHash = 0;
};

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// The machine (or CHORUS_TOPO_FILE's: topology::localTopology), read once per process.
const Topology& machine() {
  static std::mutex mutex;
  static std::optional<Topology> topology;
  std::lock_guard<std::mutex> lock(mutex);
  if (!topology) {
    try {
      topology = topology::localTopology();
    } catch (const std::exception& e) {
      // A bad file is the user's to fix; a machine hwloc cannot read only costs the search.
      if (knobSet(Knob::kTopoFile)) fail(chorusInvalidArgument, "CHORUS_TOPO_FILE: {}", e.what());
      logAt(LogLevel::kWarn, "topology discovery failed ({}); ranks keep their numbers' order", e.what());
      topology = Topology{};
    }
  }
  return *topology;
}

// This rank's host out of the machine's topology: the host of this host name, else (a cluster
// file naming other hosts) the communicator's host number modulo the file's hosts.
Topology hostTopology(const Topology& all, int communicatorHost) {
  Topology one;
  if (all.hosts.empty()) return one;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  int host = static_cast<int>(std::find(all.hosts.begin(), all.hosts.end(), std::string(name)) - all.hosts.begin());
  if (host == static_cast<int>(all.hosts.size())) host = communicatorHost % static_cast<int>(all.hosts.size());
  one.addHostFrom(all, host, all.hosts[host]);
  return one;
}

// The node this process runs on (binding it the first time), as an id of `host`'s CPU nodes.
std::string bindOnce(const Topology& host, int rank, int localRank, int localSize, bool sharedProcess) {
  static std::mutex mutex;
  static bool bound = false;
  std::lock_guard<std::mutex> lock(mutex);
  const std::vector<int> cpuNodes = host.nodesOf(0, NodeKind::kCpu);
  std::vector<std::vector<int>> nodeCpus;
  for (int node : cpuNodes) {
    try {
      nodeCpus.push_back(topology::parseCpuList(host.nodes[node].cpus));
    } catch (const std::invalid_argument& e) {
      logAt(LogLevel::kInfo, "rank {}: CPU node '{}': {}", rank, host.nodes[node].id, e.what());
      nodeCpus.emplace_back();
    }
  }
  const std::string bind = knobString(Knob::kBind);
  if (bind != "auto" && bind != "none") fail(chorusInvalidArgument, "CHORUS_BIND '{}' is not auto or none", bind);
  // A later communicator of the process finds it where the first one put it.
  const topology::BindChoice choice =
      topology::chooseBinding(nodeCpus, topology::onlineCpus(), topology::currentCpus(), localRank, localSize,
                              bound ? "none" : bind, sharedProcess);
  std::string outcome;
  if (!choice.cpus.empty()) {
    const std::string failed = topology::bindProcess(choice.cpus, host.nodes[cpuNodes[choice.node]].index);
    if (!failed.empty()) outcome = "; " + failed;
  }
  if (!bound) logAt(LogLevel::kInfo, "rank {}: {}{}", rank, choice.reason, outcome);
  bound = true;
  if (choice.node >= 0) return host.nodes[cpuNodes[choice.node]].id;
  return cpuNodes.empty() ? "" : host.nodes[cpuNodes.front()].id;
}

}  // namespace

topology::Topology thisHostTopology() { return hostTopology(machine(), 0); }

std::vector<int> placeRanks(Bootstrap& bootstrap, int rank, const std::vector<PeerInfo>& peers,
                            const std::vector<int>& hostOfRank, Deadline deadline) {
  const int nranks = static_cast<int>(peers.size());
  // Local rank: this process's place among the processes of its host (a process holding several
  // ranks counts once, by its lowest).
  int localRank = 0, localSize = 0;
  bool sharedProcess = false;
  for (int r = 0; r < nranks; ++r) {
    if (peers[r].hostHash != peers[rank].hostHash) continue;
    if (r != rank && peers[r].pid == peers[rank].pid) sharedProcess = true;
    bool firstOfProcess = true;
    for (int q = 0; q < r; ++q) {
      firstOfProcess = firstOfProcess && !(peers[q].hostHash == peers[r].hostHash && peers[q].pid == peers[r].pid);
    }
    if (!firstOfProcess) continue;
    if (r < rank) ++localRank;
    ++localSize;
  }
  const Topology host = hostTopology(machine(), hostOfRank[rank]);
  const std::string node = bindOnce(host, rank, localRank, localSize, sharedProcess);
  // Sent and compared without its host name, so alike hosts of different names agree.
  std::string xml;
  if (!host.hosts.empty()) {
    Topology unnamed;
    unnamed.addHostFrom(host, 0, "host");
    xml = topology::toChorusXml(unnamed);
  }

  std::vector<Place> places(static_cast<size_t>(nranks));
  std::strncpy(places[rank].node, node.c_str(), sizeof(places[rank].node) - 1);
  places[rank].topologyHash = fnv1a(xml);
  bootstrap.allGather(places.data(), sizeof(Place), deadline);

  // Each host's topology: this one's where the fingerprints agree, else as its lowest rank sent it.
  bool alike = true;
  for (const Place& place : places) alike = alike && place.topologyHash == places[rank].topologyHash;
  std::vector<std::vector<char>> sent;
  if (!alike) {
    const bool lowestOfHost =
        std::find(hostOfRank.begin(), hostOfRank.end(), hostOfRank[rank]) - hostOfRank.begin() == rank;
    sent = bootstrap.allGatherBlobs(lowestOfHost ? std::vector<char>(xml.begin(), xml.end()) : std::vector<char>{},
                                    deadline);
  }
  const int hosts = *std::max_element(hostOfRank.begin(), hostOfRank.end()) + 1;
  std::vector<Topology> hostTopologies(static_cast<size_t>(hosts));
  std::vector<std::string> nodeOfRank(static_cast<size_t>(nranks));
  try {
    for (int r = 0; r < nranks; ++r) {
      nodeOfRank[r] = places[r].node;
      if (nodeOfRank[r].empty()) throw std::invalid_argument(fmt::format("rank {} knows no node of its host", r));
      const int h = hostOfRank[r];
      if (!hostTopologies[h].hosts.empty()) continue;
      const bool mine = places[r].topologyHash == places[rank].topologyHash;
      hostTopologies[h] = mine ? host
                               : topology::parseChorusXml(std::string(sent[r].begin(), sent[r].end()),
                                                          fmt::format("rank {}'s host topology", r));
    }
    std::vector<int> order = topology::searchRankOrder(hostTopologies, hostOfRank, nodeOfRank);
    std::vector<int> numbers(static_cast<size_t>(nranks));
    std::iota(numbers.begin(), numbers.end(), 0);
    return order == numbers ? std::vector<int>{} : order;
  } catch (const std::invalid_argument& e) {
    if (rank == 0) logAt(LogLevel::kInfo, "rank 0: no topology search ({}); ranks keep their numbers' order", e.what());
    return {};
  }
}

}  // namespace chorus
