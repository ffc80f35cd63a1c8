// chain.cc: pipelined chains for broadcast and reduce.
//
// The ranks form a chain that starts at the root: position p = (rank - root) mod n, so the root
// is position 0 and position p talks to positions p-1 and p+1. The buffer is cut into chunks of
// at most CHORUS_CHUNK_BYTES, and each chunk moves one hop per step, so all links are busy at
// once after n-1 chunks: a large message takes about (chunks + n - 2) chunk-times.
//
// Broadcast: the root sends each chunk of its input to position 1 (and copies its input to its
// output); every other position receives the chunk into its output and, unless it is last,
// sends it on from there.
//
// Reduce: the data flows the other way. The last position sends its input chunk to position
// n-2; each middle position receives the partial result, reduces it with its own input into a
// scratch slot, and sends that on; the root reduces into its output, and for Avg divides there.
#include <algorithm>

#include "src/collectives/descriptor.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {
namespace {

constexpr size_t kSlots = 4;

}  // namespace

Schedule chainBroadcast(const ScheduleArgs& args) {
  Schedule schedule;
  const int n = args.nranks;
  const size_t size = args.typeSize;
  const size_t totalBytes = args.count * size;
  if (args.count == 0) return schedule;
  const int position = mod(args.rank - args.root, n);
  const int toward = mod(args.rank + 1, n);  // position + 1
  const int from = mod(args.rank - 1, n);    // position - 1
  const bool last = position == n - 1;
  if (position == 0) {
    schedule.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), totalBytes));
  }
  if (n == 1) return schedule;
  const size_t chunkBytes = std::min(chunkElementsFor(args.chunkBytes, size), args.count) * size;
  for (size_t offset = 0; offset < totalBytes; offset += chunkBytes) {
    const size_t bytes = std::min(chunkBytes, totalBytes - offset);
    if (position == 0) {
      schedule.steps.push_back(sendStep(toward, at(BufferId::kInput, offset), bytes));
      continue;
    }
    schedule.steps.push_back(recvStep(from, at(BufferId::kOutput, offset), bytes));
    if (!last) schedule.steps.push_back(sendStep(toward, at(BufferId::kOutput, offset), bytes));
  }
  return schedule;
}

Schedule chainReduce(const ScheduleArgs& args) {
  Schedule schedule;
  const int n = args.nranks;
  const size_t size = args.typeSize;
  const size_t totalBytes = args.count * size;
  if (args.count == 0) return schedule;
  const int position = mod(args.rank - args.root, n);
  if (n == 1) {
    schedule.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), totalBytes));
    return schedule;
  }
  const int upstream = mod(args.rank + 1, n);    // position + 1 sends to us
  const int downstream = mod(args.rank - 1, n);  // we send to position - 1
  const size_t chunkBytes = std::min(chunkElementsFor(args.chunkBytes, size), args.count) * size;
  SlotRing tmp{0, chunkBytes, kSlots};
  SlotRing partial{tmp.end(), chunkBytes, kSlots};
  if (position != n - 1) schedule.scratchBytes = position == 0 ? tmp.end() : partial.end();
  for (size_t offset = 0; offset < totalBytes; offset += chunkBytes) {
    const size_t bytes = std::min(chunkBytes, totalBytes - offset);
    if (position == n - 1) {
      schedule.steps.push_back(sendStep(downstream, at(BufferId::kInput, offset), bytes));
      continue;
    }
    const Span into = tmp.take();
    if (position == 0) {
      schedule.steps.push_back(
          recvReduceStep(upstream, at(BufferId::kInput, offset), at(BufferId::kOutput, offset), into, bytes));
      if (args.divide) schedule.steps.push_back(divideStep(at(BufferId::kOutput, offset), bytes));
      continue;
    }
    const Span result = partial.take();
    schedule.steps.push_back(recvReduceStep(upstream, at(BufferId::kInput, offset), result, into, bytes));
    schedule.steps.push_back(sendStep(downstream, result, bytes));
  }
  return schedule;
}

// Descriptors: a pipeline of n-1 hops (descriptor.h: the notation).
std::span<const AlgorithmDescriptor> chainAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kBroadcast, Algorithm::kChain, chainBroadcast,
       [](const Cost& c) { return c.pipeline(c.n - 1, c.b, c.m) + c.m * c.cp; }, Follows::kPositions},
      {Collective::kReduce, Algorithm::kChain, chainReduce,
       [](const Cost& c) { return c.pipeline(c.n - 1, c.b + c.g, c.m); }, Follows::kPositions},
  };
  return kAll;
}

}  // namespace chorus::collectives
