// launch.cc: how collbench's ranks start (launch.h).
#include "bench/launch.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace chorus::bench {

namespace {

// The peers --compare names, in order; empty (with the reason on stderr) when one is unknown.
std::vector<std::string> comparedPeers(const Options& o, bool* ok) {
  std::vector<std::string> peers;
  *ok = true;
  for (const std::string& name : splitCommas(o.compare)) {
    if (name.empty()) continue;
    if (name != "gloo" && name != "mpi") {
      std::fprintf(stderr, "collbench: --compare %s: unknown peer (gloo, mpi)\n", name.c_str());
      *ok = false;
    }
#ifndef CHORUS_COLLBENCH_GLOO
    if (name == "gloo") {
      std::fprintf(stderr, "collbench: --compare gloo: this collbench was built without Gloo (libgloo-dev)\n");
      *ok = false;
    }
#endif
#ifndef CHORUS_COLLBENCH_MPI
    if (name == "mpi") {
      std::fprintf(stderr, "collbench: --compare mpi: this collbench was built without MPI (libmpich-dev)\n");
      *ok = false;
    }
#endif
    if (std::find(peers.begin(), peers.end(), name) == peers.end()) peers.push_back(name);
  }
  return peers;
}

// The CPUs this process may run on, ascending (empty if the kernel will not say).
std::vector<int> allowedCpuList() {
  cpu_set_t allowed;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

// The same as text: "0-3", "0,2", "5".
std::string allowedCpus() {
  const std::vector<int> cpus = allowedCpuList();
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus[i]);
    if (j > i) text += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return text.empty() ? "?" : text;
}

namespace {

// Pins this process to the rank-th CPU of those it may run on (round robin when ranks outnumber them).
bool bindToCore(int rank) {
  const std::vector<int> cpus = allowedCpuList();
  if (cpus.empty()) {
    std::perror("collbench: sched_getaffinity");
    return false;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  const int cpu = cpus[static_cast<size_t>(rank) % cpus.size()];
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) {
    std::fprintf(stderr, "collbench rank %d: cannot bind to CPU %d: %s\n", rank, cpu, std::strerror(errno));
    return false;
  }
  return true;
}

bool launchedAsRank() {
  for (const char* name : {"CHORUS_RANK", "RANK", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  // A task of an srun step of several tasks (one task forks -g ranks itself).
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  return std::getenv("SLURM_PROCID") != nullptr && tasks != nullptr && std::string(tasks) != "1";
}

#ifdef CHORUS_COLLBENCH_GLOO
// Gloo's ranks meet through a file store: a fresh directory rank 0 makes (under --gloo-store, or
// TMPDIR, or /tmp), which every rank must see. Removed once the mesh stands.
std::unique_ptr<Peer> startGloo(const Options& o, chorusComm_t comm, int rank, int nranks) {
  char dir[512] = {};
  if (rank == 0) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = !o.glooStore.empty() ? o.glooStore : tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    std::snprintf(dir, sizeof(dir), "%s/collbench-gloo-XXXXXX", base.c_str());
    if (mkdtemp(dir) == nullptr) {
      std::fprintf(stderr, "collbench: --compare gloo: cannot make a store directory under %s: %s\n", base.c_str(),
                   std::strerror(errno));
      dir[0] = '\0';
    }
  }
  if (chorusBroadcast(dir, dir, sizeof(dir), chorusUint8, 0, comm, nullptr) != chorusSuccess) return nullptr;
  struct stat st {};
  int visible = dir[0] != '\0' && stat(dir, &st) == 0 && S_ISDIR(st.st_mode), everywhere = 0;
  if (chorusAllReduce(&visible, &everywhere, 1, chorusInt32, chorusMin, comm, nullptr) != chorusSuccess) return nullptr;
  if (!everywhere) {
    if (!visible && dir[0] != '\0') {
      std::fprintf(stderr,
                   "collbench rank %d: --compare gloo: the store directory %s is not visible here (ranks on several "
                   "hosts need --gloo-store on a shared filesystem)\n",
                   rank, dir);
    }
    return nullptr;
  }
  std::unique_ptr<Peer> peer;
  try {
    peer = makeGlooPeer(rank, nranks, dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collbench: %s\n", e.what());
  }
  int up = peer != nullptr, all = 0;
  chorusAllReduce(&up, &all, 1, chorusInt32, chorusMin, comm, nullptr);
  if (rank == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  return all ? std::move(peer) : nullptr;
}
#endif

}  // namespace

// The peers --compare names, started on every rank; false (the reason on stderr) when one fails
// on any rank.
bool startPeers(const Options& o, chorusComm_t comm, std::vector<std::unique_ptr<Peer>>* peers) {
  int rank = 0, nranks = 1;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &nranks);
  bool known = true;
  for ([[maybe_unused]] const std::string& name : comparedPeers(o, &known)) {  // (a build without peers)
    std::unique_ptr<Peer> peer;
#ifdef CHORUS_COLLBENCH_GLOO
    if (name == "gloo") peer = startGloo(o, comm, rank, nranks);
#endif
#ifdef CHORUS_COLLBENCH_MPI
    if (name == "mpi") {
      try {
        peer = makeMpiPeer(rank, nranks);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "collbench: %s\n", e.what());
      }
    }
#endif
    int up = peer != nullptr, all = 0;
    if (chorusAllReduce(&up, &all, 1, chorusInt32, chorusMin, comm, nullptr) != chorusSuccess || !all) return false;
    peers->push_back(std::move(peer));
  }
  return known;
}

namespace {

#ifdef CHORUS_COLLBENCH_MPI
// -g N --compare mpi: runs this collbench again as N ranks of mpiexec, with the same arguments
// (-g is ignored there); --bind core becomes mpiexec's -bind-to core. Returns only on failure.
int execUnderMpiexec(const Options& o, int argc, char** argv) {
  char self[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    std::perror("collbench: readlink /proc/self/exe");
    return 2;
  }
  std::vector<std::string> args = {CHORUS_MPIEXEC_PATH, "-n", std::to_string(o.localRanks)};
  if (o.bind == "core") args.insert(args.end(), {"-bind-to", "core"});
  args.push_back(self);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  std::fflush(stdout);
  execv(pointers[0], pointers.data());
  std::fprintf(stderr, "collbench: --compare mpi: cannot start %s: %s\n", pointers[0], std::strerror(errno));
  return 2;
}
#endif

}  // namespace

int runRanks(const Options& o, [[maybe_unused]] int* argc, [[maybe_unused]] char*** argv,
             const std::function<int(chorusComm_t)>& perRank) {
  bool peersKnown = true;
  const std::vector<std::string> peerNames = comparedPeers(o, &peersKnown);
  if (!peersKnown) return 2;
  if (std::find(peerNames.begin(), peerNames.end(), "mpi") != peerNames.end()) {
#ifdef CHORUS_COLLBENCH_MPI
    // MPI's ranks are mpiexec's processes: chorus meets over MPI then, and -g starts them so.
    if (std::getenv("PMI_RANK") != nullptr) {
      return runWithMpi(argc, argv, perRank);
    }
    if (launchedAsRank()) {
      std::fprintf(stderr, "collbench: --compare mpi: start collbench under mpiexec, or with -g N (not chorusrun)\n");
      return 2;
    }
    return execUnderMpiexec(o, *argc, *argv);
#endif
  }

  if (launchedAsRank()) {
    chorusComm_t comm = nullptr;
    const chorusResult_t result = chorusCommInitFromEnv(&comm, nullptr);
    if (result != chorusSuccess) {
      std::fprintf(stderr, "collbench: init from the environment failed: %s\n", chorusGetLastError(nullptr));
      return 2;
    }
    return perRank(comm);
  }

  // Start the ranks ourselves: one unique id, one forked process per rank.
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) {
    std::fprintf(stderr, "collbench: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < o.localRanks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("collbench: fork");
      return 2;
    }
    if (pid == 0) {
      if (o.bind == "core" && !bindToCore(rank)) _exit(2);
      chorusComm_t comm = nullptr;
      if (chorusCommInitRank(&comm, o.localRanks, id, rank) != chorusSuccess) {
        std::fprintf(stderr, "collbench rank %d: init failed: %s\n", rank, chorusGetLastError(nullptr));
        _exit(2);
      }
      const int code = perRank(comm);
      std::fflush(stdout);
      _exit(code);
    }
    pids.push_back(pid);
  }
  // Wait for every rank. When one fails, the others get a grace period to finish on their own
  // (after a wrong value every rank fails, and rank 0 still prints the footer), then are stopped.
  int firstFailure = 0;
  size_t remaining = pids.size();
  auto stopAt = std::chrono::steady_clock::time_point::max();
  while (remaining > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      if (std::chrono::steady_clock::now() > stopAt) {
        for (pid_t pid : pids) {
          if (pid > 0) kill(pid, SIGKILL);
        }
        stopAt = std::chrono::steady_clock::time_point::max();
      }
      usleep(2000);
      continue;
    }
    --remaining;
    for (pid_t& pid : pids) {
      if (pid == done) pid = -1;  // reaped: never signal a reused pid
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && firstFailure == 0) {
      firstFailure = code;
      std::fprintf(stderr, "collbench: rank process %d failed with status %d\n", done, code);
      stopAt = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  return firstFailure;
}

}  // namespace chorus::bench
