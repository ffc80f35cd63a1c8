// bind.h: which CPU node of its host a rank runs on, and pinning it there (CHORUS_BIND). The
// choice is a pure function of the host's nodes and the process's current affinity; binding
// itself goes through hwloc (every thread of the process) and set_mempolicy (the calling thread,
// and the threads it starts later). Not thread-safe: call once per process, at init.
#pragma once

#include <string>
#include <vector>

namespace chorus::topology {

// Processor numbers from a Linux list ("0-3,8,10-11"), ascending, without repeats; throws
// std::invalid_argument naming the item on bad text. The inverse: formatCpuList.
std::vector<int> parseCpuList(const std::string& text);
std::string formatCpuList(const std::vector<int>& cpus);

// The node (index into nodeCpus) whose processors hold most of `cpus`; ties go to the lowest;
// -1 when no node holds any of them.
int nodeHolding(const std::vector<std::vector<int>>& nodeCpus, const std::vector<int>& cpus);

struct BindChoice {
  int node = -1;          // the CPU node (index into nodeCpus) the rank runs on, -1 if unknown
  std::vector<int> cpus;  // what to bind the process to; empty: leave its binding as it is
  std::string reason;     // for the log: what was chosen and why
};

// Where local rank `localRank` of `localSize` processes on a host should run, for CHORUS_BIND
// `bind` ("auto" or "none"): the host's CPU nodes have processors nodeCpus (a node's processors
// not in `online` are left out); the process may run on `current` now.
// - auto: local ranks in blocks over the nodes, rank i on node i*N/L (neighbours in rank order
//   share a node, every node gets L/N ranks), bound to that node's processors; unless a launcher
//   bound the process already (`current` is not all of `online`), whose binding is kept.
// - none, or a process that holds several ranks (`sharedProcess`): no binding; the node is the
//   one holding most of `current`.
BindChoice chooseBinding(const std::vector<std::vector<int>>& nodeCpus, const std::vector<int>& online,
                         const std::vector<int>& current, int localRank, int localSize, const std::string& bind,
                         bool sharedProcess);

// The calling thread's affinity now, and the processors online.
std::vector<int> currentCpus();
std::vector<int> onlineCpus();

// Binds every thread of this process to `cpus`, and makes the calling thread (and threads it
// starts later) allocate memory on NUMA node `numaNode` first (-1: leave the memory policy).
// Returns "" on success, else what failed (the caller logs it; nothing is undone).
std::string bindProcess(const std::vector<int>& cpus, int numaNode);

}  // namespace chorus::topology
