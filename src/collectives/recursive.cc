// recursive.cc: recursive doubling and halving: all-reduce (recursive doubling, Rabenseifner),
// all-gather (recursive doubling) and reduce-scatter (recursive halving).
//
// These algorithms pair ranks whose numbers differ in one bit, so they need a power of two. With
// n ranks, let p be the largest power of two <= n and rem = n - p. The fold: ranks below 2*rem
// pair up, even rank r with r+1; the even rank hands its data to the odd one first and sits out,
// and the odd rank stands for both as virtual rank r/2. Ranks from 2*rem on are virtual rank
// r - rem. The p virtual ranks run the power-of-two algorithm; at the end each odd rank hands the
// result back to its even partner. Virtual rank v stands for real blocks [first(v), first(v+1))
// with first(v) = 2v below rem and v + rem above, so a run of virtual ranks is always one
// contiguous run of real blocks.
//
// Recursive doubling all-reduce: in round k the virtual ranks v and v^2^k exchange their whole
// buffers and both reduce, so after log2(p) rounds everyone has the sum. log2(p) messages of the
// full size: for small messages.
//
// Rabenseifner all-reduce: the buffer is cut into p blocks. Reduce-scatter by recursive halving:
// in the round of distance d = p/2, p/4, ..., 1, virtual ranks v and v^d split their current
// range of blocks; each sends the half the other keeps and reduces the half it keeps, so after
// log2(p) rounds v holds block v reduced. All-gather by recursive doubling reverses it: in the
// round of distance d = 1, 2, ..., p/2, v and v^d swap the ranges they hold. Each rank sends
// about twice the buffer in 2 log2(p) messages: for large messages with few ranks.
//
// Recursive doubling all-gather: v and v^d swap all the blocks each has gathered so far (d = 1,
// 2, ..., p/2), as chunk-sized messages in the order each got its blocks (its own first, the
// ones from the round before last), sends and receives interleaved (or as one message when all
// it holds fits in a chunk). So a round's first messages
// need nothing from the round before and go out while it is still arriving, and each forwarded
// chunk waits only for its own arrival: the rounds overlap as a ring's steps do. Recursive halving reduce-scatter:
// Rabenseifner's first half over the n real blocks of the output layout, each virtual rank ending with its real blocks.
//
// Exchanges receive into scratch and reduce with a separate local step, so no receive waits
// for a send out of the same bytes (which could deadlock once a message outgrows the buffers).
#include <algorithm>
#include <utility>
#include <vector>

