// ordered.cc: the reductions of CHORUS_DETERMINISTIC, whose bits depend on the rank count alone:
// not on the algorithm asked for, the chunk size, the transport, the timing or where the ranks lie.
//
// Every element is folded the same way: rank 0's value, then rank 1's, ... then rank n-1's, each
// step as reduce() computes it (fp16 and bf16 in fp32, rounded once per step; Avg divided once at
// the end), which is also what the direct algorithm computes (reduceMany, on the host and on a
// GPU). No partial sum travels: an algorithm that reduces on the way (a ring, a tree, recursive
// halving) adds in an order that depends on where a block starts, so this schedule moves every
// rank's contribution to the rank that owns it and that rank folds them all at once.
//
// Rank r owns block r of the buffer (Blocks: n blocks differing by one element at most; a
// reduce-scatter's block r is its output). Piece by piece (chunkBytes of the owned block), in
// n - 1 rounds rank r sends its input's piece of block r + k to rank r + k and receives block r's
// piece from rank r - k into slot r - k of scratch; one fold step then reduces the n slots (its own
// contribution read where it lies) into the output. Pieces alternate between two sets of slots, so
// one piece's messages overlap the fold of the one before.
// - All-reduce: then the reduced blocks go around a ring (the rank order's, the all-gather phase of
//   ring.cc): n - 1 steps, each rank passing on the block it received last.
// - Reduce: each rank sends its reduced pieces to the root (the root folds its own block into its
//   output and receives the others' there); a rank other than the root folds into scratch.
// - Reduce-scatter: the fold is the output.
// The bytes each rank sends are those of the ring's reduce-scatter, (n - 1) / n of the buffer, in
// n - 1 messages a piece at once instead of one after another.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/collectives/descriptor.h"
#include "src/collectives/traits.h"

namespace chorus::collectives {

Schedule orderedReduction(const ScheduleArgs& args) {
  Schedule s;
  s.algorithm = "ordered";
  const Collective collective = args.collective;
  if (!traitsOf(collective).reduces) {
    throw std::invalid_argument(std::string("the ordered reduction does not implement ") + collectiveName(collective));
  }
  const int n = args.nranks;
  const int r = args.rank;
  const size_t size = args.typeSize;
  const bool scatter = collective == Collective::kReduceScatter;
  // Block p of the input: its first element and its length.
  const Blocks blocks{args.count * (scatter ? static_cast<size_t>(n) : 1), static_cast<size_t>(n)};
  auto blockStart = [&](int p) { return scatter ? static_cast<size_t>(p) * args.count : blocks.start(p); };
  auto blockSize = [&](int p) { return scatter ? args.count : blocks.size(p); };
  const size_t chunk = chunkElementsFor(args.chunkBytes, size);
  const size_t pieces = piecesOf(blockSize(0), chunk);
  // Elements of piece c of block p, and its first element within the block.
  auto pieceSize = [&](int p, size_t c) {
    const size_t begin = c * chunk;
    return begin >= blockSize(p) ? 0 : std::min(chunk, blockSize(p) - begin);
  };
  // Where block p's piece c lies in the output: a reduce-scatter's output is its own block.
  auto outputAt = [&](int p, size_t c) {
    return at(BufferId::kOutput, ((scatter ? 0 : blockStart(p)) + c * chunk) * size);
  };
  auto inputAt = [&](int p, size_t c) { return at(BufferId::kInput, (blockStart(p) + c * chunk) * size); };
  const size_t slotBytes = std::min(chunk, blockSize(0)) * size;
  const size_t setBytes = static_cast<size_t>(n) * slotBytes;  // one piece's n contributions
  const size_t resultBase = 2 * setBytes;                      // a reduce's rank other than the root: its folds
  s.scratchBytes = resultBase + (collective == Collective::kReduce && r != args.root ? 2 * slotBytes : 0);

  for (size_t c = 0; c < pieces; ++c) {
    const size_t mine = pieceSize(r, c) * size;
    const size_t set = (c % 2) * setBytes;
    for (int k = 1; k < n; ++k) {
      const int to = mod(r + k, n);
      const int from = mod(r - k, n);
      if (const size_t bytes = pieceSize(to, c) * size; bytes > 0)
        s.steps.push_back(sendStep(to, inputAt(to, c), bytes));
      if (mine > 0) {
        s.steps.push_back(recvStep(from, at(BufferId::kScratch, set + static_cast<size_t>(from) * mine), mine));
      }
    }
    if (collective == Collective::kReduce) {
      if (r == args.root) {
        if (mine > 0) s.steps.push_back(foldStep(at(BufferId::kScratch, set), inputAt(r, c), outputAt(r, c), mine, n));
        for (int p = 0; p < n; ++p) {
          const size_t bytes = pieceSize(p, c) * size;
          if (p != r && bytes > 0) s.steps.push_back(recvStep(p, outputAt(p, c), bytes));
        }
      } else if (mine > 0) {
        const Span result = at(BufferId::kScratch, resultBase + (c % 2) * slotBytes);
        s.steps.push_back(foldStep(at(BufferId::kScratch, set), inputAt(r, c), result, mine, n));
        s.steps.push_back(sendStep(args.root, result, mine));
      }
    } else if (mine > 0) {
      s.steps.push_back(foldStep(at(BufferId::kScratch, set), inputAt(r, c), outputAt(r, c), mine, n));
    }
  }

  if (collective == Collective::kAllReduce && n > 1) {
    // The ring of the rank order: at step k the rank at position q passes on block rankAt(q - k)
    // (its own at first) and receives block rankAt(q - k - 1).
    const int q = positionOf(args, r);
    const int next = rankAt(args, q + 1);
    const int prev = rankAt(args, q - 1);
    for (int k = 0; k + 1 < n; ++k) {
      const int out = rankAt(args, q - k);
      const int in = rankAt(args, q - k - 1);
      for (size_t c = 0; c < pieces; ++c) {
        if (const size_t bytes = pieceSize(out, c) * size; bytes > 0) {
          s.steps.push_back(sendStep(next, outputAt(out, c), bytes));
        }
        if (const size_t bytes = pieceSize(in, c) * size; bytes > 0) {
          s.steps.push_back(recvStep(prev, outputAt(in, c), bytes));
        }
      }
    }
  }
  return s;
}

}  // namespace chorus::collectives
