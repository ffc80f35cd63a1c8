// topology_test: the topology readers on described machines (an 8-GPU NVSwitch server in NCCL's
// XML, a two-socket PCIe server with 4 GPUs per socket and a two-socket CPU-only server in hwloc's
// XML, and that PCIe server's variants with hwloc's NVLink distances or lstopo --whole-io's devices
// (made by tests/data/topology/variants.py), a cluster of four NVSwitch servers on a rail fabric in
// chorus's XML), the rings and trees searched over them, discovery of this machine, and the errors
// bad files get.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "src/topology/bind.h"
#include "src/topology/discover.h"
#include "src/topology/search.h"

#if defined(CHORUS_HAVE_HWLOC)
#include <hwloc.h>
#endif

// Skips a test that reads topology files this build has no reader for: libxml2 reads NCCL's and
// chorus's XML (and tells the formats apart), hwloc reads its own. A build without them refuses
// such files by name (WithoutItsReaderAFileIsRefusedNamingTheLibrary, below).
#if defined(CHORUS_HAVE_LIBXML2)
#define CHORUS_REQUIRE_XML_READER() \
  do {                              \
  } while (0)
#else
#define CHORUS_REQUIRE_XML_READER() \
  GTEST_SKIP() << "this build of chorus has no libxml2 (libxml2-dev), which reads topology XML files"
#endif
#if defined(CHORUS_HAVE_LIBXML2) && defined(CHORUS_HAVE_HWLOC)
#define CHORUS_REQUIRE_HWLOC_READER() \
  do {                                \
  } while (0)
#elif defined(CHORUS_HAVE_LIBXML2)
#define CHORUS_REQUIRE_HWLOC_READER() \
  GTEST_SKIP() << "this build of chorus has no hwloc (libhwloc-dev), which reads the hwloc XML files this test reads"
#else
#define CHORUS_REQUIRE_HWLOC_READER() CHORUS_REQUIRE_XML_READER()
#endif

namespace chorus::topology {
namespace {

// "gpu" and 3 as "gpu3".
std::string named(const char* prefix, int i) { return fmt::format("{}{}", prefix, i); }

std::string data(const std::string& name) { return std::string(CHORUS_TOPOLOGY_DATA) + "/" + name; }

// The node of a host by id, failing the test when absent.
int node(const Topology& t, int host, const std::string& id) {
  const int n = t.find(host, id);
  EXPECT_GE(n, 0) << id;
  return n;
}

int addNode(Topology& t, int host, NodeKind kind, const std::string& id) {
  Node n;
  n.kind = kind;
  n.host = host;
  n.id = id;
  return t.addNode(n);
}

const Link* linkBetween(const Topology& t, int a, int b) {
  for (const Link& l : t.links) {
    if ((l.a == a && l.b == b) || (l.a == b && l.b == a)) return &l;
  }
  return nullptr;
}

// Ranks placed on nodes by id, on host 0.
std::vector<int> place(const Topology& t, const std::vector<std::string>& ids) {
  std::vector<int> out;
  for (const auto& id : ids) out.push_back(node(t, 0, id));
  return out;
}

// How often consecutive ranks of a ring (cyclically) sit on different values of key(rank).
template <typename Key>
int changes(const std::vector<int>& ring, Key key) {
  int n = 0;
  for (size_t i = 0; i < ring.size(); ++i) n += key(ring[i]) != key(ring[(i + 1) % ring.size()]) ? 1 : 0;
  return n;
}

std::string writeTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string errorOf(const std::string& path) {
  try {
    readTopologyFile(path);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr double kPcieGen5x16 = 32.0 * 128 / 130 / 8 * 16;  // GB/s per direction after encoding

TEST(TopologyFiles, NcclXmlOfAnNvSwitchServerGivesItsDevicesAndLinks) {
  CHORUS_REQUIRE_XML_READER();
  const Topology t = readTopologyFile(data("dgx-h100.nccl.xml"));
  ASSERT_EQ(t.hosts.size(), 1u);
  EXPECT_EQ(t.nodesOf(0, NodeKind::kCpu).size(), 2u);
  EXPECT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 8u);
  EXPECT_EQ(t.nodesOf(0, NodeKind::kNic).size(), 8u);
  EXPECT_EQ(t.nodesOf(0, NodeKind::kPciSwitch).size(), 8u);
  ASSERT_EQ(t.nodesOf(0, NodeKind::kNvSwitch).size(), 1u);
  const int fabric = t.nodesOf(0, NodeKind::kNvSwitch).front();
  for (int g = 0; g < 8; ++g) {
    const int gpu = node(t, 0, named("gpu", g));
    const Link* nv = linkBetween(t, gpu, fabric);
    ASSERT_NE(nv, nullptr) << g;
    EXPECT_EQ(nv->kind, LinkKind::kNvLink);
    EXPECT_DOUBLE_EQ(nv->bandwidth, 18 * 25.0);  // 5 + 4 + 4 + 5 links of 25 GB/s
    // GPU g and NIC g share a PCIe switch under CPU g / 4.
    const int nic = node(t, 0, named("nic", g));
    EXPECT_EQ(t.nodes[nic].device, named("mlx5_", g));
    const Path p = widestPath(t, gpu, nic);
    EXPECT_EQ(p.links.size(), 2u);
    EXPECT_NEAR(p.bandwidth, kPcieGen5x16, 1e-9);
    EXPECT_EQ(p.crossings[static_cast<int>(LinkKind::kHostBridge)], 0);
    const Path toCpu = widestPath(t, nic, node(t, 0, g < 4 ? "cpu0" : "cpu1"));
    EXPECT_EQ(toCpu.crossings[static_cast<int>(LinkKind::kInterSocket)], 0);
  }
  const int net = t.find(-1, "net");
  ASSERT_GE(net, 0);
  EXPECT_DOUBLE_EQ(linkBetween(t, node(t, 0, "nic3"), net)->bandwidth, 400000 / 8000.0);
  EXPECT_EQ(t.nodes[node(t, 0, "cpu1")].cpus, "48-95");
}

TEST(TopologyFiles, HwlocXmlOfAPcieServerGivesSocketsSwitchesAndGpus) {
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("pcie-2socket-8gpu.hwloc.xml"));
  ASSERT_EQ(t.hosts.size(), 1u);
  EXPECT_EQ(t.hosts[0], "pcie-8gpu");
  ASSERT_EQ(t.nodesOf(0, NodeKind::kCpu).size(), 2u);
  EXPECT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 8u);
  EXPECT_EQ(t.nodesOf(0, NodeKind::kNic).size(), 2u);
  const Node& cpu1 = t.nodes[node(t, 0, "cpu1")];
  EXPECT_EQ(cpu1.package, 1);
  EXPECT_EQ(cpu1.cores, 8);
  EXPECT_EQ(cpu1.cpus, "8-15");
  EXPECT_EQ(cpu1.memoryBytes, uint64_t{256} << 30);
  EXPECT_EQ(cpu1.l3Bytes, uint64_t{32} << 20);
  // gpu0 and gpu1 share a switch; gpu0 and gpu2 meet at the host bridge; gpu0 and gpu4 cross sockets.
  const int g0 = node(t, 0, "gpu0");
  const Path same = widestPath(t, g0, node(t, 0, "gpu1"));
  EXPECT_EQ(same.links.size(), 2u);
  EXPECT_EQ(same.crossings[static_cast<int>(LinkKind::kHostBridge)], 0);
  const Path bridge = widestPath(t, g0, node(t, 0, "gpu2"));
  EXPECT_EQ(bridge.crossings[static_cast<int>(LinkKind::kHostBridge)], 2);
  EXPECT_EQ(bridge.crossings[static_cast<int>(LinkKind::kInterSocket)], 0);
  const Path far = widestPath(t, g0, node(t, 0, "gpu4"));
  EXPECT_EQ(far.crossings[static_cast<int>(LinkKind::kInterSocket)], 1);
  EXPECT_DOUBLE_EQ(far.bandwidth, defaultBandwidth(LinkKind::kInterSocket));
  EXPECT_EQ(t.nodes[node(t, 0, "gpu5")].device, "GH100 [H100 SXM5 80GB]");
}

TEST(TopologyFiles, ChorusXmlRoundTripsEveryNodeAndLink) {
  CHORUS_REQUIRE_HWLOC_READER();
  for (const char* file :
       {"dgx-h100.nccl.xml", "pcie-2socket-8gpu.hwloc.xml", "cpu-2socket.hwloc.xml", "dgx-h100-cluster4.chorus.xml",
        "nvswitch-2socket-8gpu.hwloc.xml", "nvlink-cpu-2socket-8gpu.hwloc.xml", "wholeio-2socket-8gpu.hwloc.xml"}) {
    const Topology t = readTopologyFile(data(file));
    const std::string path = writeTemp("roundtrip.xml", toChorusXml(t));
    const Topology back = readTopologyFile(path);
    EXPECT_EQ(describe(back), describe(t)) << file;
    EXPECT_EQ(back.links.size(), t.links.size()) << file;
  }
}

TEST(TopologyFiles, ClusterFileCopiesHostsAndJoinsEachNicToItsRail) {
  CHORUS_REQUIRE_XML_READER();
  const Topology t = readTopologyFile(data("dgx-h100-cluster4.chorus.xml"));
  ASSERT_EQ(t.hosts.size(), 4u);
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(t.nodesOf(h, NodeKind::kGpu).size(), 8u);
    for (int i = 0; i < 8; ++i) {
      const int nic = node(t, h, named("nic", i));
      const Link* rail = linkBetween(t, nic, t.find(-1, named("rail", i)));
      ASSERT_NE(rail, nullptr) << h << " " << i;
      EXPECT_EQ(rail->kind, LinkKind::kNic);
      EXPECT_DOUBLE_EQ(rail->bandwidth, 50);
    }
  }
  EXPECT_EQ(t.nodesOf(-1, NodeKind::kNetwork).size(), 8u);
}

