// xml.cc: NCCL's topology XML, chorus's own format, and telling the three formats apart (hwloc's
// is read by hwloc itself, in discover.cc). libxml2 parses; nothing here touches the machine.
//
// chorus's format:
//   <chorus-topology version="1">
//     <network> <node id="rail0" kind="network"/> ... </network>
//     <host name="a">
//       <node id="cpu0" kind="cpu" index="0" package="0" cpus="0-15" cores="16" memory="BYTES" l3="BYTES"/>
//       <node id="gpu0" kind="gpu" index="0" bus="0000:17:00.0" device="H100"/>
//       <link a="cpu0" b="gpu0" kind="host-bridge" bandwidth="64" latency="1"/>
//     </host>
//     <host name="b" like="a"/>                     (a copy of host a, with a's links to the network)
//     <link a="a/nic0" b="rail0" kind="nic" bandwidth="50" latency="2"/>
//   </chorus-topology>
// Link kinds: nvlink, pcie, host-bridge, package, inter-socket, nic, network; bandwidth in GB/s
// per direction, latency in microseconds (both optional: the kind's defaults). Top-level links
// name nodes as host/id, network nodes by id.
#include <fmt/format.h>
#if defined(CHORUS_HAVE_LIBXML2)
#include <libxml/parser.h>
#include <libxml/tree.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "src/topology/discover.h"

