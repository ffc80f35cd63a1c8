// multiprocess.cc: forked ranks for tests.
#include "tests/support/multiprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <thread>

namespace chorus::testing {

namespace {

bool readAll(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::read(fd, p, bytes);
    if (got <= 0) return false;
    p += got;
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

// A process's state letter and kernel wait channel, from /proc.
std::string describeProcess(pid_t pid) {
  auto readFile = [](const std::string& path) {
    std::ifstream in(path);
    std::string text;
    std::getline(in, text);
    return text;
  };
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  const std::string state = paren != std::string::npos && paren + 2 < stat.size() ? stat.substr(paren + 2, 1) : "?";
  return "state " + state + ", waiting in " + readFile("/proc/" + std::to_string(pid) + "/wchan");
}

}  // namespace

int64_t monotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int> runProcesses(int nranks, const RankBody& body, int deadlineSeconds) {
  // chorusGetUniqueId starts the bootstrap root as a thread of its caller. Forking the ranks from
  // a process with that thread running could copy a lock it holds at that instant (an
  // allocator's, under ASan) into a rank, which would then hang; so a helper process makes the
  // id and hosts the root until the ranks are done, and this process forks them thread-free.
  std::fflush(stdout);
  std::fflush(stderr);
  int idPipe[2], holdPipe[2];
  if (pipe(idPipe) != 0 || pipe(holdPipe) != 0) {
    ADD_FAILURE() << "pipe failed";
    return std::vector<int>(nranks, -1);
  }
  const pid_t holder = fork();
  if (holder == 0) {
    close(idPipe[0]);
    close(holdPipe[1]);
    chorusUniqueId made;
    const chorusResult_t result = chorusGetUniqueId(&made);
    if (write(idPipe[1], &result, sizeof(result)) != sizeof(result) ||
        write(idPipe[1], &made, sizeof(made)) != sizeof(made)) {
      _exit(1);
    }
    char byte;
    while (read(holdPipe[0], &byte, 1) > 0) {
    }  // until the parent closes its end
    _exit(0);
  }
  close(idPipe[1]);
  close(holdPipe[0]);
  chorusResult_t made = chorusInternalError;
  chorusUniqueId id;
  const bool got = readAll(idPipe[0], &made, sizeof(made)) && readAll(idPipe[0], &id, sizeof(id));
  close(idPipe[0]);
  auto releaseHolder = [&] {
    close(holdPipe[1]);
    waitpid(holder, nullptr, 0);
  };
  if (!got || made != chorusSuccess) {
    ADD_FAILURE() << "chorusGetUniqueId in the helper process failed (result " << made << ")";
    releaseHolder();
    return std::vector<int>(nranks, -1);
  }
  std::vector<pid_t> pids(nranks, -1);
  for (int rank = 0; rank < nranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(holdPipe[1]);
      // SIGUSR1 at the deadline makes a hung rank's communicators print their state.
      setenv("CHORUS_DUMP_SIGNAL", "1", /*overwrite=*/0);
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
      // What each rank left was doing, before it goes: its scheduler state (running: spinning;
      // sleeping: waiting; stopped) and kernel wait point, and chorus's own state dump (SIGUSR1:
      // printed by a call of the rank's communicator the next time it waits).
      for (int rank = 0; rank < nranks; ++rank) {
        if (pids[rank] > 0) {
          std::fprintf(stderr, "rank %d (pid %d) still running at the deadline: %s\n", rank, pids[rank],
                       describeProcess(pids[rank]).c_str());
          kill(pids[rank], SIGUSR1);
        }
      }
      std::this_thread::sleep_for(std::chrono::seconds(3));
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
  releaseHolder();
  return codes;
}

RanksOptions optionsFor(const TransportRanks& param) {
  RanksOptions options;
  options.nranks = param.nranks;
  options.transport = param.transport;
  return options;
}

void PrintTo(const TransportRanks& param, std::ostream* os) {
  *os << param.transport << " x " << param.nranks << " ranks";
}

// Every transport at 1 to 5 ranks; 8 ranks on shm only: the schedules at 8 ranks are the
// transports' alike (shm_8 runs them), and tcp_8 and ucx_8, 40-60 s each on CI's two cores, only
// repeated them over another wire (the stress test runs tcp at 3, 5 and 7 ranks; e2e_netns_hosts
// runs tcp and ucx between hosts).
std::vector<TransportRanks> transportRankMatrix() {
  std::vector<TransportRanks> all;
  for (const char* transport : {"shm", "tcp", "ucx"}) {
    for (int n : {1, 2, 3, 4, 5}) all.push_back({transport, n});
  }
  all.push_back({"shm", 8});
  return all;
}

std::string transportName(const ::testing::TestParamInfo<const char*>& info) { return info.param; }

std::string transportRanksName(const ::testing::TestParamInfo<TransportRanks>& info) {
  return std::string(info.param.transport) + "_" + std::to_string(info.param.nranks);
}

void runRanks(const RanksOptions& options, const std::function<void(int rank, chorusComm_t comm)>& body) {
  CHORUS_REQUIRE_TRANSPORT(options.transport);
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
