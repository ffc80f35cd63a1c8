// bind.cc: choosing a rank's CPU node and binding the process to it.
#include "src/topology/bind.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace chorus::topology {
namespace {

constexpr int kMaxCpus = 1 << 16;  // processor numbers accepted in lists
constexpr int kMpolPreferred = 1;  // linux/mempolicy.h's MPOL_PREFERRED

// The processors both hold.
std::vector<int> common(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both;
}

}  // namespace

std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    int first = -1, last = -1;
    char extra = 0;
    const int got = std::sscanf(item.c_str(), "%d-%d%c", &first, &last, &extra);
    if (got == 1) last = first;
    if ((got != 1 && got != 2) || first < 0 || last < first || last >= kMaxCpus ||
        item.find_first_not_of("0123456789-") != std::string::npos) {
      throw std::invalid_argument(fmt::format("'{}' in processor list '{}' is not N or N-M", item, text));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
    start = end + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return text;
}

int nodeHolding(const std::vector<std::vector<int>>& nodeCpus, const std::vector<int>& cpus) {
  int best = -1;
  size_t most = 0;
  for (size_t node = 0; node < nodeCpus.size(); ++node) {
    const size_t held = common(nodeCpus[node], cpus).size();
    if (held > most) {
      most = held;
      best = static_cast<int>(node);
    }
  }
  return best;
}

BindChoice chooseBinding(const std::vector<std::vector<int>>& nodeCpus, const std::vector<int>& online,
                         const std::vector<int>& current, int localRank, int localSize, const std::string& bind,
                         bool sharedProcess) {
  BindChoice choice;
  auto unbound = [&](const std::string& why) {
    choice.node = nodeHolding(nodeCpus, current);
    choice.reason = fmt::format("{}; runs on processors {} (CPU node {})", why, formatCpuList(current), choice.node);
    return choice;
  };
  if (bind == "none") return unbound("not bound (CHORUS_BIND=none)");
  if (sharedProcess) return unbound("not bound (this process holds several ranks)");
  if (nodeCpus.empty() || localSize <= 0) return unbound("not bound (no CPU nodes known)");
  if (common(current, online) != online) return unbound("kept the launcher's binding");
  const int nodes = static_cast<int>(nodeCpus.size());
  const int node = static_cast<int>(static_cast<int64_t>(localRank) * nodes / localSize);
  std::vector<int> cpus = common(nodeCpus[node], online);
  if (cpus.empty()) {
    choice.node = node;
    choice.reason =
        fmt::format("not bound: CPU node {}'s processors {} are not online here", node, formatCpuList(nodeCpus[node]));
    return choice;
  }
  choice.node = node;
  choice.cpus = std::move(cpus);
  choice.reason = fmt::format("local rank {} of {} bound to CPU node {} of {} (processors {})", localRank, localSize,
                              node, nodes, formatCpuList(choice.cpus));
  return choice;
}

std::vector<int> currentCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> onlineCpus() {
  char text[4096] = {};
  if (FILE* file = std::fopen("/sys/devices/system/cpu/online", "r")) {
    const size_t got = std::fread(text, 1, sizeof(text) - 1, file);
    std::fclose(file);
    std::string line(text, got);
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    try {
      return parseCpuList(line);
    } catch (const std::invalid_argument&) {
    }
  }
  std::vector<int> cpus;
  for (long cpu = 0; cpu < sysconf(_SC_NPROCESSORS_ONLN); ++cpu) cpus.push_back(static_cast<int>(cpu));
  return cpus;
}

std::string bindProcess(const std::vector<int>& cpus, int numaNode) {
  std::string failed;
  cpu_set_t* set = CPU_ALLOC(kMaxCpus);
  const size_t setBytes = CPU_ALLOC_SIZE(kMaxCpus);
  CPU_ZERO_S(setBytes, set);
  for (int cpu : cpus) CPU_SET_S(static_cast<size_t>(cpu), setBytes, set);
  // The whole process: every thread it has now (later threads inherit the binding).
  std::error_code error;
  bool any = false;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const pid_t tid = static_cast<pid_t>(std::atol(task.path().filename().c_str()));
    if (tid <= 0) continue;
    if (sched_setaffinity(tid, setBytes, set) != 0 && errno != ESRCH) {
      failed = fmt::format("binding to processors {} failed: {}", formatCpuList(cpus), std::strerror(errno));
      break;
    }
    any = true;
  }
  if (failed.empty() && !any && sched_setaffinity(0, setBytes, set) != 0) {
    failed = fmt::format("binding to processors {} failed: {}", formatCpuList(cpus), std::strerror(errno));
  }
  CPU_FREE(set);
  if (failed.empty() && numaNode >= 0 && numaNode < 1024) {
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {};
    mask[numaNode / (8 * sizeof(unsigned long))] = 1ul << (numaNode % (8 * sizeof(unsigned long)));
    if (syscall(SYS_set_mempolicy, kMpolPreferred, mask, 1024ul + 1) != 0) {
      failed = fmt::format("preferring memory of NUMA node {} failed: {}", numaNode, std::strerror(errno));
    }
  }
  return failed;
}

}  // namespace chorus::topology
