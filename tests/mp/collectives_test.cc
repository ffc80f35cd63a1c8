// collectives_test.cc: every collective x rank count x element count x type x op x in/out of
// place, on real forked ranks over shm and over tcp, checked against closed-form results.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/collective_checks.h"
#include "tests/support/multiprocess.h"
#include "tests/support/pattern.h"

namespace chorus {
namespace {

using namespace chorus::testing;

class CollectivesTest : public ::testing::TestWithParam<TransportRanks> {};

// Up to 4 ranks every type meets the large count; from 5 ranks on (the same kernels, longer
// schedules) the large count takes one type of each width, which keeps the suite's time in bounds.
TEST_P(CollectivesTest, EveryCollectiveTypeOpCountAndPlacement) {
  const TransportRanks param = GetParam();
  testing::RanksOptions options = testing::optionsFor(param);
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    const auto everyType = {chorusInt8,   chorusUint8,   chorusInt32,   chorusUint32,  chorusInt64,
                            chorusUint64, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16};
    const auto everyOp = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg};
    constexpr size_t kLarge = (1u << 20) + 3;
    if (param.nranks <= 4) {
      checkEveryCollective(comm, rank, param.nranks, {0, 1, 7, 1023, kLarge}, everyType, everyOp, true);
    } else {
      checkEveryCollective(comm, rank, param.nranks, {0, 1, 7, 1023}, everyType, everyOp, true);
      checkEveryCollective(comm, rank, param.nranks, {kLarge}, {chorusInt8, chorusBfloat16, chorusFloat32, chorusInt64},
                           everyOp, false);
    }
  });
}

// The barrier lets nobody out before everyone is in: each rank arrives late by a different
// amount and bumps a counter in memory shared by the forked ranks; after the barrier every rank
// must see the full count.
TEST_P(CollectivesTest, BarrierWaitsForEveryRank) {
  const TransportRanks param = GetParam();
  auto* counter = static_cast<std::atomic<int>*>(
      mmap(nullptr, sizeof(std::atomic<int>) * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(counter, MAP_FAILED);
  new (counter) std::atomic<int>(0);
  testing::RanksOptions options = testing::optionsFor(param);
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    for (int round = 1; round <= 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * ((rank + round) % param.nranks)));
      counter->fetch_add(1);
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      EXPECT_GE(counter->load(), round * param.nranks) << "rank " << rank << " left barrier " << round << " early";
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
    }
  });
  munmap(counter, sizeof(std::atomic<int>) * 2);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::ValuesIn(transportRankMatrix()), transportRanksName);

TEST(ShmReadTest, RanksCanReadEachOthersMemory) {
  // The shm transport's one-copy path reads the sender's buffer with process_vm_readv; forked
  // sibling ranks must be allowed to (else the transport falls back to two copies and the test
  // below would not reach the path).
  runRanks({}, [&](int rank, chorusComm_t comm) {
    struct Where {
      int64_t pid;
      uint64_t address;
    };
    const uint64_t mine = 0x1234000 + static_cast<uint64_t>(rank);
    const Where here{getpid(), reinterpret_cast<uint64_t>(&mine)};
    Where both[2];
    ASSERT_EQ(chorusAllGather(&here, both, sizeof(Where), chorusUint8, comm, nullptr), chorusSuccess);
    const Where& peer = both[1 - rank];
    uint64_t theirs = 0;
    iovec to{&theirs, sizeof(theirs)};
    iovec from{reinterpret_cast<void*>(peer.address), sizeof(theirs)};
    EXPECT_EQ(process_vm_readv(static_cast<pid_t>(peer.pid), &to, 1, &from, 1, 0), 8) << std::strerror(errno);
    EXPECT_EQ(theirs, 0x1234000u + static_cast<uint64_t>(1 - rank));
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // `mine` lives until both have read it
  });
}

