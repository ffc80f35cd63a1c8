// discover.h: this host as a topology, and the topology files users already have or write.
#pragma once

#include <string>

#include "src/topology/topology.h"

namespace chorus::topology {

// This host: hwloc for packages, NUMA nodes, cores, caches and the PCI tree (GPUs, NICs, PCIe
// switches, NVSwitches); NVML, loaded at run time when present, for GPUs and their NVLinks
// (without it, GPUs come from hwloc alone and have no NVLinks). NIC port speeds come from sysfs
// where it tells them. The host is named by hostname.
Topology discover();

// Files. Each reader throws std::invalid_argument naming the file (`name`), and where the format
// allows the line, and what is wrong.
// hwloc's XML (lstopo --of xml), converted as discovery converts the live machine; one host.
Topology parseHwlocXml(const std::string& text, const std::string& name);
// NCCL's topology XML (as NCCL_TOPO_DUMP_FILE writes it: <system> of <cpu>, nested <pci>,
// <gpu> with <nvlink>, <nic> with <net>); one host.
Topology parseNcclXml(const std::string& text, const std::string& name);
// chorus's own format (see xml.cc), the only one that describes several hosts and the network.
Topology parseChorusXml(const std::string& text, const std::string& name);
// Any of the three, told apart by the root element (<topology>, <system>, <chorus-topology>).
Topology parseTopology(const std::string& text, const std::string& name);
// The file's contents, by parseTopology.
Topology readTopologyFile(const std::string& path);
// chorus's format, which parseChorusXml reads back to the same graph.
std::string toChorusXml(const Topology& topology);

// CHORUS_TOPO_FILE's topology when it is set, else discover().
Topology localTopology();

}  // namespace chorus::topology
