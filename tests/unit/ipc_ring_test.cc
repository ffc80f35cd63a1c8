// ipc_ring_test.cc: the device engine's ring, the ipc algorithm (src/core/device_ring.h), run on host
// threads: each rank's channel is a thread, inboxes are host memory, the kernel's volatile words
// and fences are atomics. The code under test is the kernel's own, so its slicing, ring steps,
// slots, credits, LL flags, counters across launches and failure paths are checked here without
// a GPU; tests/gpu runs the same code as a kernel on real ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "src/core/device_ring.h"
#include "tests/support/pattern.h"

namespace chorus::ipc {
namespace {

// One thread per block: device_ring.h's host primitives, and nothing to synchronize within a block.
struct HostSync : HostPrimitives {
  static constexpr unsigned kPollEvery = 1;
  static int thread() { return 0; }
  static int threads() { return 1; }
  static void barrier() {}
  static bool uniform(bool value) { return value; }
};

// The ring's ranks: each one's inbox, counters and control live as long as the ring, so calls
// one after another reuse them as the device's do. The ring visits the ranks in `order`
// (position -> rank; empty: by number), as a topology-searched device ring does.
class HostRing {
 public:
  explicit HostRing(int nranks, std::vector<int> order = {}) : nranks_(nranks), ranks_(nranks), order_(order) {
    for (auto& r : ranks_) {
      r.inbox = std::make_unique<ChannelInbox[]>(kMaxChannels);
      r.counters = std::make_unique<ChannelCounters[]>(kMaxChannels);
    }
    if (order_.empty()) {
      for (int r = 0; r < nranks; ++r) order_.push_back(r);
    } else {
      rankAt_ = order_.data();
    }
    position_.resize(nranks);
    for (int p = 0; p < nranks; ++p) position_[order_[p]] = p;
  }

  // Runs one collective on every rank (or only those in `only`), all channels at once; inputs,
  // outputs and root by rank.
  void run(Kind kind, bool ll, int channels, chorusDataType_t type, chorusRedOp_t op, int root,
           const std::vector<const void*>& inputs, const std::vector<void*>& outputs, size_t count,
           uint64_t timeoutNs = 20'000'000'000ull, const std::vector<int>& only = {}) {
    std::vector<RingArgs> args(nranks_);
    for (int r = 0; r < nranks_; ++r) {
      auto& rank = ranks_[r];
      const int p = position_[r];
      rank.control = Control{};
      args[r] = RingArgs{kind,
                         inputs[r],
                         outputs[r],
                         count,
                         p,
                         nranks_,
                         position_[root],
                         channels,
                         op == chorusAvg,
                         rank.inbox.get(),
                         ranks_[order_[(p + 1) % nranks_]].inbox.get(),
                         ranks_[order_[(p + nranks_ - 1) % nranks_]].inbox.get(),
                         rank.counters.get(),
                         &rank.control,
                         timeoutNs,
                         rankAt_};
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks_; ++r) {
      if (!only.empty() && std::find(only.begin(), only.end(), r) == only.end()) continue;
      for (int c = 0; c < channels; ++c) {
        threads.emplace_back([&, r, c] {
          if (ll) {
            runChannel<HostSync, true>(args[r], c, type, op);
          } else {
            runChannel<HostSync, false>(args[r], c, type, op);
          }
        });
      }
    }
    for (auto& t : threads) t.join();
  }

  Control& control(int rank) { return ranks_[rank].control; }