TEST(RingSearch, NvSwitchServerGetsOneRingAtTheGpusNvLinkBandwidth) {
  CHORUS_REQUIRE_XML_READER();
  const Topology t = readTopologyFile(data("dgx-h100.nccl.xml"));
  const std::vector<int> ranks = place(t, {"gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"});
  const Plan plan = search(t, ranks);
  ASSERT_EQ(plan.rings.size(), 1u);  // the ring takes every GPU's whole NVLink bandwidth
  EXPECT_DOUBLE_EQ(plan.rings[0].bandwidth, 450);
  std::vector<int> sorted = plan.rings[0].order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  ASSERT_EQ(plan.trees[0].chains.size(), 1u);
  EXPECT_EQ(plan.trees[0].chains[0], plan.rings[0].order);
}

TEST(TopologyFiles, HwlocNvLinkDistancesToAnNvSwitchGiveOneRingAtNvLinkBandwidth) {
  // hwloc's NVLinkBandwidth matrix of an NVSwitch server (written by lstopo with the NVML
  // backend): each GPU's NVML device to two NVSwitch ports at 225 GB/s. The ports are one switch;
  // each GPU reaches it at 450 GB/s, and the ring over all eight runs at that, not over PCIe.
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("nvswitch-2socket-8gpu.hwloc.xml"));
  ASSERT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 8u);
  ASSERT_EQ(t.nodesOf(0, NodeKind::kNvSwitch).size(), 1u);
  const int nvswitch = t.nodesOf(0, NodeKind::kNvSwitch)[0];
  for (int g = 0; g < 8; ++g) {
    const Link* nv = linkBetween(t, node(t, 0, named("gpu", g)), nvswitch);
    ASSERT_NE(nv, nullptr) << g;
    EXPECT_EQ(nv->kind, LinkKind::kNvLink);
    EXPECT_DOUBLE_EQ(nv->bandwidth, 450);
  }
  const Plan plan = search(t, place(t, {"gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"}));
  ASSERT_EQ(plan.rings.size(), 1u);
  EXPECT_DOUBLE_EQ(plan.rings[0].bandwidth, 450);
}