#include "src/collectives/descriptor.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {
namespace {

struct Fold {
  int n;
  int p;
  int rem;
  explicit Fold(int nranks) : n(nranks), p(1), rem(0) {
    while (p * 2 <= n) p *= 2;
    rem = n - p;
  }
  bool sitsOut(int r) const { return r < 2 * rem && r % 2 == 0; }
  int virtualOf(int r) const { return r < 2 * rem ? r / 2 : r - rem; }
  int realOf(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  int firstBlock(int v) const { return v < rem ? 2 * v : v + rem; }  // first real block of v; firstBlock(p) = n
};

// Pre-fold (even ranks below 2*rem give their whole buffer to r+1, which reduces it in) for
// the all-reduce algorithms, working on `work` of `bytes`, with `tmp` in scratch.
void foldIn(Schedule& s, const Fold& f, int r, Span work, Span tmp, size_t bytes) {
  if (r >= 2 * f.rem) return;
  if (f.sitsOut(r)) {
    s.steps.push_back(sendStep(r + 1, work, bytes));
  } else {
    s.steps.push_back(recvStep(r - 1, tmp, bytes));
    s.steps.push_back(reduceStep(work, tmp, work, bytes));
  }
}

// Post-fold: odd ranks below 2*rem hand the result back to their even partner.
void foldOut(Schedule& s, const Fold& f, int r, Span work, size_t bytes) {
  if (r >= 2 * f.rem) return;
  if (f.sitsOut(r)) {
    s.steps.push_back(recvStep(r + 1, work, bytes));
  } else {
    s.steps.push_back(sendStep(r - 1, work, bytes));
  }
}

// The ranges of virtual blocks [lo, hi) that virtual rank v holds before the all-gather round of
// distance d, in the order it got them: its own block, then the one of v ^ 1, the two of v ^ 2,
// ..., the d/2 of v ^ (d/2) (each partner's aligned range at its round).
std::vector<std::pair<int, int>> heldInOrder(int v, int d) {
  std::vector<std::pair<int, int>> ranges{{v, v + 1}};
  for (int e = 1; e < d; e *= 2) {
    const int first = (v ^ e) & ~(e - 1);
    ranges.push_back({first, first + e});
  }
  return ranges;
}

}  // namespace

Schedule recursiveDoublingAllReduce(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t bytes = args.count * args.typeSize;
  if (args.count == 0) return s;
  const Span out = at(BufferId::kOutput, 0);
  const Span tmp = at(BufferId::kScratch, 0);
  s.steps.push_back(copyStep(at(BufferId::kInput, 0), out, bytes));
  if (n == 1) return s;
  s.scratchBytes = bytes;
  const Fold f(n);
  foldIn(s, f, r, out, tmp, bytes);
  if (!f.sitsOut(r)) {
    const int v = f.virtualOf(r);
    for (int mask = 1; mask < f.p; mask <<= 1) {
      const int partner = f.realOf(v ^ mask);
      s.steps.push_back(sendStep(partner, out, bytes));
      s.steps.push_back(recvStep(partner, tmp, bytes));
      s.steps.push_back(reduceStep(out, tmp, out, bytes));
    }
    if (args.divide) s.steps.push_back(divideStep(out, bytes));
  }
  foldOut(s, f, r, out, bytes);
  return s;
}

Schedule rabenseifnerAllReduce(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t size = args.typeSize;
  const size_t bytes = args.count * size;
  if (args.count == 0) return s;
  const Span out = at(BufferId::kOutput, 0);
  s.steps.push_back(copyStep(at(BufferId::kInput, 0), out, bytes));
  if (n == 1) return s;
  s.scratchBytes = bytes;
  const Fold f(n);
  foldIn(s, f, r, out, at(BufferId::kScratch, 0), bytes);
  if (!f.sitsOut(r)) {
    const Blocks blocks{args.count, static_cast<size_t>(f.p)};
    auto offset = [&](int block) { return blocks.start(block) * size; };
    auto length = [&](int lo, int hi) { return offset(hi) - offset(lo); };
    const int v = f.virtualOf(r);
    int lo = 0;
    int hi = f.p;
    for (int d = f.p / 2; d >= 1; d /= 2) {  // reduce-scatter by recursive halving
      const int partner = f.realOf(v ^ d);
      const int mid = lo + (hi - lo) / 2;
      const bool lower = (v & d) == 0;
      const int keepLo = lower ? lo : mid, keepHi = lower ? mid : hi;
      const int giveLo = lower ? mid : lo, giveHi = lower ? hi : mid;
      if (length(giveLo, giveHi) > 0)
        s.steps.push_back(sendStep(partner, at(BufferId::kOutput, offset(giveLo)), length(giveLo, giveHi)));
      if (length(keepLo, keepHi) > 0) {
        const Span keep = at(BufferId::kOutput, offset(keepLo));
        const Span tmp = at(BufferId::kScratch, offset(keepLo));
        s.steps.push_back(recvStep(partner, tmp, length(keepLo, keepHi)));
        s.steps.push_back(reduceStep(keep, tmp, keep, length(keepLo, keepHi)));
      }
      lo = keepLo;
      hi = keepHi;
    }
    if (args.divide && length(lo, hi) > 0)
      s.steps.push_back(divideStep(at(BufferId::kOutput, offset(lo)), length(lo, hi)));
    for (int d = 1; d < f.p; d *= 2) {  // all-gather by recursive doubling
      const int partner = f.realOf(v ^ d);
      const bool upper = (v & d) != 0;
      const int theirLo = upper ? lo - d : hi, theirHi = upper ? lo : hi + d;
      if (length(lo, hi) > 0) s.steps.push_back(sendStep(partner, at(BufferId::kOutput, offset(lo)), length(lo, hi)));
      if (length(theirLo, theirHi) > 0) {
        s.steps.push_back(recvStep(partner, at(BufferId::kOutput, offset(theirLo)), length(theirLo, theirHi)));
      }
      lo = std::min(lo, theirLo);
      hi = std::max(hi, theirHi);
    }
  }
  foldOut(s, f, r, out, bytes);
  return s;
}

Schedule recursiveDoublingAllGather(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t blockBytes = args.count * args.typeSize;
  if (args.count == 0) return s;
  auto block = [&](int b) { return at(BufferId::kOutput, static_cast<size_t>(b) * blockBytes); };
  const Fold f(n);
  // A rank outside the fold sends its own block in the first round straight from its input and
  // copies each piece into its output after posting that piece's exchange, so the copy overlaps
  // the transfers instead of preceding them (2 ranks, 16 MiB out of place took 1.6 ms where in
  // place, with no copy, took 0.9). Ranks in the fold copy first: their first message is their
  // own block or its partner's.
  const bool copyAlong = n > 1 && r >= 2 * f.rem;
  if (!copyAlong) s.steps.push_back(copyStep(at(BufferId::kInput, 0), block(r), blockBytes));
  if (n == 1) return s;
  if (r < 2 * f.rem) {  // fold: the even rank's block joins the odd rank's
    if (f.sitsOut(r)) {
      s.steps.push_back(sendStep(r + 1, block(r), blockBytes));
    } else {
      s.steps.push_back(recvStep(r - 1, block(r - 1), blockBytes));
    }
  }
  if (!f.sitsOut(r)) {
    const size_t chunkBytes = std::max(chunkElementsFor(args.chunkBytes, args.typeSize) * args.typeSize, size_t{1});
    // The chunk-sized pieces (byte offset, bytes) of what virtual rank w sends in the round of
    // distance d, in the order it got them.
    auto pieces = [&](int w, int d) {
      std::vector<std::pair<size_t, size_t>> out;
      const int first = w & ~(d - 1);  // w holds the aligned run of d virtual blocks around it
      const size_t begin = static_cast<size_t>(f.firstBlock(first)) * blockBytes;
      const size_t end = static_cast<size_t>(f.firstBlock(first + d)) * blockBytes;
      if (end - begin <= chunkBytes) return decltype(out){{begin, end - begin}};  // small: one message
      for (const auto& [lo, hi] : heldInOrder(w, d)) {
        const size_t begin = static_cast<size_t>(f.firstBlock(lo)) * blockBytes;
        const size_t end = static_cast<size_t>(f.firstBlock(hi)) * blockBytes;
        for (size_t from = begin; from < end; from += chunkBytes)
          out.push_back({from, std::min(chunkBytes, end - from)});
      }
      return out;
    };
    const int v = f.virtualOf(r);
    for (int d = 1; d < f.p; d *= 2) {
      const int partner = f.realOf(v ^ d);
      const auto mine = pieces(v, d);
      const auto theirs = pieces(v ^ d, d);
      for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
        // In the first round, mine is this rank's own block (copyAlong): its bytes at the same
        // offset within the input.
        const bool fromInput = copyAlong && d == 1 && i < mine.size();
        const Span input =
            fromInput ? at(BufferId::kInput, mine[i].first - static_cast<size_t>(r) * blockBytes) : Span{};
        if (i < mine.size()) {
          s.steps.push_back(
              sendStep(partner, fromInput ? input : at(BufferId::kOutput, mine[i].first), mine[i].second));
        }
        if (i < theirs.size()) {
          s.steps.push_back(recvStep(partner, at(BufferId::kOutput, theirs[i].first), theirs[i].second));
        }
        if (fromInput) s.steps.push_back(copyStep(input, at(BufferId::kOutput, mine[i].first), mine[i].second));
      }
    }
  }
  foldOut(s, f, r, block(0), n * blockBytes);
  return s;
}