// Every collective on 2, 3 and 4 shm ranks with knob=1, which sends every non-empty message
// the way the knob names; buffers from chorusMemAlloc where shared.
// count elements of T from chorusMemAlloc (allocated() says whether it succeeded), freed when it
// goes, the free checked; free it only after the peers are done with it (a barrier).
template <typename T>
class SharedArray {
 public:
  explicit SharedArray(size_t count) {
    EXPECT_EQ(chorusMemAlloc(reinterpret_cast<void**>(&data_), count * sizeof(T)), chorusSuccess);
  }
  ~SharedArray() {
    if (data_ != nullptr) {
      EXPECT_EQ(chorusMemFree(data_), chorusSuccess);
    }
  }
  SharedArray(const SharedArray&) = delete;
  SharedArray& operator=(const SharedArray&) = delete;
  bool allocated() const { return data_ != nullptr; }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
};

// n ranks joined by the shm transport.
RanksOptions onShm(int n) {
  RanksOptions options;
  options.nranks = n;
  options.transport = "shm";
  return options;
}

void checkEveryCollectiveOnShmWith(const char* knob, bool shared) {
  ASSERT_EQ(setenv(knob, "1", 1), 0);
  for (int n : {2, 3, 4}) {
    runRanks(onShm(n), [&](int rank, chorusComm_t comm) {
      SCOPED_TRACE(std::string(knob) + "=1, " + std::to_string(n) + " ranks");
      useChorusMemAlloc(shared);
      checkEveryCollective(comm, rank, n, {0, 1, 1000, 300007}, {chorusInt32, chorusFloat32}, {chorusSum, chorusMax},
                           /*withSendRecv=*/true);
    });
  }
  unsetenv(knob);
}

TEST(ShmReadTest, EveryCollectiveIsRightWhenEveryMessageIsReadFromTheSender) {
  // CHORUS_SHM_READ_BYTES=1: every non-empty shm message is read from the sender's memory (empty
  // ones still take a slot), so the by-address messages mix with slot messages in every FIFO.
  checkEveryCollectiveOnShmWith("CHORUS_SHM_READ_BYTES", /*shared=*/false);
}

TEST(ShmReadTest, ReductionsConsumeEveryPieceOnceAtItsPlace) {
  // Receive-reduces take their bytes piece by piece (from the slot, or read from the sender's
  // memory into a slot-sized buffer). 100-byte slots are rounded down to 64 bytes, so pieces
  // never split an 8-byte element; messages of hundreds of pieces check every piece's offset.
  ASSERT_EQ(setenv("CHORUS_SHM_SLOT_BYTES", "100", 1), 0);
  for (const char* readBytes : {"0", "1"}) {
    ASSERT_EQ(setenv("CHORUS_SHM_READ_BYTES", readBytes, 1), 0);
    runRanks(onShm(3), [&](int rank, chorusComm_t comm) {
      SCOPED_TRACE(std::string("64-byte pieces, CHORUS_SHM_READ_BYTES=") + readBytes);
      checkEveryCollective(comm, rank, 3, {1, 1000, 30007}, {chorusFloat64, chorusInt8, chorusBfloat16}, {chorusSum},
                           /*withSendRecv=*/false);
    });
  }
  unsetenv("CHORUS_SHM_READ_BYTES");
  unsetenv("CHORUS_SHM_SLOT_BYTES");
}

