// bruck.cc: Bruck's algorithms for all-gather and all-to-all: ceil(log2 n) rounds for any n.
//
// Both keep a rotated copy of the blocks in scratch, so that position i always concerns rank
// r+i (mod n): the rotation makes every rank's rounds look alike.
//
// All-gather. Position i holds the block of rank r+i. Start with the own block at position 0.
// In the round of distance d = 1, 2, 4, ... (< n), rank r sends its first min(d, n-d) positions
// to rank r-d and receives rank r+d's first positions into positions d, d+1, ...; after the last
// round it holds all n, and two copies rotate them into place in the output.
//
// All-to-all. Position i holds the block rank r sends to rank r+i. In the round of bit k
// (d = 2^k), every block whose position has bit k set moves d ranks on: the rank packs those
// positions into one contiguous message for rank r+d, receives the same positions from rank r-d
// and unpacks them. A block for rank r+i thus travels i ranks in log2 n hops, landing at position
// i, where it is the block that rank r-i sent to r; copies put it in output block r-i. Messages
// carry about n/2 blocks each: few, larger messages, for small blocks and many ranks.
#include <algorithm>
#include <vector>

#include "src/collectives/descriptor.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {

Schedule bruckAllGather(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t blockBytes = args.count * args.typeSize;
  if (args.count == 0) return s;
  auto position = [&](int i) { return at(BufferId::kScratch, static_cast<size_t>(i) * blockBytes); };
  s.scratchBytes = n * blockBytes;
  s.steps.push_back(copyStep(at(BufferId::kInput, 0), position(0), blockBytes));
  for (int d = 1; d < n; d *= 2) {
    const int count = std::min(d, n - d);
    s.steps.push_back(sendStep(mod(r - d, n), position(0), count * blockBytes));
    s.steps.push_back(recvStep(mod(r + d, n), position(d), count * blockBytes));
  }
  // Position i is rank r+i's block: positions [0, n-r) go to blocks [r, n), the rest to [0, r).
  s.steps.push_back(copyStep(position(0), at(BufferId::kOutput, r * blockBytes), (n - r) * blockBytes));
  if (r > 0) s.steps.push_back(copyStep(position(n - r), at(BufferId::kOutput, 0), r * blockBytes));
  return s;
}

Schedule bruckAllToAll(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t blockBytes = args.count * args.typeSize;
  if (args.count == 0) return s;
  const size_t half = static_cast<size_t>(n / 2 + 1);
  auto position = [&](int i) { return at(BufferId::kScratch, static_cast<size_t>(i) * blockBytes); };
  auto packed = [&](int j) { return at(BufferId::kScratch, (n + static_cast<size_t>(j)) * blockBytes); };
  auto unpacked = [&](int j) { return at(BufferId::kScratch, (n + half + static_cast<size_t>(j)) * blockBytes); };
  s.scratchBytes = (n + 2 * half) * blockBytes;
  // Rotate: position i = input block r+i.
  s.steps.push_back(copyStep(at(BufferId::kInput, r * blockBytes), position(0), (n - r) * blockBytes));
  if (r > 0) s.steps.push_back(copyStep(at(BufferId::kInput, 0), position(n - r), r * blockBytes));
  for (int d = 1; d < n; d *= 2) {
    std::vector<int> moving;
    for (int i = 0; i < n; ++i) {
      if ((i & d) != 0) moving.push_back(i);
    }
    for (size_t j = 0; j < moving.size(); ++j) s.steps.push_back(copyStep(position(moving[j]), packed(j), blockBytes));
    s.steps.push_back(sendStep(mod(r + d, n), packed(0), moving.size() * blockBytes));
    s.steps.push_back(recvStep(mod(r - d, n), unpacked(0), moving.size() * blockBytes));
    for (size_t j = 0; j < moving.size(); ++j)
      s.steps.push_back(copyStep(unpacked(j), position(moving[j]), blockBytes));
  }
  // Position i came from rank r-i.
  for (int i = 0; i < n; ++i) {
    s.steps.push_back(copyStep(position(i), at(BufferId::kOutput, mod(r - i, n) * blockBytes), blockBytes));
  }
  return s;
}

// Descriptors (descriptor.h: the notation).
std::span<const AlgorithmDescriptor> bruckAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllGather, Algorithm::kBruck, bruckAllGather,
       // The own block copied in, the whole buffer rotated out.
       [](const Cost& c) {
         double rounds = 0;
         for (double d = 1; d < c.n; d *= 2) rounds += c.exchange(d, std::min(d, c.n - d) * c.m / c.n, true);
         return rounds + (1 + 1 / c.n) * c.m * c.cp;
       },
       Follows::kNumbers},
      {Collective::kAllToAll, Algorithm::kBruck, bruckAllToAll,
       [](const Cost& c) {
         double rounds = 0;
         for (double d = 1; d < c.n; d *= 2) rounds += c.exchange(d, c.m / 2, true);
         return rounds + (2 + c.L) * c.m * c.cp;
       },
       Follows::kNumbers},
  };
  return kAll;
}

}  // namespace chorus::collectives
