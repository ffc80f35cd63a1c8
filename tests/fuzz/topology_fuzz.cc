// topology_fuzz.cc: chorus's and NCCL's topology XML readers (CHORUS_TOPO_FILE, chorus-topo
// --file) on arbitrary text. A bad file must give std::invalid_argument; what parses must be a
// valid graph that chorus's XML writes and reads back unchanged, and that the ring search can use.
// hwloc's XML is read by hwloc itself and left to hwloc's own testing.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <stdexcept>

#include "src/topology/discover.h"
#include "src/topology/search.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace topo = chorus::topology;
  FuzzedDataProvider in(data, size);
  const bool nccl = in.ConsumeBool();
  const std::string text = in.ConsumeRemainingBytesAsString();
  topo::Topology t;
  try {
    t = nccl ? topo::parseNcclXml(text, "fuzz") : topo::parseChorusXml(text, "fuzz");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  t.validate();
  const topo::Topology back = topo::parseChorusXml(topo::toChorusXml(t), "written");
  if (topo::describe(back) != topo::describe(t)) std::abort();
  // A rank on every CPU and GPU of small graphs (the search is exhaustive up to 10 per host).
  std::vector<int> ranks;
  for (int h = 0; h < static_cast<int>(t.hosts.size()); ++h) {
    for (int n : t.nodesOf(h, topo::NodeKind::kCpu)) ranks.push_back(n);
    for (int n : t.nodesOf(h, topo::NodeKind::kGpu)) ranks.push_back(n);
  }
  if (ranks.size() > 24 || t.links.size() > 200) return 0;
  try {
    topo::SearchOptions options;
    options.exactDevices = 6;
    options.maxChannels = 4;
    const topo::Plan plan = topo::search(t, ranks, options);
    for (const topo::Ring& ring : plan.rings) {
      if (ring.order.size() != ranks.size()) std::abort();
    }
  } catch (const std::invalid_argument&) {
    // Unreachable devices, or hosts without NICs: named errors, not crashes.
  }
  return 0;
}