Schedule recursiveHalvingReduceScatter(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t blockBytes = args.count * args.typeSize;
  const size_t totalBytes = blockBytes * n;
  if (args.count == 0) return s;
  if (n == 1) {
    s.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), blockBytes));
    return s;
  }
  // Work on a copy of the whole input in scratch; receive into a second scratch area.
  auto work = [&](int b) { return at(BufferId::kScratch, static_cast<size_t>(b) * blockBytes); };
  auto tmp = [&](int b) { return at(BufferId::kScratch, totalBytes + static_cast<size_t>(b) * blockBytes); };
  s.scratchBytes = 2 * totalBytes;
  s.steps.push_back(copyStep(at(BufferId::kInput, 0), work(0), totalBytes));
  const Fold f(n);
  foldIn(s, f, r, work(0), tmp(0), totalBytes);
  if (f.sitsOut(r)) {
    s.steps.push_back(recvStep(r + 1, at(BufferId::kOutput, 0), blockBytes));
  } else {
    const int v = f.virtualOf(r);
    int lo = 0, hi = f.p;  // virtual blocks still held
    for (int d = f.p / 2; d >= 1; d /= 2) {
      const int partner = f.realOf(v ^ d);
      const int mid = lo + (hi - lo) / 2;
      const bool lower = (v & d) == 0;
      const int keepLo = lower ? lo : mid, keepHi = lower ? mid : hi;
      const int giveLo = lower ? mid : lo, giveHi = lower ? hi : mid;
      const size_t give = (f.firstBlock(giveHi) - f.firstBlock(giveLo)) * blockBytes;
      const size_t keep = (f.firstBlock(keepHi) - f.firstBlock(keepLo)) * blockBytes;
      s.steps.push_back(sendStep(partner, work(f.firstBlock(giveLo)), give));
      s.steps.push_back(recvStep(partner, tmp(f.firstBlock(keepLo)), keep));
      s.steps.push_back(
          reduceStep(work(f.firstBlock(keepLo)), tmp(f.firstBlock(keepLo)), work(f.firstBlock(keepLo)), keep));
      lo = keepLo;
      hi = keepHi;
    }
    if (r < 2 * f.rem) s.steps.push_back(sendStep(r - 1, work(r - 1), blockBytes));  // the partner's block
    s.steps.push_back(copyStep(work(r), at(BufferId::kOutput, 0), blockBytes));
  }
  if (args.divide) s.steps.push_back(divideStep(at(BufferId::kOutput, 0), blockBytes));
  return s;
}