TEST(TopologyFiles, HwlocNvLinkDistancesBetweenGpusAndToTheirPackagesAreNvLinks) {
  // A POWER-style matrix: GPUs paired by NVLink, each also NVLinked to its own package (80 GB/s,
  // more than the GPUs' PCIe links). gpu0 reaches gpu1 directly and gpu2 through package 0 at
  // NVLink bandwidth, where PCIe alone gave 63 GB/s; across the sockets the inter-socket link
  // still decides.
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("nvlink-cpu-2socket-8gpu.hwloc.xml"));
  const int g0 = node(t, 0, "gpu0");
  const Link* pair = linkBetween(t, g0, node(t, 0, "gpu1"));
  ASSERT_NE(pair, nullptr);
  EXPECT_EQ(pair->kind, LinkKind::kNvLink);
  EXPECT_DOUBLE_EQ(pair->bandwidth, 80);
  const Link* toCpu = linkBetween(t, g0, node(t, 0, "cpu0"));
  ASSERT_NE(toCpu, nullptr);
  EXPECT_EQ(toCpu->kind, LinkKind::kNvLink);
  EXPECT_EQ(linkBetween(t, node(t, 0, "gpu4"), node(t, 0, "cpu0")), nullptr);
  EXPECT_NE(linkBetween(t, node(t, 0, "gpu4"), node(t, 0, "cpu1")), nullptr);
  EXPECT_EQ(linkBetween(t, g0, node(t, 0, "gpu2")), nullptr);
  const Path viaPackage = widestPath(t, g0, node(t, 0, "gpu2"));
  EXPECT_DOUBLE_EQ(viaPackage.bandwidth, 80);
  EXPECT_EQ(viaPackage.crossings[static_cast<int>(LinkKind::kNvLink)], 2);
  const Plan plan = search(t, place(t, {"gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"}));
  ASSERT_FALSE(plan.rings.empty());
  EXPECT_DOUBLE_EQ(plan.rings[0].bandwidth, defaultBandwidth(LinkKind::kInterSocket));
}

TEST(TopologyFiles, HwlocWholeIoFileWithADisplayControllerAndGpusOfManyOsDevicesLoads) {
  // lstopo --whole-io: the BMC's display controller (class 0300, a DRM card and nothing else) is
  // no GPU, and each GPU, seen as cuda, opencl, nvml and card devices, is one GPU named by CUDA.
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("wholeio-2socket-8gpu.hwloc.xml"));
  ASSERT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 8u);
  for (int g = 0; g < 8; ++g) {
    const int gpu = node(t, 0, named("gpu", g));
    EXPECT_EQ(t.nodes[gpu].index, g);
    EXPECT_EQ(t.nodes[gpu].device, "GH100 [H100 SXM5 80GB]") << g;
  }
  EXPECT_EQ(t.nodes[node(t, 0, "gpu0")].busId, "0000:11:00.0");
}

// hwloc 2.9's own test topologies (tests/hwloc/xml/ of its source: lstopo's files of real
// machines, old and new formats, and a few made up), put under .deps/ by tools/fetch-hwloc-xml
// (tools/test runs it). Each one loads, and what chorus made of it is checked against hwloc's own
// objects, read here through hwloc's API: the CPU nodes share no processor and cover every one
// (the disallowed ones too: a file describes its whole machine), each lies inside one package,
// their cores and memory add up to the machine's.
std::string hwlocOwnFiles() { return CHORUS_HWLOC_TEST_XML; }

#if defined(CHORUS_HAVE_HWLOC)
struct HwlocReference {
  std::set<int> processors;
  std::vector<std::set<int>> packages;  // by logical index
  int cores = 0;
  uint64_t memoryWithProcessors = 0;  // of the NUMA nodes that have processors
};

std::set<int> setOf(hwloc_const_bitmap_t bitmap) {
  std::set<int> out;
  for (int i = hwloc_bitmap_first(bitmap); i >= 0; i = hwloc_bitmap_next(bitmap, i)) out.insert(i);
  return out;
}

HwlocReference referenceOf(const std::string& path) {
  HwlocReference r;
  hwloc_topology_t t = nullptr;
  EXPECT_EQ(hwloc_topology_init(&t), 0);
  EXPECT_EQ(hwloc_topology_set_xml(t, path.c_str()), 0) << path;
  hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  EXPECT_EQ(hwloc_topology_load(t), 0) << path;
  const int pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  for (int i = 0; i < pus; ++i)
    r.processors.insert(static_cast<int>(hwloc_get_obj_by_type(t, HWLOC_OBJ_PU, i)->os_index));
  for (int i = 0; i < hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE); ++i) {
    r.packages.push_back(setOf(hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, i)->cpuset));
  }
  r.cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  if (r.cores == 0) r.cores = pus;  // a file of threads without cores
  for (int i = 0; i < hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE); ++i) {
    const hwloc_obj_t numa = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i);
    if (!hwloc_bitmap_iszero(numa->cpuset)) r.memoryWithProcessors += numa->attr->numanode.local_memory;
  }
  hwloc_topology_destroy(t);
  return r;
}
#endif

TEST(HwlocOwnFiles, EveryFileLoadsWithItsProcessorsCoresAndMemoryAccountedFor) {
  CHORUS_REQUIRE_HWLOC_READER();
#if defined(CHORUS_HAVE_HWLOC)
  std::ifstream list(hwlocOwnFiles() + "/COMPLETE");
  ASSERT_TRUE(list) << hwlocOwnFiles() << " is missing: tools/fetch-hwloc-xml puts hwloc's files there "
                    << "(tools/test runs it)";
  std::vector<std::string> names{std::istream_iterator<std::string>(list), std::istream_iterator<std::string>()};
  EXPECT_EQ(names.size(), 36u);  // hwloc 2.9.0's tests/hwloc/xml/*.xml
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string path = hwlocOwnFiles() + "/" + name;
    Topology t;
    try {
      t = readTopologyFile(path);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    const HwlocReference want = referenceOf(path);
    std::set<int> covered;
    int cores = 0;
    uint64_t memory = 0;
    const std::vector<int> cpus = t.nodesOf(0, NodeKind::kCpu);
    for (int c : cpus) {
      const Node& n = t.nodes[c];
      const std::vector<int> processors = parseCpuList(n.cpus);
      for (int p : processors) EXPECT_TRUE(covered.insert(p).second) << n.id << " shares processor " << p;
      cores += n.cores;
      memory += n.memoryBytes;
      if (!want.packages.empty()) {
        ASSERT_LT(n.package, static_cast<int>(want.packages.size())) << n.id;
        for (int p : processors) EXPECT_EQ(want.packages[n.package].count(p), 1u) << n.id << " " << p;
      }
    }
    EXPECT_EQ(covered, want.processors);
    EXPECT_EQ(cores, want.cores);
    // A NUMA node split over packages gives each an equal share, rounded down.
    EXPECT_LE(memory, want.memoryWithProcessors);
    EXPECT_GE(memory + cpus.size(), want.memoryWithProcessors);
    EXPECT_FALSE(search(t, cpus).rings.empty());
    std::vector<int> gpus = t.nodesOf(0, NodeKind::kGpu);
    if (!gpus.empty()) {
      EXPECT_GT(search(t, gpus).rings.at(0).bandwidth, 0);
    }
  }
#endif
}

