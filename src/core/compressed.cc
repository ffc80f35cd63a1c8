// compressed.cc: the exchanges of a compressed all-reduce (src/collectives/compression.h) run as
// this communicator's collectives, and the traffic its transports have sent.
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "src/base/error.h"
#include "src/core/communicator.h"

namespace chorus {
namespace {

using collectives::Collective;

class CommunicatorExchange final : public collectives::Exchange {
 public:
  explicit CommunicatorExchange(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int nranks() const override { return c_.nranks(); }

  // Reduce-scatter then all-gather of the count padded to whole shards: each shard's sum is made
  // by one rank and copied to the others, so every rank has the same bits whatever the algorithm.
  void sum(float* data, size_t count) override {
    if (count == 0) return;
    const size_t n = static_cast<size_t>(c_.nranks());
    const size_t shard = (count + n - 1) / n;
    padded_.assign(shard * n, 0.0f);
    std::memcpy(padded_.data(), data, count * sizeof(float));
    float* mine = padded_.data() + static_cast<size_t>(c_.rank()) * shard;
    run(c_.prepare(Collective::kReduceScatter, padded_.data(), mine, shard, chorusFloat32, chorusSum, 0));
    run(c_.prepare(Collective::kAllGather, mine, padded_.data(), shard, chorusFloat32, chorusSum, 0));
    std::memcpy(data, padded_.data(), count * sizeof(float));
  }

  // One message to each peer, all posted at once: (nranks - 1) blocks sent, whatever the tuner
  // would pick for an all-to-all.
  void allToAll(const void* send, void* recv, size_t bytes) override {
    const int n = c_.nranks();
    const int self = c_.rank();
    const char* from = static_cast<const char*>(send);
    char* to = static_cast<char*>(recv);
    std::memcpy(to + static_cast<size_t>(self) * bytes, from + static_cast<size_t>(self) * bytes, bytes);
    if (n == 1) return;
    std::vector<PreparedOp> ops;
    for (int step = 1; step < n; ++step) {
      const int peer = (self + step) % n;
      ops.push_back(c_.prepare(Collective::kSend, from + static_cast<size_t>(peer) * bytes, nullptr, bytes, chorusUint8,
                               chorusSum, peer));
      const int source = (self - step + n) % n;
      ops.push_back(c_.prepare(Collective::kRecv, nullptr, to + static_cast<size_t>(source) * bytes, bytes, chorusUint8,
                               chorusSum, source));
    }
    c_.run(std::move(ops));
  }

  void allGather(const void* send, void* recv, size_t bytes) override {
    run(c_.prepare(Collective::kAllGather, send, recv, bytes, chorusUint8, chorusSum, 0));
  }

 private:
  void run(PreparedOp op) {
    std::vector<PreparedOp> ops;
    ops.push_back(std::move(op));
    c_.run(std::move(ops));
  }

  Communicator& c_;
  std::vector<float> padded_;
};

}  // namespace

void Communicator::compressedAllReduce(collectives::CompressedAllReduce& state, const float* input, float* output,
                                       size_t count, bool average) {
  CommunicatorExchange exchange(*this);
  try {
    state.run(input, output, count, average, exchange);
  } catch (const Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(chorusInvalidArgument, "rank {}: compressed all-reduce ({}) of {} elements: {}", rank_, state.spec().text(),
         count, e.what());
  } catch (const std::runtime_error& e) {
    fail(chorusRemoteError, "rank {}: compressed all-reduce ({}) of {} elements: {}", rank_, state.spec().text(), count,
         e.what());
  }
}

}  // namespace chorus