// Descriptors (descriptor.h: the notation).
std::span<const AlgorithmDescriptor> recursiveAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllReduce, Algorithm::kRecursiveDoubling, recursiveDoublingAllReduce,
       [](const Cost& c) {
         double rounds = 0;
         for (double d = 1; d < c.p; d *= 2) rounds += c.exchange(d, c.m) + c.m * c.g;
         return rounds + c.fold() + c.m * c.cp;
       },
       Follows::kPositions},
      {Collective::kAllReduce, Algorithm::kRabenseifner, rabenseifnerAllReduce,
       // Halving from distance p/2 (half the buffer), doubling back: each distance twice.
       [](const Cost& c) {
         double rounds = 0;
         for (double d = c.p / 2, part = c.m / 2; d >= 1; d /= 2, part /= 2) rounds += 2 * c.exchange(d, part);
         return rounds + (c.p - 1) / c.p * c.m * c.g + c.fold() + c.m * c.cp;
       },
       Follows::kPositions},
      // Rounds overlap (a round's first chunks need nothing from the one before): lg latencies, and
      // each further chunk message the overhead of one more in flight.
      {Collective::kAllGather, Algorithm::kRecursiveDoubling, recursiveDoublingAllGather,
       [](const Cost& c) {
         const double block = c.m / c.n;
         double messages = 0;
         for (double d = 1; d < c.p; d *= 2) {
           if (d * block <= c.chunk) {
             messages += 1;  // all it holds in one message
             continue;
           }
           messages += std::ceil(block / c.chunk);
           for (double e = 1; e < d; e *= 2) messages += std::ceil(e * block / c.chunk);
         }
         double rounds = 0;
         for (double d = 1; d < c.p; d *= 2) rounds += c.exchange(d, d * block);
         return rounds + (messages - c.lg) * c.o + (c.folds ? 2 * c.a + c.m * c.b : 0) + c.m / c.n * c.cp;
       },
       Follows::kNumbers},
      {Collective::kReduceScatter, Algorithm::kRecursiveHalving, recursiveHalvingReduceScatter,
       // The input copied into scratch, the own block out of it.
       [](const Cost& c) {
         double rounds = 0;
         for (double d = c.p / 2, part = c.m / 2; d >= 1; d /= 2, part /= 2) rounds += c.exchange(d, part);
         return rounds + (c.p - 1) / c.p * c.m * c.g + c.fold() + (1 + 1 / c.n) * c.m * c.cp;
       },
       Follows::kNumbers},
  };
  return kAll;
}

}  // namespace chorus::collectives
