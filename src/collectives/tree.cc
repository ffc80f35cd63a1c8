// tree.cc: tree algorithms: binomial broadcast, reduce, gather and scatter; scatter + all-gather
// broadcast; reduce-scatter + gather reduce; the dissemination barrier; and the double binary
// tree all-reduce.
//
// Binomial tree. Ranks are numbered relative to the root, v = (rank - root) mod n. The parent
// of v != 0 is v minus its lowest set bit m; its children are v + m/2, v + m/4, ..., v + 1 (the
// root's: the powers of two below n), those below n. The subtree of v covers [v, v + size(v))
// with size(v) = min(m, n - v), so every subtree is one contiguous run of relative ranks. A
// message crosses ceil(log2 n) levels. Broadcast sends each chunk down (largest subtree first);
// reduce receives partial results up (smallest subtree first) and sends the sum on; gather and
// scatter move the runs of blocks of whole subtrees, kept in relative order in scratch.
//
// Scatter + all-gather broadcast (van de Geijn): the root scatters the buffer in n blocks down
// the binomial tree, then a ring all-gather (in relative order) completes every copy: about
// twice the data of one copy per rank, for large messages on many ranks.
//
// Reduce-scatter + gather reduce (Rabenseifner): a ring reduce-scatter in relative order leaves
// block v+1 reduced on relative rank v; each rank sends that block to the root.
//
// Dissemination barrier: in round k every rank sends one byte to rank r + 2^k and waits for
// one from rank r - 2^k, and sends in round k only what it received in round k-1; after
// ceil(log2 n) rounds each rank has heard, directly or not, from all others.
//
// Double binary tree all-reduce (as NCCL): tree A is the heap order over ranks (parent of r is
// (r-1)/2, children 2r+1 and 2r+2), tree B the same over positions n-1-r, so a rank is interior
// in at most one of them. The first half of the buffer is reduced up tree A to rank 0 and sent
// back down it, the second half likewise on tree B (root n-1), chunk by chunk, so both trees and
// both directions of every link are busy at once; 2 log2 n hops of latency and about the
// bandwidth of a ring.
#include <algorithm>
#include <array>
#include <bit>
#include <vector>

#include "src/collectives/descriptor.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {
namespace {

constexpr size_t kSlots = 4;

struct Binomial {
  int n;
  int root;
  int real(int v) const { return mod(v + root, n); }
  int relative(int rank) const { return mod(rank - root, n); }
  static int lowestBit(int v) { return v & -v; }
  int parent(int v) const { return v - lowestBit(v); }
  int size(int v) const {
    if (v == 0) return n;
    return std::min(lowestBit(v), n - v);
  }
  // Children of v, largest subtree first.
  std::vector<int> children(int v) const {
    int m = 1;
    if (v == 0) {
      while (m < n) m *= 2;
    } else {
      m = lowestBit(v);
    }
    std::vector<int> kids;
    for (int step = m / 2; step >= 1; step /= 2) {
      if (v + step < n) kids.push_back(v + step);
    }
    return kids;
  }
};

size_t chunkOf(const ScheduleArgs& args) {
  return std::min(chunkElementsFor(args.chunkBytes, args.typeSize), args.count) * args.typeSize;
}

}  // namespace

Schedule binomialBroadcast(const ScheduleArgs& args) {
  Schedule s;
  const size_t total = args.count * args.typeSize;
  if (args.count == 0) return s;
  const Binomial tree{args.nranks, args.root};
  const int v = tree.relative(args.rank);
  if (v == 0) s.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), total));
  const std::vector<int> kids = tree.children(v);
  const size_t chunk = chunkOf(args);
  for (size_t offset = 0; offset < total && args.nranks > 1; offset += chunk) {
    const size_t bytes = std::min(chunk, total - offset);
    if (v != 0) s.steps.push_back(recvStep(tree.real(tree.parent(v)), at(BufferId::kOutput, offset), bytes));
    const Span from = at(v == 0 ? BufferId::kInput : BufferId::kOutput, offset);
    for (int kid : kids) s.steps.push_back(sendStep(tree.real(kid), from, bytes));
  }
  return s;
}

