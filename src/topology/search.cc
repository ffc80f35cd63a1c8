// search.cc: the ring and tree search (see search.h for what it finds).
//
// Each host's part of a ring is a cycle: through its devices, and through the ring's NIC when the
// ring spans hosts (the NIC receives from the previous host and sends to the next). Hosts' links
// are disjoint, so every host's cycle is searched on its own: exhaustively (branch and bound) up
// to SearchOptions::exactDevices devices, else in node order. A cycle's score is the bandwidth
// left to it on its narrowest directed link (what earlier channels left, divided by the number
// of times this ring crosses it), then the crossings per link kind, slowest kind first, then the
// latency; a partial cycle can only get worse as hops are added, which is what the bound prunes on.
#include "src/topology/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace chorus::topology {
namespace {

constexpr int kKinds = static_cast<int>(LinkKind::kCount);
constexpr double kInfinite = std::numeric_limits<double>::infinity();

struct Score {
  double bandwidth = kInfinite;
  int crossings[kKinds] = {};
  double latencyUs = 0;
};

bool better(const Score& a, const Score& b) {
  constexpr double kSame = 1e-9;
  if (a.bandwidth > b.bandwidth * (1 + kSame)) return true;
  if (b.bandwidth > a.bandwidth * (1 + kSame)) return false;
  for (int k = kKinds - 1; k >= 0; --k) {
    if (a.crossings[k] != b.crossings[k]) return a.crossings[k] < b.crossings[k];
  }
  return a.latencyUs < b.latencyUs - 1e-12;
}

class Searcher {
 public:
  Searcher(const Topology& t, const SearchOptions& options)
      : t_(t), options_(options), residual_(2 * t.links.size()), load_(2 * t.links.size(), 0) {
    for (size_t l = 0; l < t.links.size(); ++l) residual_[2 * l] = residual_[2 * l + 1] = t.links[l].bandwidth;
  }

  const Path& path(int from, int to) {
    const long long key = static_cast<long long>(from) * static_cast<long long>(t_.nodes.size()) + to;
    auto it = paths_.find(key);
    if (it == paths_.end()) {
      Path p = widestPath(t_, from, to);
      if (from != to && p.bandwidth <= 0) {
        throw std::invalid_argument(fmt::format("no path from {} to {} in the topology", label(from), label(to)));
      }
      it = paths_.emplace(key, std::move(p)).first;
    }
    return it->second;
  }

  // Adds one crossing of the path to the loads; returns the narrowest share among its links.
  double add(const Path& p) {
    double narrowest = kInfinite;
    for (size_t i = 0; i < p.links.size(); ++i) {
      const size_t d = 2 * static_cast<size_t>(p.links[i]) + (p.forward[i] ? 0 : 1);
      ++load_[d];
      narrowest = std::min(narrowest, residual_[d] / load_[d]);
    }
    return narrowest;
  }
  void remove(const Path& p) {
    for (size_t i = 0; i < p.links.size(); ++i) --load_[2 * static_cast<size_t>(p.links[i]) + (p.forward[i] ? 0 : 1)];
  }
  static void addTo(Score& s, const Path& p, double narrowest) {
    s.bandwidth = std::min(s.bandwidth, narrowest);
    for (int k = 0; k < kKinds; ++k) s.crossings[k] += p.crossings[k];
    s.latencyUs += p.latencyUs;
  }

  // The best cycle through `start` and every one of `items`: start first, then items in order.
  std::vector<int> cycle(int start, std::vector<int> items) {
    if (static_cast<int>(items.size()) > options_.exactDevices) return inNodeOrder(start, std::move(items));
    best_ = Score{};
    best_.bandwidth = -1;
    bestOrder_.clear();
    std::vector<int> order;
    std::vector<bool> used(items.size(), false);
    extend(start, start, items, used, order, Score{});
    return bestOrder_;
  }

  // A whole ring's loads (cycles per host, and NIC to NIC across hosts) and its bandwidth.
  double ringBandwidth(const std::vector<std::vector<int>>& cycles, const std::vector<int>& nics) {
    std::fill(load_.begin(), load_.end(), 0);
    std::vector<const Path*> hops;
    for (const auto& c : cycles) {
      for (size_t i = 0; i + 1 < c.size(); ++i) hops.push_back(&path(c[i], c[i + 1]));
      if (c.size() > 1) hops.push_back(&path(c.back(), c.front()));
    }
    if (nics.size() > 1) {
      for (size_t h = 0; h < nics.size(); ++h) hops.push_back(&path(nics[h], nics[(h + 1) % nics.size()]));
    }
    double bandwidth = kInfinite;
    for (const Path* p : hops) bandwidth = std::min(bandwidth, add(*p));
    return bandwidth;
  }
  // Takes a ring's bandwidth from every link it crosses (loads as ringBandwidth left them).
  void consume(double bandwidth) {
    for (size_t d = 0; d < load_.size(); ++d) residual_[d] = std::max(0.0, residual_[d] - bandwidth * load_[d]);
  }

