// stress_test.cc: thousands of random collectives on real forked ranks, every result checked
// against its closed form (tests/support/pattern.h). Each call draws its collective, type, reduction op,
// count (0 and odd ones included), root, placement and buffer kind (heap or chorusMemAlloc);
// calls come alone and blocking, several in a group, or several non-blocking, waited for in an
// order each rank draws for itself or polled with chorusTest; now and then the ranks switch
// algorithms. Rank counts 2-8 over shm and tcp. CHORUS_STRESS_CALLS (default 3500) sets the total,
// CHORUS_STRESS_SEED repeats a run.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/support/multiprocess.h"
#include "tests/support/pattern.h"

namespace chorus {
namespace {

using pattern::asStored;
using pattern::expectedReduce;
using pattern::moveInput;
using pattern::reduceInput;

enum Kind {
  kAllReduce,
  kReduceScatter,
  kReduce,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kAllToAllv,
  kGather,
  kScatter,
  kSendRecv,
  kBarrier,
  kKinds
};
constexpr const char* kKindNames[] = {"allreduce", "reducescatter", "reduce",  "allgather", "broadcast", "alltoall",
                                      "alltoallv", "gather",        "scatter", "sendrecv",  "barrier"};
enum Mode { kBlocking, kGroup, kNonBlockingWait, kNonBlockingTest, kModes };
constexpr const char* kModeNames[] = {"blocking", "group", "non-blocking (wait)", "non-blocking (test)"};

// Zeroed bytes from the heap or from chorusMemAlloc; NULL when empty.
class Buffer {
 public:
  Buffer(size_t bytes, bool shared) : bytes_(bytes), shared_(shared) {
    if (bytes == 0) return;
    if (shared) {
      if (chorusMemAlloc(reinterpret_cast<void**>(&data_), bytes) != chorusSuccess) {
        ADD_FAILURE() << "chorusMemAlloc(" << bytes << "): " << chorusGetLastError(nullptr);
      }
    } else {
      data_ = static_cast<char*>(std::calloc(bytes, 1));
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ == nullptr) return;
    if (shared_) {
      chorusMemFree(data_);
    } else {
      std::free(data_);
    }
  }
  char* data() { return data_; }
  char* at(size_t offset) { return data_ == nullptr ? nullptr : data_ + offset; }

 private:
  char* data_ = nullptr;
  size_t bytes_;
  bool shared_;
};

// One random call: its arguments, buffers filled with this rank's inputs, and the check of its
// result. `salt` shifts the inputs so that calls in flight together differ.
struct Call {
  Kind kind;
  chorusDataType_t type;
  chorusRedOp_t op;
  size_t count;
  int root;
  bool inPlace;
  bool shared;
  size_t salt;
  int rank;
  int n;
  std::unique_ptr<Buffer> send, recv;
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;  // alltoallv
  char* in = nullptr;
  char* out = nullptr;

  size_t amount(int from, int to) const { return static_cast<size_t>((from + 2 * to + salt) % 3) + count; }

  std::string describe() const {
    std::string text = std::string(kKindNames[kind]) + " count " + std::to_string(count) + " " + chorusTypeName(type) +
                       (kind <= kReduce ? std::string(" ") + chorusOpName(op) : "") + " root " + std::to_string(root) +
                       (inPlace ? " in place" : " out of place") + (shared ? ", chorusMemAlloc" : ", heap");
    return text;
  }