Schedule binomialReduce(const ScheduleArgs& args) {
  Schedule s;
  const size_t total = args.count * args.typeSize;
  if (args.count == 0) return s;
  const Binomial tree{args.nranks, args.root};
  const int v = tree.relative(args.rank);
  std::vector<int> kids = tree.children(v);
  std::reverse(kids.begin(), kids.end());  // smallest subtree first: it finishes first
  if (args.nranks == 1) {
    s.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), total));
    return s;
  }
  const size_t chunk = chunkOf(args);
  SlotRing tmp{0, chunk, kSlots};
  SlotRing partial{tmp.end(), chunk, kSlots};
  if (!kids.empty()) s.scratchBytes = partial.end();
  for (size_t offset = 0; offset < total; offset += chunk) {
    const size_t bytes = std::min(chunk, total - offset);
    const Span in = at(BufferId::kInput, offset);
    if (kids.empty()) {
      s.steps.push_back(sendStep(tree.real(tree.parent(v)), in, bytes));
      continue;
    }
    const Span acc = v == 0 ? at(BufferId::kOutput, offset) : partial.take();
    for (size_t k = 0; k < kids.size(); ++k) {
      s.steps.push_back(recvReduceStep(tree.real(kids[k]), k == 0 ? in : acc, acc, tmp.take(), bytes));
    }
    if (v != 0) {
      s.steps.push_back(sendStep(tree.real(tree.parent(v)), acc, bytes));
    } else if (args.divide) {
      s.steps.push_back(divideStep(acc, bytes));
    }
  }
  return s;
}

Schedule binomialGather(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const size_t blockBytes = args.count * args.typeSize;
  if (args.count == 0) return s;
  const Binomial tree{n, args.root};
  const int v = tree.relative(args.rank);
  // Scratch holds the blocks of v's subtree, relative ranks v, v+1, ... in order.
  auto run = [&](int u) { return at(BufferId::kScratch, static_cast<size_t>(u - v) * blockBytes); };
  s.scratchBytes = tree.size(v) * blockBytes;
  s.steps.push_back(copyStep(at(BufferId::kInput, 0), run(v), blockBytes));
  std::vector<int> kids = tree.children(v);
  std::reverse(kids.begin(), kids.end());
  for (int kid : kids) s.steps.push_back(recvStep(tree.real(kid), run(kid), tree.size(kid) * blockBytes));
  if (v != 0) {
    s.steps.push_back(sendStep(tree.real(tree.parent(v)), run(v), tree.size(v) * blockBytes));
  } else {
    // Relative rank u is real rank u + root: runs [0, n-root) and [n-root, n) swap places.
    const int root = args.root;
    s.steps.push_back(copyStep(run(0), at(BufferId::kOutput, root * blockBytes), (n - root) * blockBytes));
    if (root > 0) s.steps.push_back(copyStep(run(n - root), at(BufferId::kOutput, 0), root * blockBytes));
  }
  return s;
}

Schedule binomialScatter(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const size_t blockBytes = args.count * args.typeSize;
  if (args.count == 0) return s;
  const Binomial tree{n, args.root};
  const int v = tree.relative(args.rank);
  auto run = [&](int u) { return at(BufferId::kScratch, static_cast<size_t>(u - v) * blockBytes); };
  s.scratchBytes = tree.size(v) * blockBytes;
  if (v == 0) {
    const int root = args.root;
    s.steps.push_back(copyStep(at(BufferId::kInput, root * blockBytes), run(0), (n - root) * blockBytes));
    if (root > 0) s.steps.push_back(copyStep(at(BufferId::kInput, 0), run(n - root), root * blockBytes));
  } else {
    s.steps.push_back(recvStep(tree.real(tree.parent(v)), run(v), tree.size(v) * blockBytes));
  }
  for (int kid : tree.children(v)) s.steps.push_back(sendStep(tree.real(kid), run(kid), tree.size(kid) * blockBytes));
  s.steps.push_back(copyStep(run(v), at(BufferId::kOutput, 0), blockBytes));
  return s;
}

