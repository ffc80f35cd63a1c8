// discover.cc: this host through hwloc (and NVML when its library loads), and hwloc's XML files
// through the same conversion.
//
// Conversion: one CPU node per NUMA node and package (its processors, cores, memory, L3; NUMA
// nodes of the same processors are one, memory-only ones none: addCpus); the CPU nodes of one
// package joined pairwise (package links), the packages joined through their first CPU nodes
// (inter-socket links). Each host bridge's children hang off the CPU node it is local
// to (host-bridge links); each PCI-PCI bridge is a PCIe switch node, joined to its parent by a
// PCIe link of the bridge's link speed; GPUs (class 03xx) and NICs (02xx) are nodes under their
// bridge, each NIC joined to the network at its port speed (a display controller that is no
// compute device, and other PCI devices, are left out). NVLinks come from hwloc's NVLinkBandwidth
// distances where it has them (files lstopo wrote on NVLink machines), and on this host from NVML:
// GPU to GPU, to the NVSwitches (taken together as one switch), or to a CPU package.
//
// Built without hwloc, discovery reads sysfs instead: one CPU node per NUMA node (processors,
// cores, memory), each network device on a PCI bus a NIC under the first node, and GPUs from NVML;
// no PCIe switches. hwloc XML files are then refused by name.
#include "src/topology/discover.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "src/topology/bind.h"

#if defined(CHORUS_HAVE_HWLOC)
#include <hwloc.h>
#endif

