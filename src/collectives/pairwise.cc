// pairwise.cc: pairwise exchange for all-to-all and all-to-allv.
//
// Rank r copies its own block, then in step s = 1 .. n-1 sends its block for rank r+s and
// receives the block from rank r-s (mod n). Every rank posts all its steps at once (nothing in
// them conflicts), so all n-1 exchanges are in flight together and each link carries one block
// each way: bandwidth-optimal, n-1 messages per rank. All-to-allv is the same with each block's
// size and place given per peer.
#include "src/collectives/descriptor.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {
namespace {

// Block sizes and displacements in elements.
Schedule pairwise(const ScheduleArgs& args, auto sendCount, auto sendDispl, auto recvCount, auto recvDispl) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t size = args.typeSize;
  if (sendCount(r) > 0) {
    s.steps.push_back(copyStep(at(BufferId::kInput, sendDispl(r) * size), at(BufferId::kOutput, recvDispl(r) * size),
                               sendCount(r) * size));
  }
  for (int step = 1; step < n; ++step) {
    const int to = mod(r + step, n);
    const int from = mod(r - step, n);
    if (sendCount(to) > 0) {
      s.steps.push_back(sendStep(to, at(BufferId::kInput, sendDispl(to) * size), sendCount(to) * size));
    }
    if (recvCount(from) > 0) {
      s.steps.push_back(recvStep(from, at(BufferId::kOutput, recvDispl(from) * size), recvCount(from) * size));
    }
  }
  return s;
}

}  // namespace

Schedule pairwiseAllToAll(const ScheduleArgs& args) {
  const size_t count = args.count;
  auto counts = [count](int) { return count; };
  auto displs = [count](int peer) { return static_cast<size_t>(peer) * count; };
  return pairwise(args, counts, displs, counts, displs);
}

Schedule pairwiseAllToAllv(const ScheduleArgs& args) {
  return pairwise(
      args, [&](int peer) { return args.sendCounts[peer]; }, [&](int peer) { return args.sendDispls[peer]; },
      [&](int peer) { return args.recvCounts[peer]; }, [&](int peer) { return args.recvDispls[peer]; });
}

// Descriptors (descriptor.h: the notation). Every exchange is posted at once: one latency, plus
// the overhead of each further message. On two levels a host's link carries its l ranks' blocks
// for the n-l ranks elsewhere; their blocks for the host's own ranks go at local prices.
std::span<const AlgorithmDescriptor> pairwiseAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllToAll, Algorithm::kPairwise, pairwiseAllToAll,
       [](const Cost& c) {
         const double moved = c.twoLevels ? c.l * (c.n - c.l) / c.n * c.m * c.b + (c.l - 1) / c.n * c.m * c.lb
                                          : (c.n - 1) / c.n * c.m * c.b;
         return c.a + (c.n - 2) * c.o + moved + c.m / c.n * c.cp;
       },
       Follows::kNumbers},
      {Collective::kAllToAllv, Algorithm::kPairwise, pairwiseAllToAllv, onlyAlgorithmCost, Follows::kNumbers},
  };
  return kAll;
}

}  // namespace chorus::collectives
