// trace_test.cc: the flight recorder (CHORUS_TRACE_DIR) and chorus-trace on forked ranks. Each
// test breaks a run of 3 ranks the way programs break (a rank skips a call, calls with another
// count, is stopped or killed inside a collective) and checks that chorus-trace, reading the
// files the ranks wrote, names the rank or the call.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

constexpr int kRanks = 3;

struct Traced {
  std::vector<int> codes;
  std::string report;  // chorus-trace's output
  std::vector<std::string> files;
};

// Runs body on kRanks ranks recording into a fresh CHORUS_TRACE_DIR (calls time out after 3 s),
// then chorus-trace over what they wrote.
Traced runTraced(const std::function<void(int rank, chorusComm_t comm, const std::string& dir)>& body) {
  char folder[] = "/tmp/chorus-trace-test-XXXXXX";
  EXPECT_NE(mkdtemp(folder), nullptr);
  const std::string dir = folder;
  EXPECT_EQ(setenv("CHORUS_TRACE_DIR", dir.c_str(), 1), 0);
  Traced traced;
  traced.codes = runProcesses(
      kRanks,
      [&](int rank, const chorusUniqueId& id) {
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.timeoutMs = 3000;
        chorusComm_t comm = nullptr;
        ASSERT_EQ(chorusCommInitRankConfig(&comm, kRanks, id, rank, &config), chorusSuccess);
        body(rank, comm, dir);
        chorusCommDestroy(comm);
      },
      60);
  unsetenv("CHORUS_TRACE_DIR");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) traced.files.push_back(entry.path().string());
  const std::string command = std::string(CHORUS_TRACE_TOOL) + " " + dir + " 2>&1";
  if (FILE* out = popen(command.c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), out)) > 0;) traced.report.append(buffer, n);
    pclose(out);
  }
  std::filesystem::remove_all(dir);
  std::printf("chorus-trace said:\n%s", traced.report.c_str());
  return traced;
}

std::vector<float> ones(size_t count) { return std::vector<float>(count, 1.0f); }

TEST(TraceTest, ASkippedCallNamesTheRankThatNeverArrived) {
  const Traced t = runTraced([](int rank, chorusComm_t comm, const std::string&) {
    std::vector<float> a = ones(100);
    ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 100, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    if (rank == 2) return;  // skips the second all-reduce and leaves
    EXPECT_NE(chorusAllReduce(a.data(), a.data(), 100, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
  });
  for (int code : t.codes) EXPECT_EQ(code, 0);
  EXPECT_EQ(t.files.size(), 3u) << t.report;
  EXPECT_NE(t.report.find("Rank 2 never arrived at allreduce #1 (count 100 float32 sum"), std::string::npos)
      << t.report;
  EXPECT_NE(t.report.find("its last call was allreduce #0"), std::string::npos) << t.report;
  EXPECT_NE(t.report.find("the communicator was destroyed"), std::string::npos) << t.report;
}

TEST(TraceTest, AMismatchedCountNamesTheCallWhereTheRanksDiverged) {
  const Traced t = runTraced([](int rank, chorusComm_t comm, const std::string&) {
    std::vector<float> a = ones(200);
    ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 100, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    const size_t count = rank == 1 ? 200 : 100;
    EXPECT_NE(chorusAllReduce(a.data(), a.data(), count, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
  });
  for (int code : t.codes) EXPECT_EQ(code, 0);
  EXPECT_NE(t.report.find("The ranks diverged at collective #1: ranks 0 and 2 called allreduce #1 (count 100"),
            std::string::npos)
      << t.report;
  EXPECT_NE(t.report.find("rank 1 called allreduce #1 (count 200"), std::string::npos) << t.report;
}

// Ranks all-reduce 16 MiB again and again; a thread of rank 2 sends it `signal` 300 ms in, inside a
// call; ranks 0 and 1 stop at the first call that fails, and rank 0 then kills rank 2 (stopped, it
// would wait for the deadline).
Traced breakRankTwo(int signal) {
  SharedWithRanks<std::array<pid_t, kRanks>> pids;
  return runTraced([&](int rank, chorusComm_t comm, const std::string&) {
    (*pids)[rank] = getpid();
    const size_t count = 4 << 20;
    std::vector<float> a = ones(count);
    std::thread breaker;
    if (rank == 2) {
      breaker = std::thread([signal] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        raise(signal);
      });
      breaker.detach();
    }
    for (int i = 0; i < 100000; ++i) {
      if (chorusAllReduce(a.data(), a.data(), count, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess) break;
    }
    if (rank == 0) kill((*pids)[2], SIGKILL);
  });
}

TEST(TraceTest, ARankStoppedInsideACollectiveIsNamed) {
  const Traced t = breakRankTwo(SIGSTOP);
  EXPECT_EQ(t.codes[0], 0);
  EXPECT_EQ(t.codes[1], 0);
  EXPECT_EQ(t.files.size(), 2u) << t.report;
  EXPECT_NE(t.report.find("Rank 2 left no record (stopped, killed, or not recording) and held the others up in "
                          "allreduce #"),
            std::string::npos)
      << t.report;
}

TEST(TraceTest, ARankKilledInsideACollectiveIsNamed) {
  const Traced t = breakRankTwo(SIGKILL);
  EXPECT_EQ(t.codes[0], 0);
  EXPECT_EQ(t.codes[1], 0);
  EXPECT_NE(t.report.find("Rank 2 left no record (stopped, killed, or not recording) and held the others up in "
                          "allreduce #"),
            std::string::npos)
      << t.report;
}

TEST(TraceTest, SigusrOneWritesTheRecordOfACallThatWaits) {
  // Rank 2 comes 1.5 s late to the second call; meanwhile rank 0 signals itself and finds its
  // record written, naming the call it waits in and the peer it waits on.
  SharedWithRanks<std::array<int, 2>> seen;
  const Traced t = runTraced([&](int rank, chorusComm_t comm, const std::string& dir) {
    std::vector<float> a = ones(100);
    ASSERT_EQ(chorusAllReduce(a.data(), a.data(), 100, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    std::thread reader;
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (rank == 0) {
      reader = std::thread([&seen, dir] {
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        raise(SIGUSR1);
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        for (const auto& entry : std::filesystem::directory_iterator(dir)) {
          std::ifstream in(entry.path());
          std::stringstream text;
          text << in.rdbuf();
          (*seen)[0] = text.str().find("\"reason\": \"SIGUSR1\"") != std::string::npos;
          (*seen)[1] = text.str().find("\"call\": \"allreduce #1 (count 100 float32 sum") != std::string::npos;
        }
      });
    }
    EXPECT_EQ(chorusAllReduce(a.data(), a.data(), 100, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    if (reader.joinable()) reader.join();
  });
  for (int code : t.codes) EXPECT_EQ(code, 0);
  EXPECT_EQ((*seen)[0], 1) << "no record with reason SIGUSR1 while rank 0 waited";
  EXPECT_EQ((*seen)[1], 1) << "the record did not name the call rank 0 waited in";
}

}  // namespace
}  // namespace chorus
