// hierarchical.cc: collectives in two levels, for ranks spread over several hosts.
//
// Every host has L ranks; a rank's "place" is its index among its host's ranks (ascending), and
// its "rail" is the H ranks with its place, one per host. Within a host ranks talk on the host's
// ring (place p to p+1); across hosts only along rails, so a host's L ranks cross the network at
// once, each carrying 1/L of what crosses.
//
// All-reduce: the ring all-reduce of ring.cc within each host, with one step added between its
// two phases: when a rank has reduced a chunk of the block it owns over its host (the
// reduce-scatter phase), it all-reduces that chunk with its rail (a ring of one rank per host).
// The all-gather phase then spreads the fully reduced blocks within the host. Each rank sends
// 2(L-1)/L of the buffer within its host and 2(H-1)/(HL) of it to other hosts; every host link
// carries 2(H-1)/H of the buffer in all, in 2(H-1) messages per chunk instead of the flat ring's
// 2(n-1) network-bound steps.
//
// The other collectives work chunk by chunk (CHORUS_CHUNK_BYTES of a rank's block, or of the
// buffer), each chunk through the two levels as sub-schedules of ring.cc and chain.cc run among
// the host's ranks or the rail's:
// - all-gather: the rail all-gathers the chunk of each rail member's block; then within the host,
//   one ring all-gather per host's blocks (this host's first, the others' as the rail brings them).
//   A rank sends (H-1) chunks to other hosts and H(L-1) within its host.
// - reduce-scatter: the mirror. Within the host, one ring reduce-scatter per host's blocks leaves
//   at each place the host's partial sums of the blocks its rail owns (in scratch); the rail then
//   reduce-scatters those, and each rank ends with its own block reduced over all ranks.
// - broadcast: the root's rail carries the chunk to every host on a chain (root first); within
//   each host, the rail member passes it on a chain to the host's other ranks.
// - reduce: the mirror. Within each host a chain reduces the chunk to the root's place (into
//   scratch, or the root's output on its host); the root's rail then reduces those on a chain to
//   the root.
// Chunks pipeline: a chunk's host steps wait only for its own network steps (the executor orders
// steps by the byte ranges they touch), so the levels overlap.
//
// Every host must have the same number of ranks (so the rails line up); otherwise, and on one
// host, the schedule is the collective's flat ring (all-gather, reduce-scatter, all-reduce) or
// chain (broadcast, reduce) over all ranks.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>

#include "src/collectives/algorithm.h"
#include "src/collectives/descriptor.h"

