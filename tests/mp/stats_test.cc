// stats_test.cc: a communicator's live statistics (chorusCommGetStats, CHORUS_STATS_FILE) on
// forked ranks: calls, bytes and algorithms per collective and size bucket as made, each link's
// bytes seen alike from both ends, the straggler hint naming a rank that comes late, and the files
// written at destroy and on the interval.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;
using nlohmann::json;

std::string statsOf(chorusComm_t comm, int format) {
  size_t size = 0;
  EXPECT_EQ(chorusCommGetStats(comm, format, nullptr, &size), chorusSuccess) << chorusGetLastError(comm);
  std::string text(size, '\0');
  EXPECT_EQ(chorusCommGetStats(comm, format, text.data(), &size), chorusSuccess) << chorusGetLastError(comm);
  text.resize(size > 0 ? size - 1 : 0);
  return text;
}

// The row of a collective and size bucket, or null.
json rowOf(const json& stats, const std::string& collective, const std::string& bucket) {
  for (const json& row : stats["collectives"]) {
    if (row["collective"] == collective && row["bytes_at_most"] == bucket) return row;
  }
  return nullptr;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

constexpr int kRanks = 3;

TEST(StatsTest, CallsBytesAlgorithmsAndLinksAreCountedAsMade) {
  SharedWithRanks<std::array<std::array<uint64_t, kRanks>, kRanks>> sent, received;
  RanksOptions options;
  options.nranks = kRanks;
  runRanks(options, [&](int rank, chorusComm_t comm) {
    ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:ring"), chorusSuccess);
    std::vector<float> a(1000, 1.0f);
    for (int i = 0; i < 5; ++i) {
      ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 1000, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    }
    std::vector<int32_t> b(10, rank);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(chorusBroadcast(b.data(), b.data(), 10, chorusInt32, 1, comm, nullptr), chorusSuccess);
    }
    const json stats = json::parse(statsOf(comm, CHORUS_STATS_JSON));
    EXPECT_EQ(stats["rank"], rank);
    EXPECT_EQ(stats["nranks"], kRanks);
    // 4000-byte all-reduces fall in the 64 KiB bucket, 40-byte broadcasts in the 1 KiB one.
    const json allreduce = rowOf(stats, "allreduce", "65536");
    ASSERT_TRUE(allreduce.is_object()) << stats.dump(1);
    EXPECT_EQ(allreduce["calls"], 5);
    EXPECT_EQ(allreduce["failed"], 0);
    EXPECT_EQ(allreduce["bytes"], 5 * 4000);
    EXPECT_EQ(allreduce["algorithms"]["ring"], 5);
    EXPECT_GT(allreduce["seconds"].get<double>(), 0.0);
    const json broadcast = rowOf(stats, "broadcast", "1024");
    ASSERT_TRUE(broadcast.is_object()) << stats.dump(1);
    EXPECT_EQ(broadcast["calls"], 2);
    EXPECT_EQ(broadcast["bytes"], 2 * 40);
    ASSERT_EQ(stats["peers"].size(), static_cast<size_t>(kRanks - 1));
    for (const json& peer : stats["peers"]) {
      const int p = peer["peer"];
      (*sent)[rank][p] = peer["sent_bytes"];
      (*received)[rank][p] = peer["received_bytes"];
    }
    // The same numbers in Prometheus' text format.
    const std::string prometheus = statsOf(comm, CHORUS_STATS_PROMETHEUS);
    EXPECT_NE(prometheus.find("# TYPE chorus_calls_total counter\n"), std::string::npos) << prometheus;
    EXPECT_NE(prometheus.find(",rank=\"" + std::to_string(rank) + "\",collective=\"allreduce\",le=\"65536\"} 5\n"),
              std::string::npos)
        << prometheus;
    EXPECT_NE(prometheus.find("collective=\"allreduce\",le=\"65536\",algorithm=\"ring\"} 5\n"), std::string::npos)
        << prometheus;
    EXPECT_NE(prometheus.find("chorus_bytes_total{"), std::string::npos);
    // The errors.
    size_t tiny = 4;
    char buffer[4];
    EXPECT_EQ(chorusCommGetStats(comm, CHORUS_STATS_JSON, buffer, &tiny), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("the text needs"), std::string::npos);
    EXPECT_EQ(chorusCommGetStats(comm, 7, nullptr, &tiny), chorusInvalidArgument);
  });
  // Each link's bytes, from both ends.
  for (int r = 0; r < kRanks; ++r) {
    for (int p = 0; p < kRanks; ++p) {
      if (p == r) continue;
      EXPECT_GT((*sent)[r][p], 0u) << r << " -> " << p;
      EXPECT_EQ((*sent)[r][p], (*received)[p][r]) << r << " -> " << p;
    }
  }
}