  std::string label(int node) const {
    const Node& n = t_.nodes[node];
    return n.host < 0 ? "network/" + n.id : t_.hosts[n.host] + "/" + n.id;
  }

 private:
  void extend(int start, int at, const std::vector<int>& items, std::vector<bool>& used, std::vector<int>& order,
              const Score& partial) {
    if (order.size() == items.size()) {
      Score full = partial;
      if (at != start) {
        const Path& back = path(at, start);
        addTo(full, back, add(back));
        remove(back);
      }
      if (better(full, best_)) {
        best_ = full;
        bestOrder_ = order;
      }
      return;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (used[i]) continue;
      const Path& hop = path(at, items[i]);
      Score next = partial;
      addTo(next, hop, add(hop));
      // Hops only narrow a cycle and add crossings and latency: a partial cycle that is not
      // better than the best whole one cannot become so.
      if (bestOrder_.empty() || better(next, best_)) {
        used[i] = true;
        order.push_back(items[i]);
        extend(start, items[i], items, used, order, next);
        order.pop_back();
        used[i] = false;
      }
      remove(hop);
    }
  }

  // Too many devices to search: the order of the machine's tree (node order), begun, after a
  // NIC, at the item nearest to it.
  std::vector<int> inNodeOrder(int start, std::vector<int> items) {
    std::sort(items.begin(), items.end());
    if (t_.nodes[start].kind != NodeKind::kNic) return items;
    size_t first = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      Score a, b;
      addTo(a, path(start, items[i]), path(start, items[i]).bandwidth);
      addTo(b, path(start, items[first]), path(start, items[first]).bandwidth);
      if (better(a, b)) first = i;
    }
    std::rotate(items.begin(), items.begin() + static_cast<long>(first), items.end());
    return items;
  }

  const Topology& t_;
  SearchOptions options_;
  std::vector<double> residual_;
  std::vector<int> load_;
  std::unordered_map<long long, Path> paths_;
  Score best_;
  std::vector<int> bestOrder_;
};

int parentInHeap(int position) { return position == 0 ? -1 : (position - 1) / 2; }

}  // namespace

Plan search(const Topology& t, const std::vector<int>& rankNode, const SearchOptions& options) {
  // Hosts in order, each with its devices in node order and each device's ranks in rank order.
  std::map<int, std::map<int, std::vector<int>>> ranksOn;
  for (int r = 0; r < static_cast<int>(rankNode.size()); ++r) {
    const int node = rankNode[r];
    if (node < 0 || node >= static_cast<int>(t.nodes.size())) {
      throw std::invalid_argument(
          fmt::format("rank {} sits on node {}, not in the topology ({} nodes)", r, node, t.nodes.size()));
    }
    const NodeKind kind = t.nodes[node].kind;
    if (kind != NodeKind::kCpu && kind != NodeKind::kGpu) {
      throw std::invalid_argument(
          fmt::format("rank {} sits on {} '{}', which is not a CPU or GPU", r, nodeKindName(kind), t.nodes[node].id));
    }
    ranksOn[t.nodes[node].host][node].push_back(r);
  }
  Plan plan;
  if (ranksOn.empty()) return plan;
  const bool acrossHosts = ranksOn.size() > 1;
  if (acrossHosts) {
    for (const auto& [host, devices] : ranksOn) {
      if (t.nodesOf(host, NodeKind::kNic).empty()) {
        throw std::invalid_argument(fmt::format("ranks span hosts, but host '{}' (rank {}) has no NIC in the topology",
                                                t.hosts[host], devices.begin()->second.front()));
      }
    }
  }
  Searcher searcher(t, options);
  double firstBandwidth = 0;
  for (int channel = 0; channel < std::max(1, options.maxChannels); ++channel) {
    std::vector<std::vector<int>> cycles;
    std::vector<int> nics;
    for (const auto& [host, devices] : ranksOn) {
      std::vector<int> items;
      for (const auto& entry : devices) items.push_back(entry.first);
      int nic = -1;
      if (acrossHosts) {
        const std::vector<int> hostNics = t.nodesOf(host, NodeKind::kNic);
        nic = hostNics[static_cast<size_t>(channel) % hostNics.size()];
      }
      std::vector<int> c;
      if (nic >= 0) {
        c.push_back(nic);
        for (int d : searcher.cycle(nic, items)) c.push_back(d);
      } else {
        const int start = items.front();
        c.push_back(start);
        items.erase(items.begin());
        for (int d : searcher.cycle(start, items)) c.push_back(d);
      }
      cycles.push_back(std::move(c));
      nics.push_back(nic);
    }
    const double bandwidth = searcher.ringBandwidth(cycles, nics);
    if (channel == 0) firstBandwidth = bandwidth;
    if (channel > 0 && !(bandwidth >= firstBandwidth * (1 - 1e-9))) break;
    Ring ring;
    ring.bandwidth = bandwidth;
    ring.nics = nics;
    Tree tree;
    size_t h = 0;
    for (const auto& [host, devices] : ranksOn) {
      std::vector<int> chain;
      for (int node : cycles[h]) {
        if (t.nodes[node].kind == NodeKind::kNic) continue;
        for (int r : devices.at(node)) chain.push_back(r);
      }
      ring.order.insert(ring.order.end(), chain.begin(), chain.end());
      tree.chains.push_back(std::move(chain));
      ++h;
    }
    const int hosts = static_cast<int>(tree.chains.size());
    for (int p = 0; p < hosts; ++p) {
      tree.parentA.push_back(parentInHeap(p));
      const int mirrored = parentInHeap(hosts - 1 - p);
      tree.parentB.push_back(mirrored < 0 ? -1 : hosts - 1 - mirrored);
    }
    plan.rings.push_back(std::move(ring));
    plan.trees.push_back(std::move(tree));
    if (bandwidth == kInfinite) break;  // every rank on one device: nothing is crossed
    searcher.consume(bandwidth);
  }
  return plan;
}