namespace chorus::topology {
namespace {
#if defined(CHORUS_HAVE_LIBXML2)

struct DocDeleter {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using Document = std::unique_ptr<xmlDoc, DocDeleter>;

Document parse(const std::string& text, const std::string& name) {
  xmlDoc* doc = xmlReadMemory(text.data(), static_cast<int>(text.size()), name.c_str(), nullptr,
                              XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
  if (doc == nullptr) {
    const xmlError* error = xmlGetLastError();
    throw std::invalid_argument(fmt::format("{}: not readable XML{}{}", name, error != nullptr ? ": " : "",
                                            error != nullptr && error->message != nullptr ? error->message : ""));
  }
  if (xmlDocGetRootElement(doc) == nullptr) {
    xmlFreeDoc(doc);
    throw std::invalid_argument(fmt::format("{}: the document is empty", name));
  }
  return Document(doc);
}

bool named(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE && xmlStrcmp(node->name, reinterpret_cast<const xmlChar*>(name)) == 0;
}

std::optional<std::string> attribute(const xmlNode* node, const char* name) {
  xmlChar* value = xmlGetProp(node, reinterpret_cast<const xmlChar*>(name));
  if (value == nullptr) return std::nullopt;
  std::string out(reinterpret_cast<const char*>(value));
  xmlFree(value);
  return out;
}

// Errors name the file, the line and the element.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const xmlNode* node, const std::string& what) const {
    throw std::invalid_argument(
        fmt::format("{}:{}: <{}>: {}", path_, xmlGetLineNo(node), reinterpret_cast<const char*>(node->name), what));
  }
  std::string required(const xmlNode* node, const char* name) const {
    auto value = attribute(node, name);
    if (!value) fail(node, fmt::format("the attribute {} is missing", name));
    return *value;
  }
  double number(const xmlNode* node, const char* name, double fallback) const {
    auto value = attribute(node, name);
    if (!value) return fallback;
    char* end = nullptr;
    const double parsed = std::strtod(value->c_str(), &end);
    if (value->empty() || *end != '\0' || !std::isfinite(parsed) || parsed < 0) {
      fail(node, fmt::format("{}=\"{}\" is not a non-negative number", name, *value));
    }
    return parsed;
  }
  long integer(const xmlNode* node, const char* name, long fallback) const {
    auto value = attribute(node, name);
    if (!value) return fallback;
    char* end = nullptr;
    const long parsed = std::strtol(value->c_str(), &end, 0);
    if (value->empty() || *end != '\0' || parsed < 0 || parsed > (1L << 40)) {
      fail(node, fmt::format("{}=\"{}\" is not a non-negative integer", name, *value));
    }
    return parsed;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- NCCL's format ----

// "32.0 GT/s PCIe" x16: GB/s per direction after line encoding (8b/10b before Gen3, 128b/130b after).
double pcieBandwidth(const std::string& speed, long width) {
  const double gts = std::strtod(speed.c_str(), nullptr);
  if (!(gts > 0) || width <= 0) return 0;
  const double encoding = gts < 8 ? 0.8 : 128.0 / 130.0;
  return gts * encoding / 8 * static_cast<double>(width);
}

// Per NVLink, GB/s per direction, by the GPU's generation (sm): NVLink 1 (Pascal) 20, NVLink 2-4
// (Volta to Hopper) 25, NVLink 5 (Blackwell) 50.
double nvlinkBandwidth(long sm) { return sm < 70 ? 20 : sm < 100 ? 25 : 50; }

// NCCL's affinity mask ("00000000,0000ffff": 32-bit words, most significant first) as a list.
std::string maskToList(const std::string& mask) {
  std::vector<uint32_t> words;
  size_t start = 0;
  while (start <= mask.size()) {
    const size_t comma = mask.find(',', start);
    const std::string word = mask.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    words.push_back(static_cast<uint32_t>(std::strtoul(word.c_str(), nullptr, 16)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::string out;
  int bit = 0, runStart = -1;
  auto close = [&](int end) {
    if (runStart < 0) return;
    if (!out.empty()) out += ',';
    out += end - 1 == runStart ? fmt::format("{}", runStart) : fmt::format("{}-{}", runStart, end - 1);
    runStart = -1;
  };
  for (auto w = words.rbegin(); w != words.rend(); ++w) {
    for (int b = 0; b < 32; ++b, ++bit) {
      if ((*w >> b) & 1u) {
        if (runStart < 0) runStart = bit;
      } else {
        close(bit);
      }
    }
  }
  close(bit);
  return out;
}

class NcclReader : public Reader {
 public:
  using Reader::Reader;

  Topology read(const xmlNode* system) {
    host_ = t_.addHost("host0");
    for (const xmlNode* c = system->children; c != nullptr; c = c->next) {
      if (!named(c, "cpu")) continue;
      Node cpu;
      cpu.kind = NodeKind::kCpu;
      cpu.host = host_;
      cpu.index = static_cast<int>(integer(c, "numaid", static_cast<long>(t_.nodesOf(host_, NodeKind::kCpu).size())));
      cpu.package = cpu.index;  // NCCL describes NUMA nodes only; each is taken as its own socket
      cpu.id = fmt::format("cpu{}", cpu.index);
      if (auto mask = attribute(c, "affinity")) cpu.cpus = maskToList(*mask);
      if (t_.find(host_, cpu.id) >= 0) fail(c, fmt::format("numaid {} appears twice", cpu.index));
      const int id = t_.addNode(cpu);
      for (int other : t_.nodesOf(host_, NodeKind::kCpu)) {
        if (other != id) t_.addLink(other, id, LinkKind::kInterSocket);
      }
      children(c, id, LinkKind::kHostBridge, 0);
    }
    if (t_.nodesOf(host_, NodeKind::kCpu).empty()) fail(system, "it has no <cpu>");
    // NVLinks: to another GPU, or to the NVSwitches, which NCCL and this graph take as one
    // switch (every GPU reaches every NVSwitch alike), so a GPU's links to them add up.
    std::map<std::pair<int, int>, double> bandwidth;
    for (const Pending& link : nvlinks_) {
      auto bus = busToNode_.find(link.target);
      int target = -1;
      if (link.nvswitch || (bus != busToNode_.end() && t_.nodes[bus->second].kind == NodeKind::kNvSwitch)) {
        target = t_.nvSwitch(host_);
      } else if (bus != busToNode_.end()) {
        target = bus->second;
      } else {
        fail(link.element, fmt::format("its target {} is no device of this file", link.target));
      }
      if (t_.nodes[target].kind == NodeKind::kGpu && bandwidth.count({target, link.gpu}) > 0) continue;
      bandwidth[{link.gpu, target}] += link.bandwidth;
    }
    for (const auto& [pair, gbps] : bandwidth) {
      t_.addLink(pair.first, pair.second, LinkKind::kNvLink, gbps, defaultLatencyUs(LinkKind::kNvLink));
    }
    t_.validate(path());
    return std::move(t_);
  }

 private:
  struct Pending {
    const xmlNode* element;
    int gpu;
    std::string target;
    bool nvswitch;
    double bandwidth;
  };

  void children(const xmlNode* parentElement, int parent, LinkKind kind, double parentBandwidth) {
    for (const xmlNode* c = parentElement->children; c != nullptr; c = c->next) {
      if (named(c, "pci")) pci(c, parent, kind);
      if (named(c, "nic")) nic(c, parent, kind, parentBandwidth, "");
    }
  }

  void pci(const xmlNode* element, int parent, LinkKind kind) {
    const std::string bus = lower(required(element, "busid"));
    const long cls = std::strtol(required(element, "class").c_str(), nullptr, 16);
    double bandwidth = pcieBandwidth(attribute(element, "link_speed").value_or(""), integer(element, "link_width", 0));
    if (bandwidth <= 0) bandwidth = defaultBandwidth(kind);
    const long top = cls >> 16;
    Node node;
    node.host = host_;
    node.busId = bus;
    if (top == 0x06 && ((cls >> 8) & 0xff) == 0x04) {
      node.kind = NodeKind::kPciSwitch;
      node.id = fmt::format("pci{}", switches_++);
    } else if (top == 0x06 && ((cls >> 8) & 0xff) == 0x80) {
      busToNode_[bus] = t_.nvSwitch(host_);  // reached by NVLink; its PCI link carries no data
      return;
    } else if (top == 0x03) {
      const xmlNode* gpu = child(element, "gpu");
      if (gpu == nullptr) return;  // a display device NCCL does not use
      node.kind = NodeKind::kGpu;
      node.index = static_cast<int>(integer(gpu, "dev", static_cast<long>(t_.nodesOf(host_, NodeKind::kGpu).size())));
      node.id = fmt::format("gpu{}", node.index);
      if (t_.find(host_, node.id) >= 0) fail(gpu, fmt::format("dev {} appears twice", node.index));
      const int id = t_.addNode(node);
      busToNode_[bus] = id;
      t_.addLink(parent, id, kind, bandwidth, defaultLatencyUs(kind));
      const double perLink = nvlinkBandwidth(integer(gpu, "sm", 90));
      for (const xmlNode* l = gpu->children; l != nullptr; l = l->next) {
        if (!named(l, "nvlink")) continue;
        const long tclass = std::strtol(attribute(l, "tclass").value_or("0").c_str(), nullptr, 16);
        const long count = integer(l, "count", 1);
        if (count == 0) continue;
        nvlinks_.push_back({l, id, lower(required(l, "target")), tclass == 0x068000, perLink * count});
      }
      return;
    } else if (top == 0x02) {
      nic(child(element, "nic") != nullptr ? child(element, "nic") : element, parent, kind, bandwidth, bus);
      return;
    } else {
      return;
    }
    const int id = t_.addNode(node);
    busToNode_[bus] = id;
    t_.addLink(parent, id, kind, bandwidth, defaultLatencyUs(kind));
    if (node.kind == NodeKind::kPciSwitch) children(element, id, LinkKind::kPcie, bandwidth);
  }

  // A NIC: one node per <net> (port), each joined to the network at its speed (Mbit/s).
  void nic(const xmlNode* element, int parent, LinkKind kind, double bandwidth, const std::string& bus) {
    if (bandwidth <= 0) bandwidth = defaultBandwidth(kind);
    for (const xmlNode* n = element->children; n != nullptr; n = n->next) {
      if (!named(n, "net")) continue;
      Node node;
      node.kind = NodeKind::kNic;
      node.host = host_;
      node.busId = bus;
      node.device = required(n, "name");
      node.index = static_cast<int>(t_.nodesOf(host_, NodeKind::kNic).size());
      node.id = fmt::format("nic{}", node.index);
      const int id = t_.addNode(node);
      t_.addLink(parent, id, kind, bandwidth, defaultLatencyUs(kind));
      const double speed = number(n, "speed", 0) / 8000;
      t_.addLink(id, t_.network(), LinkKind::kNic, speed > 0 ? speed : defaultBandwidth(LinkKind::kNic),
                 defaultLatencyUs(LinkKind::kNic));
    }
  }

  static const xmlNode* child(const xmlNode* element, const char* name) {
    for (const xmlNode* c = element->children; c != nullptr; c = c->next) {
      if (named(c, name)) return c;
    }
    return nullptr;
  }
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  Topology t_;
  int host_ = 0;
  int switches_ = 0;
  std::map<std::string, int> busToNode_;
  std::vector<Pending> nvlinks_;
};

// ---- chorus's format ----

class ChorusReader : public Reader {
 public:
  using Reader::Reader;

  Topology read(const xmlNode* root) {
    const long version = integer(root, "version", 1);
    if (version != 1) fail(root, fmt::format("version {} is not one this build reads (1)", version));
    for (const xmlNode* c = root->children; c != nullptr; c = c->next) {
      if (!named(c, "network")) continue;
      for (const xmlNode* n = c->children; n != nullptr; n = n->next) {
        if (named(n, "node")) addNode(n, -1);
      }
    }
    std::vector<std::pair<const xmlNode*, std::string>> likes;
    for (const xmlNode* c = root->children; c != nullptr; c = c->next) {
      if (!named(c, "host")) continue;
      const std::string name = required(c, "name");
      if (hostIndex_.count(name) > 0) fail(c, fmt::format("host '{}' appears twice", name));
      if (auto like = attribute(c, "like")) {
        likes.emplace_back(c, *like);
        hostIndex_[name] = -1;
        continue;
      }
      const int host = t_.addHost(name);
      hostIndex_[name] = host;
      for (const xmlNode* n = c->children; n != nullptr; n = n->next) {
        if (named(n, "node")) addNode(n, host);
      }
      for (const xmlNode* n = c->children; n != nullptr; n = n->next) {
        if (named(n, "link")) addLink(n, host);
      }
    }
    // Links between hosts and the network, first those of the hosts described in full (so
    // that copies take them along), then those that name copies.
    std::vector<const xmlNode*> later;
    for (const xmlNode* c = root->children; c != nullptr; c = c->next) {
      if (!named(c, "link")) continue;
      if (namesCopy(c, "a") || namesCopy(c, "b")) {
        later.push_back(c);
      } else {
        addLink(c, -1);
      }
    }
    for (const auto& [element, like] : likes) {
      auto from = hostIndex_.find(like);
      if (from == hostIndex_.end() || from->second < 0) {
        fail(element, fmt::format("like=\"{}\" names no host described in full", like));
      }
      const std::string name = required(element, "name");
      hostIndex_[name] = t_.cloneHost(from->second, name);
    }
    for (const xmlNode* element : later) addLink(element, -1);
    t_.validate(path());
    return std::move(t_);
  }

 private:
  void addNode(const xmlNode* element, int host) {
    Node node;
    node.host = host;
    node.id = required(element, "id");
    if (node.id.find('/') != std::string::npos) fail(element, fmt::format("id '{}' has a '/'", node.id));
    if (!parseNodeKind(required(element, "kind"), &node.kind)) {
      fail(element,
           fmt::format("kind '{}' is not cpu, gpu, nic, pci-switch, nvswitch or network", required(element, "kind")));
    }
    if ((host < 0) != (node.kind == NodeKind::kNetwork)) {
      fail(element,
           host < 0 ? "only network nodes may stand outside a host" : "a network node must stand outside hosts");
    }
    node.index = static_cast<int>(integer(element, "index", -1));
    node.package = node.kind == NodeKind::kCpu ? static_cast<int>(integer(element, "package", 0)) : -1;
    node.busId = attribute(element, "bus").value_or("");
    node.device = attribute(element, "device").value_or("");
    node.cpus = attribute(element, "cpus").value_or("");
    node.cores = static_cast<int>(integer(element, "cores", 0));
    node.memoryBytes = static_cast<uint64_t>(integer(element, "memory", 0));
    node.l3Bytes = static_cast<uint64_t>(integer(element, "l3", 0));
    if (t_.find(host, node.id) >= 0) fail(element, fmt::format("node '{}' appears twice", node.id));
    t_.addNode(node);
  }

  bool namesCopy(const xmlNode* element, const char* end) const {
    const std::string name = attribute(element, end).value_or("");
    const size_t slash = name.find('/');
    if (slash == std::string::npos) return false;
    auto it = hostIndex_.find(name.substr(0, slash));
    return it != hostIndex_.end() && it->second < 0;
  }

  int resolve(const xmlNode* element, const char* end, int host) {
    const std::string name = required(element, end);
    int node = -1;
    if (host >= 0) {
      node = t_.find(host, name);
    } else if (const size_t slash = name.find('/'); slash != std::string::npos) {
      auto it = hostIndex_.find(name.substr(0, slash));
      if (it == hostIndex_.end()) fail(element, fmt::format("{}=\"{}\" names no host", end, name));
      node = t_.find(it->second, name.substr(slash + 1));
    } else {
      node = t_.find(-1, name);
    }
    if (node < 0) fail(element, fmt::format("{}=\"{}\" names no node", end, name));
    return node;
  }

  void addLink(const xmlNode* element, int host) {
    const int a = resolve(element, "a", host);
    const int b = resolve(element, "b", host);
    if (a == b) fail(element, "it joins a node to itself");
    LinkKind kind;
    if (!parseLinkKind(required(element, "kind"), &kind)) {
      fail(element, fmt::format("kind '{}' is not nvlink, pcie, host-bridge, package, inter-socket, nic or network",
                                required(element, "kind")));
    }
    const double bandwidth = number(element, "bandwidth", defaultBandwidth(kind));
    if (!(bandwidth > 0)) fail(element, "bandwidth must be above 0");
    t_.addLink(a, b, kind, bandwidth, number(element, "latency", defaultLatencyUs(kind)));
  }

  Topology t_;
  std::map<std::string, int> hostIndex_;  // -1 while a copy is not made yet
};

#endif  // CHORUS_HAVE_LIBXML2

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string nodeXml(const Node& node) {
  std::string out = fmt::format("<node id=\"{}\" kind=\"{}\"", escape(node.id), nodeKindName(node.kind));
  if (node.index >= 0) out += fmt::format(" index=\"{}\"", node.index);
  if (node.kind == NodeKind::kCpu) out += fmt::format(" package=\"{}\"", std::max(node.package, 0));
  if (!node.busId.empty()) out += fmt::format(" bus=\"{}\"", escape(node.busId));
  if (!node.device.empty()) out += fmt::format(" device=\"{}\"", escape(node.device));
  if (!node.cpus.empty()) out += fmt::format(" cpus=\"{}\"", escape(node.cpus));
  if (node.cores > 0) out += fmt::format(" cores=\"{}\"", node.cores);
  if (node.memoryBytes > 0) out += fmt::format(" memory=\"{}\"", node.memoryBytes);
  if (node.l3Bytes > 0) out += fmt::format(" l3=\"{}\"", node.l3Bytes);
  return out + "/>";
}

}  // namespace

#if defined(CHORUS_HAVE_LIBXML2)
namespace {

// A parsed document read by one of the readers, once its root is the one the format has.
template <typename FormatReader>
Topology readAs(const xmlNode* root, const std::string& name, const char* rootName, const char* format) {
  FormatReader reader(name);
  if (!named(root, rootName)) reader.fail(root, fmt::format("the root of {} is <{}>", format, rootName));
  return reader.read(root);
}

constexpr const char* kNcclFormat = "NCCL's topology XML";
constexpr const char* kChorusFormat = "chorus's topology XML";

}  // namespace

Topology parseNcclXml(const std::string& text, const std::string& name) {
  Document doc = parse(text, name);
  return readAs<NcclReader>(xmlDocGetRootElement(doc.get()), name, "system", kNcclFormat);
}

Topology parseChorusXml(const std::string& text, const std::string& name) {
  Document doc = parse(text, name);
  return readAs<ChorusReader>(xmlDocGetRootElement(doc.get()), name, "chorus-topology", kChorusFormat);
}

Topology parseTopology(const std::string& text, const std::string& name) {
  Document doc = parse(text, name);
  const xmlNode* root = xmlDocGetRootElement(doc.get());
  const std::string rootName = reinterpret_cast<const char*>(root->name);
  if (rootName == "chorus-topology") return readAs<ChorusReader>(root, name, "chorus-topology", kChorusFormat);
  if (rootName == "system") return readAs<NcclReader>(root, name, "system", kNcclFormat);
  if (rootName == "topology") return parseHwlocXml(text, name);  // hwloc reads its own format
  throw std::invalid_argument(fmt::format(
      "{}: the root element <{}> is none of <chorus-topology> (chorus), <system> (NCCL), <topology> (hwloc)", name,
      rootName));
}
#else
namespace {

[[noreturn]] void noReader(const std::string& name) {
  throw std::invalid_argument(fmt::format(
      "{}: this build of chorus has no libxml2, which reads topology XML files (build with libxml2-dev)", name));
}

}  // namespace

Topology parseNcclXml(const std::string&, const std::string& name) { noReader(name); }
Topology parseChorusXml(const std::string&, const std::string& name) { noReader(name); }
Topology parseTopology(const std::string&, const std::string& name) { noReader(name); }
#endif  // CHORUS_HAVE_LIBXML2

Topology readTopologyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (!in || !(text << in.rdbuf())) {
    throw std::invalid_argument(fmt::format("{}: cannot read the file: {}", path, std::strerror(errno)));
  }
  return parseTopology(text.str(), path);
}

std::string toChorusXml(const Topology& t) {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<chorus-topology version=\"1\">\n";
  bool network = false;
  for (const Node& node : t.nodes) {
    if (node.host != -1) continue;
    if (!network) out += "  <network>\n";
    network = true;
    out += "    " + nodeXml(node) + "\n";
  }
  if (network) out += "  </network>\n";
  auto linkXml = [&](const Link& link, bool qualified) {
    auto name = [&](int i) {
      const Node& n = t.nodes[i];
      return escape(qualified && n.host >= 0 ? t.hosts[n.host] + "/" + n.id : n.id);
    };
    return fmt::format("<link a=\"{}\" b=\"{}\" kind=\"{}\" bandwidth=\"{:g}\" latency=\"{:g}\"/>", name(link.a),
                       name(link.b), linkKindName(link.kind), link.bandwidth, link.latencyUs);
  };
  for (int h = 0; h < static_cast<int>(t.hosts.size()); ++h) {
    out += fmt::format("  <host name=\"{}\">\n", escape(t.hosts[h]));
    for (const Node& node : t.nodes) {
      if (node.host == h) out += "    " + nodeXml(node) + "\n";
    }
    for (const Link& link : t.links) {
      if (t.nodes[link.a].host == h && t.nodes[link.b].host == h) out += "    " + linkXml(link, false) + "\n";
    }
    out += "  </host>\n";
  }
  for (const Link& link : t.links) {
    if (t.nodes[link.a].host != t.nodes[link.b].host || t.nodes[link.a].host < 0) {
      out += "  " + linkXml(link, true) + "\n";
    }
  }
  return out + "</chorus-topology>\n";
}

}  // namespace chorus::topology