TEST(ShmForwardTest, RingReductionsAreRightWhetherTheForwardFusesOrNot) {
  // The rings' receive-reduce-send: each reduced piece goes into the outgoing slot in the same
  // pass where the forward is first in its queue and a slot is free, else it is copied from the
  // output later. Chunks of half a FIFO (the tuner's) fuse nearly every piece; 64 KiB chunks over
  // a FIFO of two 4 KiB slots leave the forward behind its chunk's send for most pieces, so the
  // two ways mix within one message; 64-byte slots give messages of thousands of pieces (at most
  // 30007 elements there: a FIFO of 256 bytes hands over a piece per wake-up, and 300007 on
  // cores shared with other work took past the 4-minute deadline, every rank still moving). Heap
  // and chorusMemAlloc buffers (whose other messages go mapped); 2 ranks (prev = next) to 4.
  struct Setting {
    const char* slots;
    const char* slotBytes;
    const char* chunkBytes;  // null: the tuner's
    size_t largest;          // elements of the largest call
  };
  // CHORUS_FORWARD_RANKS: the most ranks (default 4; the sanitized run takes 3, where 4 took it
  // to three minutes: 3 already have a prev that is not the next).
  const char* ranksText = std::getenv("CHORUS_FORWARD_RANKS");
  const int maxRanks = ranksText != nullptr ? std::atoi(ranksText) : 4;
  ASSERT_GE(maxRanks, 2) << "CHORUS_FORWARD_RANKS=" << ranksText;
  ASSERT_EQ(setenv("CHORUS_ALGO", "allreduce:ring,reducescatter:ring,allgather:ring", 1), 0);
  for (const Setting& setting : {Setting{"8", "262144", nullptr, 300007}, Setting{"2", "4096", "65536", 300007},
                                 Setting{"4", "64", "4096", 30007}}) {
    ASSERT_EQ(setenv("CHORUS_SHM_SLOTS", setting.slots, 1), 0);
    ASSERT_EQ(setenv("CHORUS_SHM_SLOT_BYTES", setting.slotBytes, 1), 0);
    if (setting.chunkBytes != nullptr) {
      ASSERT_EQ(setenv("CHORUS_CHUNK_BYTES", setting.chunkBytes, 1), 0);
    } else {
      unsetenv("CHORUS_CHUNK_BYTES");
    }
    for (bool shared : {false, true}) {
      for (int n = 2; n <= maxRanks; ++n) {
        // Seconds each alone: a rank still running at 4 minutes is hung and is shown, then killed.
        RanksOptions options = onShm(n);
        options.deadlineSeconds = 240;
        runRanks(options, [&](int rank, chorusComm_t comm) {
          SCOPED_TRACE(std::string(setting.slots) + " slots of " + setting.slotBytes + " bytes, chunk " +
                       (setting.chunkBytes ? setting.chunkBytes : "the tuner's") + ", " +
                       (shared ? "chorusMemAlloc, " : "heap, ") + std::to_string(n) + " ranks");
          useChorusMemAlloc(shared);
          checkEveryCollective(comm, rank, n, {1, 1000, setting.largest}, {chorusFloat32, chorusBfloat16, chorusInt32},
                               {chorusSum, chorusAvg}, /*withSendRecv=*/false);
        });
      }
    }
  }
  for (const char* knob : {"CHORUS_ALGO", "CHORUS_SHM_SLOTS", "CHORUS_SHM_SLOT_BYTES", "CHORUS_CHUNK_BYTES"}) {
    unsetenv(knob);
  }
}

TEST(ShmMapTest, EveryCollectiveIsRightOnChorusMemAllocBuffers) {
  // CHORUS_SHM_MAP_BYTES=1: every non-empty shm message out of a chorusMemAlloc buffer is copied
  // or reduced by the receiver straight from the sender's mapped pages; buffers are allocated
  // and freed per call, so descriptor numbers are reused for new allocations and the receivers
  // must map each anew (the serial tells them apart). All-reduces take their messages too, not the
  // direct path (ShmDirectTest).
  ASSERT_EQ(setenv("CHORUS_SHM_DIRECT_BYTES", "0", 1), 0);
  checkEveryCollectiveOnShmWith("CHORUS_SHM_MAP_BYTES", /*shared=*/true);
  unsetenv("CHORUS_SHM_DIRECT_BYTES");
}