TEST(HwlocOwnFiles, RealMachinesDevicesAreReadAsTheyAre) {
  CHORUS_REQUIRE_HWLOC_READER();
  ASSERT_TRUE(std::filesystem::exists(hwlocOwnFiles() + "/COMPLETE"))
      << hwlocOwnFiles() << " is missing: tools/fetch-hwloc-xml puts hwloc's files there (tools/test runs it)";
  auto read = [](const char* name) { return readTopologyFile(hwlocOwnFiles() + "/" + name); };
  {  // A POWER8 server: GPUs paired by NVLink (2 links, 40 GB/s), each pair NVLinked to its package.
    const Topology t = read("power8gpudistances.xml");
    ASSERT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 4u);
    for (const auto& [a, b] : {std::pair<const char*, const char*>{"gpu0", "gpu1"},
                               {"gpu2", "gpu3"},
                               {"gpu0", "cpu0"},
                               {"gpu1", "cpu0"},
                               {"gpu2", "cpu1"},
                               {"gpu3", "cpu1"}}) {
      const Link* nv = linkBetween(t, node(t, 0, a), node(t, 0, b));
      ASSERT_NE(nv, nullptr) << a << " " << b;
      EXPECT_EQ(nv->kind, LinkKind::kNvLink);
      EXPECT_DOUBLE_EQ(nv->bandwidth, 40);
    }
    // The ring runs at NVLink's 40 GB/s (the sockets' link is as fast), not PCIe's 7.9.
    const Plan plan = search(t, place(t, {"gpu0", "gpu1", "gpu2", "gpu3"}));
    ASSERT_FALSE(plan.rings.empty());
    EXPECT_DOUBLE_EQ(plan.rings[0].bandwidth, 40);
    EXPECT_EQ(widestPath(t, node(t, 0, "gpu1"), node(t, 0, "gpu2")).crossings[static_cast<int>(LinkKind::kNvLink)], 2);
  }
  {  // Three Tesla cards and the server's ES1000 console (ATI, VGA class, no OS device): no GPU.
    const Topology t = read("24em64t-2n6c2t-pci.xml");
    ASSERT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 3u);
    for (int g : t.nodesOf(0, NodeKind::kGpu)) EXPECT_NE(t.nodes[g].busId, "0000:01:03.0");
    const Plan plan = search(t, place(t, {"gpu0", "gpu1", "gpu2"}));
    EXPECT_DOUBLE_EQ(plan.rings.at(0).bandwidth, 4);  // their PCIe links
  }
  {  // lstopo --whole-io: the one GPU with a CUDA device is gpu0 whatever its place; a Matrox console is none.
    const Topology t = read("32em64t-2n8c2t-pci-wholeio.xml");
    ASSERT_EQ(t.nodesOf(0, NodeKind::kGpu).size(), 4u);
    EXPECT_EQ(t.nodes[node(t, 0, "gpu0")].busId, "0000:84:00.0");
  }
  {  // Cisco VICs with SR-IOV: 12 virtual functions have no network device, and are no NIC; the
     // physical functions are named by their verbs device where they have one.
    const Topology t = read("16intel64-manyVFs.xml");
    std::set<std::string> names;
    for (int n : t.nodesOf(0, NodeKind::kNic)) names.insert(t.nodes[n].device);
    EXPECT_EQ(names, (std::set<std::string>{"eth0", "eth1", "usnic_0", "usnic_1", "usnic_2", "eth7"}));
  }
  {  // A KNL in SNC-4 hybrid mode: each quarter's DDR and MCDRAM NUMA nodes are one CPU node.
    const Topology t = read("64intel64-fakeKNL-SNC4-hybrid.xml");
    ASSERT_EQ(t.nodesOf(0, NodeKind::kCpu).size(), 4u);
    for (int c : t.nodesOf(0, NodeKind::kCpu)) EXPECT_EQ(t.nodes[c].memoryBytes, uint64_t{3} << 30) << t.nodes[c].id;
  }
  {  // Four sockets and no NUMA information: one CPU node per socket, joined by inter-socket links.
    const Topology t = read("16em64t-4s2c2t.xml");
    ASSERT_EQ(t.nodesOf(0, NodeKind::kCpu).size(), 4u);
    const Path across = widestPath(t, node(t, 0, "cpu0p0"), node(t, 0, "cpu0p3"));
    EXPECT_EQ(across.crossings[static_cast<int>(LinkKind::kInterSocket)], 1);
  }
  {  // Written by a process kept to two of eight packages: all eight are read, the second GPU near the last.
    const Topology t = read("64intel64-3g2n+2n-irregulargroups+pci.xml");
    ASSERT_EQ(t.nodesOf(0, NodeKind::kCpu).size(), 8u);
    const int gpu1 = node(t, 0, "gpu1");
    EXPECT_EQ(widestPath(t, gpu1, node(t, 0, "cpu7")).crossings[static_cast<int>(LinkKind::kHostBridge)], 1);
  }
}

TEST(RingSearch, PcieServerRingCrossesTheSocketsOnceEachWayAndKeepsSwitchesTogether) {
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("pcie-2socket-8gpu.hwloc.xml"));
  // Ranks given the GPUs in a scattered order: the ring must still follow the machine.
  const std::vector<std::string> ids = {"gpu0", "gpu4", "gpu2", "gpu6", "gpu1", "gpu5", "gpu3", "gpu7"};
  const std::vector<int> ranks = place(t, ids);
  const Plan plan = search(t, ranks);
  ASSERT_EQ(plan.rings.size(), 1u);  // a second ring would find the inter-socket link used up
  const std::vector<int>& ring = plan.rings[0].order;
  ASSERT_EQ(ring.size(), 8u);
  auto gpuOf = [&](int rank) { return t.nodes[ranks[rank]].index; };
  EXPECT_EQ(changes(ring, [&](int r) { return gpuOf(r) / 4; }), 2);  // sockets
  EXPECT_EQ(changes(ring, [&](int r) { return gpuOf(r) / 2; }), 4);  // PCIe switches
  // Ranks 0 (gpu0) onward: gpu0 gpu1 gpu2 gpu3 gpu4 gpu5 gpu6 gpu7 is the machine's order.
  std::vector<int> gpus;
  for (int r : ring) gpus.push_back(gpuOf(r));
  EXPECT_EQ(gpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_DOUBLE_EQ(plan.rings[0].bandwidth, defaultBandwidth(LinkKind::kInterSocket));
  // Without the exhaustive search, the machine's (node) order groups them the same way.
  topology::SearchOptions oneByOne;
  oneByOne.exactDevices = 0;
  const Plan ordered = search(t, ranks, oneByOne);
  EXPECT_EQ(changes(ordered.rings[0].order, [&](int r) { return gpuOf(r) / 4; }), 2);
}

