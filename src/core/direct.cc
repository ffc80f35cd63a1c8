// direct.cc: the direct all-reduce and reduce-scatter among ranks of one host whose buffers are
// chorusMemAlloc allocations (Communicator::reduceDirect).
//
// The ranks first swap where their input and output lie (a 64-byte all-gather of descriptors:
// memfd number, serial, size, offset). If every rank's buffers are shareable and every peer can
// map them, each rank maps the peers' inputs (all-reduce: their outputs too; once per
// allocation: the shm transport keeps the mappings) and reduces its part over every rank's input
// in one pass (kernels::reduceMany), streamed past the cache for large calls: an all-reduce rank
// takes its 1/n of the elements, cut at cache lines, and stores each result into every rank's
// output; a reduce-scatter rank takes its own block and stores it into its output. A barrier then
// tells every rank that its output is complete and its input no longer read.
//
// Each input byte is read once and each output byte written once, by one rank, in one pass: the
// copy bound, where the ring through the FIFOs reads and writes each byte twice (with mapped
// messages, reads the reduced parts back once more). It costs two exchanges of small messages,
// so it starts at CHORUS_SHM_DIRECT_BYTES of input; where a swap finds a heap buffer, the next 63
// eligible calls skip it, so heap buffers pay one swap per 64 calls.
#include <algorithm>
#include <memory>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/reduce.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/base/memory.h"
#include "src/core/communicator.h"

