// collbench.cc: the chorus collective benchmark. nccl-tests' flags and columns (size, count,
// type, redop, root, then time, algbw, busbw and #wrong for out-of-place and in-place), with
// a correctness check against closed-form results, JSON output, and three ways to start:
// `collbench -g 4 ...` forks 4 local ranks itself; under `mpiexec -n 4 collbench ...` or
// `chorusrun -n 4 collbench ...` every process is one rank (chorusCommInitFromEnv).
// The calibration and the timing simulator are their own tools (chorus-tune, chorus-sim);
// `collbench --calibrate` and `collbench --simulate` hand the command line to them.
#include <chorus/chorus.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/engine.h"
#include "bench/launch.h"
#include "bench/options.h"

namespace {

using chorus::bench::Options;

// Runs `tool` (chorus-sim, chorus-tune) with this command line: the one beside this collbench
// (an install's bin/, the build tree's bench/), else the PATH's. Returns only on failure.
int forward(const char* tool, char** argv) {
  std::fflush(stdout);
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) > 0) {
    std::string beside = self;
    beside = beside.substr(0, beside.rfind('/') + 1) + tool;
    if (access(beside.c_str(), X_OK) == 0) execv(beside.c_str(), argv);
  }
  execvp(tool, argv);
  std::fprintf(stderr, "collbench: cannot start %s (beside collbench or on the PATH): %s\n", tool,
               std::strerror(errno));
  return 2;
}

int runRank(const Options& options, chorusComm_t comm) {
  int code = 2;
  std::vector<std::unique_ptr<chorus::bench::Peer>> peers;
  if (!options.compress.empty()) {
    code = chorus::bench::runCompressed(options, comm);
  } else if (chorus::bench::startPeers(options, comm, &peers)) {
    code = chorus::bench::Bench(options, comm, std::move(peers)).run();
  }
  chorusCommDestroy(comm);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int code = chorus::bench::parseOptions(argc, argv, &o); code >= 0) return code;
  if (o.simulate) return forward("chorus-sim", argv);
  if (!o.calibrate.empty()) return forward("chorus-tune", argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return chorus::bench::runRanks(o, &argc, &argv, [&](chorusComm_t comm) { return runRank(o, comm); });
}
