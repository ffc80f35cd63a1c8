// direct.cc: the meeting before a call of the direct algorithm (src/collectives/direct.cc) among
// ranks of one host whose buffers are chorusMemAlloc allocations.
//
// The ranks swap where their input and output lie (a 64-byte all-gather of descriptors: memfd
// number, serial, size, offset). If every rank's buffers are shareable and every peer can map
// them, each rank maps the peers' inputs (all-reduce: their outputs too; once per allocation:
// the shm transport keeps the mappings) and the op runs its schedule: one reduce-peers step, then
// a barrier. The swap is also the meeting that step needs: once a rank has every descriptor,
// every rank is in the call, so the inputs are final and the outputs free. Where a swap finds a
// heap buffer, every rank's op takes its fallback schedule (the tuner's choice without direct),
// and the next 63 direct calls take it without a swap, so heap buffers pay one swap per 64 calls.
#include <algorithm>
#include <memory>
#include <utility>

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

void Communicator::mapPeers(PreparedOp& op) {
  const bool allReduce = op.collective == collectives::Collective::kAllReduce;
  const char* name = collectives::collectiveName(op.collective);
  const size_t inBytes = op.inputBytes;
  const size_t outBytes = op.count * kernels::typeSize(op.type);
  auto fallBack = [&] {
    op.schedule = std::move(op.fallback);
    op.tag = op.fallbackTag;
    op.fallback.reset();
  };
  // After a swap found a heap buffer, the next kDirectBackoff calls of the shape skip the swap
  // (with 4 ranks on 2 cores a 64-byte all-gather took 62-89 us in the host tables, a 64 KiB
  // all-reduce 90 us, so heap buffers pay about 1% more): every rank saw the same descriptors and
  // counts the same calls, so all skip alike.
  const uint64_t shape = (static_cast<uint64_t>(op.collective) << 56) ^ inBytes;
  if (auto skips = directSkips_.find(shape); skips != directSkips_.end()) {
    if (--skips->second == 0) directSkips_.erase(skips);
    fallBack();
    return;
  }

  // Direct calls map every peer's buffers: every pair set up first (both sides' probes answered,
  // so each rank knows whether it may map each peer's memory). Every rank makes the same call.
  // The peers hear of a failure here or below at the barrier of the op, which this rank never
  // reaches.
  auto tell = [&](const Error& e) {
    const Error told(e.code(), bootstrap_->failed(e, fmt::format("rank {}: {} of {} input bytes between "
                                                                 "chorusMemAlloc buffers",
                                                                 rank_, name, inBytes)));
    breakWith(told);
    return told;
  };
  if (!meshConnected_) {
    try {
      connectEveryPeer();
    } catch (const Error& e) {
      throw tell(e);
    }
    meshConnected_ = true;
  }
  DirectBuffers mine;
  SharedRange in, out;
  bool shareable = findShared(op.input, inBytes, &in) && findShared(op.output, outBytes, &out);
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
    if (!theirs.shareable) {                                  // every rank sees the same descriptors and decides alike
      if (directSkips_.size() >= 1024) directSkips_.clear();  // shapes long gone
      directSkips_[shape] = kDirectBackoff;
      if (!fallbackLogged_ && logEnabled(LogLevel::kInfo)) {
        fallbackLogged_ = true;
        logAt(LogLevel::kInfo,
              "rank {}: {} of {} input bytes takes {} instead of direct: a rank's buffer is not a chorusMemAlloc "
              "allocation (the next {} such calls skip the swap); logged once",
              rank_, name, inBytes, op.fallback->algorithm, kDirectBackoff);
      }
      fallBack();
      return;
    }
  }

  try {
    // Every rank's input (all-reduce: and output), mapped here.
    auto peers = std::make_shared<PeerBuffers>();
    peers->inputs.assign(nranks_, nullptr);
    peers->outputs.assign(nranks_, nullptr);
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
        peers->inputs[peer] = static_cast<const char*>(op.input);
        peers->outputs[peer] = static_cast<char*>(op.output);
        continue;
      }
      Transport* transport = transportOfPeer_[peer];
      peers->inputs[peer] = transport->mapPeerMemory(peer, d.inFd, d.inSerial, d.inBytes) + d.inOffset;
      if (allReduce) {
        peers->outputs[peer] = transport->mapPeerMemory(peer, d.outFd, d.outSerial, d.outBytes) + d.outOffset;
      }
    }
    op.peers = std::move(peers);
    op.fallback.reset();
    if (!directLogged_ && logEnabled(LogLevel::kInfo)) {
      directLogged_ = true;
      logAt(LogLevel::kInfo,
            "rank {}: {} of {} input bytes goes direct between chorusMemAlloc buffers (CHORUS_SHM_DIRECT_BYTES {}); "
            "logged once",
            rank_, name, inBytes, costs_.directMinBytes);
    }
  } catch (const Error& e) {
    throw tell(e);
  }
}

}  // namespace chorus