Schedule scatterAllGatherBroadcast(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const size_t size = args.typeSize;
  if (args.count == 0) return s;
  const Binomial tree{n, args.root};
  const int v = tree.relative(args.rank);
  const Blocks blocks{args.count, static_cast<size_t>(n)};
  auto offset = [&](int u) { return blocks.start(u) * size; };  // u in [0, n]
  auto span = [&](int u) { return at(BufferId::kOutput, offset(u)); };
  auto length = [&](int lo, int hi) { return offset(hi) - offset(lo); };
  if (v == 0) s.steps.push_back(copyStep(at(BufferId::kInput, 0), span(0), args.count * size));
  if (n == 1) return s;
  if (v != 0 && length(v, v + tree.size(v)) > 0) {
    s.steps.push_back(recvStep(tree.real(tree.parent(v)), span(v), length(v, v + tree.size(v))));
  }
  for (int kid : tree.children(v)) {
    if (length(kid, kid + tree.size(kid)) > 0)
      s.steps.push_back(sendStep(tree.real(kid), span(kid), length(kid, kid + tree.size(kid))));
  }
  const int next = tree.real(v + 1);
  const int prev = tree.real(v - 1);
  for (int step = 0; step < n - 1; ++step) {
    const int sendBlock = mod(v - step, n);
    const int recvBlock = mod(v - step - 1, n);
    if (length(sendBlock, sendBlock + 1) > 0)
      s.steps.push_back(sendStep(next, span(sendBlock), length(sendBlock, sendBlock + 1)));
    if (length(recvBlock, recvBlock + 1) > 0)
      s.steps.push_back(recvStep(prev, span(recvBlock), length(recvBlock, recvBlock + 1)));
  }
  return s;
}

Schedule reduceScatterGatherReduce(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const size_t size = args.typeSize;
  const size_t total = args.count * size;
  if (args.count == 0) return s;
  const Binomial order{n, args.root};
  const int v = order.relative(args.rank);
  const Blocks blocks{args.count, static_cast<size_t>(n)};
  auto offset = [&](int u) { return blocks.start(u) * size; };
  auto length = [&](int u) { return blocks.size(u) * size; };
  // The root works in its output; the others in scratch after the receive slots.
  const size_t slotBytes = blocks.size(0) * size;
  SlotRing tmp{0, slotBytes, 2};
  const BufferId workBuffer = v == 0 ? BufferId::kOutput : BufferId::kScratch;
  const size_t workBase = v == 0 ? 0 : tmp.end();
  auto work = [&](int u) { return at(workBuffer, workBase + offset(u)); };
  s.scratchBytes = tmp.end() + (v == 0 ? 0 : total);
  s.steps.push_back(copyStep(at(BufferId::kInput, 0), work(0), total));
  if (n == 1) return s;
  const int next = order.real(v + 1);
  const int prev = order.real(v - 1);
  for (int step = 0; step < n - 1; ++step) {
    const int sendBlock = mod(v - step, n);
    const int recvBlock = mod(v - step - 1, n);
    if (length(sendBlock) > 0) s.steps.push_back(sendStep(next, work(sendBlock), length(sendBlock)));
    if (length(recvBlock) > 0) {
      s.steps.push_back(recvReduceStep(prev, work(recvBlock), work(recvBlock), tmp.take(), length(recvBlock)));
    }
  }
  const int owned = mod(v + 1, n);
  if (args.divide && length(owned) > 0) s.steps.push_back(divideStep(work(owned), length(owned)));
  if (v == 0) {
    for (int u = 1; u < n; ++u) {
      const int block = mod(u + 1, n);
      if (length(block) > 0) s.steps.push_back(recvStep(order.real(u), work(block), length(block)));
    }
  } else if (length(owned) > 0) {
    s.steps.push_back(sendStep(args.root, work(owned), length(owned)));
  }
  return s;
}