TEST(RingSearch, CpuServerRingGroupsRanksByNumaNodeAndSocket) {
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("cpu-2socket.hwloc.xml"));
  ASSERT_EQ(t.nodesOf(0, NodeKind::kCpu).size(), 4u);
  // Two ranks per NUMA node, given round-robin over the nodes.
  const std::vector<int> ranks = place(t, {"cpu0", "cpu2", "cpu1", "cpu3", "cpu0", "cpu2", "cpu1", "cpu3"});
  const Plan plan = search(t, ranks);
  ASSERT_EQ(plan.rings.size(), 1u);
  const std::vector<int>& ring = plan.rings[0].order;
  EXPECT_EQ(ring, (std::vector<int>{0, 4, 2, 6, 1, 5, 3, 7}));
  auto numaOf = [&](int r) { return t.nodes[ranks[r]].index; };
  EXPECT_EQ(changes(ring, numaOf), 4);
  EXPECT_EQ(changes(ring, [&](int r) { return t.nodes[ranks[r]].package; }), 2);
  EXPECT_DOUBLE_EQ(plan.rings[0].bandwidth, defaultBandwidth(LinkKind::kInterSocket));
  EXPECT_EQ(plan.trees[0].chains.at(0), ring);
}

TEST(RingSearch, ClusterRingsAreRailAlignedOnePerNic) {
  CHORUS_REQUIRE_XML_READER();
  const Topology t = readTopologyFile(data("dgx-h100-cluster4.chorus.xml"));
  std::vector<int> ranks;  // rank 8h + g on GPU g of host h
  for (int h = 0; h < 4; ++h) {
    for (int g = 0; g < 8; ++g) ranks.push_back(node(t, h, named("gpu", g)));
  }
  const Plan plan = search(t, ranks);
  ASSERT_EQ(plan.rings.size(), 8u);  // one per rail; a ninth would find NIC 0's port used up
  for (int c = 0; c < 8; ++c) {
    const Ring& ring = plan.rings[c];
    EXPECT_DOUBLE_EQ(ring.bandwidth, 50) << c;
    ASSERT_EQ(ring.order.size(), 32u);
    ASSERT_EQ(ring.nics.size(), 4u);
    const Tree& tree = plan.trees[c];
    ASSERT_EQ(tree.chains.size(), 4u);
    for (int h = 0; h < 4; ++h) {
      EXPECT_EQ(t.nodes[ring.nics[h]].id, named("nic", c)) << c;
      EXPECT_EQ(t.nodes[ring.nics[h]].host, h);
      // Host h's part of the ring: its 8 ranks, entered at GPU c (beside NIC c) and left from a
      // GPU of NIC c's socket.
      const std::vector<int> part(ring.order.begin() + 8 * h, ring.order.begin() + 8 * h + 8);
      EXPECT_EQ(part, tree.chains[h]);
      EXPECT_EQ(part.front(), 8 * h + c) << "ring " << c << " host " << h;
      EXPECT_EQ((part.back() % 8) / 4, c / 4) << "ring " << c << " host " << h;
      EXPECT_NE(part.back(), part.front());
      for (int r : part) EXPECT_EQ(r / 8, h);
    }
    // Two complementary binary trees of the hosts.
    EXPECT_EQ(tree.parentA, (std::vector<int>{-1, 0, 0, 1}));
    EXPECT_EQ(tree.parentB, (std::vector<int>{2, 3, 3, -1}));
  }
  // Each ring leaves its hosts from a different GPU than any other ring of its socket (each
  // switch's uplink carries one ring).
  std::set<int> exits;
  for (const Ring& ring : plan.rings) exits.insert(ring.order[7] % 8);
  EXPECT_EQ(exits.size(), 8u);
}

TEST(RingSearch, TreesOverManyHostsMakeEveryInteriorHostALeafOfTheOtherTree) {
  CHORUS_REQUIRE_HWLOC_READER();
  Topology t = readTopologyFile(data("cpu-2socket.hwloc.xml"));
  for (int h = 1; h < 7; ++h) t.cloneHost(0, named("h", h));
  std::vector<int> ranks;
  for (int h = 0; h < 7; ++h) ranks.push_back(node(t, h, named("cpu", h % 4)));
  const Plan plan = search(t, ranks);
  ASSERT_FALSE(plan.trees.empty());
  const Tree& tree = plan.trees[0];
  ASSERT_EQ(tree.parentA.size(), 7u);
  std::vector<int> childrenA(7, 0), childrenB(7, 0);
  for (int p = 0; p < 7; ++p) {
    if (tree.parentA[p] >= 0) ++childrenA[tree.parentA[p]];
    if (tree.parentB[p] >= 0) ++childrenB[tree.parentB[p]];
  }
  for (int p = 0; p < 7; ++p) EXPECT_FALSE(childrenA[p] > 0 && childrenB[p] > 0) << "host position " << p;
  EXPECT_EQ(std::count(tree.parentA.begin(), tree.parentA.end(), -1), 1);
  EXPECT_EQ(std::count(tree.parentB.begin(), tree.parentB.end(), -1), 1);
}

