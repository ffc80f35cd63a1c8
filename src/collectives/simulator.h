// simulator.h: runs every rank's schedule of one collective in one process, on real data, the
// way the executor runs them: steps are issued in order, a step waits only for the earlier
// incomplete steps whose byte ranges it conflicts with, and a send completes only when the
// matching receive has been posted (no buffering at all). A schedule that finishes here cannot
// deadlock on any FIFO or socket size, and its results are the ones real ranks would get.
// Used by tests (correctness at up to 1024+ ranks) and, later, collbench --simulate.
#pragma once

#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {

struct SimulatedRank {
  Schedule schedule;
  std::vector<char> input;
  std::vector<char> output;
  std::vector<char> scratch;
  // In place: input and output are views of `output` at these byte offsets, as in-place calls
  // pass them (all-gather: input at rank * count * size; reduce-scatter: output there).
  bool inPlace = false;
  size_t inputOffset = 0;
  size_t outputOffset = 0;
};

struct SimulationResult {
  bool ok = true;
  std::string error;  // the deadlock or mismatch, naming ranks and steps
  size_t messages = 0;
  size_t rounds = 0;  // passes over all ranks until done: a rough count of dependent steps
};

// Allocates each rank's scratch, runs, and reports. Reductions use the CPU kernels.
SimulationResult simulate(std::vector<SimulatedRank>& ranks, chorusDataType_t type, chorusRedOp_t op);

}  // namespace chorus::collectives
