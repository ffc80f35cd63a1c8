// schedule.h: collectives as schedules. A schedule is one rank's list of steps (send, recv,
// recv-reduce, copy, divide, reduce, reduce-peers, agree, fold) over byte ranges of its input, output and
// scratch buffers, made by a
// pure function of (collective, nranks, rank, count, type size, root/peer, chunking, rank order). No I/O and
// no threads here: src/core/executor runs schedules over the transports.
//
// Order and dependencies: steps are listed in the order a rank posts them. A step depends on the
// earlier steps whose byte ranges it conflicts with (it reads what they write, or writes what they
// read or write): stepAccesses() gives those ranges, and every runner of schedules (the executor,
// the simulator) waits for exactly those conflicts (the issue rule, mustWait below). Messages between a pair of ranks
// match in posting order, so each schedule posts, for every pair, its sends in the order the peer's schedule posts the
// matching receives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace chorus::collectives {

enum class Collective : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kSend,
  kRecv,
  kBarrier,
  kAllToAll,
  kAllToAllv,
  kGather,
  kScatter,
};
const char* collectiveName(Collective collective);

enum class BufferId : uint8_t { kInput = 0, kOutput = 1, kScratch = 2 };
inline constexpr int kBufferCount = 3;

// A byte offset into one of the buffers.
struct Span {
  BufferId buffer = BufferId::kInput;
  size_t offset = 0;
};

enum class StepKind : uint8_t {
  kSend,        // send `bytes` at src to peer
  kRecv,        // receive `bytes` from peer into dst
  kRecvReduce,  // receive `bytes` from peer into tmp, then dst = src (op) tmp
  kCopy,        // dst = src
  kDivide,      // dst = dst / nranks (the last step of Avg)
  kReduce,      // dst = src (op) tmp, local: after a kRecv into tmp, when dst is still being sent
  // dst = the fold (op; Avg: then divided by nranks) over every rank's input at src, read where
  // the peers' inputs lie (whoever runs the schedule maps them), into this rank's output at dst,
  // or with peer == kEveryRank into every rank's output at dst; then tmp (one scratch byte) is
  // written, so the steps that read it (a barrier's first send) follow. The ranks must have met
  // before (every input final, every output free): the swap that mapped the buffers is that meeting.
  kReducePeers,
  // dst = the agreement of two call records, this rank's so far at src and a peer's at tmp (each
  // `bytes`, opaque here: whoever runs the schedule writes and merges them); with peer ==
  // kEveryRank the records then cover every rank, and ranks whose calls differ fail the call.
  kAgree,
  // dst = the fold in rank order (op; Avg: then divided by the count) over `parts` contributions of
  // `bytes` each: rank p's at src + p * bytes, except this rank's own, read at tmp (its slot at src
  // is not read). The ordered reductions' (ordered.cc) only arithmetic.
  kFold,
};
inline constexpr int kEveryRank = -2;
const char* stepKindName(StepKind kind);

struct Step {
  StepKind kind = StepKind::kCopy;
  int peer = -1;
  Span src;
  Span dst;
  Span tmp;
  size_t bytes = 0;
  int parts = 0;  // kFold: the contributions folded (the rank count)
};

struct Schedule {
  std::vector<Step> steps;
  size_t scratchBytes = 0;  // bytes of scratch the steps use
  const char* algorithm = "";
  // The ranks' agreement on the call (ScheduleArgs::recordBytes): the first agreementSteps steps,
  // which start from this rank's call record at scratch offset recordOffset; 0 when there is none.
  size_t agreementSteps = 0;
  size_t recordOffset = 0;
};

// The algorithms; which apply to which collective is in algorithm.cc.
enum class Algorithm : uint8_t {
  kDefault,  // let the library choose
  kRing,
  kChain,
  kTree,                 // double binary tree (all-reduce)
  kRecursiveDoubling,    // all-reduce, all-gather
  kRabenseifner,         // all-reduce: recursive-halving reduce-scatter + recursive-doubling all-gather
  kBruck,                // all-gather, all-to-all
  kRecursiveHalving,     // reduce-scatter
  kPairwise,             // all-to-all(v)
  kBinomial,             // broadcast, reduce, gather, scatter
  kScatterAllGather,     // broadcast
  kReduceScatterGather,  // reduce
  kDissemination,        // barrier
  kHierarchical,         // across hosts: within hosts, along rails across them (all-reduce, all-gather,
                         // reduce-scatter, broadcast, reduce)
  kDirect,               // all-reduce, reduce-scatter: read every rank's buffers where they lie (one host);
                         // on device buffers, every collective of fixed blocks, ranks sharing one GPU
  kIpc,                  // device buffers only: the ring kernel over inboxes mapped with CUDA IPC (one host)
  kStaged,               // device buffers only: through pinned host memory to the host engine
  kCount
};