TEST(RingSearch, ALinkCrossedTwiceInOneDirectionGivesEachCrossingHalf) {
  // Two switches of two GPUs each under one CPU; the switches' uplinks (10 GB/s) are the narrow part.
  Topology t;
  t.addHost("h");
  auto add = [&](NodeKind kind, const std::string& id) { return addNode(t, 0, kind, id); };
  const int cpu = add(NodeKind::kCpu, "cpu0");
  const int swA = add(NodeKind::kPciSwitch, "swA");
  const int swB = add(NodeKind::kPciSwitch, "swB");
  t.addLink(cpu, swA, LinkKind::kHostBridge, 10, 1);
  t.addLink(cpu, swB, LinkKind::kHostBridge, 10, 1);
  // Nodes added interleaved, so that node order alternates between the switches.
  std::vector<int> gpus;
  for (const char* id : {"a1", "b1", "a2", "b2"}) {
    gpus.push_back(add(NodeKind::kGpu, id));
    t.addLink(id[0] == 'a' ? swA : swB, gpus.back(), LinkKind::kPcie, 100, 1);
  }
  const Plan best = search(t, gpus);
  EXPECT_DOUBLE_EQ(best.rings[0].bandwidth, 10);
  EXPECT_EQ(changes(best.rings[0].order, [&](int r) { return t.nodes[gpus[r]].id[0]; }), 2);
  SearchOptions nodeOrder;
  nodeOrder.exactDevices = 0;  // a1 b1 a2 b2: each uplink crossed twice each way
  const Plan interleaved = search(t, gpus, nodeOrder);
  EXPECT_EQ(interleaved.rings[0].order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_DOUBLE_EQ(interleaved.rings[0].bandwidth, 5);
}

// The device path's ring: ranks given by their GPUs' PCI bus ids (as CUDA writes them, upper
// case), two ranks sharing a GPU, on a machine whose NVLinks join the GPUs out of bus order.
TEST(RingSearch, GpuRingOrderFollowsNvLinkFromBusIds) {
  Topology t;
  t.addHost("h");
  const int cpu = addNode(t, 0, NodeKind::kCpu, "cpu0");
  std::vector<int> gpus;
  for (int g = 0; g < 4; ++g) {
    Node n;
    n.kind = NodeKind::kGpu;
    n.host = 0;
    n.id = named("gpu", g);
    n.index = g;
    n.busId = fmt::format("0000:{:02x}:00.0", 0xa0 + g);
    gpus.push_back(t.addNode(n));
    t.addLink(cpu, gpus.back(), LinkKind::kPcie);
  }
  // NVLink ring gpu0 - gpu2 - gpu1 - gpu3 - gpu0.
  for (auto [a, b] : {std::pair{0, 2}, std::pair{2, 1}, std::pair{1, 3}, std::pair{3, 0}}) {
    t.addLink(gpus[a], gpus[b], LinkKind::kNvLink);
  }
  // Ranks 0..4 on gpu0, gpu1, gpu2, gpu3, gpu3.
  const std::vector<std::string> busIds = {"0000:A0:00.0", "0000:A1:00.0", "0000:A2:00.0", "0000:A3:00.0",
                                           "0000:a3:00.0"};
  const std::vector<int> order = gpuRingOrder(t, busIds);
  ASSERT_EQ(order.size(), 5u);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4}));
  const std::vector<int> gpuOfRank = {0, 1, 2, 3, 3};
  for (size_t p = 0; p < order.size(); ++p) {
    const int a = gpuOfRank[order[p]], b = gpuOfRank[order[(p + 1) % order.size()]];
    if (a == b) continue;  // the two ranks of gpu3, side by side
    const Link* link = linkBetween(t, gpus[a], gpus[b]);
    ASSERT_NE(link, nullptr);
    EXPECT_EQ(link->kind, LinkKind::kNvLink) << "gpu" << a << " to gpu" << b << " in the ring";
  }
  try {
    gpuRingOrder(t, {"0000:A0:00.0", "0000:B7:00.0"});
    ADD_FAILURE() << "an unknown bus id was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's GPU 0000:B7:00.0 is not among the 4 GPUs"), std::string::npos)
        << e.what();
  }
}

TEST(RingSearch, RejectsRanksOffDevicesAndHostsWithoutNic) {
  CHORUS_REQUIRE_HWLOC_READER();
  Topology t = readTopologyFile(data("pcie-2socket-8gpu.hwloc.xml"));
  try {
    search(t, {node(t, 0, "gpu0"), node(t, 0, "nic0")});
    FAIL() << "a rank on a NIC was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 sits on nic 'nic0'"), std::string::npos) << e.what();
  }
  Topology bare;
  for (int h = 0; h < 2; ++h) addNode(bare, bare.addHost(named("bare", h)), NodeKind::kCpu, "cpu0");
  try {
    search(bare, {0, 1});
    FAIL() << "ranks across hosts without NICs were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("host 'bare0' (rank 0) has no NIC"), std::string::npos) << e.what();
  }
}

