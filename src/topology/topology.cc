// topology.cc: the graph's bookkeeping, its description, and widest paths over it.
#include "src/topology/topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

namespace chorus::topology {
namespace {

constexpr const char* kNodeKindNames[] = {"cpu", "gpu", "nic", "pci-switch", "nvswitch", "network"};
constexpr const char* kLinkKindNames[] = {"nvlink", "pcie", "host-bridge", "package", "inter-socket", "nic", "network"};

struct Kind {
  double bandwidth;
  double latencyUs;
};
// GB/s per direction, microseconds. NVLink: an H100's 18 links; PCIe: Gen5 x16; package: the
// fabric between NUMA nodes of one package; inter-socket: two UPI/xGMI links; NIC: a 400 Gbit/s
// port; network: the switch fabric behind the ports, not narrower than them.
constexpr Kind kKinds[] = {{360, 0.5}, {64, 1}, {64, 1}, {100, 0.3}, {40, 0.6}, {50, 2}, {50, 3}};

std::string humanBytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.0f} GiB", bytes / double(uint64_t{1} << 30));
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.0f} MiB", bytes / double(uint64_t{1} << 20));
  return fmt::format("{} KiB", bytes >> 10);
}

// The order widestPath keeps: wider first, then fewer crossings of the slowest kinds, then less latency.
bool better(const Path& a, const Path& b) {
  constexpr double kSame = 1e-9;
  if (a.bandwidth > b.bandwidth * (1 + kSame)) return true;
  if (b.bandwidth > a.bandwidth * (1 + kSame)) return false;
  for (int k = static_cast<int>(LinkKind::kCount) - 1; k >= 0; --k) {
    if (a.crossings[k] != b.crossings[k]) return a.crossings[k] < b.crossings[k];
  }
  return a.latencyUs < b.latencyUs;
}

}  // namespace

const char* nodeKindName(NodeKind kind) { return kNodeKindNames[static_cast<int>(kind)]; }
const char* linkKindName(LinkKind kind) { return kLinkKindNames[static_cast<int>(kind)]; }

bool parseLinkKind(const std::string& name, LinkKind* kind) {
  for (int k = 0; k < static_cast<int>(LinkKind::kCount); ++k) {
    if (name == kLinkKindNames[k]) {
      *kind = static_cast<LinkKind>(k);
      return true;
    }
  }
  return false;
}

bool parseNodeKind(const std::string& name, NodeKind* kind) {
  for (int k = 0; k < static_cast<int>(std::size(kNodeKindNames)); ++k) {
    if (name == kNodeKindNames[k]) {
      *kind = static_cast<NodeKind>(k);
      return true;
    }
  }
  return false;
}

double defaultBandwidth(LinkKind kind) { return kKinds[static_cast<int>(kind)].bandwidth; }
double defaultLatencyUs(LinkKind kind) { return kKinds[static_cast<int>(kind)].latencyUs; }

int Topology::addHost(std::string name) {
  hosts.push_back(std::move(name));
  return static_cast<int>(hosts.size()) - 1;
}

int Topology::addNode(Node node) {
  nodes.push_back(std::move(node));
  return static_cast<int>(nodes.size()) - 1;
}

int Topology::addLink(int a, int b, LinkKind kind, double bandwidth, double latencyUs) {
  links.push_back(Link{a, b, kind, bandwidth, latencyUs});
  return static_cast<int>(links.size()) - 1;
}

std::vector<int> Topology::nodesOf(int host, NodeKind kind) const {
  std::vector<int> found;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    if (nodes[i].kind == kind && (host < 0 || nodes[i].host == host)) found.push_back(i);
  }
  return found;
}

int Topology::find(int host, const std::string& id) const {
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    if (nodes[i].host == host && nodes[i].id == id) return i;
  }
  return -1;
}