namespace chorus::collectives {
namespace {

// Where the ranks sit, seen from one rank.
struct Layout {
  std::vector<std::vector<int>> hosts;  // ranks of each host, ascending; hosts by their lowest rank
  int host = 0;                         // this rank's host (index into hosts)
  int place = 0;                        // this rank's place in its host
  std::vector<int> rail;                // the ranks with this rank's place, one per host
  int hostOf(int rank) const {
    for (size_t h = 0; h < hosts.size(); ++h) {
      if (std::find(hosts[h].begin(), hosts[h].end(), rank) != hosts[h].end()) return static_cast<int>(h);
    }
    return -1;
  }
  int placeOf(int rank) const {
    const auto& ranks = hosts[hostOf(rank)];
    return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  }
  int perHost() const { return static_cast<int>(hosts.front().size()); }
  int hostCount() const { return static_cast<int>(hosts.size()); }
};

// The layout, or nothing when the ranks are on one host or hosts differ in rank count.
std::optional<Layout> layoutOf(const ScheduleArgs& args) {
  Layout layout;
  std::map<int, size_t> index;  // host number -> place in layout.hosts
  for (int rank = 0; rank < args.nranks; ++rank) {
    const int host = args.hosts != nullptr ? args.hosts[rank] : 0;
    auto [it, added] = index.emplace(host, layout.hosts.size());
    if (added) layout.hosts.emplace_back();
    layout.hosts[it->second].push_back(rank);
  }
  for (const auto& ranks : layout.hosts) {
    if (ranks.size() != layout.hosts.front().size()) return std::nullopt;
  }
  if (layout.hosts.size() == 1) return std::nullopt;
  layout.host = layout.hostOf(args.rank);
  layout.place = layout.placeOf(args.rank);
  for (const auto& ranks : layout.hosts) layout.rail.push_back(ranks[layout.place]);
  return layout;
}

// The flat form of the collective over all ranks, following args.order.
Schedule flat(const ScheduleArgs& args, Algorithm algorithm) {
  ScheduleArgs all = args;
  all.algorithm = algorithm;
  all.hosts = nullptr;
  all.recordBytes = 0;  // the agreement, if any, is the whole schedule's
  return buildSchedule(all);
}

// Arguments of a sub-schedule: `count` elements among `nranks` (this one `rank`), root `root`,
// no divide (the caller divides the final result), no order and one host.
ScheduleArgs subArgs(const ScheduleArgs& args, int nranks, int rank, size_t count, int root) {
  ScheduleArgs sub = args;
  sub.nranks = nranks;
  sub.rank = rank;
  sub.count = count;
  sub.root = root;
  sub.divide = false;
  sub.order = nullptr;
  sub.hosts = nullptr;
  return sub;
}

// Appends `sub`, a schedule among `peers` (its rank i is peers[i]), to `out`: its scratch moved to
// start at `scratchBase`, its input and output spans moved by `place`; a copy onto itself is left
// out. Raises out.scratchBytes to cover the sub-schedule's scratch.
using Place = std::function<Span(Span)>;
void embed(Schedule& out, const Schedule& sub, const std::vector<int>& peers, size_t scratchBase, const Place& place) {
  for (Step step : sub.steps) {
    if (step.peer >= 0) step.peer = peers[step.peer];
    for (Span* span : {&step.src, &step.dst, &step.tmp}) {
      *span = span->buffer == BufferId::kScratch ? at(BufferId::kScratch, scratchBase + span->offset) : place(*span);
    }
    if (step.kind == StepKind::kCopy && step.src.buffer == step.dst.buffer && step.src.offset == step.dst.offset) {
      continue;
    }
    out.steps.push_back(step);
  }
  if (sub.scratchBytes > 0) out.scratchBytes = std::max(out.scratchBytes, scratchBase + sub.scratchBytes);
}

// Pieces of `count` elements: piece c starts at element c*chunkElements.
struct Pieces {
  size_t count;
  size_t chunkElements;
  size_t number() const { return count == 0 ? 0 : piecesOf(count, chunkElements); }
  size_t start(size_t c) const { return c * chunkElements; }
  size_t size(size_t c) const { return std::min(count, start(c) + chunkElements) - start(c); }
};
Pieces piecesFor(const ScheduleArgs& args) {
  return {args.count, std::min(chunkElementsFor(args.chunkBytes, args.typeSize), std::max<size_t>(args.count, 1))};
}

// The most scratch `build` uses for `count` elements among `nranks` at any rank, root 0 (the
// root, its neighbour and the last position cover the chains' and rings' cases).
size_t largestScratch(Schedule (*build)(const ScheduleArgs&), const ScheduleArgs& args, int nranks, size_t count) {
  size_t most = 0;
  for (int rank : {0, std::min(1, nranks - 1), nranks - 1}) {
    most = std::max(most, build(subArgs(args, nranks, rank, count, 0)).scratchBytes);
  }
  return most;
}

}  // namespace

Schedule hierarchicalAllReduce(const ScheduleArgs& args) {
  const std::optional<Layout> layout = layoutOf(args);
  if (!layout) return flat(args, Algorithm::kRing);
  const std::vector<int>& local = layout->hosts[layout->host];

  Schedule schedule;
  // Scratch: the host ring's (all the schedule has when the first chunk comes), then two regions
  // the size of the first (largest) chunk's rail scratch.
  size_t ringScratch = 0;
  size_t region = 0;
  bool first = true;
  // The rail's all-reduce of each owned chunk, in place in the output, with its scratch past the
  // host ring's (two regions, alternating by chunk, so one chunk's need not wait for the last's).
  auto acrossHosts = [&](Schedule& out, size_t offset, size_t bytes, size_t chunk) {
    const Schedule sub =
        ringAllReduce(subArgs(args, layout->hostCount(), layout->host, bytes / args.typeSize, args.root));
    if (first) {
      ringScratch = out.scratchBytes;
      region = sub.scratchBytes;
      first = false;
    }
    embed(out, sub, layout->rail, ringScratch + (chunk % 2) * region,
          [&](Span span) { return at(BufferId::kOutput, span.offset + offset); });
  };
  appendRingAllReduce(schedule, args, local, layout->place, acrossHosts);
  return schedule;
}

Schedule hierarchicalAllGather(const ScheduleArgs& args) {
  const std::optional<Layout> layout = layoutOf(args);
  if (!layout) return flat(args, Algorithm::kRing);
  const int hostCount = layout->hostCount();
  const size_t size = args.typeSize;
  const size_t blockBytes = args.count * size;  // each rank's block in the output
  auto blockOf = [&](int rank) { return static_cast<size_t>(rank) * blockBytes; };
  Schedule schedule;
  const Pieces pieces = piecesFor(args);
  for (size_t c = 0; c < pieces.number(); ++c) {
    const size_t offset = pieces.start(c) * size;
    const size_t pieceBytes = pieces.size(c) * size;
    // Across: the rail's ring all-gather of this piece; rail member h's block at its rank's offset.
    const Schedule rail = ringAllGather(subArgs(args, hostCount, layout->host, pieces.size(c), 0));
    embed(schedule, rail, layout->rail, 0, [&](Span span) {
      if (span.buffer == BufferId::kInput) return at(BufferId::kInput, offset + span.offset);
      return at(BufferId::kOutput, blockOf(layout->rail[span.offset / pieceBytes]) + offset + span.offset % pieceBytes);
    });
    // Within: one ring all-gather per host's blocks, each starting from the block of this rank's
    // rail member on that host (already in the output: the rail's copy or receive put it there).
    const Schedule within = ringAllGather(subArgs(args, layout->perHost(), layout->place, pieces.size(c), 0));
    for (int i = 0; i < hostCount; ++i) {
      const std::vector<int>& ranks = layout->hosts[(layout->host + i) % hostCount];
      embed(schedule, within, layout->hosts[layout->host], 0, [&](Span span) {
        if (span.buffer == BufferId::kInput)
          return at(BufferId::kOutput, blockOf(ranks[layout->place]) + offset + span.offset);
        return at(BufferId::kOutput, blockOf(ranks[span.offset / pieceBytes]) + offset + span.offset % pieceBytes);
      });
    }
  }
  return schedule;
}

Schedule hierarchicalReduceScatter(const ScheduleArgs& args) {
  const std::optional<Layout> layout = layoutOf(args);
  if (!layout) return flat(args, Algorithm::kRing);
  const int hostCount = layout->hostCount();
  const size_t size = args.typeSize;
  const size_t blockBytes = args.count * size;  // each rank's block of the input
  Schedule schedule;
  const Pieces pieces = piecesFor(args);
  if (pieces.number() == 0) return schedule;
  // Scratch: the host rings' own, the rail's own, then two sets (alternating by piece) of the
  // host's partial sums of the rail's blocks, one piece per host.
  const size_t firstBytes = pieces.size(0) * size;
  const size_t withinScratch = largestScratch(ringReduceScatter, args, layout->perHost(), pieces.size(0));
  const size_t railScratch = largestScratch(ringReduceScatter, args, hostCount, pieces.size(0));
  const size_t partialsBase = withinScratch + railScratch;
  for (size_t c = 0; c < pieces.number(); ++c) {
    const size_t offset = pieces.start(c) * size;
    const size_t pieceBytes = pieces.size(c) * size;
    const size_t partials = partialsBase + (c % 2) * hostCount * firstBytes;
    // Within: per host h, the host's ranks reduce-scatter that host's blocks; this rank's share
    // (the block of its rail member on h, summed over this host) goes to partials + h * piece.
    const Schedule within = ringReduceScatter(subArgs(args, layout->perHost(), layout->place, pieces.size(c), 0));
    for (int h = 0; h < hostCount; ++h) {
      const std::vector<int>& ranks = layout->hosts[h];
      embed(schedule, within, layout->hosts[layout->host], 0, [&](Span span) {
        if (span.buffer == BufferId::kOutput) return at(BufferId::kScratch, partials + h * pieceBytes + span.offset);
        return at(BufferId::kInput, static_cast<size_t>(ranks[span.offset / pieceBytes]) * blockBytes + offset +
                                        span.offset % pieceBytes);
      });
    }
    // Across: the rail reduce-scatters the partials; this rank keeps its own block.
    const Schedule rail = ringReduceScatter(subArgs(args, hostCount, layout->host, pieces.size(c), 0));
    embed(schedule, rail, layout->rail, withinScratch, [&](Span span) {
      if (span.buffer == BufferId::kOutput) return at(BufferId::kOutput, offset + span.offset);
      return at(BufferId::kScratch, partials + span.offset);
    });
    if (args.divide) schedule.steps.push_back(divideStep(at(BufferId::kOutput, offset), pieceBytes));
  }
  schedule.scratchBytes = std::max(schedule.scratchBytes, partialsBase + 2 * hostCount * firstBytes);
  return schedule;
}

Schedule hierarchicalBroadcast(const ScheduleArgs& args) {
  const std::optional<Layout> layout = layoutOf(args);
  if (!layout) return flat(args, Algorithm::kChain);
  const int rootHost = layout->hostOf(args.root);
  const int rootPlace = layout->placeOf(args.root);
  const size_t size = args.typeSize;
  Schedule schedule;
  const Pieces pieces = piecesFor(args);
  for (size_t c = 0; c < pieces.number(); ++c) {
    const size_t offset = pieces.start(c) * size;
    auto moved = [&](Span span) { return at(span.buffer, offset + span.offset); };
    // Across: the root's rail, a chain from the root's host.
    if (layout->place == rootPlace) {
      embed(schedule, chainBroadcast(subArgs(args, layout->hostCount(), layout->host, pieces.size(c), rootHost)),
            layout->rail, 0, moved);
    }
    // Within: a chain from the rail member, which has the piece in its output (the root too: the
    // rail's chain copied it there).
    embed(schedule, chainBroadcast(subArgs(args, layout->perHost(), layout->place, pieces.size(c), rootPlace)),
          layout->hosts[layout->host], 0, [&](Span span) { return at(BufferId::kOutput, offset + span.offset); });
  }
  return schedule;
}

Schedule hierarchicalReduce(const ScheduleArgs& args) {
  const std::optional<Layout> layout = layoutOf(args);
  if (!layout) return flat(args, Algorithm::kChain);
  const int rootHost = layout->hostOf(args.root);
  const int rootPlace = layout->placeOf(args.root);
  const bool root = args.rank == args.root;
  const size_t size = args.typeSize;
  Schedule schedule;
  const Pieces pieces = piecesFor(args);
  if (pieces.number() == 0) return schedule;
  // Scratch: the host chain's own, the rail chain's own, then two host partials (by piece).
  const size_t firstBytes = pieces.size(0) * size;
  const size_t withinScratch = largestScratch(chainReduce, args, layout->perHost(), pieces.size(0));
  const size_t railScratch = largestScratch(chainReduce, args, layout->hostCount(), pieces.size(0));
  const size_t partialsBase = withinScratch + railScratch;
  for (size_t c = 0; c < pieces.number(); ++c) {
    const size_t offset = pieces.start(c) * size;
    const size_t pieceBytes = pieces.size(c) * size;
    // The host's partial sum of the piece: the root's output on its host, scratch elsewhere.
    const Span partial = layout->host == rootHost ? at(BufferId::kOutput, offset)
                                                  : at(BufferId::kScratch, partialsBase + (c % 2) * firstBytes);
    auto moved = [&](Span span) { return at(span.buffer, offset + span.offset); };
    // Within: a chain to the root's place.
    embed(schedule, chainReduce(subArgs(args, layout->perHost(), layout->place, pieces.size(c), rootPlace)),
          layout->hosts[layout->host], 0, [&](Span span) {
            if (span.buffer == BufferId::kOutput) return at(partial.buffer, partial.offset + span.offset);
            return moved(span);
          });
    // Across: the root's rail reduces the hosts' partials on a chain to the root.
    if (layout->place == rootPlace) {
      embed(schedule, chainReduce(subArgs(args, layout->hostCount(), layout->host, pieces.size(c), rootHost)),
            layout->rail, withinScratch, [&](Span span) {
              if (span.buffer == BufferId::kInput) return at(partial.buffer, partial.offset + span.offset);
              return moved(span);
            });
    }
    if (root && args.divide) schedule.steps.push_back(divideStep(at(BufferId::kOutput, offset), pieceBytes));
  }
  if (layout->host != rootHost && layout->place == rootPlace) {
    schedule.scratchBytes = std::max(schedule.scratchBytes, partialsBase + 2 * firstBytes);
  }
  return schedule;
}

// Descriptors (descriptor.h: the notation). Only across hosts of equal rank counts.
// A ring within each host of l ranks (local costs), and for each chunk a rank owns, a ring of one
// rank per host over it. A host's l ranks cross the network at once, sharing its link: 2(h-1)/h
// of the buffer goes through it.
std::span<const AlgorithmDescriptor> hierarchicalAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllReduce, Algorithm::kHierarchical, hierarchicalAllReduce,
       [](const Cost& c) {
         if (!c.twoLevels) return kCannot;
         const double k = std::ceil(c.m / c.l / c.chunk);
         const double local = 2 * (c.l - 1) * (k * c.la + c.m / c.l * c.lb);
         const double across = 2 * (c.h - 1) * k * c.a + 2 * (c.h - 1) / c.h * c.m * c.b;
         return local + across + ((c.l - 1) / c.l * c.m + (c.h - 1) / c.h * c.m / c.l) * c.g;
       },
       Follows::kNumbers},
      // The rail's ring (h-1 steps of a block), then h ring all-gathers within the host.
      {Collective::kAllGather, Algorithm::kHierarchical, hierarchicalAllGather,
       [](const Cost& c) {
         if (!c.twoLevels) return kCannot;
         const double k = std::ceil(c.m / c.n / c.chunk);
         return (c.h - 1) * k * c.a + (c.h - 1) / c.h * c.m * c.b + (c.l - 1) * c.h * k * c.la +
                (c.l - 1) / c.l * c.m * c.lb + c.m / c.n * c.cp;
       },
       Follows::kNumbers},
      // h ring reduce-scatters within the host, then the rail's ring over the partial sums.
      {Collective::kReduceScatter, Algorithm::kHierarchical, hierarchicalReduceScatter,
       [](const Cost& c) {
         if (!c.twoLevels) return kCannot;
         const double k = std::ceil(c.m / c.n / c.chunk);
         return (c.l - 1) * c.h * k * c.la + (c.l - 1) / c.l * c.m * (c.lb + c.g) + (c.h - 1) * k * c.a +
                (c.h - 1) / c.h * c.m * c.b + (c.h - 1) / c.h * c.m / c.l * c.g;
       },
       Follows::kNumbers},
      {Collective::kBroadcast, Algorithm::kHierarchical, hierarchicalBroadcast,
       [](const Cost& c) { return c.twoLevels ? c.twoLevelChain(c.h - 1, c.l - 1, 0, c.cp, c.cp) : kCannot; },
       Follows::kNumbers},
      {Collective::kReduce, Algorithm::kHierarchical, hierarchicalReduce,
       [](const Cost& c) { return c.twoLevels ? c.twoLevelChain(c.h - 1, c.l - 1, c.g, 2 * c.g, 0) : kCannot; },
       Follows::kNumbers},
  };
  return kAll;
}

}  // namespace chorus::collectives
