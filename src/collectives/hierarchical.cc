// hierarchical.cc: all-reduce in two levels, for ranks spread over several hosts.
//
// Within each host the ranks form a ring (in rank order) and run the ring all-reduce of ring.cc,
// with one step added between its two phases: when a rank has reduced a chunk of the block it owns
// over its host (the reduce-scatter phase), it all-reduces that chunk with the ranks of the other
// hosts that own the same block (its "rail": the ranks with the same place in their hosts), on a
// ring of one rank per host. The all-gather phase then spreads the fully reduced blocks within
// the host. Chunk by chunk, so the three levels overlap.
//
// Traffic: each rank sends 2(L-1)/L of the buffer within its host (L ranks per host) and
// 2(H-1)/(HL) of it to other hosts (H hosts); every host link carries 2(H-1)/H of the buffer in
// all, in 2(H-1) messages per chunk instead of the flat ring's 2(n-1) network-bound steps.
//
// Every host must have the same number of ranks (so the rails line up); otherwise, and on one
// host, the schedule is the flat ring all-reduce over rank numbers.
#include <algorithm>
#include <map>

#include "src/collectives/schedule.h"

namespace chorus::collectives {

Schedule hierarchicalAllReduce(const ScheduleArgs& args) {
  std::vector<std::vector<int>> hosts;  // ranks of each host, ascending
  std::map<int, size_t> index;          // host number -> place in hosts
  for (int rank = 0; rank < args.nranks; ++rank) {
    const int host = args.hosts != nullptr ? args.hosts[rank] : 0;
    auto [it, added] = index.emplace(host, hosts.size());
    if (added) hosts.emplace_back();
    hosts[it->second].push_back(rank);
  }
  const size_t perHost = hosts.front().size();
  bool even = true;
  for (const auto& ranks : hosts) even = even && ranks.size() == perHost;
  if (hosts.size() == 1 || !even) {
    ScheduleArgs flat = args;
    flat.order = nullptr;
    return ringAllReduce(flat);
  }

  const int myHost = static_cast<int>(index.at(args.hosts[args.rank]));
  const std::vector<int>& local = hosts[myHost];
  const int localPlace = static_cast<int>(std::find(local.begin(), local.end(), args.rank) - local.begin());
  std::vector<int> rail;  // the ranks with this rank's place, one per host
  for (const auto& ranks : hosts) rail.push_back(ranks[localPlace]);

  Schedule schedule;
  // Scratch: the host ring's (all the schedule has when the first chunk comes), then two regions
  // the size of the first (largest) chunk's rail scratch.
  size_t ringScratch = 0;
  size_t region = 0;
  bool first = true;
  // The rail's all-reduce of each owned chunk, in place in the output, with its scratch past the
  // host ring's (two regions, alternating by chunk, so one chunk's need not wait for the last's).
  auto acrossHosts = [&](Schedule& out, size_t offset, size_t bytes, size_t chunk) {
    ScheduleArgs railArgs = args;
    railArgs.nranks = static_cast<int>(rail.size());
    railArgs.rank = myHost;
    railArgs.count = bytes / args.typeSize;
    railArgs.divide = false;
    railArgs.order = nullptr;
    railArgs.hosts = nullptr;
    const Schedule sub = ringAllReduce(railArgs);
    if (first) {
      ringScratch = out.scratchBytes;
      region = sub.scratchBytes;
      first = false;
    }
    const size_t regionStart = ringScratch + (chunk % 2) * region;
    for (Step step : sub.steps) {
      if (step.peer >= 0) step.peer = rail[step.peer];
      for (Span* span : {&step.src, &step.dst, &step.tmp}) {
        if (span->buffer == BufferId::kScratch) {
          span->offset += regionStart;
        } else {
          span->buffer = BufferId::kOutput;
          span->offset += offset;
        }
      }
      out.steps.push_back(step);
    }
    out.scratchBytes = std::max(out.scratchBytes, regionStart + region);
  };
  appendRingAllReduce(schedule, args, local, localPlace, acrossHosts);
  return schedule;
}

}  // namespace chorus::collectives
