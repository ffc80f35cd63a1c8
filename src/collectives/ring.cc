// ring.cc: ring algorithms for all-reduce, all-gather and reduce-scatter.
//
// The ranks form a ring: rank r sends to next = r+1 and receives from prev = r-1 (mod n). The
// data is cut into n blocks, and each block into chunks of at most CHORUS_CHUNK_BYTES; the steps
// below run once per chunk index, so a chunk travels the ring while the next one follows it
// (pipelining), and scratch stays a few chunks large whatever the message size.
//
// Reduce-scatter phase (n-1 steps). At step s, rank r sends block r-s and receives block r-s-1,
// which it reduces with its own input into the output. At step 0 it sends its own input block;
// later it sends the block it reduced at the step before. After n-1 steps rank r holds block r+1
// reduced over all ranks ("owns" it). For Avg, the owner divides its block once, here.
//
// All-gather phase (n-1 steps). At step s, rank r sends block r+1-s (its owned block at step 0,
// then the block it received at the step before) and receives block r-s into the output.
//
// Each rank sends and receives 2(n-1)/n of the buffer: the bandwidth-optimal all-reduce.
//
// The stand-alone all-gather is the second phase with rank r starting from its own block r; the
// stand-alone reduce-scatter is the first phase shifted by one block, so rank r ends owning block
// r, with partial sums kept in scratch (its output holds one block only).
//
// With a rank order (ScheduleArgs::order), "rank r" above is position r of the order: the ring
// runs from each rank to the next in the order. All-reduce's blocks are its own to choose; the
// all-gather and reduce-scatter keep block b (the one position b starts or ends with) at its
// rank's offset, so the output is laid out by rank whatever the order.
#include <algorithm>

#include "src/collectives/descriptor.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {
namespace {

constexpr size_t kTmpSlots = 4;  // receive buffers for recv-reduce, reused round robin

// Piece c of a block: byte offset from the block's start and byte length (0 if empty).
struct Piece {
  size_t offset;
  size_t bytes;
};
Piece pieceOf(size_t blockElements, size_t chunkElements, size_t c, size_t typeSize) {
  const size_t first = c * chunkElements;
  if (first >= blockElements) return {0, 0};
  const size_t last = std::min(blockElements, first + chunkElements);
  return {first * typeSize, (last - first) * typeSize};
}

}  // namespace

Schedule ringAllReduce(const ScheduleArgs& args) {
  std::vector<int> ring(static_cast<size_t>(args.nranks));
  for (int position = 0; position < args.nranks; ++position) ring[position] = position;
  Schedule schedule;
  appendRingAllReduce(schedule, args, ring, args.rank, nullptr);
  return schedule;
}

void appendRingAllReduce(Schedule& schedule, const ScheduleArgs& args, const std::vector<int>& ring, int r,
                         const OwnedChunkSteps& owned) {
  const int n = static_cast<int>(ring.size());
  const size_t size = args.typeSize;
  if (args.count == 0) return;
  const Blocks blocks{args.count, static_cast<size_t>(n)};
  const size_t chunkElements = std::min(chunkElementsFor(args.chunkBytes, size), blocks.size(0));
  const size_t pieces = piecesOf(blocks.size(0), chunkElements);
  if (n == 1) {
    schedule.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), args.count * size));
    if (!owned) return;
    for (size_t c = 0; c < pieces; ++c) {
      const Piece piece = pieceOf(args.count, chunkElements, c, size);
      owned(schedule, piece.offset, piece.bytes, c);
      if (args.divide) schedule.steps.push_back(divideStep(at(BufferId::kOutput, piece.offset), piece.bytes));
    }
    return;
  }
  const int next = ring[mod(r + 1, n)];
  const int prev = ring[mod(r - 1, n)];
  SlotRing tmp{0, chunkElements * size, kTmpSlots};
  schedule.scratchBytes = std::max(schedule.scratchBytes, tmp.end());

  for (size_t c = 0; c < pieces; ++c) {
    auto piece = [&](int block) { return pieceOf(blocks.size(block), chunkElements, c, size); };
    auto offset = [&](int block) { return blocks.start(block) * size + piece(block).offset; };
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = mod(r - s, n);
      const int recvBlock = mod(r - s - 1, n);
      if (piece(sendBlock).bytes > 0) {
        const BufferId from = s == 0 ? BufferId::kInput : BufferId::kOutput;
        schedule.steps.push_back(sendStep(next, at(from, offset(sendBlock)), piece(sendBlock).bytes));
      }
      if (piece(recvBlock).bytes > 0) {
        schedule.steps.push_back(recvReduceStep(prev, at(BufferId::kInput, offset(recvBlock)),
                                                at(BufferId::kOutput, offset(recvBlock)), tmp.take(),
                                                piece(recvBlock).bytes));
      }
    }
    const int ownedBlock = mod(r + 1, n);
    if (piece(ownedBlock).bytes > 0) {
      if (owned) owned(schedule, offset(ownedBlock), piece(ownedBlock).bytes, c);
      if (args.divide) {
        schedule.steps.push_back(divideStep(at(BufferId::kOutput, offset(ownedBlock)), piece(ownedBlock).bytes));
      }
    }
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = mod(r + 1 - s, n);
      const int recvBlock = mod(r - s, n);
      if (piece(sendBlock).bytes > 0) {
        schedule.steps.push_back(sendStep(next, at(BufferId::kOutput, offset(sendBlock)), piece(sendBlock).bytes));
      }
      if (piece(recvBlock).bytes > 0) {
        schedule.steps.push_back(recvStep(prev, at(BufferId::kOutput, offset(recvBlock)), piece(recvBlock).bytes));
      }
    }
  }
}