TEST(StatsTest, TheStragglerHintNamesTheRankThatComesLate) {
  // Rank 1 sleeps 50 ms before each of 5 all-reduces: rank 0 can only finish each after rank 1
  // has sent, so it waits on rank 1 at least that long in all.
  SharedWithRanks<std::array<double, 2>> waited;
  SharedWithRanks<std::array<int, 2>> hint;
  RanksOptions options;
  options.nranks = 2;
  runRanks(options, [&](int rank, chorusComm_t comm) {
    std::vector<float> a(100, 1.0f);
    for (int i = 0; i < 5; ++i) {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 100, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    }
    const json stats = json::parse(statsOf(comm, CHORUS_STATS_JSON));
    (*hint)[rank] = stats["straggler_hint"].is_object() ? stats["straggler_hint"]["peer"].get<int>() : -1;
    (*waited)[rank] = stats["peers"][0]["wait_seconds"];
  });
  EXPECT_EQ((*hint)[0], 1);
  EXPECT_GE((*waited)[0], 0.2);
}

TEST(StatsTest, FilesAreWrittenAtDestroyAndOnTheInterval) {
  char folder[] = "/tmp/chorus-stats-test-XXXXXX";
  ASSERT_NE(mkdtemp(folder), nullptr);
  const std::string dir = folder;
  for (const char* extension : {".json", ".prom"}) {
    const std::string pattern = dir + "/stats-%r" + extension;
    ASSERT_EQ(setenv("CHORUS_STATS_FILE", pattern.c_str(), 1), 0);
    ASSERT_EQ(setenv("CHORUS_STATS_INTERVAL_S", "1", 1), 0);
    RanksOptions options;
    options.nranks = 2;
    runRanks(options, [&](int rank, chorusComm_t comm) {
      std::vector<float> a(10, 1.0f);
      ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 10, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
      // Past the interval, the next call's end writes the file.
      std::this_thread::sleep_for(std::chrono::milliseconds(1100));
      ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 10, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
      const std::string file = dir + "/stats-" + std::to_string(rank) + extension;
      EXPECT_TRUE(std::filesystem::exists(file)) << file;
    });
    unsetenv("CHORUS_STATS_FILE");
    unsetenv("CHORUS_STATS_INTERVAL_S");
    for (int rank = 0; rank < 2; ++rank) {
      // At destroy: every call of the rank counted (the harness's own included).
      const std::string text = readFile(dir + "/stats-" + std::to_string(rank) + extension);
      if (std::string(extension) == ".json") {
        const json stats = json::parse(text);
        EXPECT_EQ(stats["rank"], rank);
        const json row = rowOf(stats, "allreduce", "1024");
        ASSERT_TRUE(row.is_object()) << text;
        EXPECT_GE(row["calls"].get<int>(), 2);
      } else {
        EXPECT_NE(text.find("# TYPE chorus_calls_total counter"), std::string::npos) << text;
        EXPECT_NE(text.find("chorus_straggler_hint{"), std::string::npos) << text;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(StatsTest, OffTheyAreRefusedNamingTheVariable) {
  ASSERT_EQ(setenv("CHORUS_STATS", "0", 1), 0);
  RanksOptions options;
  options.nranks = 1;
  runRanks(options, [&](int, chorusComm_t comm) {
    size_t size = 0;
    EXPECT_EQ(chorusCommGetStats(comm, CHORUS_STATS_JSON, nullptr, &size), chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("CHORUS_STATS=0"), std::string::npos);
  });
  unsetenv("CHORUS_STATS");
}

}  // namespace
}  // namespace chorus