TEST(Binding, ProcessorListsParseAndPrintBack) {
  EXPECT_EQ(parseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parseCpuList("5,1-2,2"), (std::vector<int>{1, 2, 5}));
  EXPECT_TRUE(parseCpuList("").empty());
  EXPECT_EQ(formatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(formatCpuList(parseCpuList("16-31,48-63")), "16-31,48-63");
  for (const char* bad : {"3-1", "a", "1-2-3", "1,,2", "-4", "1 2"}) {
    EXPECT_THROW(parseCpuList(bad), std::invalid_argument) << bad;
  }
}

TEST(Binding, LocalRanksGoInBlocksOverTheNumaNodesOfATwoSocketServer) {
  CHORUS_REQUIRE_HWLOC_READER();
  // 4 NUMA nodes (processors 0-3, 4-7 on socket 0; 8-11, 12-15 on socket 1).
  const Topology t = readTopologyFile(data("cpu-2socket.hwloc.xml"));
  std::vector<std::vector<int>> nodeCpus;
  for (int node : t.nodesOf(0, NodeKind::kCpu)) nodeCpus.push_back(parseCpuList(t.nodes[node].cpus));
  ASSERT_EQ(nodeCpus.size(), 4u);
  const std::vector<int> all = parseCpuList("0-15");
  auto nodesFor = [&](int localSize) {
    std::vector<int> nodes;
    for (int local = 0; local < localSize; ++local) {
      const BindChoice choice = chooseBinding(nodeCpus, all, all, local, localSize, "auto", false);
      EXPECT_EQ(choice.cpus, nodeCpus.at(choice.node)) << local << " of " << localSize;
      nodes.push_back(choice.node);
    }
    return nodes;
  };
  EXPECT_EQ(nodesFor(8), (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(nodesFor(6), (std::vector<int>{0, 0, 1, 2, 2, 3}));
  EXPECT_EQ(nodesFor(2), (std::vector<int>{0, 2}));  // one per socket
  EXPECT_EQ(nodesFor(1), (std::vector<int>{0}));
  // Processors not online are left out; a node with none online is not bound to.
  const std::vector<int> half = parseCpuList("0-5");
  BindChoice partly = chooseBinding(nodeCpus, half, half, 1, 4, "auto", false);
  EXPECT_EQ(partly.node, 1);
  EXPECT_EQ(partly.cpus, (std::vector<int>{4, 5}));
  BindChoice offline = chooseBinding(nodeCpus, half, half, 2, 4, "auto", false);
  EXPECT_EQ(offline.node, 2);
  EXPECT_TRUE(offline.cpus.empty());
  EXPECT_NE(offline.reason.find("not online"), std::string::npos) << offline.reason;
}

TEST(Binding, ALaunchersBindingIsKeptAndNoneOrASharedProcessBindsNothing) {
  CHORUS_REQUIRE_HWLOC_READER();
  const Topology t = readTopologyFile(data("cpu-2socket.hwloc.xml"));
  std::vector<std::vector<int>> nodeCpus;
  for (int node : t.nodesOf(0, NodeKind::kCpu)) nodeCpus.push_back(parseCpuList(t.nodes[node].cpus));
  const std::vector<int> all = parseCpuList("0-15");
  // Bound by a launcher: kept, and the node is the one holding most of it (ties: the lowest).
  for (const auto& [current, node] :
       {std::pair{"5", 1}, std::pair{"3-5", 1}, std::pair{"3-4", 0}, std::pair{"12-13,15", 3}, std::pair{"2-13", 1}}) {
    const BindChoice choice = chooseBinding(nodeCpus, all, parseCpuList(current), 0, 4, "auto", false);
    EXPECT_TRUE(choice.cpus.empty()) << current;
    EXPECT_EQ(choice.node, node) << current;
    EXPECT_NE(choice.reason.find("launcher"), std::string::npos) << choice.reason;
  }
  const BindChoice none = chooseBinding(nodeCpus, all, all, 3, 4, "none", false);
  EXPECT_TRUE(none.cpus.empty());
  EXPECT_EQ(none.node, 0);
  const BindChoice shared = chooseBinding(nodeCpus, all, all, 3, 4, "auto", true);
  EXPECT_TRUE(shared.cpus.empty());
  EXPECT_NE(shared.reason.find("several ranks"), std::string::npos) << shared.reason;
  EXPECT_EQ(nodeHolding(nodeCpus, parseCpuList("20-30")), -1);
}

TEST(RingSearch, RankOrderOverHostsJoinsTheirTopologiesAndGroupsRanksByHostAndSocket) {
  CHORUS_REQUIRE_HWLOC_READER();
  // Two two-socket CPU servers; ranks alternate between the hosts (hosts numbered by their lowest
  // rank: rank 0 on host 0, rank 1 on host 1) and, on each host, over its four NUMA nodes.
  const Topology server = readTopologyFile(data("cpu-2socket.hwloc.xml"));  // one NIC, on socket 0
  const std::vector<Topology> hosts = {server, server};
  const std::vector<int> hostOfRank = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
  std::vector<std::string> nodeOfRank;
  for (int r = 0; r < 16; ++r) nodeOfRank.push_back(named("cpu", (r / 2) % 4));
  const std::vector<int> order = searchRankOrder(hosts, hostOfRank, nodeOfRank);
  ASSERT_EQ(order.size(), 16u);
  EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), 16u);
  EXPECT_EQ(changes(order, [&](int r) { return hostOfRank[r]; }), 2);
  // Each host's eight ranks cross its sockets once each way, and change NUMA node 4 times.
  auto socketOf = [&](int r) { return server.nodes[server.find(0, nodeOfRank[r])].package; };
  auto numaOf = [&](int r) { return nodeOfRank[r]; };
  for (int h = 0; h < 2; ++h) {
    std::vector<int> part;
    for (int r : order) {
      if (hostOfRank[r] == h) part.push_back(r);
    }
    EXPECT_EQ(changes(part, socketOf), 2) << "host " << h;
    EXPECT_EQ(changes(part, numaOf), 4) << "host " << h;
  }
  // A rank on a node its host lacks is named.
  std::vector<std::string> wrong = nodeOfRank;
  wrong[5] = "gpu7";
  try {
    searchRankOrder(hosts, hostOfRank, wrong);
    ADD_FAILURE() << "no error for a rank on a node its host lacks";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5 runs on 'gpu7'"), std::string::npos) << e.what();
  }
}

TEST(WidestPath, PrefersTheWiderWayAndNeverPassesThroughAGpu) {
  Topology t;
  t.addHost("h");
  auto add = [&](NodeKind kind, const std::string& id) { return addNode(t, 0, kind, id); };
  const int cpu = add(NodeKind::kCpu, "cpu0");
  const int a = add(NodeKind::kGpu, "a");
  const int b = add(NodeKind::kGpu, "b");
  const int c = add(NodeKind::kGpu, "c");
  const int sw = add(NodeKind::kPciSwitch, "sw");
  t.addLink(a, b, LinkKind::kNvLink, 100, 1);
  t.addLink(b, c, LinkKind::kNvLink, 100, 1);  // a-b-c would pass through GPU b
  t.addLink(a, sw, LinkKind::kPcie, 30, 1);
  t.addLink(sw, c, LinkKind::kPcie, 30, 1);
  t.addLink(a, cpu, LinkKind::kHostBridge, 10, 1);
  t.addLink(cpu, c, LinkKind::kHostBridge, 10, 1);
  const Path ac = widestPath(t, a, c);
  EXPECT_DOUBLE_EQ(ac.bandwidth, 30);
  EXPECT_EQ(ac.links.size(), 2u);
  EXPECT_EQ(ac.crossings[static_cast<int>(LinkKind::kPcie)], 2);
  EXPECT_TRUE(ac.forward[0]);
  EXPECT_TRUE(ac.forward[1]);
  const Path ca = widestPath(t, c, a);
  EXPECT_FALSE(ca.forward[0]);
  EXPECT_DOUBLE_EQ(widestPath(t, a, b).bandwidth, 100);
  t.addLink(sw, add(NodeKind::kGpu, "d"), LinkKind::kPcie, 5, 1);
  EXPECT_DOUBLE_EQ(widestPath(t, a, t.find(0, "d")).bandwidth, 5);
  const int isolated = add(NodeKind::kGpu, "lone");
  EXPECT_DOUBLE_EQ(widestPath(t, a, isolated).bandwidth, 0);
}

TEST(Discovery, FindsThisMachinesProcessorsMemoryAndNics) {
  const Topology t = discover();
  ASSERT_EQ(t.hosts.size(), 1u);
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  EXPECT_EQ(t.hosts[0], name);
  const std::vector<int> cpus = t.nodesOf(0, NodeKind::kCpu);
  ASSERT_FALSE(cpus.empty());
  int cores = 0;
  for (int c : cpus) {
    cores += t.nodes[c].cores;
    EXPECT_GT(t.nodes[c].memoryBytes, 0u);
    EXPECT_FALSE(t.nodes[c].cpus.empty());
  }
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
  // Every PCI network device sysfs shows is a NIC of the graph, joined to the network.
  std::set<std::string> nics;
  for (int n : t.nodesOf(0, NodeKind::kNic)) {
    nics.insert(t.nodes[n].device);
    EXPECT_FALSE(t.nodes[n].busId.empty());
  }
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/net")) {
    std::ifstream cls(entry.path() / "device" / "class");
    std::string value;
    if (!(cls >> value) || value.rfind("0x02", 0) != 0) continue;  // virtual, or not a network controller
    EXPECT_EQ(nics.count(entry.path().filename().string()), 1u) << entry.path();
  }
  EXPECT_NO_THROW(t.validate());
}