 private:
  struct Rank {
    std::unique_ptr<ChannelInbox[]> inbox;
    std::unique_ptr<ChannelCounters[]> counters;
    Control control{};
  };
  int nranks_;
  std::vector<Rank> ranks_;
  std::vector<int> order_;
  std::vector<int> position_;
  const int* rankAt_ = nullptr;
};

// Each ring order the block-placing tests run: by number, and one that visits the ranks out of
// it (as a topology search may).
std::vector<std::vector<int>> ordersOf(int n) {
  static const std::vector<int> shuffled[] = {{}, {0}, {1, 0}, {1, 0, 2}, {2, 0, 3, 1}};
  return {{}, shuffled[n]};
}

using Buffers = std::vector<std::vector<char>>;

std::vector<const void*> inputs(const Buffers& b) {
  std::vector<const void*> p;
  for (const auto& v : b) p.push_back(v.data());
  return p;
}
std::vector<void*> outputs(Buffers& b) {
  std::vector<void*> p;
  for (auto& v : b) p.push_back(v.data());
  return p;
}

// Counts that cover the empty call, a partial line, several messages and several ring rounds.
std::vector<size_t> countsFor(bool ll, chorusDataType_t type) {
  const size_t message = (ll ? kLlSlotBytes : kBulkSlotBytes) / kernels::typeSize(type);
  return {0, 1, 37, message * 3 + 5, message * 9 + 101};
}

void checkAllReduce(HostRing& ring, int n, bool ll, int channels, chorusDataType_t type, chorusRedOp_t op,
                    bool inPlace) {
  const size_t size = kernels::typeSize(type);
  for (const size_t count : countsFor(ll, type)) {
    Buffers in(n, std::vector<char>(count * size)), out(n, std::vector<char>(count * size));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) pattern::store(in[r].data(), i, type, pattern::reduceInput(op, type, r, i));
    }
    Buffers& dst = inPlace ? in : out;
    ring.run(Kind::kAllReduce, ll, channels, type, op, 0, inputs(in), outputs(dst), count);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(ring.control(r).status, kStatusOk);
      const size_t wrong = pattern::countWrong(dst[r].data(), count, type,
                                               [&](size_t i) { return pattern::expectedReduce(op, type, n, i); });
      ASSERT_EQ(wrong, 0u) << "rank " << r << " of " << n << " count " << count << " " << chorusTypeName(type) << " "
                           << chorusOpName(op) << (ll ? " LL" : " bulk") << " channels " << channels;
    }
  }
}

TEST(IpcRingTest, AllReduceEveryTypeAndOpBothProtocols) {
  for (const int n : {1, 2, 3}) {
    HostRing ring(n);
    for (const bool ll : {true, false}) {
      for (int t = 0; t < chorusNumTypes; ++t) {
        for (int o = 0; o < chorusNumOps; ++o) {
          checkAllReduce(ring, n, ll, 2, static_cast<chorusDataType_t>(t), static_cast<chorusRedOp_t>(o), false);
        }
      }
    }
  }
}

TEST(IpcRingTest, AllReduceInPlaceOnFourRanksAndManyChannels) {
  HostRing ring(4);
  for (const bool ll : {true, false}) {
    for (const int channels : {1, 5, kMaxChannels}) {
      checkAllReduce(ring, 4, ll, channels, chorusFloat32, chorusSum, true);
      checkAllReduce(ring, 4, ll, channels, chorusBfloat16, chorusAvg, true);
      checkAllReduce(ring, 4, ll, channels, chorusInt64, chorusMax, true);
    }
  }
}

