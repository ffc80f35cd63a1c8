// launched_collectives.cc: every collective checked on ranks started by a launcher (chorusrun,
// mpiexec, one per namespace host), not forked by the test: the end-to-end tests across hosts
// run it. Each rank prints one line (with the processors it may run on) and exits 0 when every
// check passed. CHORUS_TEST_COUNTS=small leaves out the large count (for runs that check where the
// ranks ran, not the pipelined paths).
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/support/collective_checks.h"

namespace chorus {
namespace {

TEST(LaunchedRanksTest, EveryCollectiveTypeOpCountAndPlacement) {
  chorusComm_t comm = nullptr;
  ASSERT_EQ(chorusCommInitFromEnv(&comm, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  int rank = -1, nranks = 0;
  ASSERT_EQ(chorusCommUserRank(comm, &rank), chorusSuccess);
  ASSERT_EQ(chorusCommCount(comm, &nranks), chorusSuccess);
  const char* counts = std::getenv("CHORUS_TEST_COUNTS");
  auto check = [&](std::initializer_list<size_t> sizes) {
    testing::checkEveryCollective(
        comm, rank, nranks, sizes,
        {chorusInt8, chorusInt32, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16},
        {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}, /*withSendRecv=*/true);
  };
  if (counts != nullptr && std::string(counts) == "small") {
    check({0, 1, 7, 1023});
  } else {
    check({0, 1, 7, 1023, (1u << 20) + 3});
  }
  ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
  if (!HasFailure()) {
    const char* transport = std::getenv("CHORUS_TRANSPORT");
    // The processors it may run on, as CHORUS_BIND left them.
    cpu_set_t set;
    CPU_ZERO(&set);
    std::string cpus;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        if (!cpus.empty()) cpus += ',';
        cpus += std::to_string(cpu);
      }
    }
    std::printf("rank %d of %d: every collective right (transport %s, processors %s)\n", rank, nranks,
                transport != nullptr ? transport : "auto", cpus.c_str());
  }
  chorusCommDestroy(comm);
}

}  // namespace
}  // namespace chorus
