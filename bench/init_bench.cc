// init_bench.cc: chorus-init-bench, what a communicator costs to make and what it holds, per rank
// count, transport and CHORUS_CONNECT: forks the ranks of each configuration on this machine and
// prints, over its ranks, the slowest init, the open file descriptors and connections after init,
// the first ring all-reduce (which makes its connections, lazily), and the descriptors and
// connections after it, then a second all-reduce for comparison.
//
//   chorus-init-bench [--ranks 8,32,128] [--transport shm,tcp] [--connect lazy,eager] [--json FILE]
#include <chorus/chorus.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct RankReport {
  int ok = 0;
  double initMs = 0;
  int fdsAfterInit = 0;
  int connectionsAfterInit = 0;
  double firstAllReduceMs = 0;
  double secondAllReduceMs = 0;
  int fdsAfter = 0;
  int connectionsAfter = 0;
  char error[256] = {};
};

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) parts.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

int openDescriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

int connectionsOf(chorusComm_t comm) {
  size_t size = 0;
  if (chorusCommGetStats(comm, CHORUS_STATS_JSON, nullptr, &size) != chorusSuccess) return -1;
  std::string text(size, '\0');
  if (chorusCommGetStats(comm, CHORUS_STATS_JSON, text.data(), &size) != chorusSuccess) return -1;
  text.resize(size > 0 ? size - 1 : 0);
  return nlohmann::json::parse(text)["connections"].get<int>();
}

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void runRank(const chorusUniqueId& id, int nranks, int rank, RankReport* report) {
  auto failed = [&](const char* what, chorusComm_t comm) {
    std::snprintf(report->error, sizeof(report->error), "%s: %s", what, chorusGetLastError(comm));
  };
  const Clock::time_point start = Clock::now();
  chorusComm_t comm = nullptr;
  if (chorusCommInitRank(&comm, nranks, id, rank) != chorusSuccess) return failed("init", nullptr);
  report->initMs = msSince(start);
  report->fdsAfterInit = openDescriptors();
  report->connectionsAfterInit = connectionsOf(comm);
  float value = 1.0f;
  if (chorusCommSetAlgorithms(comm, "allreduce:ring") != chorusSuccess) return failed("algorithm", comm);
  for (double* ms : {&report->firstAllReduceMs, &report->secondAllReduceMs}) {
    const Clock::time_point call = Clock::now();
    if (chorusAllReduce(&value, &value, 1, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess) {
      return failed("all-reduce", comm);
    }
    *ms = msSince(call);
  }
  report->fdsAfter = openDescriptors();
  report->connectionsAfter = connectionsOf(comm);
  if (value != static_cast<float>(nranks) * static_cast<float>(nranks)) {
    std::snprintf(report->error, sizeof(report->error), "all-reduce gave %g, not %d", value, nranks * nranks);
    return;
  }
  chorusCommDestroy(comm);
  report->ok = 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ranksText = "8,32,128", transports = "shm,tcp", connects = "lazy,eager", jsonFile;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--ranks" || flag == "--transport" || flag == "--connect" || flag == "--json") && i + 1 < argc) {
      (flag == "--ranks"       ? ranksText
       : flag == "--transport" ? transports
       : flag == "--connect"   ? connects
                               : jsonFile) = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--ranks 8,32,128] [--transport shm,tcp] [--connect lazy,eager] [--json FILE]\n",
                   argv[0]);
      return flag == "-h" || flag == "--help" ? 0 : 2;
    }
  }
  std::printf(
      "# chorus-init-bench: per configuration, the slowest rank's init and all-reduce times and the most\n"
      "# descriptors and connections any rank holds (a ring all-reduce of one float, forced)\n");
  std::printf("%6s %9s %7s %10s %8s %8s %12s %12s %8s %8s  %s\n", "ranks", "transport", "connect", "init_ms", "fds",
              "conns", "allreduce1", "allreduce2", "fds", "conns", "");
  std::printf("%6s %9s %7s %10s %8s %8s %12s %12s %8s %8s\n", "", "", "", "", "(init)", "(init)", "(ms)", "(ms)",
              "(after)", "(after)");
  nlohmann::json rows = nlohmann::json::array();
  int code = 0;
  for (const std::string& text : splitCommas(ranksText)) {
    const int nranks = std::atoi(text.c_str());
    if (nranks < 1) {
      std::fprintf(stderr, "chorus-init-bench: --ranks %s: not a rank count\n", text.c_str());
      return 2;
    }
    for (const std::string& transport : splitCommas(transports)) {
      for (const std::string& connect : splitCommas(connects)) {
        // The ranks start together once all are forked: a rank forked after others have met the
        // id's root (a thread of this process) would inherit the root's sockets to them.
        const size_t bytes = 64 + sizeof(RankReport) * static_cast<size_t>(nranks);
        void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (shared == MAP_FAILED) return 2;
        auto* go = new (shared) std::atomic<int>(0);
        auto* reports = new (static_cast<char*>(shared) + 64) RankReport[static_cast<size_t>(nranks)];
        chorusUniqueId id;
        if (chorusGetUniqueId(&id) != chorusSuccess) return 2;
        std::fflush(stdout);
        std::vector<pid_t> children;
        for (int rank = 0; rank < nranks; ++rank) {
          const pid_t pid = fork();
          if (pid == 0) {
            setenv("CHORUS_TRANSPORT", transport.c_str(), 1);
            setenv("CHORUS_CONNECT", connect.c_str(), 1);
            while (go->load() == 0) usleep(1000);
            runRank(id, nranks, rank, &reports[rank]);
            _exit(0);
          }
          children.push_back(pid);
        }
        go->store(1);
        for (pid_t child : children) waitpid(child, nullptr, 0);
        RankReport worst;
        worst.ok = 1;
        std::string error;
        for (int rank = 0; rank < nranks; ++rank) {
          const RankReport& r = reports[rank];
          if (r.ok == 0 && error.empty()) {
            error = "rank " + std::to_string(rank) + ": " + (r.error[0] != 0 ? r.error : "exited early");
          }
          worst.ok &= r.ok;
          worst.initMs = std::max(worst.initMs, r.initMs);
          worst.fdsAfterInit = std::max(worst.fdsAfterInit, r.fdsAfterInit);
          worst.connectionsAfterInit = std::max(worst.connectionsAfterInit, r.connectionsAfterInit);
          worst.firstAllReduceMs = std::max(worst.firstAllReduceMs, r.firstAllReduceMs);
          worst.secondAllReduceMs = std::max(worst.secondAllReduceMs, r.secondAllReduceMs);
          worst.fdsAfter = std::max(worst.fdsAfter, r.fdsAfter);
          worst.connectionsAfter = std::max(worst.connectionsAfter, r.connectionsAfter);
        }
        munmap(shared, bytes);
        if (worst.ok == 0) {
          code = 1;
          std::printf("%6d %9s %7s  failed: %s\n", nranks, transport.c_str(), connect.c_str(), error.c_str());
        } else {
          std::printf("%6d %9s %7s %10.1f %8d %8d %12.2f %12.3f %8d %8d\n", nranks, transport.c_str(), connect.c_str(),
                      worst.initMs, worst.fdsAfterInit, worst.connectionsAfterInit, worst.firstAllReduceMs,
                      worst.secondAllReduceMs, worst.fdsAfter, worst.connectionsAfter);
        }
        rows.push_back({{"ranks", nranks},
                        {"transport", transport},
                        {"connect", connect},
                        {"ok", worst.ok != 0},
                        {"error", error},
                        {"init_ms", worst.initMs},
                        {"fds_after_init", worst.fdsAfterInit},
                        {"connections_after_init", worst.connectionsAfterInit},
                        {"first_allreduce_ms", worst.firstAllReduceMs},
                        {"second_allreduce_ms", worst.secondAllReduceMs},
                        {"fds_after", worst.fdsAfter},
                        {"connections_after", worst.connectionsAfter}});
      }
    }
  }
  if (!jsonFile.empty()) std::ofstream(jsonFile) << rows.dump(1) << "\n";
  return code;
}