namespace chorus::topology {
namespace {

// NIC port speed in GB/s from sysfs, 0 when unknown (virtual NICs say -1).
double portSpeed(const std::string& netName, const std::string& fabricName) {
  if (!fabricName.empty()) {
    std::ifstream rate("/sys/class/infiniband/" + fabricName + "/ports/1/rate");
    double gbits = 0;
    if (rate >> gbits && gbits > 0) return gbits / 8;
  }
  if (!netName.empty()) {
    std::ifstream speed("/sys/class/net/" + netName + "/speed");
    double mbits = 0;
    if (speed >> mbits && mbits > 0) return mbits / 8000;
  }
  return 0;
}

#if defined(CHORUS_HAVE_HWLOC)
std::string busIdOf(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
}

std::string listOf(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string out(text);
  std::free(text);
  return out;
}

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* set) const { hwloc_bitmap_free(set); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

class Converter {
 public:
  Converter(hwloc_topology_t hw, Topology& t, int host, bool live) : hw_(hw), t_(t), host_(host), live_(live) {}

  void run() {
    addCpus();
    for (hwloc_obj_t b = hwloc_get_next_bridge(hw_, nullptr); b != nullptr; b = hwloc_get_next_bridge(hw_, b)) {
      if (b->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_HOST) continue;
      const int cpu = cpuNear(hwloc_get_non_io_ancestor_obj(hw_, b));
      for (hwloc_obj_t child = b->io_first_child; child != nullptr; child = child->next_sibling) {
        walk(child, cpu, LinkKind::kHostBridge);
      }
    }
    numberGpus();
    addNvLinks();
  }

 private:
  // A CPU node is the part of a NUMA node's locality inside one package. NUMA nodes with the same
  // processors (a KNL's MCDRAM beside its DDR; a cluster-on-die file written without its groups)
  // make one CPU node holding both memories; a NUMA node over several packages (a file with its
  // NUMA node at the machine, or none, so hwloc made one) makes one CPU node per package, each
  // with an equal share of its memory; a NUMA node without processors (memory only) makes none;
  // a package's processors in no NUMA node (theirs offline) make one of their own, "package<N>".
  void addCpus() {
    const int numas = hwloc_get_nbobjs_by_type(hw_, HWLOC_OBJ_NUMANODE);
    if (numas <= 0) throw std::invalid_argument("hwloc found no NUMA node");
    std::vector<hwloc_obj_t> packages;
    for (int p = 0; p < hwloc_get_nbobjs_by_type(hw_, HWLOC_OBJ_PACKAGE); ++p) {
      packages.push_back(hwloc_get_obj_by_type(hw_, HWLOC_OBJ_PACKAGE, p));
    }
    if (packages.empty()) packages.push_back(hwloc_get_root_obj(hw_));  // no packages: the machine is one
    for (int i = 0; i < numas; ++i) {
      const hwloc_obj_t numa = hwloc_get_obj_by_type(hw_, HWLOC_OBJ_NUMANODE, i);
      std::vector<std::pair<int, Bitmap>> parts;  // package, processors
      for (int p = 0; p < static_cast<int>(packages.size()); ++p) {
        Bitmap part(hwloc_bitmap_alloc());
        hwloc_bitmap_and(part.get(), numa->cpuset, packages[p]->cpuset);
        if (!hwloc_bitmap_iszero(part.get())) parts.emplace_back(p, std::move(part));
      }
      const int index = static_cast<int>(numa->os_index);
      for (auto& [package, cpus] : parts) {
        const uint64_t memory = numa->attr->numanode.local_memory / parts.size();
        const int same = cpuWith(cpus.get());
        if (same >= 0) {
          t_.nodes[same].memoryBytes += memory;
          cpuByNuma_.emplace(index, same);
          continue;
        }
        const int id = addCpu(parts.size() == 1 ? fmt::format("cpu{}", index) : fmt::format("cpu{}p{}", index, package),
                              index, package, std::move(cpus), memory);
        cpuByNuma_.emplace(index, id);
      }
    }
    for (int p = 0; p < static_cast<int>(packages.size()); ++p) {
      Bitmap rest(hwloc_bitmap_dup(packages[p]->cpuset));
      for (const auto& [id, set] : cpuSets_) hwloc_bitmap_andnot(rest.get(), rest.get(), set.get());
      if (!hwloc_bitmap_iszero(rest.get())) addCpu(fmt::format("package{}", p), -1, p, std::move(rest), 0);
    }
    if (cpuSets_.empty()) throw std::invalid_argument("hwloc found no processors");
  }

  int addCpu(std::string name, int numa, int package, Bitmap cpus, uint64_t memory) {
    Node node;
    node.kind = NodeKind::kCpu;
    node.host = host_;
    node.index = numa;
    node.id = std::move(name);
    node.package = package;
    node.cpus = listOf(cpus.get());
    // A file without cores (threads only) counts its processors.
    node.cores = hwloc_get_nbobjs_inside_cpuset_by_type(hw_, cpus.get(), HWLOC_OBJ_CORE);
    if (node.cores == 0) node.cores = hwloc_get_nbobjs_inside_cpuset_by_type(hw_, cpus.get(), HWLOC_OBJ_PU);
    node.memoryBytes = memory;
    const int l3s = hwloc_get_nbobjs_by_type(hw_, HWLOC_OBJ_L3CACHE);
    for (int c = 0; c < l3s && node.l3Bytes == 0; ++c) {
      const hwloc_obj_t l3 = hwloc_get_obj_by_type(hw_, HWLOC_OBJ_L3CACHE, c);
      if (hwloc_bitmap_intersects(l3->cpuset, cpus.get())) node.l3Bytes = l3->attr->cache.size;
    }
    const int id = t_.addNode(node);
    cpuSets_.emplace_back(id, std::move(cpus));
    // Package links within a package; one inter-socket link between packages' first nodes.
    for (int other : t_.nodesOf(host_, NodeKind::kCpu)) {
      if (other != id && t_.nodes[other].package == package) t_.addLink(other, id, LinkKind::kPackage);
    }
    if (firstOfPackage_.count(package) == 0) {
      for (const auto& [pkg, first] : firstOfPackage_) t_.addLink(first, id, LinkKind::kInterSocket);
      firstOfPackage_[package] = id;
    }
    return id;
  }

  // The CPU node of exactly these processors, -1 when none.
  int cpuWith(hwloc_const_bitmap_t cpus) const {
    for (const auto& [id, set] : cpuSets_) {
      if (hwloc_bitmap_isequal(set.get(), cpus)) return id;
    }
    return -1;
  }

  // The CPU node nearest an object: the one of the first NUMA node in its nodeset that shares its
  // processors, else the first sharing its processors, else the first CPU node.
  int cpuNear(hwloc_obj_t obj) const {
    if (obj == nullptr) return cpuSets_.front().first;
    const int numa = obj->nodeset != nullptr ? hwloc_bitmap_first(obj->nodeset) : -1;
    int sharing = -1;
    for (const auto& [id, set] : cpuSets_) {
      if (obj->cpuset == nullptr || !hwloc_bitmap_intersects(set.get(), obj->cpuset)) continue;
      if (t_.nodes[id].index == numa) return id;
      if (sharing < 0) sharing = id;
    }
    if (sharing >= 0) return sharing;
    const auto found = cpuByNuma_.find(numa);
    return found != cpuByNuma_.end() ? found->second : cpuSets_.front().first;
  }

  void walk(hwloc_obj_t obj, int parent, LinkKind kind) {
    if (obj->type == HWLOC_OBJ_BRIDGE) {
      Node node;
      node.kind = NodeKind::kPciSwitch;
      node.host = host_;
      node.id = fmt::format("pci{}", switches_++);
      if (obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) node.busId = busIdOf(obj->attr->bridge.upstream.pci);
      const int id = t_.addNode(node);
      link(parent, id, kind,
           obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI ? obj->attr->bridge.upstream.pci.linkspeed : 0);
      for (hwloc_obj_t child = obj->io_first_child; child != nullptr; child = child->next_sibling) {
        walk(child, id, LinkKind::kPcie);
      }
      return;
    }
    if (obj->type != HWLOC_OBJ_PCI_DEVICE) return;
    const unsigned cls = obj->attr->pcidev.class_id;
    Node node;
    node.host = host_;
    node.busId = busIdOf(obj->attr->pcidev);
    std::string netName, fabricName;
    // A GPU shows as several OS devices (cuda0, nvml0, opencl0d0, rsmi0, card0 ...): one GPU,
    // numbered by CUDA, else by NVML or ROCm SMI (numberGpus).
    int cudaIndex = -1, smiIndex = -1;
    bool compute = false;
    for (hwloc_obj_t os = obj->io_first_child; os != nullptr; os = os->next_sibling) {
      if (os->type != HWLOC_OBJ_OS_DEVICE || os->name == nullptr) continue;
      const std::string name = os->name;
      if (os->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) netName = name;
      if (os->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) fabricName = name;
      if (name.rfind("cuda", 0) == 0) cudaIndex = std::atoi(name.c_str() + 4);
      if (name.rfind("nvml", 0) == 0) smiIndex = std::atoi(name.c_str() + 4);
      if (name.rfind("rsmi", 0) == 0) smiIndex = std::atoi(name.c_str() + 4);
      compute = compute || name.rfind("cuda", 0) == 0 || name.rfind("nvml", 0) == 0 || name.rfind("rsmi", 0) == 0 ||
                name.rfind("opencl", 0) == 0 || name.rfind("ze", 0) == 0;
    }
    // Without a compute OS device (a file written without them, or only a "card0"): NVIDIA's
    // display controllers, and AMD's that are no VGA controller (a server's ES1000 console is one;
    // Instinct cards are 3D or other display controllers). Other vendors' (ASPEED, Matrox: BMC
    // consoles) are no GPU.
    const unsigned vendor = obj->attr->pcidev.vendor_id;
    if (!compute) compute = vendor == 0x10de || (vendor == 0x1002 && cls != 0x0300);
    if ((cls >> 8) == 0x03) {
      if (!compute) return;
      node.kind = NodeKind::kGpu;
      node.id = fmt::format("gpu-{}", gpus_.size());  // numbered once all are found (numberGpus)
      gpus_.push_back({cudaIndex, smiIndex, 0});
      if (const char* model = hwloc_obj_get_info_by_name(obj, "PCIDevice")) node.device = model;
    } else if ((cls >> 8) == 0x02) {
      // A function no driver took (an SR-IOV virtual function left to virtual machines) has no
      // network device: no NIC, where the topology shows OS devices at all.
      if (netName.empty() && fabricName.empty() && hwloc_get_next_osdev(hw_, nullptr) != nullptr) return;
      node.kind = NodeKind::kNic;
      node.index = static_cast<int>(t_.nodesOf(host_, NodeKind::kNic).size());
      node.id = fmt::format("nic{}", node.index);
      node.device = !fabricName.empty() ? fabricName : netName;
    } else {  // NVSwitches' PCI functions carry no data: NVML joins GPUs to them (addNvml)
      return;
    }
    const int id = t_.addNode(node);
    if (node.kind == NodeKind::kGpu) gpus_.back().node = id;
    nodeOfDevice_[obj] = id;
    link(parent, id, kind, obj->attr->pcidev.linkspeed);
    if (node.kind == NodeKind::kNic) {
      const double speed = live_ ? portSpeed(netName, fabricName) : 0;
      t_.addLink(id, t_.network(), LinkKind::kNic, speed > 0 ? speed : defaultBandwidth(LinkKind::kNic),
                 defaultLatencyUs(LinkKind::kNic));
    }
  }

  // GPU numbers: CUDA's where the file has it, else NVML's or ROCm SMI's, else the first free
  // ones in the order found.
  void numberGpus() {
    std::set<int> taken;
    auto claim = [&](Found& gpu, int number) {
      if (number < 0 || taken.count(number) > 0) return;
      t_.nodes[gpu.node].index = number;
      taken.insert(number);
    };
    for (Found& gpu : gpus_) claim(gpu, gpu.cuda);
    for (Found& gpu : gpus_) {
      if (t_.nodes[gpu.node].index < 0) claim(gpu, gpu.smi);
    }
    int next = 0;
    for (Found& gpu : gpus_) {
      if (t_.nodes[gpu.node].index >= 0) continue;
      while (taken.count(next) > 0) ++next;
      claim(gpu, next);
    }
    for (const Found& gpu : gpus_) t_.nodes[gpu.node].id = fmt::format("gpu{}", t_.nodes[gpu.node].index);
  }

  void link(int a, int b, LinkKind kind, float speed) {
    t_.addLink(a, b, kind, speed > 0 ? speed : defaultBandwidth(kind), defaultLatencyUs(kind));
  }

  // NVLinks from hwloc's NVLinkBandwidth distances (its NVML backend; lstopo writes them to XML):
  // GPU to GPU, GPU to NVSwitch (all switch ports taken together as one switch, as NVML discovery
  // does) and GPU to a processor package (POWER's NVLink to the CPU), each at the matrix's
  // bandwidth (MB/s per direction).
  void addNvLinks() {
    unsigned count = 1;
    hwloc_distances_s* distances = nullptr;
    if (hwloc_distances_get_by_name(hw_, "NVLinkBandwidth", &count, &distances, 0) != 0 || count == 0) return;
#if HWLOC_API_VERSION >= 0x00020500
    // Fails with ENOENT where there is no switch: the matrix is then used as it is.
    hwloc_distances_transform(hw_, distances, HWLOC_DISTANCES_TRANSFORM_MERGE_SWITCH_PORTS, nullptr, 0);
#endif
    const unsigned n = distances->nbobjs;
    std::vector<int> nodes(n, -1);
    for (unsigned i = 0; i < n; ++i) nodes[i] = nodeOfNvLinkEnd(distances->objs[i]);
    for (unsigned i = 0; i < n; ++i) {
      for (unsigned j = i + 1; j < n; ++j) {
        const uint64_t mbps = std::max(distances->values[i * n + j], distances->values[j * n + i]);
        if (mbps == 0 || nodes[i] < 0 || nodes[j] < 0 || nodes[i] == nodes[j]) continue;
        t_.addLink(nodes[i], nodes[j], LinkKind::kNvLink, static_cast<double>(mbps) / 1000,
                   defaultLatencyUs(LinkKind::kNvLink));
      }
    }
    hwloc_distances_release(hw_, distances);
  }

  // The node an end of an NVLink stands for: a GPU (named by one of its OS devices or its PCI
  // device), the NVSwitch (made on first use), a package's first CPU node; -1 for anything else.
  int nodeOfNvLinkEnd(hwloc_obj_t obj) {
    if (obj != nullptr && obj->type == HWLOC_OBJ_OS_DEVICE) obj = obj->parent;
    if (obj == nullptr) return -1;
    if (obj->type == HWLOC_OBJ_PCI_DEVICE && obj->subtype != nullptr && std::string(obj->subtype) == "NVSwitch") {
      if (nvSwitch_ < 0) {
        Node node;
        node.kind = NodeKind::kNvSwitch;
        node.host = host_;
        node.id = "nvswitch0";
        nvSwitch_ = t_.addNode(node);
      }
      return nvSwitch_;
    }
    if (obj->type == HWLOC_OBJ_PCI_DEVICE) {
      const auto found = nodeOfDevice_.find(obj);
      return found != nodeOfDevice_.end() && t_.nodes[found->second].kind == NodeKind::kGpu ? found->second : -1;
    }
    if (obj->type == HWLOC_OBJ_PACKAGE) {
      for (int cpu : t_.nodesOf(host_, NodeKind::kCpu)) {
        if (t_.nodes[cpu].package == static_cast<int>(obj->logical_index)) return cpu;
      }
    }
    return -1;
  }

  hwloc_topology_t hw_;
  Topology& t_;
  int host_;
  bool live_;
  std::map<int, int> cpuByNuma_;                 // NUMA node number: its first CPU node
  std::map<int, int> firstOfPackage_;            // package: its first CPU node
  std::vector<std::pair<int, Bitmap>> cpuSets_;  // CPU node, its processors
  std::map<hwloc_obj_t, int> nodeOfDevice_;      // GPUs' and NICs' PCI devices
  struct Found {
    int cuda, smi;  // the GPU's CUDA and NVML (or ROCm SMI) numbers, -1 when the file has none
    int node;
  };
  std::vector<Found> gpus_;
  int nvSwitch_ = -1;
  int switches_ = 0;
};

struct HwlocDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using HwlocTopology = std::unique_ptr<hwloc_topology, HwlocDeleter>;

// This machine (text null), or hwloc XML text.
HwlocTopology loadHwloc(const std::string* text, const std::string& name) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) throw std::runtime_error("hwloc_topology_init failed");
  HwlocTopology hw(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // A file describes its machine whole: the processors the process that wrote it was kept to (a
  // job's cgroup) are no limit on the ranks that will run there.
  if (text != nullptr) hwloc_topology_set_flags(raw, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  // hwloc wants the buffer's length with its terminating NUL.
  if (text != nullptr && hwloc_topology_set_xmlbuffer(raw, text->c_str(), static_cast<int>(text->size() + 1)) != 0) {
    throw std::invalid_argument(fmt::format("{}: hwloc cannot read it as hwloc XML", name));
  }
  if (hwloc_topology_load(raw) != 0) {
    // The one cause worth naming: a file newer than this hwloc's format (hwloc 3 writes version
    // 3.0 XML, which hwloc 2 refuses).
    const unsigned api = hwloc_get_api_version();
    const std::string root = "<topology version=\"";
    const size_t at = text != nullptr ? text->find(root) : std::string::npos;
    if (at != std::string::npos) {
      const int major = std::atoi(text->c_str() + at + root.size());
      if (major > static_cast<int>(api >> 16)) {
        throw std::invalid_argument(
            fmt::format("{}: hwloc XML of format version {}, which this hwloc ({}.x) cannot read: have lstopo write "
                        "the file in version {} format (hwloc 3: --export-xml-flags v2)",
                        name, major, api >> 16, api >> 16));
      }
    }
    throw std::invalid_argument(fmt::format("{}: hwloc failed to load the topology", name));
  }
  return hw;
}
#else
// The first line of a sysfs file, "" when it cannot be read.
std::string sysfsLine(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// This host from sysfs: CPU nodes by NUMA node, and the network devices on a PCI bus as NICs.
void addSysfs(Topology& t, int host) {
  namespace fs = std::filesystem;
  std::map<int, std::vector<int>> cpusOfNuma;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/node", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.find_first_not_of("0123456789", 4) != std::string::npos) continue;
    try {
      cpusOfNuma[std::atoi(name.c_str() + 4)] = parseCpuList(sysfsLine(entry.path() / "cpulist"));
    } catch (const std::invalid_argument&) {
    }
  }
  std::erase_if(cpusOfNuma, [](const auto& numa) { return numa.second.empty(); });
  if (cpusOfNuma.empty()) cpusOfNuma[0] = onlineCpus();  // no NUMA in sysfs: one node of every processor
  const long pageBytes = sysconf(_SC_PAGESIZE);
  const long pages = sysconf(_SC_PHYS_PAGES);
  for (const auto& [numa, cpus] : cpusOfNuma) {
    Node node;
    node.kind = NodeKind::kCpu;
    node.host = host;
    node.index = numa;
    node.id = fmt::format("cpu{}", numa);
    node.cpus = formatCpuList(cpus);
    std::set<std::pair<std::string, std::string>> cores;  // (package, core)
    for (int cpu : cpus) {
      const fs::path topo = fmt::format("/sys/devices/system/cpu/cpu{}/topology", cpu);
      cores.insert({sysfsLine(topo / "physical_package_id"), sysfsLine(topo / "core_id")});
    }
    node.package = std::max(
        0, std::atoi(
               sysfsLine(fmt::format("/sys/devices/system/cpu/cpu{}/topology/physical_package_id", cpus[0])).c_str()));
    node.cores = static_cast<int>(cores.size());
    // "Node 0 MemTotal:  123456 kB"; the whole memory when there is one node and no such line.
    std::ifstream meminfo(fmt::format("/sys/devices/system/node/node{}/meminfo", numa));
    for (std::string line; std::getline(meminfo, line);) {
      unsigned long long kb = 0;
      if (std::sscanf(line.c_str(), "Node %*d MemTotal: %llu kB", &kb) == 1) node.memoryBytes = kb * 1024;
    }
    if (node.memoryBytes == 0 && cpusOfNuma.size() == 1 && pageBytes > 0 && pages > 0) {
      node.memoryBytes = static_cast<uint64_t>(pageBytes) * static_cast<uint64_t>(pages);
    }
    const int id = t.addNode(node);
    for (int other : t.nodesOf(host, NodeKind::kCpu)) {
      if (other == id) continue;
      t.addLink(other, id, t.nodes[other].package == node.package ? LinkKind::kPackage : LinkKind::kInterSocket);
    }
  }
  const int first = t.nodesOf(host, NodeKind::kCpu).front();
  for (const auto& entry : fs::directory_iterator("/sys/class/net", error)) {
    if (sysfsLine(entry.path() / "device" / "class").rfind("0x02", 0) != 0) continue;  // virtual, or not a NIC
    const fs::path device = fs::canonical(entry.path() / "device", error);
    if (error) continue;
    Node node;
    node.kind = NodeKind::kNic;
    node.host = host;
    node.index = static_cast<int>(t.nodesOf(host, NodeKind::kNic).size());
    node.id = fmt::format("nic{}", node.index);
    node.busId = device.filename().string();
    node.device = entry.path().filename().string();
    const int id = t.addNode(node);
    t.addLink(first, id, LinkKind::kHostBridge);
    const double speed = portSpeed(node.device, "");
    t.addLink(id, t.network(), LinkKind::kNic, speed > 0 ? speed : defaultBandwidth(LinkKind::kNic),
              defaultLatencyUs(LinkKind::kNic));
  }
}
#endif

// ---- NVML, loaded at run time: the few calls we use, declared as NVML's ABI has them ----
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
using NvmlDevice = void*;

struct Nvml {
  void* library = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, NvmlDevice*) = nullptr;
  int (*pciInfo)(NvmlDevice, NvmlPciInfo*) = nullptr;
  int (*name)(NvmlDevice, char*, unsigned) = nullptr;
  int (*linkState)(NvmlDevice, unsigned, int*) = nullptr;
  int (*linkRemote)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  int (*linkVersion)(NvmlDevice, unsigned, unsigned*) = nullptr;

  template <typename F>
  bool bind(F& f, const char* symbol) {
    f = reinterpret_cast<F>(dlsym(library, symbol));
    return f != nullptr;
  }
  bool open() {
    library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return false;
    return bind(init, "nvmlInit_v2") && bind(shutdown, "nvmlShutdown") && bind(count, "nvmlDeviceGetCount_v2") &&
           bind(handle, "nvmlDeviceGetHandleByIndex_v2") && bind(pciInfo, "nvmlDeviceGetPciInfo_v3") &&
           bind(name, "nvmlDeviceGetName") && bind(linkState, "nvmlDeviceGetNvLinkState") &&
           bind(linkRemote, "nvmlDeviceGetNvLinkRemotePciInfo_v2") && bind(linkVersion, "nvmlDeviceGetNvLinkVersion") &&
           init() == 0;
  }
  ~Nvml() {
    if (library != nullptr) {
      if (shutdown != nullptr) shutdown();
      dlclose(library);
    }
  }
};

// NVML's "00000000:17:00.0" as hwloc's "0000:17:00.0".
std::string shortBusId(const char* busId) {
  std::string id(busId);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return id.size() > 12 ? id.substr(id.size() - 12) : id;
}

// GPUs and NVLinks from NVML; no library, no GPUs (not an error).
void addNvml(Topology& t, int host) {
  Nvml nvml;
  if (!nvml.open()) return;
  unsigned count = 0;
  if (nvml.count(&count) != 0) return;
  std::map<std::string, int> gpuByBus;
  std::vector<NvmlDevice> devices(count);
  for (unsigned i = 0; i < count; ++i) {
    NvmlPciInfo pci{};
    if (nvml.handle(i, &devices[i]) != 0 || nvml.pciInfo(devices[i], &pci) != 0) continue;
    const std::string bus = shortBusId(pci.busId);
    int id = -1;
    for (int g : t.nodesOf(host, NodeKind::kGpu)) {
      if (t.nodes[g].busId == bus) id = g;
    }
    if (id < 0) {  // hwloc saw no PCI tree: the GPU hangs off the first CPU
      Node node;
      node.kind = NodeKind::kGpu;
      node.host = host;
      node.busId = bus;
      id = t.addNode(node);
      t.addLink(t.nodesOf(host, NodeKind::kCpu).front(), id, LinkKind::kHostBridge);
    }
    t.nodes[id].index = static_cast<int>(i);
    t.nodes[id].id = fmt::format("gpu{}", i);
    char model[96] = {};
    if (nvml.name(devices[i], model, sizeof model) == 0) t.nodes[id].device = model;
    gpuByBus[bus] = id;
  }
  constexpr unsigned kMaxLinks = 18;
  for (const auto& [bus, gpu] : gpuByBus) {
    const NvmlDevice device = devices[t.nodes[gpu].index];
    std::map<std::string, int> linksTo;
    double perLink = 25;
    for (unsigned l = 0; l < kMaxLinks; ++l) {
      int active = 0;
      NvmlPciInfo remote{};
      if (nvml.linkState(device, l, &active) != 0 || active == 0) continue;
      if (nvml.linkRemote(device, l, &remote) != 0) continue;
      unsigned version = 0;
      if (nvml.linkVersion(device, l, &version) == 0 && version == 1) perLink = 20;
      ++linksTo[shortBusId(remote.busId)];
    }
    // NVSwitches are taken as one switch (every GPU reaches each alike): a GPU's links to them add up.
    int toSwitches = 0;
    for (const auto& [remoteBus, links] : linksTo) {
      auto peer = gpuByBus.find(remoteBus);
      if (peer == gpuByBus.end()) {
        toSwitches += links;
      } else if (peer->second > gpu) {  // each pair once
        t.addLink(gpu, peer->second, LinkKind::kNvLink, perLink * links, defaultLatencyUs(LinkKind::kNvLink));
      }
    }
    if (toSwitches > 0) {
      t.addLink(gpu, t.nvSwitch(host), LinkKind::kNvLink, perLink * toSwitches, defaultLatencyUs(LinkKind::kNvLink));
    }
  }
}

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

Topology discover() {
  Topology t;
  const int host = t.addHost(hostName());
#if defined(CHORUS_HAVE_HWLOC)
  HwlocTopology hw = loadHwloc(nullptr, "this machine");
  Converter(hw.get(), t, host, true).run();
#else
  addSysfs(t, host);
#endif
  addNvml(t, host);
  t.validate();
  return t;
}

Topology parseHwlocXml(const std::string& text, const std::string& name) {
#if !defined(CHORUS_HAVE_HWLOC)
  (void)text;
  throw std::invalid_argument(fmt::format(
      "{}: an hwloc XML file, but this build of chorus has no hwloc to read it (build with libhwloc-dev)", name));
#else
  HwlocTopology hw = loadHwloc(&text, name);
  Topology t;
  const char* recorded = hwloc_obj_get_info_by_name(hwloc_get_root_obj(hw.get()), "HostName");
  const int host = t.addHost(recorded != nullptr ? recorded : "host0");
  Converter(hw.get(), t, host, false).run();
  t.validate(name);
  return t;
#endif
}

Topology localTopology() {
  const char* file = std::getenv("CHORUS_TOPO_FILE");
  if (file != nullptr && file[0] != '\0') return readTopologyFile(file);
  return discover();
}

}  // namespace chorus::topology
