// topology.h: the machine (or cluster) as a graph of devices and links. Nodes are CPUs (one per
// NUMA node, with its cores and memory), GPUs, NICs, PCIe switches, NVSwitches and network
// switches; links are typed (NVLink, PCIe, host bridge, on-package, inter-socket, NIC, network)
// and carry a bandwidth per direction and a latency. Discovery (discover.cc), the XML readers
// and writer (xml.cc) fill it; the ring and tree search (search.h) reads it. No threads, no
// communication.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::topology {

enum class NodeKind : uint8_t { kCpu, kGpu, kNic, kPciSwitch, kNvSwitch, kNetwork };
const char* nodeKindName(NodeKind kind);

// Ordered from the fastest kind of crossing to the slowest: the search counts crossings of the
// later kinds as worse.
enum class LinkKind : uint8_t { kNvLink, kPcie, kHostBridge, kPackage, kInterSocket, kNic, kNetwork, kCount };
const char* linkKindName(LinkKind kind);
// The inverse of the names above ("nvlink", "pcie", ...); false for an unknown name.
bool parseLinkKind(const std::string& name, LinkKind* kind);
bool parseNodeKind(const std::string& name, NodeKind* kind);

// Nominal bandwidth (GB/s per direction) and latency of a link kind, for sources that do not
// say (hwloc has no NIC port speeds or inter-socket bandwidths). What matters to the search is
// their order, which follows real machines: NVLink > PCIe > inter-socket.
double defaultBandwidth(LinkKind kind);
double defaultLatencyUs(LinkKind kind);

struct Node {
  NodeKind kind = NodeKind::kCpu;
  int host = -1;       // index into Topology::hosts; -1 for network switches between hosts
  std::string id;      // unique within its host (or among the network nodes): "cpu0", "gpu3"
  int index = -1;      // CPU: NUMA node number; GPU: device number; NIC: its number on the host
  int package = -1;    // CPU: the package (socket) it belongs to
  std::string busId;   // PCI devices: "0000:17:00.0"
  std::string device;  // NIC: OS name ("mlx5_0", "eth0"); GPU: model
  std::string cpus;    // CPU: its processors as a list ("0-15,32-47")
  int cores = 0;       // CPU: physical cores
  uint64_t memoryBytes = 0;
  uint64_t l3Bytes = 0;  // CPU: the last-level cache shared by its cores (the first one found)
};

// A full-duplex link: bandwidth in each direction.
struct Link {
  int a = -1;
  int b = -1;
  LinkKind kind = LinkKind::kPcie;
  double bandwidth = 0;  // GB/s per direction
  double latencyUs = 0;
};

struct Topology {
  std::vector<std::string> hosts;
  std::vector<Node> nodes;
  std::vector<Link> links;

  int addHost(std::string name);
  int addNode(Node node);  // returns its index
  int addLink(int a, int b, LinkKind kind, double bandwidth, double latencyUs);
  int addLink(int a, int b, LinkKind kind) {
    return addLink(a, b, kind, defaultBandwidth(kind), defaultLatencyUs(kind));
  }
  // Nodes of a kind on a host (in the order added); host -1: on any host.
  std::vector<int> nodesOf(int host, NodeKind kind) const;
  // The node with this id on the host (-1 for network nodes), or -1.
  int find(int host, const std::string& id) const;
  // Made on first use: the host's NVSwitch node (a host's NVSwitches are taken as one switch:
  // every GPU reaches each alike) and the network node "net" of sources that describe one host.
  int nvSwitch(int host);
  int network();
  // Appends a copy of host `from`'s nodes and links under a new host name (a cluster of alike
  // hosts); links from those nodes to network nodes are copied too. Returns the new host.
  int cloneHost(int from, std::string name);
  // Appends host `from` of `source` (nodes, links within it, links to its network nodes, which
  // join this topology's network nodes of the same id) under the name given. Returns the new host.
  int addHostFrom(const Topology& source, int from, std::string name);
  // Throws std::invalid_argument naming the problem (after "source: " when a source is given):
  // links to missing nodes, duplicate ids, non-positive bandwidths, a host without CPUs.
  void validate(const std::string& source = "") const;
};

// Human-readable: hosts, then each node with its links (what chorus-topo prints).
std::string describe(const Topology& topology);

// A path between two nodes: the links it crosses, in order, and the direction of each.
struct Path {
  std::vector<int> links;
  std::vector<bool> forward;  // true where the path goes a -> b along the link
  double bandwidth = 0;       // the narrowest link's
  double latencyUs = 0;       // the sum
  // Crossings of each link kind (a measure of how slow the path is beyond its bandwidth).
  int crossings[static_cast<int>(LinkKind::kCount)] = {};
  bool empty() const { return links.empty(); }
};

// The widest path from one node to another (largest bandwidth; among those, the fewest
// crossings of the slowest kinds, then the least latency). Paths pass through CPUs, switches
// and NICs, never through a GPU. A node to itself: an empty path of infinite bandwidth.
// Unreachable: bandwidth 0.
Path widestPath(const Topology& topology, int from, int to);

}  // namespace chorus::topology