int Topology::nvSwitch(int host) {
  int id = find(host, "nvswitch");
  if (id < 0) {
    Node node;
    node.kind = NodeKind::kNvSwitch;
    node.host = host;
    node.index = 0;
    node.id = "nvswitch";
    id = addNode(std::move(node));
  }
  return id;
}

int Topology::network() {
  int id = find(-1, "net");
  if (id < 0) {
    Node node;
    node.kind = NodeKind::kNetwork;
    node.id = "net";
    id = addNode(std::move(node));
  }
  return id;
}

int Topology::cloneHost(int from, std::string name) { return addHostFrom(Topology(*this), from, std::move(name)); }

int Topology::addHostFrom(const Topology& source, int from, std::string name) {
  const int host = addHost(std::move(name));
  std::map<int, int> copyOf;  // source node -> node here
  for (int i = 0; i < static_cast<int>(source.nodes.size()); ++i) {
    if (source.nodes[i].host != from) continue;
    Node copy = source.nodes[i];
    copy.host = host;
    copyOf[i] = addNode(std::move(copy));
  }
  // Links inside the host, and links to the network (to the network node of the same id here,
  // added when missing); links to other hosts are left out.
  for (const Link& link : source.links) {
    const bool aIn = copyOf.count(link.a) > 0, bIn = copyOf.count(link.b) > 0;
    if (!aIn && !bIn) continue;
    auto here = [&](int node, bool in) {
      if (in) return copyOf[node];
      const Node& outside = source.nodes[node];
      if (outside.host != -1) return -1;
      const int found = find(-1, outside.id);
      return found >= 0 ? found : addNode(outside);
    };
    const int a = here(link.a, aIn), b = here(link.b, bIn);
    if (a >= 0 && b >= 0) addLink(a, b, link.kind, link.bandwidth, link.latencyUs);
  }
  return host;
}

void Topology::validate(const std::string& source) const {
  if (!source.empty()) {
    try {
      validate();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: {}", source, e.what()));
    }
    return;
  }
  const int n = static_cast<int>(nodes.size());
  std::set<std::pair<int, std::string>> ids;
  for (const Node& node : nodes) {
    if (node.host < -1 || node.host >= static_cast<int>(hosts.size())) {
      throw std::invalid_argument(fmt::format("node '{}' names host {} of {}", node.id, node.host, hosts.size()));
    }
    if (node.host == -1 && node.kind != NodeKind::kNetwork) {
      throw std::invalid_argument(fmt::format("node '{}' ({}) is on no host", node.id, nodeKindName(node.kind)));
    }
    if (!ids.insert({node.host, node.id}).second) {
      throw std::invalid_argument(fmt::format("two nodes are called '{}' on {}", node.id,
                                              node.host < 0 ? std::string("the network") : hosts[node.host]));
    }
  }
  for (const Link& link : links) {
    if (link.a < 0 || link.a >= n || link.b < 0 || link.b >= n || link.a == link.b) {
      throw std::invalid_argument(
          fmt::format("a {} link joins nodes {} and {} of {}", linkKindName(link.kind), link.a, link.b, n));
    }
    if (!(link.bandwidth > 0) || !(link.latencyUs >= 0)) {
      throw std::invalid_argument(fmt::format("the {} link {} - {} has bandwidth {} GB/s and latency {} us",
                                              linkKindName(link.kind), nodes[link.a].id, nodes[link.b].id,
                                              link.bandwidth, link.latencyUs));
    }
  }
  for (int h = 0; h < static_cast<int>(hosts.size()); ++h) {
    if (nodesOf(h, NodeKind::kCpu).empty()) {
      throw std::invalid_argument(fmt::format("host '{}' has no CPU", hosts[h]));
    }
  }
}