TEST(ShmMapTest, ReceiversMapTheSendersAllocation) {
  // The path above is taken, not the FIFO: after an all-gather out of chorusMemAlloc buffers,
  // each rank maps its peer's send buffer beside its own two allocations.
  auto allocationsMapped = [] {
    std::ifstream maps("/proc/self/maps");
    int count = 0;
    for (std::string line; std::getline(maps, line);) count += line.find("memfd:chorus-buffer") != std::string::npos;
    return count;
  };
  runRanks({}, [&](int rank, chorusComm_t comm) {
    constexpr size_t kCount = 1 << 18;
    SharedArray<int32_t> sendArray(kCount), recvArray(2 * kCount);
    ASSERT_TRUE(sendArray.allocated() && recvArray.allocated());
    int32_t* send = sendArray.get();
    int32_t* recv = recvArray.get();
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<int32_t>(i * 3 + rank);
    const int before = allocationsMapped();
    ASSERT_EQ(chorusAllGather(send, recv, kCount, chorusInt32, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    EXPECT_EQ(allocationsMapped(), before + 1) << "rank " << rank << " did not map its peer's buffer";
    for (size_t r = 0; r < 2; ++r) {
      for (size_t i = 0; i < kCount; i += 997) ASSERT_EQ(recv[r * kCount + i], static_cast<int32_t>(i * 3 + r));
    }
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peer has read `send`
  });
}

TEST(ShmDirectTest, EveryCollectiveIsRightWhenReductionsGoDirect) {
  // CHORUS_SHM_DIRECT_BYTES=1: every non-empty all-reduce on chorusMemAlloc buffers is reduced
  // by each rank over its slice of every rank's input, straight into every rank's output, and
  // every reduce-scatter by each rank over its block of every input into its output, among the
  // other collectives' calls (which keep their messages): 1 element (one rank's slice holds it,
  // the others' are empty), 1000 and 300007 (slices cut at cache lines, a partial last one).
  checkEveryCollectiveOnShmWith("CHORUS_SHM_DIRECT_BYTES", /*shared=*/true);
}

TEST(ShmDirectTest, ReductionsAreRightForEveryTypeAndOp) {
  // All-reduce and reduce-scatter: Avg divides once after the sum, integers wrap, fp16 and bf16
  // round once per element, as the scheduled ones do; in place and out of place.
  ASSERT_EQ(setenv("CHORUS_SHM_DIRECT_BYTES", "1", 1), 0);
  for (int n : {2, 3}) {
    runRanks(onShm(n), [&](int rank, chorusComm_t comm) {
      useChorusMemAlloc(true);
      for (chorusDataType_t type :
           {chorusInt8, chorusUint8, chorusInt64, chorusFloat16, chorusBfloat16, chorusFloat64}) {
        for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
          for (bool inPlace : {false, true}) {
            SCOPED_TRACE(std::to_string(n) + " ranks, type " + std::to_string(type) + ", op " + std::to_string(op));
            checkAllReduce(comm, rank, n, 40001, type, op, inPlace);
            checkReduceScatter(comm, rank, n, 20001, type, op, inPlace);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    });
  }
  unsetenv("CHORUS_SHM_DIRECT_BYTES");
}

// Mappings of chorusMemAlloc allocations in this process, and how many of them are writable.
std::pair<int, int> chorusBuffersMapped() {
  std::ifstream maps("/proc/self/maps");
  int count = 0, writable = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:chorus-buffer") == std::string::npos) continue;
    ++count;
    writable += line.find(" rw") != std::string::npos;
  }
  return {count, writable};
}

// Runs body on 3 shm ranks with mapped messages off (CHORUS_SHM_MAP_BYTES=0), so that only the
// direct algorithm maps peers' allocations, and CHORUS_SHM_DIRECT_BYTES=directBytes.
void onThreeShmRanksDirectFrom(const char* directBytes, const std::function<void(int rank, chorusComm_t comm)>& body) {
  ASSERT_EQ(setenv("CHORUS_SHM_MAP_BYTES", "0", 1), 0);
  ASSERT_EQ(setenv("CHORUS_SHM_DIRECT_BYTES", directBytes, 1), 0);
  runRanks(onShm(3), [&](int rank, chorusComm_t comm) {
    SCOPED_TRACE(std::string("CHORUS_SHM_DIRECT_BYTES=") + directBytes);
    body(rank, comm);
  });
  unsetenv("CHORUS_SHM_DIRECT_BYTES");
  unsetenv("CHORUS_SHM_MAP_BYTES");
}

// The same, once with the direct algorithm on (from 64 KiB), once off.
void onThreeRanksDirectOnAndOff(const std::function<void(bool direct, int rank, chorusComm_t comm)>& body) {
  for (const bool direct : {true, false}) {
    onThreeShmRanksDirectFrom(direct ? "65536" : "0", [&](int rank, chorusComm_t comm) { body(direct, rank, comm); });
  }
}

TEST(ShmDirectTest, EachRankWritesEveryRanksOutput) {
  // With mapped messages off (CHORUS_SHM_MAP_BYTES=0), only the direct all-reduce maps peers'
  // allocations: after one, each of 3 ranks has its peers' inputs and outputs mapped read-write
  // beside its own two; with CHORUS_SHM_DIRECT_BYTES=0 it maps none. The results are checked
  // against the closed form (values distinct per rank and index).
  onThreeRanksDirectOnAndOff([](bool direct, int rank, chorusComm_t comm) {
    constexpr size_t kCount = 100003;
    SharedArray<int64_t> sendArray(kCount), recvArray(kCount);
    ASSERT_TRUE(sendArray.allocated() && recvArray.allocated());
    int64_t* send = sendArray.get();
    int64_t* recv = recvArray.get();
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<int64_t>(i * 1000 + rank * rank + 1);
    const auto before = chorusBuffersMapped();
    ASSERT_EQ(chorusAllReduce(send, recv, kCount, chorusInt64, chorusSum, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    const auto after = chorusBuffersMapped();
    const int peers = direct ? 2 * (3 - 1) : 0;
    EXPECT_EQ(after.first, before.first + peers) << "rank " << rank;
    EXPECT_EQ(after.second, before.second + peers) << "rank " << rank;
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(recv[i], static_cast<int64_t>(3 * (i * 1000 + 1) + 0 + 1 + 4)) << "rank " << rank << " at " << i;
    }
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peers are done with both
  });
}

TEST(ShmDirectTest, EachRankReducesItsBlockFromThePeersInputs) {
  // A direct reduce-scatter maps each peer's input only (2 mappings for 3 ranks, none with
  // CHORUS_SHM_DIRECT_BYTES=0; mapped messages off) and each rank writes its own output, checked
  // against the closed form, out of place and in place (the output is the rank's block of its
  // input, which its peers read while it writes).
  onThreeRanksDirectOnAndOff([](bool direct, int rank, chorusComm_t comm) {
    constexpr size_t kCount = 50021;
    SharedArray<int64_t> sendArray(3 * kCount), recvArray(kCount);
    ASSERT_TRUE(sendArray.allocated() && recvArray.allocated());
    int64_t* send = sendArray.get();
    auto value = [](size_t j, int r) { return static_cast<int64_t>(j * 1000 + r * r + 1); };
    auto expected = [&](size_t j) { return value(j, 0) + value(j, 1) + value(j, 2); };
    for (bool inPlace : {false, true}) {
      for (size_t j = 0; j < 3 * kCount; ++j) send[j] = value(j, rank);
      int64_t* recv = inPlace ? send + rank * kCount : recvArray.get();
      const auto before = chorusBuffersMapped();
      ASSERT_EQ(chorusReduceScatter(send, recv, kCount, chorusInt64, chorusSum, comm, nullptr), chorusSuccess)
          << chorusGetLastError(comm);
      const int peers = direct && !inPlace ? 2 : 0;  // in place: mapped by the first call
      EXPECT_EQ(chorusBuffersMapped().first, before.first + peers) << "rank " << rank << " in place " << inPlace;
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(recv[i], expected(rank * kCount + i)) << "rank " << rank << " at " << i << " in place " << inPlace;
      }
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peers are done with both
    }
  });
}

TEST(ShmDirectTest, RanksAgreeToGoTheScheduledWayWhenOneBufferIsNotShareable) {
  // Rank 1's output is on the heap: every rank learns it from the swap of descriptors and all
  // take the scheduled all-reduce (no peer allocation mapped), with the right sums. The next 63
  // calls skip the swap, on shareable buffers too; the 64th swaps and goes direct.
  onThreeShmRanksDirectFrom("4096", [&](int rank, chorusComm_t comm) {
    constexpr size_t kCount = 30011;
    SharedArray<float> sendArray(kCount), sharedArray(kCount);
    ASSERT_TRUE(sendArray.allocated() && sharedArray.allocated());
    float* send = sendArray.get();
    float* shared = sharedArray.get();
    std::vector<float> heap(kCount);
    float* recv = rank == 1 ? heap.data() : shared;
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>(i % 1000 + rank);
    const auto before = chorusBuffersMapped();
    ASSERT_EQ(chorusAllReduce(send, recv, kCount, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    EXPECT_EQ(chorusBuffersMapped().first, before.first) << "rank " << rank << " mapped a peer's buffer";
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recv[i], static_cast<float>(3 * (i % 1000) + 3)) << i;
    for (int call = 1; call <= 64; ++call) {
      std::fill(shared, shared + kCount, -1.0f);
      ASSERT_EQ(chorusAllReduce(send, shared, kCount, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
          << chorusGetLastError(comm);
      EXPECT_EQ(chorusBuffersMapped().first, before.first + (call == 64 ? 4 : 0))
          << "rank " << rank << " call " << call;
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(shared[i], static_cast<float>(3 * (i % 1000) + 3)) << i;
    }
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peers are done with both
  });
}

TEST(ShmDirectTest, AHeapBufferHoldsBackOnlyCallsOfItsShape) {
  // After a swap finds rank 1's output on the heap, the next calls of that shape (collective and
  // size) skip the swap, on shareable buffers too; a call of another size still goes direct.
  // Fresh allocations per call show which went direct: only a direct call maps them.
  onThreeShmRanksDirectFrom("4096", [&](int rank, chorusComm_t comm) {
    auto allReduce = [&](size_t count, bool heapOnRank1, int mapped, const char* what) {
      SharedArray<float> send(count), recv(count);
      ASSERT_TRUE(send.allocated() && recv.allocated());
      std::vector<float> heap(count);
      float* out = heapOnRank1 && rank == 1 ? heap.data() : recv.get();
      for (size_t i = 0; i < count; ++i) send.get()[i] = static_cast<float>(i % 1000 + rank);
      const auto before = chorusBuffersMapped();
      ASSERT_EQ(chorusAllReduce(send.get(), out, count, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
          << chorusGetLastError(comm);
      EXPECT_EQ(chorusBuffersMapped().first, before.first + mapped) << "rank " << rank << ": " << what;
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<float>(3 * (i % 1000) + 3)) << what << " " << i;
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peers are done with both
    };
    allReduce(2000, true, 0, "a heap buffer on rank 1");
    allReduce(3000, false, 2 * (3 - 1), "another size");
    allReduce(2000, false, 0, "the heap call's size");
  });
}

TEST(ShmDirectTest, ForcedDirectRunsBelowTheFloorAndOnlyWhereItCan) {
  // CHORUS_ALGO's direct: a blocking all-reduce of 8000 bytes, under CHORUS_SHM_DIRECT_BYTES, goes
  // direct when forced (each of 3 ranks maps its peers' inputs and outputs), and not when the
  // tuner picks (below its floor); forced in a group, where the ranks cannot swap descriptors
  // first, the tuner picks too. Every result against the closed form.
  onThreeShmRanksDirectFrom("65536", [&](int rank, chorusComm_t comm) {
    constexpr size_t kCount = 1000;
    SharedArray<int64_t> sendArray(kCount), recvArray(kCount);
    ASSERT_TRUE(sendArray.allocated() && recvArray.allocated());
    int64_t* send = sendArray.get();
    int64_t* recv = recvArray.get();
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<int64_t>(i * 7 + rank + 1);
    auto allReduce = [&](bool inGroup, int mapped, const char* what) {
      std::fill(recv, recv + kCount, -1);
      const auto before = chorusBuffersMapped();
      if (inGroup) {
        ASSERT_EQ(chorusGroupStart(), chorusSuccess);
      }
      ASSERT_EQ(chorusAllReduce(send, recv, kCount, chorusInt64, chorusSum, comm, nullptr), chorusSuccess)
          << chorusGetLastError(comm);
      if (inGroup) {
        ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
      }
      EXPECT_EQ(chorusBuffersMapped().first, before.first + mapped) << "rank " << rank << ": " << what;
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(recv[i], static_cast<int64_t>(3 * (i * 7 + 1) + 0 + 1 + 2)) << "rank " << rank << " at " << i;
      }
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peers are done with both
    };
    allReduce(false, 0, "the tuner's choice under its floor");
    ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:direct"), chorusSuccess) << chorusGetLastError(comm);
    allReduce(true, 0, "forced direct in a group");
    allReduce(false, 2 * (3 - 1), "forced direct");
  });
}

TEST(ShmMapTest, MemAllocRejectsWhatItDidNotAllocate) {
  void* buffer = nullptr;
  EXPECT_EQ(chorusMemAlloc(&buffer, 0), chorusInvalidArgument);
  EXPECT_EQ(chorusMemAlloc(nullptr, 64), chorusInvalidArgument);
  ASSERT_EQ(chorusMemAlloc(&buffer, 100000), chorusSuccess);
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer) % 4096, 0u);
  EXPECT_EQ(static_cast<char*>(buffer)[99999], 0);
  EXPECT_EQ(chorusMemFree(static_cast<char*>(buffer) + 64), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("not returned by chorusMemAlloc"), std::string::npos)
      << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusMemFree(buffer), chorusSuccess);
  EXPECT_EQ(chorusMemFree(buffer), chorusInvalidArgument);  // freed already
}

TEST(ShmFifoTest, SmallPiecesInLineWithTheirHeaderArriveWhole) {
  // A piece of up to 16 bytes shares its header's cache line, a larger one starts at the next
  // line; the receiver watches each slot's sequence number. Every size from 0 to 80 bytes each
  // way, then 3000 small all-reduces (each FIFO wraps hundreds of times) with distinct values.
  RanksOptions options;
  options.transport = "shm";
  runRanks(options, [&](int rank, chorusComm_t comm) {
    const int peer = 1 - rank;
    for (size_t bytes = 0; bytes <= 80; ++bytes) {
      std::vector<uint8_t> out(bytes), in(bytes, 0xee);
      for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 7 + bytes + 31 * rank);
      ASSERT_EQ(chorusGroupStart(), chorusSuccess);
      ASSERT_EQ(chorusSend(out.data(), bytes, chorusUint8, peer, comm, nullptr), chorusSuccess);
      ASSERT_EQ(chorusRecv(in.data(), bytes, chorusUint8, peer, comm, nullptr), chorusSuccess);
      ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
      for (size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(in[i], static_cast<uint8_t>(i * 7 + bytes + 31 * peer)) << bytes << "-byte message, byte " << i;
      }
    }
    for (int64_t round = 0; round < 3000; ++round) {
      int64_t values[2] = {round * 3 + rank, -round - 10 * rank};
      ASSERT_EQ(chorusAllReduce(values, values, 2, chorusInt64, chorusSum, comm, nullptr), chorusSuccess)
          << chorusGetLastError(comm);
      ASSERT_EQ(values[0], round * 6 + 1) << "round " << round;
      ASSERT_EQ(values[1], -2 * round - 10) << "round " << round;
    }
  });
}

}  // namespace
}  // namespace chorus
