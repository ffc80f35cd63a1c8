// chorus-topo: prints the topology chorus sees (this host discovered, or a file), writes it in
// chorus's XML, and shows the rings and trees the search lays over ranks placed on it.
//
//   chorus-topo                          this host (or CHORUS_TOPO_FILE's topology)
//   chorus-topo --file dgx.xml --ranks gpus --xml out.xml
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "src/topology/discover.h"
#include "src/topology/search.h"

namespace topo = chorus::topology;

namespace {

// "gpus": a rank on every GPU of every host, in device-number order; "cpus": on every CPU node;
// else a comma-separated list of host/node (or node, on a single host).
std::vector<int> placeRanks(const topo::Topology& t, const std::string& spec) {
  std::vector<int> ranks;
  if (spec == "gpus" || spec == "cpus") {
    const topo::NodeKind kind = spec == "gpus" ? topo::NodeKind::kGpu : topo::NodeKind::kCpu;
    for (int h = 0; h < static_cast<int>(t.hosts.size()); ++h) {
      std::vector<int> nodes = t.nodesOf(h, kind);
      if (kind == topo::NodeKind::kGpu) {
        std::stable_sort(nodes.begin(), nodes.end(), [&](int a, int b) { return t.nodes[a].index < t.nodes[b].index; });
      }
      ranks.insert(ranks.end(), nodes.begin(), nodes.end());
    }
    if (ranks.empty()) throw std::invalid_argument(fmt::format("--ranks {}: the topology has none", spec));
    return ranks;
  }
  std::stringstream list(spec);
  std::string item;
  while (std::getline(list, item, ',')) {
    const size_t slash = item.find('/');
    int host = 0;
    std::string id = item;
    if (slash != std::string::npos) {
      host = -1;
      for (int h = 0; h < static_cast<int>(t.hosts.size()); ++h) {
        if (t.hosts[h] == item.substr(0, slash)) host = h;
      }
      id = item.substr(slash + 1);
    }
    const int node = host < 0 ? -1 : t.find(host, id);
    if (node < 0) throw std::invalid_argument(fmt::format("--ranks: '{}' is no node of the topology", item));
    ranks.push_back(node);
  }
  return ranks;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-topo: the machine as chorus sees it, and the rings and trees laid over it"};
  std::string file, xml, ranks;
  int channels = 16;
  bool quiet = false;
  app.add_option("--file", file, "read this topology (chorus, hwloc or NCCL XML) instead of discovering");
  app.add_option("--xml", xml, "write the topology in chorus's XML to this file ('-': standard output)");
  app.add_option("--ranks", ranks, "place ranks: gpus, cpus, or host/node,host/node,... and print rings and trees");
  app.add_option("--channels", channels, "most rings to search")->check(CLI::Range(1, 64));
  app.add_flag("--quiet", quiet, "do not print the graph");
  CLI11_PARSE(app, argc, argv);
  try {
    const topo::Topology t = file.empty() ? topo::localTopology() : topo::readTopologyFile(file);
    if (!quiet) std::cout << topo::describe(t);
    if (!xml.empty()) {
      const std::string text = topo::toChorusXml(t);
      if (xml == "-") {
        std::cout << text;
      } else {
        std::ofstream out(xml);
        if (!(out << text) || !out.flush()) throw std::runtime_error(fmt::format("cannot write {}", xml));
      }
    }
    if (!ranks.empty()) {
      const std::vector<int> placement = placeRanks(t, ranks);
      topo::SearchOptions options;
      options.maxChannels = channels;
      std::cout << topo::describe(t, placement, topo::search(t, placement, options));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-topo: %s\n", e.what());
    return 1;
  }
  return 0;
}