struct ScheduleArgs {
  Collective collective = Collective::kAllReduce;
  int nranks = 1;
  int rank = 0;
  // Elements: all-reduce, broadcast, reduce, send, recv: the buffer; all-gather: each rank's
  // input; reduce-scatter: each rank's output.
  size_t count = 0;
  size_t typeSize = 1;
  int root = 0;         // broadcast and reduce: the root; send and recv: the peer
  bool divide = false;  // Avg: add divide steps on the final results
  size_t chunkBytes = 512 * 1024;
  Algorithm algorithm = Algorithm::kDefault;
  // All-to-allv only: per-peer element counts and displacements (nranks entries each).
  const size_t* sendCounts = nullptr;
  const size_t* sendDispls = nullptr;
  const size_t* recvCounts = nullptr;
  const size_t* recvDispls = nullptr;
  // Rank order: position -> rank (nranks entries, a permutation), the order in which rings,
  // chains and trees visit the ranks, so they can be laid along the fastest links; null is 0, 1,
  // ..., n-1. Algorithms on the whole buffer (all-reduce, broadcast, reduce, barrier) are built
  // over positions and their peers mapped to ranks; the ring all-gather and reduce-scatter follow
  // it too, keeping each rank's block at its rank's offset; the others pair ranks by number.
  const int* order = nullptr;
  // Host of each rank (nranks entries, hosts numbered 0, 1, ... by their lowest rank); null: one
  // host. Hierarchical algorithms split their work by it.
  const int* hosts = nullptr;
  // Bytes of a call record; not 0: the schedule first has the ranks agree on the call (agreement()).
  size_t recordBytes = 0;
  // CHORUS_DETERMINISTIC: all-reduce, reduce-scatter and reduce fold every element in rank order
  // whatever the algorithm (ordered.cc; the direct algorithm already does).
  bool deterministic = false;
};

// The rank at a position (mod nranks) of args.order, and a rank's position in it.
inline int rankAt(const ScheduleArgs& args, int position) {
  position = ((position % args.nranks) + args.nranks) % args.nranks;
  return args.order != nullptr ? args.order[position] : position;
}
int positionOf(const ScheduleArgs& args, int rank);

// Step builders, so algorithms read as the prose that opens their files.
inline Step sendStep(int peer, Span src, size_t bytes) { return {StepKind::kSend, peer, src, {}, {}, bytes}; }
inline Step recvStep(int peer, Span dst, size_t bytes) { return {StepKind::kRecv, peer, {}, dst, {}, bytes}; }
inline Step recvReduceStep(int peer, Span src, Span dst, Span tmp, size_t bytes) {
  return {StepKind::kRecvReduce, peer, src, dst, tmp, bytes};
}
inline Step copyStep(Span src, Span dst, size_t bytes) { return {StepKind::kCopy, -1, src, dst, {}, bytes}; }
inline Step divideStep(Span dst, size_t bytes) { return {StepKind::kDivide, -1, {}, dst, {}, bytes}; }
inline Step reduceStep(Span src, Span tmp, Span dst, size_t bytes) {
  return {StepKind::kReduce, -1, src, dst, tmp, bytes};
}
inline Step reducePeersStep(Span src, Span dst, Span mark, size_t bytes, bool everyOutput) {
  return {StepKind::kReducePeers, everyOutput ? kEveryRank : -1, src, dst, mark, bytes};
}
inline Step agreeStep(Span mine, Span theirs, Span merged, size_t bytes, bool last) {
  return {StepKind::kAgree, last ? kEveryRank : -1, mine, merged, theirs, bytes};
}
inline Step foldStep(Span slots, Span own, Span dst, size_t bytes, int parts) {
  return {StepKind::kFold, -1, slots, dst, own, bytes, parts};
}
inline Span at(BufferId buffer, size_t offset) { return {buffer, offset}; }

// A reduce-peers step's operands, given where each rank's input and output begin in this address
// space (inputOf(p), outputOf(p)): every rank's input at src; this rank's output at dst, or with
// peer == kEveryRank every rank's. What the executor and the simulator hand the reduction.
template <typename InputOf, typename OutputOf>
void reducePeersOperands(const Step& step, int nranks, int rank, InputOf inputOf, OutputOf outputOf,
                         std::vector<const void*>* from, std::vector<void*>* to) {
  from->resize(static_cast<size_t>(nranks));
  for (int p = 0; p < nranks; ++p) (*from)[p] = inputOf(p) + step.src.offset;
  to->clear();
  for (int p = 0; p < nranks; ++p) {
    if (step.peer == kEveryRank || p == rank) to->push_back(outputOf(p) + step.dst.offset);
  }
}