  void prepare() {
    const size_t size = chorusTypeSize(type);
    const size_t all = count * static_cast<size_t>(n);
    switch (kind) {
      case kAllReduce:
      case kReduce:
        send = std::make_unique<Buffer>(count * size, shared);
        recv = std::make_unique<Buffer>(count * size, shared);
        for (size_t i = 0; i < count; ++i) pattern::store(send->data(), i, type, reduceInput(op, type, rank, i + salt));
        in = send->data();
        out = inPlace ? in : (kind == kReduce && rank != root ? nullptr : recv->data());
        break;
      case kReduceScatter:
        send = std::make_unique<Buffer>(all * size, shared);
        recv = std::make_unique<Buffer>(count * size, shared);
        for (size_t j = 0; j < all; ++j) pattern::store(send->data(), j, type, reduceInput(op, type, rank, j + salt));
        in = send->data();
        out = inPlace ? send->at(rank * count * size) : recv->data();
        break;
      case kAllGather:
      case kGather: {
        send = std::make_unique<Buffer>(count * size, shared);
        recv = std::make_unique<Buffer>(all * size, shared);
        const bool here = inPlace && (kind == kAllGather || rank == root);
        in = here ? recv->at(rank * count * size) : send->data();
        for (size_t i = 0; i < count; ++i) pattern::store(in, i, type, moveInput(rank, i + salt));
        out = kind == kGather && rank != root ? nullptr : recv->data();
        break;
      }
      case kBroadcast:
        send = std::make_unique<Buffer>(count * size, shared);
        recv = std::make_unique<Buffer>(count * size, shared);
        out = recv->data();
        in = rank != root ? nullptr : inPlace ? out : send->data();
        if (rank == root) {
          for (size_t i = 0; i < count; ++i) pattern::store(in, i, type, moveInput(root, i + salt));
        }
        break;
      case kScatter:
        send = std::make_unique<Buffer>(all * size, shared);
        recv = std::make_unique<Buffer>(count * size, shared);
        if (rank == root) {
          for (size_t j = 0; j < all; ++j) pattern::store(send->data(), j, type, moveInput(root, j + salt));
        }
        in = rank == root ? send->data() : nullptr;
        out = inPlace && rank == root ? send->at(root * count * size) : recv->data();
        break;
      case kAllToAll:
        send = std::make_unique<Buffer>(all * size, shared);
        recv = std::make_unique<Buffer>(all * size, shared);
        for (size_t j = 0; j < all; ++j) pattern::store(send->data(), j, type, moveInput(rank, j + salt));
        in = send->data();
        out = recv->data();
        break;
      case kAllToAllv: {
        sendCounts.resize(n);
        sendDispls.resize(n);
        recvCounts.resize(n);
        recvDispls.resize(n);
        size_t sendTotal = 0, recvTotal = 0;
        for (int j = 0; j < n; ++j) {
          sendCounts[j] = amount(rank, j);
          sendDispls[j] = sendTotal;
          sendTotal += sendCounts[j] + 1;
          recvCounts[j] = amount(j, rank);
          recvDispls[j] = recvTotal;
          recvTotal += recvCounts[j] + 1;
        }
        send = std::make_unique<Buffer>(sendTotal * size, shared);
        recv = std::make_unique<Buffer>(recvTotal * size, shared);
        for (size_t i = 0; i < sendTotal; ++i) pattern::store(send->data(), i, type, moveInput(rank, i + salt));
        in = send->data();
        out = recv->data();
        break;
      }
      case kSendRecv:
        send = std::make_unique<Buffer>(count * size, shared);
        recv = std::make_unique<Buffer>(count * size, shared);
        for (size_t i = 0; i < count; ++i) pattern::store(send->data(), i, type, moveInput(rank, i + salt));
        in = send->data();
        out = recv->data();
        break;
      default:
        break;
    }
  }