std::string describe(const Topology& t) {
  std::string out;
  auto nodeLine = [&](int i) {
    const Node& node = t.nodes[i];
    std::string line = fmt::format("    {} ({})", node.id, nodeKindName(node.kind));
    if (node.kind == NodeKind::kCpu) {
      line += fmt::format(": package {}, {}, {} cores, processors {}", node.package,
                          node.index >= 0 ? fmt::format("NUMA node {}", node.index) : "no NUMA node", node.cores,
                          node.cpus.empty() ? "?" : node.cpus);
      if (node.memoryBytes > 0) line += fmt::format(", {} memory", humanBytes(node.memoryBytes));
      if (node.l3Bytes > 0) line += fmt::format(", {} L3", humanBytes(node.l3Bytes));
    } else {
      if (!node.device.empty()) line += ": " + node.device;
      if (!node.busId.empty()) line += fmt::format("{}PCI {}", node.device.empty() ? ": " : ", ", node.busId);
    }
    out += line + "\n";
    for (const Link& link : t.links) {
      if (link.a != i && link.b != i) continue;
      const Node& other = t.nodes[link.a == i ? link.b : link.a];
      const std::string where =
          other.host == node.host ? "" : (other.host < 0 ? "network/" : t.hosts[other.host] + "/");
      out += fmt::format("      - {}{}: {}, {:.4g} GB/s, {:g} us\n", where, other.id, linkKindName(link.kind),
                         link.bandwidth, link.latencyUs);
    }
  };
  for (int h = 0; h < static_cast<int>(t.hosts.size()); ++h) {
    out += fmt::format("host {}\n", t.hosts[h]);
    for (int i = 0; i < static_cast<int>(t.nodes.size()); ++i) {
      if (t.nodes[i].host == h) nodeLine(i);
    }
  }
  bool network = false;
  for (int i = 0; i < static_cast<int>(t.nodes.size()); ++i) {
    if (t.nodes[i].host != -1) continue;
    if (!network) out += "network\n";
    network = true;
    nodeLine(i);
  }
  return out;
}

Path widestPath(const Topology& t, int from, int to) {
  Path none;
  if (from == to) {
    none.bandwidth = std::numeric_limits<double>::infinity();
    return none;
  }
  const int n = static_cast<int>(t.nodes.size());
  std::vector<std::vector<int>> incident(n);
  for (int l = 0; l < static_cast<int>(t.links.size()); ++l) {
    incident[t.links[l].a].push_back(l);
    incident[t.links[l].b].push_back(l);
  }
  // Dijkstra over the (bandwidth, crossings, latency) order: extending a path never makes it
  // better, so the first time a node is settled its path is the best.
  std::vector<Path> best(n);
  std::vector<bool> reached(n, false), settled(n, false);
  best[from].bandwidth = std::numeric_limits<double>::infinity();
  reached[from] = true;
  // Between two devices of one host the path stays in the host (not out through a NIC and back).
  const int host = t.nodes[from].host == t.nodes[to].host ? t.nodes[from].host : -2;
  while (true) {
    int u = -1;
    for (int i = 0; i < n; ++i) {
      if (reached[i] && !settled[i] && (u < 0 || better(best[i], best[u]))) u = i;
    }
    if (u < 0 || u == to) break;
    settled[u] = true;
    if (u != from && t.nodes[u].kind == NodeKind::kGpu) continue;  // GPUs do not forward
    for (int l : incident[u]) {
      const Link& link = t.links[l];
      const int v = link.a == u ? link.b : link.a;
      if (settled[v] || (host != -2 && t.nodes[v].host != host)) continue;
      Path next = best[u];
      next.links.push_back(l);
      next.forward.push_back(link.a == u);
      next.bandwidth = std::min(next.bandwidth, link.bandwidth);
      next.latencyUs += link.latencyUs;
      ++next.crossings[static_cast<int>(link.kind)];
      if (!reached[v] || better(next, best[v])) {
        best[v] = std::move(next);
        reached[v] = true;
      }
    }
  }
  if (!reached[to]) return none;
  return best[to];
}

}  // namespace chorus::topology
