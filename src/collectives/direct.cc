// direct.cc: all-reduce and reduce-scatter among ranks that can map one another's buffers (every
// rank on one host, on shm, each buffer a chorusMemAlloc allocation): one step reads every rank's
// input where it lies, then the ranks meet at a barrier.
//
// All-reduce: rank r takes its 1/n of the elements (cut at 64-byte lines, so no two ranks write
// one line) and folds that slice over every rank's input into every rank's output, in one pass.
// Reduce-scatter: rank r folds its own block over every rank's input into its output. Then a
// dissemination barrier, whose first send reads the byte the reduction marks, so it waits for
// it: once a rank is past the barrier every output is complete and no peer reads its input.
//
// Each input byte is read once and each output byte written once, by one rank: the copy bound,
// where the ring reads and writes each byte twice. What it needs before it runs (the ranks'
// buffers mapped, and every rank in the call, so inputs are final and outputs free) the
// communicator provides by swapping where the buffers lie (src/core/direct.cc); where one cannot
// be mapped, the call takes the algorithm the tuner would pick without this one.
#include <algorithm>

#include "src/collectives/descriptor.h"

namespace chorus::collectives {

Schedule directAllReduce(const ScheduleArgs& args) {
  Schedule s = disseminationBarrier(args);
  const size_t size = args.typeSize;
  const Slice mine = alignedSlice(args.count, args.nranks, args.rank, size, 64);
  const Step reduce = reducePeersStep(at(BufferId::kInput, mine.begin * size), at(BufferId::kOutput, mine.begin * size),
                                      at(BufferId::kScratch, 0), (mine.end - mine.begin) * size, /*everyOutput=*/true);
  s.steps.insert(s.steps.begin(), reduce);
  s.scratchBytes = std::max<size_t>(s.scratchBytes, 1);
  return s;
}

Schedule directReduceScatter(const ScheduleArgs& args) {
  Schedule s = disseminationBarrier(args);
  const size_t bytes = args.count * args.typeSize;
  const Step reduce = reducePeersStep(at(BufferId::kInput, static_cast<size_t>(args.rank) * bytes),
                                      at(BufferId::kOutput, 0), at(BufferId::kScratch, 0), bytes,
                                      /*everyOutput=*/false);
  s.steps.insert(s.steps.begin(), reduce);
  s.scratchBytes = std::max<size_t>(s.scratchBytes, 1);
  return s;
}

// Two meetings (the swap, an all-gather of 64 bytes, and the barrier of 1-byte messages: L rounds
// each, priced at o a round: messages that small cost a rank its overhead, not a transfer; on 2
// shm ranks a direct reduce-scatter of 64 KiB took 1.8-3.0 us where the ring's one 32 KiB message
// took 9.0-13.1), then one pass that reads m bytes and writes m (all-reduce: 1/n of the inputs'
// n * m, into n outputs; reduce-scatter, m the whole input: its block of each input, into its
// output of m / n), folding (n - 1) / n of what it reads. Only where the communicator can map its
// peers' buffers (CostParams::directMinBytes) and the call is that large.
std::span<const AlgorithmDescriptor> directAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kAllReduce, Algorithm::kDirect, directAllReduce,
       [](const Cost& c) {
         if (c.directFrom <= 0 || c.m < c.directFrom) return kCannot;
         return 2 * c.L * c.o + c.m * c.cp + (c.n - 1) / c.n * c.m * c.g;
       },
       Follows::kNumbers},
      {Collective::kReduceScatter, Algorithm::kDirect, directReduceScatter,
       [](const Cost& c) {
         if (c.directFrom <= 0 || c.m < c.directFrom) return kCannot;
         return 2 * c.L * c.o + (c.n + 1) / (2 * c.n) * c.m * c.cp + (c.n - 1) / c.n * c.m * c.g;
       },
       Follows::kNumbers},
  };
  return kAll;
}

}  // namespace chorus::collectives