TEST(TopologyFiles, BadFilesAreRejectedNamingFileLineAndProblem) {
  CHORUS_REQUIRE_XML_READER();
  const std::string dangling = writeTemp("dangling.xml",
                                         "<chorus-topology version=\"1\">\n"
                                         "  <host name=\"a\">\n"
                                         "    <node id=\"cpu0\" kind=\"cpu\"/>\n"
                                         "    <link a=\"cpu0\" b=\"gpu9\" kind=\"pcie\"/>\n"
                                         "  </host>\n"
                                         "</chorus-topology>\n");
  std::string e = errorOf(dangling);
  EXPECT_NE(e.find("dangling.xml:4: <link>: b=\"gpu9\" names no node"), std::string::npos) << e;

  const std::string kind =
      writeTemp("kind.xml",
                "<chorus-topology version=\"1\">\n"
                "  <host name=\"a\"><node id=\"cpu0\" kind=\"cpu\"/><node id=\"x\" kind=\"tpu\"/></host>\n"
                "</chorus-topology>\n");
  e = errorOf(kind);
  EXPECT_NE(e.find("kind 'tpu' is not"), std::string::npos) << e;

  const std::string bandwidth =
      writeTemp("bandwidth.xml",
                "<chorus-topology version=\"1\">\n"
                "  <host name=\"a\"><node id=\"cpu0\" kind=\"cpu\"/><node id=\"g\" kind=\"gpu\"/>\n"
                "  <link a=\"cpu0\" b=\"g\" kind=\"pcie\" bandwidth=\"fast\"/></host>\n"
                "</chorus-topology>\n");
  e = errorOf(bandwidth);
  EXPECT_NE(e.find("bandwidth=\"fast\" is not a non-negative number"), std::string::npos) << e;

  const std::string noCpu =
      writeTemp("nocpu.xml", "<chorus-topology version=\"1\"><host name=\"a\"/></chorus-topology>\n");
  e = errorOf(noCpu);
  EXPECT_NE(e.find("host 'a' has no CPU"), std::string::npos) << e;

  const std::string like =
      writeTemp("like.xml", "<chorus-topology version=\"1\">\n<host name=\"b\" like=\"z\"/>\n</chorus-topology>\n");
  e = errorOf(like);
  EXPECT_NE(e.find("like.xml:2: <host>: like=\"z\" names no host described in full"), std::string::npos) << e;

  const std::string nvlink =
      writeTemp("nvlink.xml",
                "<system version=\"1\">\n"
                " <cpu numaid=\"0\">\n"
                "  <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
                "   <gpu dev=\"0\" sm=\"80\"><nvlink target=\"0000:02:00.0\" count=\"4\" tclass=\"0x030200\"/></gpu>\n"
                "  </pci>\n"
                " </cpu>\n"
                "</system>\n");
  e = errorOf(nvlink);
  EXPECT_NE(e.find("nvlink.xml:4: <nvlink>: its target 0000:02:00.0 is no device of this file"), std::string::npos)
      << e;

  e = errorOf(writeTemp("root.xml", "<machine/>\n"));
  EXPECT_NE(e.find("the root element <machine> is none of"), std::string::npos) << e;
  e = errorOf(writeTemp("broken.xml", "<chorus-topology version=\"1\"><host name=\"a\">\n"));
  EXPECT_NE(e.find("broken.xml: not readable XML"), std::string::npos) << e;
  e = errorOf(writeTemp("hwloc.xml", "<topology version=\"2.0\"><object type=\"Banana\"/></topology>\n"));
#if defined(CHORUS_HAVE_HWLOC)
  EXPECT_NE(e.find("hwloc.xml: hwloc"), std::string::npos) << e;
  // A file hwloc 3 wrote (format 3.0), read by hwloc 2: the version is named, and how to get one.
  std::string v3;
  {
    std::ifstream in(data("nvlink-cpu-2socket-8gpu.hwloc.xml"));
    v3.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string v2Root = "<topology version=\"2.0\">";
  v3.replace(v3.find(v2Root), v2Root.size(), "<topology version=\"3.0\">");
  e = errorOf(writeTemp("v3.hwloc.xml", v3));
  if (!e.empty()) {  // empty only with an hwloc 3, which reads it
    EXPECT_NE(e.find("v3.hwloc.xml: hwloc XML of format version 3, which this hwloc (2."), std::string::npos) << e;
    EXPECT_NE(e.find("--export-xml-flags v2"), std::string::npos) << e;
  }
#else
  EXPECT_NE(e.find("hwloc.xml: an hwloc XML file, but this build of chorus has no hwloc"), std::string::npos) << e;
#endif
  e = errorOf(::testing::TempDir() + "absent.xml");
  EXPECT_NE(e.find("absent.xml: cannot read the file: No such file or directory"), std::string::npos) << e;
}

#if !defined(CHORUS_HAVE_LIBXML2) || !defined(CHORUS_HAVE_HWLOC)
// A build without a reader refuses the files it cannot read, naming the file and the library.
TEST(TopologyFiles, WithoutItsReaderAFileIsRefusedNamingTheLibrary) {
  const std::string hwloc = errorOf(data("cpu-2socket.hwloc.xml"));
  EXPECT_NE(hwloc.find("cpu-2socket.hwloc.xml: "), std::string::npos) << hwloc;
#if !defined(CHORUS_HAVE_LIBXML2)
  EXPECT_NE(hwloc.find("has no libxml2"), std::string::npos) << hwloc;
  const std::string nccl = errorOf(data("dgx-h100.nccl.xml"));
  EXPECT_NE(nccl.find("dgx-h100.nccl.xml: this build of chorus has no libxml2"), std::string::npos) << nccl;
#else
  EXPECT_NE(hwloc.find("has no hwloc"), std::string::npos) << hwloc;
#endif
}
#endif

}  // namespace
}  // namespace chorus::topology