std::string describe(const Topology& t, const std::vector<int>& rankNode, const Plan& plan) {
  std::string out;
  for (size_t c = 0; c < plan.rings.size(); ++c) {
    const Ring& ring = plan.rings[c];
    out += fmt::format(
        "ring {}: {}", c,
        ring.bandwidth == kInfinite ? std::string("no link crossed") : fmt::format("{:.4g} GB/s", ring.bandwidth));
    std::string nicNames;
    for (int nic : ring.nics) {
      if (nic >= 0) nicNames += (nicNames.empty() ? "" : ", ") + t.hosts[t.nodes[nic].host] + "/" + t.nodes[nic].id;
    }
    if (!nicNames.empty()) out += ", through " + nicNames;
    out += "\n  ";
    for (size_t i = 0; i < ring.order.size(); ++i) {
      const Node& node = t.nodes[rankNode[ring.order[i]]];
      out += fmt::format("{}{}:{}", i == 0 ? "" : " ", ring.order[i], node.id);
    }
    out += "\n";
    const Tree& tree = plan.trees[c];
    out += fmt::format("tree {}: chains", c);
    for (const auto& chain : tree.chains) {
      out += " [";
      for (size_t i = 0; i < chain.size(); ++i) out += fmt::format("{}{}", i == 0 ? "" : " ", chain[i]);
      out += "]";
    }
    if (tree.chains.size() > 1) {
      out += "; host parents A";
      for (int p : tree.parentA) out += fmt::format(" {}", p);
      out += ", B";
      for (int p : tree.parentB) out += fmt::format(" {}", p);
    }
    out += "\n";
  }
  return out;
}

}  // namespace chorus::topology

namespace chorus::topology {

std::vector<int> searchRankOrder(const std::vector<Topology>& hostTopologies, const std::vector<int>& hostOfRank,
                                 const std::vector<std::string>& nodeOfRank) {
  Topology cluster;
  for (size_t h = 0; h < hostTopologies.size(); ++h) {
    const Topology& one = hostTopologies[h];
    if (one.hosts.empty()) throw std::invalid_argument(fmt::format("host {}'s topology has no host", h));
    cluster.addHostFrom(one, 0, fmt::format("{}:{}", h, one.hosts[0]));
  }
  std::vector<int> rankNode;
  for (size_t r = 0; r < hostOfRank.size(); ++r) {
    const int node = cluster.find(hostOfRank[r], nodeOfRank[r]);
    if (node < 0) {
      throw std::invalid_argument(fmt::format("rank {} runs on '{}', which host {} ({}) does not have", r,
                                              nodeOfRank[r], hostOfRank[r], cluster.hosts.at(hostOfRank[r])));
    }
    rankNode.push_back(node);
  }
  const Plan plan = search(cluster, rankNode);
  if (plan.rings.empty()) throw std::invalid_argument("the search found no ring");
  return plan.rings[0].order;
}

std::vector<int> gpuRingOrder(const Topology& host, const std::vector<std::string>& busIdOfRank) {
  if (host.hosts.empty()) throw std::invalid_argument("the topology has no host");
  auto lower = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    return text;
  };
  const std::vector<int> gpus = host.nodesOf(0, NodeKind::kGpu);
  std::vector<int> rankNode;
  for (size_t r = 0; r < busIdOfRank.size(); ++r) {
    const std::string busId = lower(busIdOfRank[r]);
    const auto gpu = std::find_if(gpus.begin(), gpus.end(), [&](int n) { return lower(host.nodes[n].busId) == busId; });
    if (gpu == gpus.end()) {
      throw std::invalid_argument(fmt::format("rank {}'s GPU {} is not among the {} GPUs of {}'s topology", r,
                                              busIdOfRank[r], gpus.size(), host.hosts[0]));
    }
    rankNode.push_back(*gpu);
  }
  const Plan plan = search(host, rankNode);
  if (plan.rings.empty()) throw std::invalid_argument("the search found no ring");
  return plan.rings[0].order;
}

}  // namespace chorus::topology