  // Starts the call: blocking (requests null), or non-blocking, adding its requests.
  chorusResult_t start(chorusComm_t comm, std::vector<chorusRequest_t>* requests) {
    chorusRequest_t request = nullptr;
    chorusRequest_t* r = requests != nullptr ? &request : nullptr;
    chorusResult_t result = chorusSuccess;
    switch (kind) {
      case kAllReduce:
        result = r ? chorusIAllReduce(in, out, count, type, op, comm, r)
                   : chorusAllReduce(in, out, count, type, op, comm, nullptr);
        break;
      case kReduceScatter:
        result = r ? chorusIReduceScatter(in, out, count, type, op, comm, r)
                   : chorusReduceScatter(in, out, count, type, op, comm, nullptr);
        break;
      case kReduce:
        result = r ? chorusIReduce(in, out, count, type, op, root, comm, r)
                   : chorusReduce(in, out, count, type, op, root, comm, nullptr);
        break;
      case kAllGather:
        result =
            r ? chorusIAllGather(in, out, count, type, comm, r) : chorusAllGather(in, out, count, type, comm, nullptr);
        break;
      case kBroadcast:
        result = r ? chorusIBroadcast(in, out, count, type, root, comm, r)
                   : chorusBroadcast(in, out, count, type, root, comm, nullptr);
        break;
      case kAllToAll:
        result =
            r ? chorusIAllToAll(in, out, count, type, comm, r) : chorusAllToAll(in, out, count, type, comm, nullptr);
        break;
      case kAllToAllv:
        result = r ? chorusIAllToAllv(in, sendCounts.data(), sendDispls.data(), out, recvCounts.data(),
                                      recvDispls.data(), type, comm, r)
                   : chorusAllToAllv(in, sendCounts.data(), sendDispls.data(), out, recvCounts.data(),
                                     recvDispls.data(), type, comm, nullptr);
        break;
      case kGather:
        result = r ? chorusIGather(in, out, count, type, root, comm, r)
                   : chorusGather(in, out, count, type, root, comm, nullptr);
        break;
      case kScatter:
        result = r ? chorusIScatter(in, out, count, type, root, comm, r)
                   : chorusScatter(in, out, count, type, root, comm, nullptr);
        break;
      case kSendRecv: {
        // A ring shift: to rank + 1, from rank - 1 (a message to itself with one rank).
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        if (r != nullptr) {
          result = chorusISend(in, count, type, next, comm, r);
          if (result == chorusSuccess) {
            requests->push_back(request);
            result = chorusIRecv(out, count, type, prev, comm, r);
          }
        } else {
          chorusGroupStart();
          chorusSend(in, count, type, next, comm, nullptr);
          chorusRecv(out, count, type, prev, comm, nullptr);
          result = chorusGroupEnd();
        }
        break;
      }
      default:
        result = r ? chorusIBarrier(comm, r) : chorusBarrier(comm, nullptr);
        break;
    }
    if (r != nullptr && result == chorusSuccess) requests->push_back(request);
    return result;
  }