Schedule ringAllGather(const ScheduleArgs& args) {
  Schedule schedule;
  const int n = args.nranks;
  const int r = positionOf(args, args.rank);  // the ring runs over positions of the rank order
  const size_t size = args.typeSize;
  const size_t blockBytes = args.count * size;
  if (args.count == 0) return schedule;
  // The executor skips the copies of the input into the output when the call is in place (same
  // address). With more than one rank, the first step sends each chunk of this rank's block
  // straight from the input and the chunk is copied after the chunk's steps are posted, so the
  // copy overlaps the transfers instead of preceding them.
  if (n == 1) {
    schedule.steps.push_back(
        copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, args.rank * blockBytes), blockBytes));
    return schedule;
  }
  const int next = rankAt(args, r + 1);
  const int prev = rankAt(args, r - 1);
  // Block b of the ring (the one position b started with) is rank rankAt(b)'s.
  auto blockStart = [&](int b) { return static_cast<size_t>(rankAt(args, b)) * blockBytes; };
  const size_t chunkElements = std::min(chunkElementsFor(args.chunkBytes, size), args.count);
  const size_t pieces = piecesOf(args.count, chunkElements);
  for (size_t c = 0; c < pieces; ++c) {
    const Piece piece = pieceOf(args.count, chunkElements, c, size);
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = mod(r - s, n);
      const int recvBlock = mod(r - s - 1, n);
      const Span from =
          s == 0 ? at(BufferId::kInput, piece.offset) : at(BufferId::kOutput, blockStart(sendBlock) + piece.offset);
      schedule.steps.push_back(sendStep(next, from, piece.bytes));
      schedule.steps.push_back(
          recvStep(prev, at(BufferId::kOutput, blockStart(recvBlock) + piece.offset), piece.bytes));
    }
    schedule.steps.push_back(copyStep(at(BufferId::kInput, piece.offset),
                                      at(BufferId::kOutput, static_cast<size_t>(args.rank) * blockBytes + piece.offset),
                                      piece.bytes));
  }
  return schedule;
}

Schedule ringReduceScatter(const ScheduleArgs& args) {
  Schedule schedule;
  const int n = args.nranks;
  const int r = positionOf(args, args.rank);  // the ring runs over positions of the rank order
  const size_t size = args.typeSize;
  const size_t blockBytes = args.count * size;
  if (args.count == 0) return schedule;
  if (n == 1) {
    schedule.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), blockBytes));
    return schedule;
  }
  const int next = rankAt(args, r + 1);
  const int prev = rankAt(args, r - 1);
  // Block b of the ring is rank rankAt(b)'s.
  auto blockStart = [&](int b) { return static_cast<size_t>(rankAt(args, b)) * blockBytes; };
  const size_t chunkElements = std::min(chunkElementsFor(args.chunkBytes, size), args.count);
  const size_t pieces = piecesOf(args.count, chunkElements);
  SlotRing tmp{0, chunkElements * size, kTmpSlots};
  SlotRing partial{tmp.end(), chunkElements * size, kTmpSlots};
  schedule.scratchBytes = partial.end();

  for (size_t c = 0; c < pieces; ++c) {
    const Piece piece = pieceOf(args.count, chunkElements, c, size);
    Span carried{};  // the partial result to send at the next step
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = mod(r - s - 1, n);
      const int recvBlock = mod(r - s - 2, n);
      const Span from = s == 0 ? at(BufferId::kInput, blockStart(sendBlock) + piece.offset) : carried;
      schedule.steps.push_back(sendStep(next, from, piece.bytes));
      const bool last = s == n - 2;
      const Span into = last ? at(BufferId::kOutput, piece.offset) : partial.take();
      schedule.steps.push_back(recvReduceStep(prev, at(BufferId::kInput, blockStart(recvBlock) + piece.offset), into,
                                              tmp.take(), piece.bytes));
      carried = into;
    }
    if (args.divide) schedule.steps.push_back(divideStep(at(BufferId::kOutput, piece.offset), piece.bytes));
  }
  return schedule;
}

// Descriptors: 2(n-1) ring steps of a block for the all-reduce, n-1 for the all-gather and
// reduce-scatter (descriptor.h: the notation).
std::span<const AlgorithmDescriptor> ringAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllReduce, Algorithm::kRing, ringAllReduce,
       [](const Cost& c) { return c.ringSteps(2 * (c.n - 1), c.m / c.n, c.b) + (c.n - 1) * c.m / c.n * c.g; },
       Follows::kPositions},
      {Collective::kAllGather, Algorithm::kRing, ringAllGather,
       [](const Cost& c) { return c.ringSteps(c.n - 1, c.m / c.n, c.b) + c.m / c.n * c.cp; }, Follows::kItself},
      {Collective::kReduceScatter, Algorithm::kRing, ringReduceScatter,
       [](const Cost& c) { return c.ringSteps(c.n - 1, c.m / c.n, c.b + c.g); }, Follows::kItself},
  };
  return kAll;
}

}  // namespace chorus::collectives