namespace chorus {
namespace {

// Where one rank's input and output lie; all zero where they are not shareable.
struct DirectBuffers {
  uint32_t shareable = 0;  // both lie in chorusMemAlloc allocations and every peer can map them
  int32_t inFd = -1;
  int32_t outFd = -1;
  uint32_t unused = 0;
  uint64_t inSerial = 0, inBytes = 0, inOffset = 0;
  uint64_t outSerial = 0, outBytes = 0, outOffset = 0;
};
static_assert(sizeof(DirectBuffers) == 64);

// Eligible calls that skip the swap after one that found a heap buffer.
constexpr int kDirectBackoff = 63;

}  // namespace

bool Communicator::reduceDirect(collectives::Collective collective, const void* input, void* output, size_t count,
                                chorusDataType_t type, chorusRedOp_t op) {
  const bool allReduce = collective == collectives::Collective::kAllReduce;
  if (!allReduce && collective != collectives::Collective::kReduceScatter) return false;
  const char* name = allReduce ? "all-reduce" : "reduce-scatter";
  const size_t size = kernels::typeSize(type);
  const size_t outBytes = count * size;
  const size_t inBytes = allReduce ? outBytes : outBytes * static_cast<size_t>(nranks_);
  if (directBytes_ == 0 || inBytes < directBytes_) return false;
  // After a swap found a heap buffer, the next kDirectBackoff such calls skip the swap (with 4
  // ranks on 2 cores a 64-byte all-gather took 62-89 us in the host tables, a 64 KiB all-reduce
  // 90 us, so heap buffers pay about 1% more): every rank saw the same descriptors, so all skip
  // alike.
  if (directSkips_ > 0) {
    --directSkips_;
    return false;
  }

  DirectBuffers mine;
  SharedRange in, out;
  bool shareable = findShared(input, inBytes, &in) && findShared(output, outBytes, &out);
  for (int peer = 0; peer < nranks_; ++peer) {
    shareable = shareable && (peer == rank_ || transportOfPeer_[peer]->peerMapsMemory(peer));
  }
  if (shareable) {
    mine = {1, in.fd, out.fd, 0, in.serial, in.bytes, in.offset, out.serial, out.bytes, out.offset};
  }
  std::vector<DirectBuffers> all(nranks_);
  std::vector<PreparedOp> swap;
  swap.push_back(
      prepare(collectives::Collective::kAllGather, &mine, all.data(), sizeof(mine), chorusUint8, chorusSum, 0));
  run(std::move(swap));
  for (const DirectBuffers& theirs : all) {
    if (!theirs.shareable) {  // every rank sees the same descriptors and decides alike
      directSkips_ = kDirectBackoff;
      return false;
    }
  }

  try {
    // Every rank's input (all-reduce: and output), mapped here.
    std::vector<const char*> inputs(nranks_);
    std::vector<char*> outputs(allReduce ? nranks_ : 1, static_cast<char*>(output));
    for (int peer = 0; peer < nranks_; ++peer) {
      const DirectBuffers& d = all[peer];
      if (d.inOffset > d.inBytes || inBytes > d.inBytes - d.inOffset || d.outOffset > d.outBytes ||
          outBytes > d.outBytes - d.outOffset) {
        fail(chorusRemoteError,
             "rank {}: rank {} named buffers at offsets {} and {} of allocations of {} and {} bytes for a {} of {} "
             "input and {} output bytes",
             rank_, peer, d.inOffset, d.outOffset, d.inBytes, d.outBytes, name, inBytes, outBytes);
      }
      if (peer == rank_) {
        inputs[peer] = static_cast<const char*>(input);
        continue;
      }
      Transport* transport = transportOfPeer_[peer];
      inputs[peer] = transport->mapPeerMemory(peer, d.inFd, d.inSerial, d.inBytes) + d.inOffset;
      if (allReduce) {
        outputs[peer] = transport->mapPeerMemory(peer, d.outFd, d.outSerial, d.outBytes) + d.outOffset;
      }
    }
    if (!directLogged_ && logEnabled(LogLevel::kInfo)) {
      directLogged_ = true;
      logAt(LogLevel::kInfo,
            "rank {}: {} of {} input bytes goes direct between chorusMemAlloc buffers (CHORUS_SHM_DIRECT_BYTES {}); "
            "logged once",
            rank_, name, inBytes, directBytes_);
    }

    // This rank's part, reduced from every input into every output it goes to in one pass: an
    // all-reduce's slice in whole cache lines (elements are at most 8 bytes), a reduce-scatter's
    // own block. Outputs of large calls are streamed past the cache, except where a rank's output
    // is its input (reduceMany: those lines were just read into the cache). The call's footprint
    // decides (all-reduce out of place: 2 ranks 1 MiB 37-39 us plain vs 94-104 streamed, 4 MiB
    // alike, 340-400 us, 16 MiB 2.4-2.7 ms plain vs 1.3-1.5; 4 ranks 1 MiB 115-171 us plain vs
    // 190-242, 4 MiB 801-1047 vs 690-692; 8 ranks 1 MiB alike, 429-467 us, 4 MiB 2629-2778 vs
    // 1697-1757).
    size_t begin = 0, end = count, at = static_cast<size_t>(rank_) * count;
    if (allReduce) {
      const size_t perLine = 64 / size;
      const size_t slice = ((count + nranks_ - 1) / nranks_ + perLine - 1) / perLine * perLine;
      begin = std::min(count, slice * static_cast<size_t>(rank_));
      end = std::min(count, begin + slice);
      at = begin;
    }
    std::vector<const void*> from(nranks_);
    for (int peer = 0; peer < nranks_; ++peer) from[peer] = inputs[peer] + at * size;
    std::vector<void*> to(outputs.size());
    for (size_t j = 0; j < outputs.size(); ++j) to[j] = outputs[j] + begin * size;
    const std::unique_ptr<bool[]> stream(new bool[to.size()]);
    const size_t footprint = (inBytes + outBytes) * static_cast<size_t>(nranks_);
    std::fill_n(stream.get(), to.size(), kernels::streamingPays(footprint, outBytes));
    kernels::reduceMany(to.data(), static_cast<int>(to.size()), from.data(), nranks_, end - begin, type, op,
                        stream.get());
  } catch (const Error& e) {
    // The peers hear of it at the barrier below.
    const Error told(e.code(), bootstrap_->failed(e, fmt::format("rank {}: {} of {} input bytes between "
                                                                 "chorusMemAlloc buffers",
                                                                 rank_, name, inBytes)));
    breakWith(told);
    throw told;
  }
  // Every output complete, every input read (the barrier's messages order the stores before).
  std::vector<PreparedOp> barrier;
  barrier.push_back(prepare(collectives::Collective::kBarrier, nullptr, nullptr, 0, chorusUint8, chorusSum, 0));
  run(std::move(barrier));
  return true;
}

}  // namespace chorus