  // Elements of the result that differ from the closed form.
  size_t wrong() const {
    const size_t c = count;
    switch (kind) {
      case kAllReduce:
        return pattern::countWrong(out, c, type, [&](size_t i) { return expectedReduce(op, type, n, i + salt); });
      case kReduce:
        if (rank != root) return 0;
        return pattern::countWrong(out, c, type, [&](size_t i) { return expectedReduce(op, type, n, i + salt); });
      case kReduceScatter:
        return pattern::countWrong(out, c, type,
                                   [&](size_t i) { return expectedReduce(op, type, n, rank * c + i + salt); });
      case kAllGather:
      case kGather:
        if (kind == kGather && rank != root) return 0;
        return pattern::countWrong(out, c * n, type, [&](size_t j) {
          return asStored(type, moveInput(static_cast<int>(j / c), j % c + salt));
        });
      case kBroadcast:
        return pattern::countWrong(out, c, type, [&](size_t i) { return asStored(type, moveInput(root, i + salt)); });
      case kScatter:
        return pattern::countWrong(out, c, type,
                                   [&](size_t i) { return asStored(type, moveInput(root, rank * c + i + salt)); });
      case kAllToAll:
        return pattern::countWrong(out, c * n, type, [&](size_t j) {
          return asStored(type, moveInput(static_cast<int>(j / c), rank * c + j % c + salt));
        });
      case kAllToAllv: {
        size_t bad = 0;
        const size_t size = chorusTypeSize(type);
        for (int from = 0; from < n; ++from) {
          size_t theirDispl = 0;
          for (int j = 0; j < rank; ++j) theirDispl += amount(from, j) + 1;
          bad += pattern::countWrong(out + recvDispls[from] * size, recvCounts[from], type,
                                     [&](size_t i) { return asStored(type, moveInput(from, theirDispl + i + salt)); });
        }
        return bad;
      }
      case kSendRecv: {
        const int prev = (rank + n - 1) % n;
        return pattern::countWrong(out, c, type, [&](size_t i) { return asStored(type, moveInput(prev, i + salt)); });
      }
      default:
        return 0;
    }
  }
};

constexpr size_t kCounts[] = {0, 1, 2, 3, 5, 7, 8, 13, 31, 64, 100, 127, 255, 1000, 1023, 4096, 10007, 65539, 262147};

// Sets a random algorithm (or the library's choice) for each collective that has several.
void switchAlgorithms(chorusComm_t comm, std::mt19937_64& pick) {
  std::string text;
  for (const char* collective : {"allreduce", "allgather", "reducescatter", "broadcast", "reduce"}) {
    std::vector<std::string> names{"default"};
    std::string list = chorusAlgorithmNames(collective);
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      if (comma > at) names.push_back(list.substr(at, comma - at));
      at = comma + 1;
    }
    text += std::string(text.empty() ? "" : ",") + collective + ":" + names[pick() % names.size()];
  }
  ASSERT_EQ(chorusCommSetAlgorithms(comm, text.c_str()), chorusSuccess) << text << ": " << chorusGetLastError(comm);
}

struct Tally {
  int calls = 0;
  int wrong = 0;
};

void stress(chorusComm_t comm, int rank, int n, uint64_t seed, int calls, Tally* tally) {
  std::mt19937_64 pick(seed);             // the same draws on every rank
  std::mt19937_64 own(seed * 31 + rank);  // this rank's wait order
  int done = 0;
  for (int batchIndex = 0; done < calls; ++batchIndex) {
    if (pick() % 25 == 0) switchAlgorithms(comm, pick);
    const Mode mode = static_cast<Mode>(pick() % kModes);
    const int size = mode == kBlocking ? 1 : 1 + static_cast<int>(pick() % 4);
    std::vector<Call> batch(size);
    for (int k = 0; k < size; ++k) {
      Call& c = batch[k];
      c.kind = static_cast<Kind>(pick() % kKinds);
      c.type = static_cast<chorusDataType_t>(pick() % chorusNumTypes);
      c.op = static_cast<chorusRedOp_t>(pick() % chorusNumOps);
      c.count = kCounts[pick() % std::size(kCounts)];
      if (c.count > 10000 && (c.kind == kAllGather || c.kind == kAllToAll || c.kind == kGather || c.kind == kScatter ||
                              c.kind == kReduceScatter || c.kind == kAllToAllv)) {
        c.count /= static_cast<size_t>(n);  // n blocks of it
      }
      c.root = static_cast<int>(pick() % static_cast<uint64_t>(n));
      c.inPlace = pick() % 2 == 0;
      c.shared = pick() % 2 == 0;
      c.salt = static_cast<size_t>(k) * 11 + static_cast<size_t>(batchIndex % 5);
      c.rank = rank;
      c.n = n;
      c.prepare();
    }
    auto what = [&](const Call& c) {
      return "seed " + std::to_string(seed) + ", batch " + std::to_string(batchIndex) + " (" + kModeNames[mode] + ", " +
             std::to_string(size) + " calls), rank " + std::to_string(rank) + " of " + std::to_string(n) + ": " +
             c.describe();
    };
    std::vector<chorusRequest_t> requests;
    if (mode == kGroup) chorusGroupStart();
    for (Call& c : batch) {
      const chorusResult_t result =
          c.start(comm, mode == kNonBlockingWait || mode == kNonBlockingTest ? &requests : nullptr);
      ASSERT_EQ(result, chorusSuccess) << what(c) << ": " << chorusGetLastError(comm);
    }
    if (mode == kGroup) {
      ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << what(batch[0]) << ": " << chorusGetLastError(comm);
    }
    if (mode == kNonBlockingWait) {
      std::shuffle(requests.begin(), requests.end(), own);
      for (chorusRequest_t& r : requests) ASSERT_EQ(chorusWait(&r), chorusSuccess) << chorusGetLastError(comm);
    } else if (mode == kNonBlockingTest) {
      for (size_t left = requests.size(); left > 0;) {
        left = 0;
        for (chorusRequest_t& r : requests) {
          if (r == nullptr) continue;
          int finished = 0;
          ASSERT_EQ(chorusTest(&r, &finished), chorusSuccess) << chorusGetLastError(comm);
          left += finished ? 0 : 1;
        }
      }
    }
    for (const Call& c : batch) {
      const size_t bad = c.wrong();
      EXPECT_EQ(bad, 0u) << what(c);
      tally->wrong += bad > 0 ? 1 : 0;
      ++tally->calls;
      ++done;
    }
  }
}

TEST(StressTest, EveryCallOfAGroupGetsAlignedScratch) {
  // Over tcp a receive-reduce lands in scratch first; a group's calls share one scratch block, and
  // a barrier's few bytes of it (or 7 bfloat16 elements') left the next calls' uint32 and float64
  // elements misaligned until each call's began on a cache line. The sanitized run
  // (sanitize_stress) traps on such loads.
  testing::RanksOptions options;
  options.nranks = 3;
  options.transport = "tcp";
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:ring,reduce:chain"), chorusSuccess);
    const Kind kinds[] = {kBarrier, kAllReduce, kReduce, kAllReduce};
    const chorusDataType_t types[] = {chorusUint8, chorusBfloat16, chorusUint32, chorusFloat64};
    const size_t counts[] = {0, 7, 13, 5};
    std::vector<Call> group(4);
    for (int k = 0; k < 4; ++k) {
      Call& c = group[k];
      c.kind = kinds[k];
      c.type = types[k];
      c.op = chorusSum;
      c.count = counts[k];
      c.root = 0;
      c.inPlace = false;
      c.shared = false;
      c.salt = static_cast<size_t>(k);
      c.rank = rank;
      c.n = 3;
      c.prepare();
    }
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    for (Call& c : group) ASSERT_EQ(c.start(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
    for (const Call& c : group) EXPECT_EQ(c.wrong(), 0u) << c.describe();
  });
}

TEST(StressTest, RandomCollectivesModesAndAlgorithmsOnTwoToEightRanks) {
  const char* callsText = std::getenv("CHORUS_STRESS_CALLS");
  const int total = callsText != nullptr ? std::atoi(callsText) : 3500;
  const char* seedText = std::getenv("CHORUS_STRESS_SEED");
  const uint64_t seed = seedText != nullptr ? std::strtoull(seedText, nullptr, 10) : std::random_device{}();
  std::printf("CHORUS_STRESS_SEED=%llu, %d calls\n", static_cast<unsigned long long>(seed), total);
  struct Tallies {
    Tally byRank[8];
  };
  testing::SharedWithRanks<Tallies> shared;
  Tally* tallies = shared->byRank;
  int calls = 0, wrong = 0;
  for (int n = 2; n <= 8; ++n) {
    testing::RanksOptions options;
    options.nranks = n;
    options.transport = n % 2 == 0 ? "shm" : "tcp";
    const uint64_t runSeed = seed + static_cast<uint64_t>(n);
    std::fill(tallies, tallies + 8, Tally{});
    testing::runRanks(options,
                      [&](int rank, chorusComm_t comm) { stress(comm, rank, n, runSeed, total / 7, &tallies[rank]); });
    std::printf("%d ranks (%s): %d calls, %d with a wrong result\n", n, options.transport, tallies[0].calls,
                tallies[0].wrong);
    for (int r = 0; r < n; ++r) wrong += tallies[r].wrong;
    calls += tallies[0].calls;
  }
  std::printf("%d random calls, %d wrong\n", calls, wrong);
  EXPECT_EQ(wrong, 0);
}

}  // namespace
}  // namespace chorus
