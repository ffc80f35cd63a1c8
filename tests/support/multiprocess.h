// multiprocess.h: runs test bodies in real forked processes, one per rank, joined by a chorus
// communicator (or handed a unique id, for bootstrap tests). The parent waits with a deadline
// and kills everything past it, so a hang fails the test instead of stalling the suite.
#pragma once

#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <functional>
#include <new>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus::testing {

// Whether this build of chorus has the transport (ucx only where UCX was found at build time).
inline bool transportBuilt(const std::string& name) {
#if defined(CHORUS_TEST_HAVE_UCX)
  (void)name;
  return true;
#else
  return name != "ucx";
#endif
}

// Skips the test, naming the reason, where the build lacks the transport.
#define CHORUS_REQUIRE_TRANSPORT(name)                                                                 \
  do {                                                                                                 \
    if (!::chorus::testing::transportBuilt(name)) {                                                    \
      GTEST_SKIP() << "this build of chorus has no " << (name) << " transport (UCX was not found, or " \
                   << "CHORUS_WITH_UCX was OFF, when it was built)";                                   \
    }                                                                                                  \
  } while (0)

struct RanksOptions {
  int nranks = 2;
  const char* transport = "auto";  // auto | shm | tcp | ucx
  int timeoutMs = 60000;           // per-operation timeout inside the ranks
  int initTimeoutMs = 30000;
  int deadlineSeconds = 600;  // the whole run, enforced by the parent
};

// Nanoseconds on CLOCK_MONOTONIC (steady_clock), one clock for every process of the host: what
// ranks report of when things happened is compared across processes.
int64_t monotonicNs();

// A T in memory the test shares with the ranks it forks (MAP_SHARED): what they report of
// themselves. Unmapped when this goes.
template <typename T>
class SharedWithRanks {
 public:
  SharedWithRanks() {
    void* memory = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw std::runtime_error("mmap of memory shared with the ranks failed");
    value_ = new (memory) T();
  }
  ~SharedWithRanks() {
    value_->~T();
    munmap(value_, sizeof(T));
  }
  SharedWithRanks(const SharedWithRanks&) = delete;
  SharedWithRanks& operator=(const SharedWithRanks&) = delete;
  // Starts over with a fresh T.
  void reset() {
    value_->~T();
    new (value_) T();
  }
  T* operator->() const { return value_; }
  T& operator*() const { return *value_; }

 private:
  T* value_;
};

// Exit status of each rank: 0 when it passed; 124 when the parent killed it at the deadline.
using RankBody = std::function<void(int rank, const chorusUniqueId& id)>;
std::vector<int> runProcesses(int nranks, const RankBody& body, int deadlineSeconds = 600);

// The transport x rank-count matrix of the multi-process tests: shm, tcp and ucx; 1, 2, 3, 4, 5, 8.
struct TransportRanks {
  const char* transport;
  int nranks;
};
void PrintTo(const TransportRanks& param, std::ostream* os);
// The options of a run on param's transport and rank count (the rest at their defaults).
RanksOptions optionsFor(const TransportRanks& param);
std::vector<TransportRanks> transportRankMatrix();
// Test-name suffix, e.g. "shm_4"; for tests parameterised by the transport alone, e.g. "ucx".
std::string transportName(const ::testing::TestParamInfo<const char*>& info);
std::string transportRanksName(const ::testing::TestParamInfo<TransportRanks>& info);

// Runs body(rank, comm) on nranks ranks sharing one communicator. Fails (gtest) if any rank's
// init fails, any assertion in a rank fails, or any rank does not finish by the deadline.
void runRanks(const RanksOptions& options, const std::function<void(int rank, chorusComm_t comm)>& body);

}  // namespace chorus::testing
