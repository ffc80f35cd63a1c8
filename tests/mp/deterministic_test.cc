// deterministic_test.cc: CHORUS_DETERMINISTIC on real forked ranks over shm and tcp. Every
// algorithm of all-reduce, reduce-scatter and reduce, at several chunk sizes, on inputs whose sums
// round differently in different orders, gives every rank the rank-order fold bit for bit: the
// hash of each result equals the hash of that fold computed here element by element.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "src/collectives/algorithm.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_order_fold.h"

namespace chorus {
namespace {

using namespace chorus::testing;

constexpr uint64_t kSeed = 0xd1ce;

struct Kind {
  chorusDataType_t type;
  chorusRedOp_t op;
};
constexpr Kind kKinds[] = {{chorusFloat32, chorusSum},
                           {chorusFloat16, chorusSum},
                           {chorusBfloat16, chorusAvg},
                           {chorusFloat64, chorusProd},
                           {chorusInt32, chorusSum}};
const char* const kReductions[] = {"allreduce", "reducescatter", "reduce"};

// Runs one reduction on comm (root n - 1 for reduce) and returns the number of this rank's
// elements whose bits differ from the rank-order fold; the hashes of the two go to *got, *want.
size_t runOne(chorusComm_t comm, const std::string& collective, int rank, int n, size_t count, Kind kind, void* in,
              void* out, uint64_t* got, uint64_t* want) {
  const size_t size = chorusTypeSize(kind.type);
  const bool scatter = collective == "reducescatter";
  const size_t inCount = scatter ? count * n : count;
  for (size_t i = 0; i < inCount; ++i) {
    pattern::store(in, i, kind.type, pattern::unorderedInput(kind.op, kind.type, rank, i, kSeed));
  }
  chorusResult_t result;
  if (collective == "allreduce") {
    result = chorusAllReduce(in, out, count, kind.type, kind.op, comm, nullptr);
  } else if (scatter) {
    result = chorusReduceScatter(in, out, count, kind.type, kind.op, comm, nullptr);
  } else {
    result = chorusReduce(in, out, count, kind.type, kind.op, n - 1, comm, nullptr);
  }
  EXPECT_EQ(result, chorusSuccess) << chorusGetLastError(comm);
  *got = *want = 0;
  if (collective == "reduce" && rank != n - 1) return 0;  // only the root has a result
  const size_t first = scatter ? rank * count : 0;
  std::vector<char> fold(count * size);
  for (size_t i = 0; i < count; ++i) {
    pattern::store(fold.data(), i, kind.type, pattern::rankOrderFold(kind.op, kind.type, n, first + i, kSeed));
  }
  *got = pattern::hashBytes(out, count * size);
  *want = pattern::hashBytes(fold.data(), count * size);
  return pattern::countWrong(out, count, kind.type, [&](size_t i) { return pattern::load(fold.data(), i, kind.type); });
}

class DeterministicTest : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(DeterministicTest, EveryAlgorithmAndChunkGivesTheRankOrderFold) {
  const TransportRanks param = GetParam();
  RanksOptions options = optionsFor(param);
  runRanks(options, [&](int rank, chorusComm_t comm) {
    const int n = param.nranks;
    const size_t most = 20001 * static_cast<size_t>(n) * 8;
    void* in = nullptr;
    void* out = nullptr;
    // The library's own allocations, so the direct algorithm can run where every rank is on shm.
    ASSERT_EQ(chorusMemAlloc(&in, most), chorusSuccess);
    ASSERT_EQ(chorusMemAlloc(&out, most), chorusSuccess);
    // Chunks of 256 bytes and 4 KiB (CHORUS_CHUNK_BYTES), then the tuner's; the first by the
    // environment, the others by the config.
    for (const char* chunk : {"256", "4096", ""}) {
      if (chunk[0] != '\0') {
        ASSERT_EQ(setenv("CHORUS_CHUNK_BYTES", chunk, 1), 0);
      } else {
        ASSERT_EQ(unsetenv("CHORUS_CHUNK_BYTES"), 0);
      }
      const bool byEnvironment = std::string(chunk) == "256";
      ASSERT_EQ(setenv("CHORUS_DETERMINISTIC", byEnvironment ? "1" : "0", 1), 0);
      chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
      if (!byEnvironment) config.deterministic = 1;
      chorusComm_t sub = nullptr;
      ASSERT_EQ(chorusCommSplit(comm, 0, rank, &sub, &config), chorusSuccess) << chorusGetLastError(comm);
      for (const char* collective : kReductions) {
        for (const std::string& algorithm : collectives::splitCommas(chorusAlgorithmNames(collective))) {
          const std::string spec = std::string(collective) + ":" + algorithm;
          ASSERT_EQ(chorusCommSetAlgorithms(sub, spec.c_str()), chorusSuccess) << chorusGetLastError(sub);
          for (const Kind& kind : kKinds) {
            for (size_t count : {size_t{5}, size_t{20001}}) {
              uint64_t got = 0, want = 0;
              const size_t wrong = runOne(sub, collective, rank, n, count, kind, in, out, &got, &want);
              ASSERT_EQ(wrong, 0u) << spec << " chunk '" << chunk << "' " << chorusTypeName(kind.type) << " "
                                   << chorusOpName(kind.op) << " count " << count << " rank " << rank;
              ASSERT_EQ(got, want);
            }
          }
        }
      }
      ASSERT_EQ(chorusCommDestroy(sub), chorusSuccess);
    }
    ASSERT_EQ(chorusMemFree(in), chorusSuccess);
    ASSERT_EQ(chorusMemFree(out), chorusSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeterministicTest,
                         ::testing::Values(TransportRanks{"shm", 2}, TransportRanks{"shm", 3}, TransportRanks{"tcp", 3},
                                           TransportRanks{"shm", 5}, TransportRanks{"tcp", 5}, TransportRanks{"shm", 8},
                                           TransportRanks{"tcp", 8}),
                         transportRanksName);

TEST(DeterministicConfigTest, AValueOtherThanOneZeroOrMinusOneIsRefused) {
  const auto codes = runProcesses(1, [](int, const chorusUniqueId& id) {
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.deterministic = 2;
    chorusComm_t comm = nullptr;
    EXPECT_EQ(chorusCommInitRankConfig(&comm, 1, id, 0, &config), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("config.deterministic = 2"), std::string::npos)
        << chorusGetLastError(nullptr);
  });
  EXPECT_EQ(codes[0], 0);
}

}  // namespace
}  // namespace chorus