Schedule disseminationBarrier(const ScheduleArgs& args) {
  Schedule s;
  // Round k sends the byte received in round k-1 (byte k of scratch; byte 0 for round 0), so
  // the executor cannot post it before that receive completes: that wait is the barrier.
  size_t round = 0;
  for (const DisseminationRound& exchange : disseminationRounds(args.nranks, args.rank)) {
    s.steps.push_back(sendStep(exchange.to, at(BufferId::kScratch, round), 1));
    s.steps.push_back(recvStep(exchange.from, at(BufferId::kScratch, round + 1), 1));
    ++round;
  }
  s.scratchBytes = 1 + round;
  return s;
}

Schedule doubleTreeAllReduce(const ScheduleArgs& args) {
  Schedule s;
  const int n = args.nranks;
  const int r = args.rank;
  const size_t size = args.typeSize;
  if (args.count == 0) return s;
  if (n == 1) {
    s.steps.push_back(copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), args.count * size));
    return s;
  }
  struct Tree {
    int parent = -1;
    std::vector<int> kids;
    size_t first = 0;  // elements of the buffer this tree carries
    size_t count = 0;
    int depth = 0;  // of this rank
  };
  Tree trees[2];
  for (int t = 0; t < 2; ++t) {
    const int position = t == 0 ? r : n - 1 - r;
    auto rankAt = [&](int q) { return t == 0 ? q : n - 1 - q; };
    if (position > 0) trees[t].parent = rankAt((position - 1) / 2);
    for (int q : {2 * position + 1, 2 * position + 2}) {
      if (q < n) trees[t].kids.push_back(rankAt(q));
    }
    trees[t].depth = std::bit_width(static_cast<unsigned>(position + 1)) - 1;
  }
  const int height = std::bit_width(static_cast<unsigned>(n)) - 1;  // of both trees' deepest rank
  trees[0].count = args.count / 2;
  trees[1].first = trees[0].count;
  trees[1].count = args.count - trees[0].count;
  const size_t chunkElements = std::min(chunkElementsFor(args.chunkBytes, size), trees[1].count);
  const size_t pieces = piecesOf(trees[1].count, chunkElements);  // the second half is the longer
  SlotRing tmp{0, chunkElements * size, kSlots};
  s.scratchBytes = tmp.end();
  auto piece = [&](const Tree& tree, size_t c, size_t* offset) {
    const size_t first = c * chunkElements;
    if (first >= tree.count) return size_t{0};
    *offset = (tree.first + first) * size;
    return (std::min(tree.count, first + chunkElements) - first) * size;
  };
  // Each step is keyed by when its message should move, in chunk times: chunk c leaves a rank at
  // depth d on its way up at c + height - d and on its way down at c + height + d. Sender and
  // receiver key a message alike, so sorting every rank's steps by (time, tree, direction, chunk)
  // keeps each pair's messages in one order on both sides (a consistent global order: nothing can
  // deadlock), and the steps a rank posts in order come in the order they become ready: a chunk
  // goes down while later ones still come up, and neither tree waits for the other's chunks.
  struct Keyed {
    std::array<int64_t, 4> key;  // time, tree, direction (0 up, 1 down), chunk
    Step step;
  };
  std::vector<Keyed> keyed;
  for (size_t c = 0; c < pieces; ++c) {
    for (int t = 0; t < 2; ++t) {
      const Tree& tree = trees[t];
      size_t offset = 0;
      const size_t bytes = piece(tree, c, &offset);
      if (bytes == 0) continue;
      const int64_t chunk = static_cast<int64_t>(c);
      const int64_t up = chunk + height - tree.depth;  // when this rank's result of chunk c leaves
      const int64_t down = chunk + height + tree.depth;
      const Span in = at(BufferId::kInput, offset);
      const Span out = at(BufferId::kOutput, offset);
      for (size_t k = 0; k < tree.kids.size(); ++k) {
        keyed.push_back(
            {{up - 1, t, 0, chunk}, recvReduceStep(tree.kids[k], k == 0 ? in : out, out, tmp.take(), bytes)});
      }
      const Span result = tree.kids.empty() ? in : out;
      if (tree.parent >= 0) {
        keyed.push_back({{up, t, 0, chunk}, sendStep(tree.parent, result, bytes)});
        keyed.push_back({{down - 1, t, 1, chunk}, recvStep(tree.parent, out, bytes)});
      } else if (args.divide) {
        keyed.push_back({{up, t, 0, chunk}, divideStep(out, bytes)});
      }
      for (int kid : tree.kids) keyed.push_back({{down, t, 1, chunk}, sendStep(kid, out, bytes)});
    }
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) { return a.key < b.key; });
  for (Keyed& k : keyed) s.steps.push_back(k.step);
  return s;
}