TEST(IpcRingTest, AllGatherAndReduceScatterPlaceEveryBlock) {
  for (const int n : {2, 3, 4}) {
    for (const std::vector<int>& order : ordersOf(n)) {
      HostRing ring(n, order);
      for (const bool ll : {true, false}) {
        for (const auto type : {chorusFloat32, chorusFloat16, chorusInt8}) {
          const size_t size = kernels::typeSize(type);
          for (const size_t count : countsFor(ll, type)) {
            Buffers in(n, std::vector<char>(count * size)), out(n, std::vector<char>(n * count * size));
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i) pattern::store(in[r].data(), i, type, pattern::moveInput(r, i));
            }
            ring.run(Kind::kAllGather, ll, 3, type, chorusSum, 0, inputs(in), outputs(out), count);
            for (int r = 0; r < n; ++r) {
              const size_t wrong = pattern::countWrong(out[r].data(), n * count, type, [&](size_t i) {
                return pattern::asStored(type, pattern::moveInput(static_cast<int>(i / count), i % count));
              });
              ASSERT_EQ(wrong, 0u) << "all-gather rank " << r << " of " << n << " count " << count;
            }
            // Reduce-scatter: rank r's input block k holds reduceInput of (r, k * count + i).
            Buffers rsIn(n, std::vector<char>(n * count * size)), rsOut(n, std::vector<char>(count * size));
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < n * count; ++i) {
                pattern::store(rsIn[r].data(), i, type, pattern::reduceInput(chorusSum, type, r, i));
              }
            }
            ring.run(Kind::kReduceScatter, ll, 3, type, chorusSum, 0, inputs(rsIn), outputs(rsOut), count);
            for (int r = 0; r < n; ++r) {
              const size_t wrong = pattern::countWrong(rsOut[r].data(), count, type, [&](size_t i) {
                return pattern::expectedReduce(chorusSum, type, n, r * count + i);
              });
              ASSERT_EQ(wrong, 0u) << "reduce-scatter rank " << r << " of " << n << " count " << count;
            }
          }
        }
      }
      checkAllReduce(ring, n, false, 2, chorusFloat32, chorusSum, false);
    }
  }
}

TEST(IpcRingTest, BroadcastAndReduceFromEveryRoot) {
  for (const int n : {2, 3, 4}) {
    for (const std::vector<int>& order : ordersOf(n)) {
      HostRing ring(n, order);
      for (const bool ll : {true, false}) {
        const auto type = chorusInt32;
        for (const size_t count : countsFor(ll, type)) {
          for (int root = 0; root < n; ++root) {
            Buffers in(n, std::vector<char>(count * 4)), out(n, std::vector<char>(count * 4, 0x55));
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i) pattern::store(in[r].data(), i, type, pattern::moveInput(r, i));
            }
            ring.run(Kind::kBroadcast, ll, 2, type, chorusSum, root, inputs(in), outputs(out), count);
            for (int r = 0; r < n; ++r) {
              const size_t wrong = pattern::countWrong(out[r].data(), count, type,
                                                       [&](size_t i) { return pattern::moveInput(root, i); });
              ASSERT_EQ(wrong, 0u) << "broadcast root " << root << " rank " << r << " count " << count;
            }
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i) {
                pattern::store(in[r].data(), i, type, pattern::reduceInput(chorusProd, type, r, i));
              }
            }
            ring.run(Kind::kReduce, ll, 2, type, chorusProd, root, inputs(in), outputs(out), count);
            const size_t wrong = pattern::countWrong(out[root].data(), count, type, [&](size_t i) {
              return pattern::expectedReduce(chorusProd, type, n, i);
            });
            ASSERT_EQ(wrong, 0u) << "reduce root " << root << " count " << count;
          }
        }
      }
    }
  }
}

// A rank that never joins: the others' waits end at the deadline with the reason recorded, and
// a raised abort word ends them at once.
TEST(IpcRingTest, WaitsEndAtTheDeadlineOrOnAbort) {
  HostRing ring(3);
  const size_t count = 1000;
  Buffers in(3, std::vector<char>(count * 4)), out(3, std::vector<char>(count * 4));
  const auto start = std::chrono::steady_clock::now();
  ring.run(Kind::kAllReduce, false, 2, chorusFloat32, chorusSum, 0, inputs(in), outputs(out), count, 200'000'000,
           {0, 1});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(ring.control(0).status, kStatusTimeout);
  EXPECT_EQ(ring.control(1).status, kStatusTimeout);
  // Rank 0 waits for data from rank 2 (its predecessor), which never sends.
  EXPECT_EQ(ring.control(0).what, kWaitData);

  HostRing fresh(2);
  std::thread raise([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::atomic_ref<uint32_t>(fresh.control(0).abort).store(1);
  });
  fresh.run(Kind::kAllReduce, true, 1, chorusFloat32, chorusSum, 0, inputs(in), outputs(out), count, 60'000'000'000ull,
            {0});
  raise.join();
  EXPECT_EQ(fresh.control(0).status, kStatusAborted);
}

}  // namespace
}  // namespace chorus::ipc