// Rank r's share [begin, end) of count elements cut into nranks equal slices of whole
// `alignBytes` (each starts on an alignBytes boundary of the buffer; the last may be short or
// empty): the direct all-reduces' split, on the host (cache lines, so no two ranks write one) and
// on the device (16-byte vectors).
struct Slice {
  size_t begin;
  size_t end;
};
inline Slice alignedSlice(size_t count, int nranks, int rank, size_t typeSize, size_t alignBytes) {
  const size_t n = static_cast<size_t>(nranks);
  const size_t perAlign = std::max<size_t>(1, alignBytes / typeSize);
  const size_t slice = ((count + n - 1) / n + perAlign - 1) / perAlign * perAlign;
  const size_t begin = std::min(count, slice * static_cast<size_t>(rank));
  return {begin, std::min(count, begin + slice)};
}
// Rotating chunk-sized slots in scratch, starting at `base`.
struct SlotRing {
  size_t base;
  size_t slotBytes;
  size_t slots;
  size_t next = 0;
  Span take() {
    const Span span{BufferId::kScratch, base + (next % slots) * slotBytes};
    ++next;
    return span;
  }
  size_t end() const { return base + slots * slotBytes; }
};

// a mod n in [0, n), for ring and chain positions.
inline int mod(int a, int n) { return ((a % n) + n) % n; }

// A dissemination exchange's rounds (the barrier's, the ranks' agreement on a call): in round k,
// rank sends to rank + 2^k and receives from rank - 2^k, for ceil(log2 n) rounds. Distances stay
// below n, so each ordered pair meets in one round at most.
struct DisseminationRound {
  int to;
  int from;
};
inline std::vector<DisseminationRound> disseminationRounds(int nranks, int rank) {
  std::vector<DisseminationRound> rounds;
  for (int distance = 1; distance < nranks; distance *= 2) {
    rounds.push_back({mod(rank + distance, nranks), mod(rank - distance, nranks)});
  }
  return rounds;
}

// Byte ranges a step touches, for dependency analysis: up to two read and two written ranges.
struct Access {
  Span span;
  size_t bytes = 0;
  bool write = false;
};
int stepAccesses(const Step& step, Access out[4]);

// The issue rule, one for every runner of schedules (the executor, both simulator modes): a rank
// issues its steps in order, and the next waits while a step in flight conflicts with it, that
// is, some range of one overlaps a range of the other and one of the two writes it. A runner
// places each step's ranges (PlacedStep) in its own addresses: pointers into real buffers, or
// integers of a virtual address space.
template <typename Address>
struct PlacedStep {
  struct Range {
    Address begin;
    Address end;
    bool write;
  };
  Range ranges[4];
  int count = 0;

  bool conflictsWith(const PlacedStep& other) const {
    for (int i = 0; i < count; ++i) {
      for (int j = 0; j < other.count; ++j) {
        const Range& a = ranges[i];
        const Range& b = other.ranges[j];
        if ((a.write || b.write) && a.begin < b.end && b.begin < a.end) return true;
      }
    }
    return false;
  }
};

// step's ranges with each buffer starting at base(BufferId).
template <typename Address, typename Base>
PlacedStep<Address> placeStep(const Step& step, Base base) {
  Access accesses[4];
  PlacedStep<Address> placed;
  placed.count = stepAccesses(step, accesses);
  for (int i = 0; i < placed.count; ++i) {
    const Address begin = base(accesses[i].span.buffer) + accesses[i].span.offset;
    placed.ranges[i] = {begin, begin + accesses[i].bytes, accesses[i].write};
  }
  return placed;
}

// Whether `next` must wait: some entry of inFlight, placed by placedOf (null for an entry that has
// finished), conflicts with it.
template <typename Address, typename InFlight, typename PlacedOf>
bool mustWait(const PlacedStep<Address>& next, const InFlight& inFlight, PlacedOf placedOf) {
  for (const auto& entry : inFlight) {
    const PlacedStep<Address>* earlier = placedOf(entry);
    if (earlier != nullptr && earlier->conflictsWith(next)) return true;
  }
  return false;
}