// Descriptors (descriptor.h: the notation).
// Each half of the buffer goes up and down one of the two trees; a rank is interior in one (two
// children's chunks in and one out going up, one in and two out coming down) and a leaf in the
// other (one out, one in): five transfers and two reductions per byte of a half, which a stream of
// chunks costs (k pieces of p bytes). Before the stream flows, the first chunk climbs and descends
// the trees' D = floor(log2 n) levels, each taking in two children's pieces and reducing them, or
// sending two: D (4 p b + p g). The two overlap only in part (the stream's first chunks climb while
// the first descends); their root sum of squares follows the timing simulator within 10% from 64
// to 16384 ranks and 8 B to 1 GiB (tests/unit/simulator_test.cc), where the larger alone was 40%
// short at 1024 ranks and 1-64 MiB.
double binomialRunsCost(const Cost& c) { return c.L * c.a + (c.n - 1) / c.n * c.m * c.b + (1 + 1 / c.n) * c.m * c.cp; }

std::span<const AlgorithmDescriptor> treeAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllReduce, Algorithm::kTree, doubleTreeAllReduce,
       [](const Cost& c) {
         const double k = std::ceil(c.m / 2 / c.chunk);
         const double piece = c.m / 2 / k;
         const double depth = std::floor(std::log2(c.n));
         // Per chunk a rank handles up to eight messages of the two trees, six beyond the two on
         // its critical path: the overhead of each. On two levels nearly every edge of heap-order
         // trees over consecutive ranks joins two hosts, and a host's l ranks are all on the trees
         // at once: each hop's bytes share the host's link with the l - 1 others'.
         const double b = c.twoLevels ? c.l * c.b : c.b;
         return (2 * depth + k) * c.a + 6 * k * c.o +
                std::hypot(depth * piece * (4 * b + c.g), c.m / 2 * (5 * b + 2 * c.g));
       },
       Follows::kPositions},
      {Collective::kBroadcast, Algorithm::kBinomial, binomialBroadcast,
       [](const Cost& c) { return c.L * (std::ceil(c.m / c.chunk) * c.a + c.m * c.b) + c.m * c.cp; },
       Follows::kPositions},
      {Collective::kBroadcast, Algorithm::kScatterAllGather, scatterAllGatherBroadcast,
       [](const Cost& c) { return (c.L + c.n - 1) * c.a + 2 * (c.n - 1) / c.n * c.m * c.b + c.m * c.cp; },
       Follows::kPositions},
      {Collective::kReduce, Algorithm::kBinomial, binomialReduce,
       [](const Cost& c) { return c.L * (std::ceil(c.m / c.chunk) * c.a + c.m * (c.b + c.g)); }, Follows::kPositions},
      {Collective::kReduce, Algorithm::kReduceScatterGather, reduceScatterGatherReduce,
       // n-1 ring steps, then every rank's block to the root at once: one latency, the root taking in
       // n-1 messages (the overhead of each beyond the first).
       [](const Cost& c) { return c.n * c.a + (c.n - 2) * c.o + (c.n - 1) / c.n * c.m * (2 * c.b + c.g) + c.m * c.cp; },
       Follows::kPositions},
      // The root takes in (or sends out) n-1 blocks through its port, a subtree's run per child;
      // the own block copied in and the whole buffer out (scatter: the other way).
      {Collective::kGather, Algorithm::kBinomial, binomialGather, binomialRunsCost, Follows::kNumbers},
      {Collective::kScatter, Algorithm::kBinomial, binomialScatter, binomialRunsCost, Follows::kNumbers},
      {Collective::kBarrier, Algorithm::kDissemination, disseminationBarrier, onlyAlgorithmCost, Follows::kPositions},
  };
  return kAll;
}

}  // namespace chorus::collectives
