// multiprocess.cc: forked ranks for tests.
#include "tests/support/multiprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace chorus::testing {

std::vector<int> runProcesses(int nranks, const RankBody& body, int deadlineSeconds) {
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) {
    ADD_FAILURE() << "chorusGetUniqueId: " << chorusGetLastError(nullptr);
    return std::vector<int>(nranks, -1);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(nranks, -1);
  for (int rank = 0; rank < nranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int status = 0;
      try {
        body(rank, id);
        status = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
        status = 3;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(status);
    }
    pids[rank] = pid;
  }
  std::vector<int> codes(nranks, -1);
  int remaining = nranks;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadlineSeconds);
  while (remaining > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (int rank = 0; rank < nranks; ++rank) {
        if (pids[rank] == done) {
          codes[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          pids[rank] = -1;
          --remaining;
        }
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < nranks; ++rank) {
        if (pids[rank] > 0) {
          kill(pids[rank], SIGKILL);
          waitpid(pids[rank], nullptr, 0);
          codes[rank] = 124;
          --remaining;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes;
}

void PrintTo(const TransportRanks& param, std::ostream* os) {
  *os << param.transport << " x " << param.nranks << " ranks";
}

std::vector<TransportRanks> transportRankMatrix() {
  std::vector<TransportRanks> all;
  for (const char* transport : {"shm", "tcp"}) {
    for (int n : {1, 2, 3, 4, 5, 8}) all.push_back({transport, n});
  }
  return all;
}

std::string transportRanksName(const ::testing::TestParamInfo<TransportRanks>& info) {
  return std::string(info.param.transport) + "_" + std::to_string(info.param.nranks);
}

void runRanks(const RanksOptions& options, const std::function<void(int rank, chorusComm_t comm)>& body) {
  const auto codes = runProcesses(
      options.nranks,
      [&](int rank, const chorusUniqueId& id) {
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.transport = options.transport;
        config.timeoutMs = options.timeoutMs;
        config.initTimeoutMs = options.initTimeoutMs;
        chorusComm_t comm = nullptr;
        const chorusResult_t result = chorusCommInitRankConfig(&comm, options.nranks, id, rank, &config);
        ASSERT_EQ(result, chorusSuccess) << "rank " << rank << " init: " << chorusGetLastError(nullptr);
        body(rank, comm);
        EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess) << chorusGetLastError(comm);
      },
      options.deadlineSeconds);
  for (int rank = 0; rank < options.nranks; ++rank) {
    EXPECT_EQ(codes[rank], 0) << "rank " << rank << " of " << options.nranks << " (transport " << options.transport
                              << ") failed" << (codes[rank] == 124 ? ": killed at the deadline (hang)" : "");
  }
}

}  // namespace chorus::testing