// The algorithms. Each file opens with its prose.
Schedule ringAllReduce(const ScheduleArgs& args);
Schedule ringAllGather(const ScheduleArgs& args);
Schedule ringReduceScatter(const ScheduleArgs& args);
Schedule chainBroadcast(const ScheduleArgs& args);
Schedule chainReduce(const ScheduleArgs& args);
Schedule pointToPoint(const ScheduleArgs& args);
Schedule recursiveDoublingAllReduce(const ScheduleArgs& args);
Schedule rabenseifnerAllReduce(const ScheduleArgs& args);
Schedule recursiveDoublingAllGather(const ScheduleArgs& args);
Schedule recursiveHalvingReduceScatter(const ScheduleArgs& args);
Schedule bruckAllGather(const ScheduleArgs& args);
Schedule bruckAllToAll(const ScheduleArgs& args);
Schedule pairwiseAllToAll(const ScheduleArgs& args);
Schedule pairwiseAllToAllv(const ScheduleArgs& args);
Schedule binomialBroadcast(const ScheduleArgs& args);
Schedule binomialReduce(const ScheduleArgs& args);
Schedule binomialGather(const ScheduleArgs& args);
Schedule binomialScatter(const ScheduleArgs& args);
Schedule scatterAllGatherBroadcast(const ScheduleArgs& args);
Schedule reduceScatterGatherReduce(const ScheduleArgs& args);
Schedule disseminationBarrier(const ScheduleArgs& args);
Schedule doubleTreeAllReduce(const ScheduleArgs& args);
Schedule hierarchicalAllReduce(const ScheduleArgs& args);
Schedule directAllReduce(const ScheduleArgs& args);
Schedule directReduceScatter(const ScheduleArgs& args);
Schedule hierarchicalAllGather(const ScheduleArgs& args);
Schedule hierarchicalReduceScatter(const ScheduleArgs& args);
Schedule hierarchicalBroadcast(const ScheduleArgs& args);
Schedule hierarchicalReduce(const ScheduleArgs& args);
// All-reduce, reduce-scatter or reduce folding every element in rank order (CHORUS_DETERMINISTIC).
Schedule orderedReduction(const ScheduleArgs& args);

// The ring all-reduce of ring.cc over `ring` (ring position -> rank; this rank at position r).
// `owned`, when set, appends steps for each chunk this rank owns after the reduce-scatter phase
// (offset and bytes in the output; the chunk's index), before the divide and the all-gather phase:
// the hierarchical all-reduce's step across hosts. Returns the scratch it used; steps go to
// schedule.
using OwnedChunkSteps = std::function<void(Schedule& schedule, size_t offset, size_t bytes, size_t chunk)>;
void appendRingAllReduce(Schedule& schedule, const ScheduleArgs& args, const std::vector<int>& ring, int r,
                         const OwnedChunkSteps& owned);

// The ranks' agreement on a call, put before `schedule`'s steps: in ceil(log2 n) rounds of a
// dissemination exchange (round k: send what this rank knows to rank + 2^k, receive from rank -
// 2^k, merge) every rank learns of every rank's call record of recordBytes, placed in scratch
// after the schedule's own; the last merge decides. Its messages come before the call's own
// between every pair, so ranks that disagree on the call still agree on these.
void prependAgreement(Schedule& schedule, int nranks, int rank, size_t recordBytes);

// The schedule for args: args.algorithm, or the default for the collective when kDefault (with
// args.deterministic, an all-reduce, reduce-scatter or reduce not direct is the ordered
// reduction), after the ranks' agreement on the call where args.recordBytes is set.
// Throws std::invalid_argument when the algorithm does not apply to the collective.
Schedule buildSchedule(const ScheduleArgs& args);

// Blocks: count elements split into `parts` contiguous blocks whose sizes differ by at most one
// (the first count % parts blocks are one longer).
struct Blocks {
  size_t count;
  size_t parts;
  size_t start(size_t block) const { return block * (count / parts) + std::min(block, count % parts); }
  size_t size(size_t block) const { return count / parts + (block < count % parts ? 1 : 0); }
};

// Chunking of a block of `elements` into pieces of at most chunkElements: piece c covers
// [c*chunkElements, min((c+1)*chunkElements, elements)), empty when c*chunkElements >= elements.
inline size_t chunkElementsFor(size_t chunkBytes, size_t typeSize) {
  const size_t elements = chunkBytes / typeSize;
  return elements == 0 ? 1 : elements;
}
inline size_t piecesOf(size_t elements, size_t chunkElements) { return (elements + chunkElements - 1) / chunkElements; }

}  // namespace chorus::collectives
