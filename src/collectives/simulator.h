// simulator.h: runs every rank's schedule of one collective in one process, on real data, the
// way the executor runs them: steps are issued in order, a step waits only for the earlier
// incomplete steps whose byte ranges it conflicts with, and a send completes only when the
// matching receive has been posted (no buffering at all). A schedule that finishes here cannot
// deadlock on any FIFO or socket size, and its results are the ones real ranks would get.
// Used by tests (correctness at up to 1024+ ranks). Timing mode, below, predicts times for
// collbench --simulate (up to tens of thousands of ranks).
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

namespace chorus::collectives {

// Timing mode: predicts how long one call takes on a modelled machine, running every rank's
// schedule with the executor's rules (steps posted in order, a step waits for the earlier steps
// it conflicts with) on a clock instead of data. A message costs alpha (latency) plus bytes *
// beta. A rank's outgoing port sends its messages one after another, in the order they were
// posted; a rank's incoming port takes in one message's bytes at a time (a message lands no
// sooner than bytes * beta after the one before it); between hosts, each host's one NIC, shared
// by its ranks, does the same in each direction. Sends are eager (a send's buffer is free once
// its bytes have left). Reductions, copies and divides occupy the
// rank's core for bytes * gamma or bytes * copy. All ranks start at time 0.
struct LinkCost {
  double alphaUs = 5;
  double betaUsPerByte = 2e-4;
};
struct NetworkModel {
  int ranksPerHost = 0;  // consecutive ranks share a host; 0: all ranks on one host
  LinkCost intraHost;    // between ranks of one host
  LinkCost interHost;    // between hosts
  double gammaUsPerByte = 2.5e-4;
  double copyUsPerByte = 1e-4;
};

struct TimingResult {
  bool ok = true;
  std::string error;    // a schedule that cannot finish, naming the ranks and steps
  double timeUs = 0;    // when the last rank finished
  size_t messages = 0;  // messages sent, all ranks
  size_t steps = 0;     // steps run, all ranks
};

TimingResult simulateTime(const std::vector<Schedule>& schedules, const NetworkModel& model);

// Every rank's schedule of one call (args.rank is set per rank). Instead of allocating schedules
// that together would hold more than maxSteps steps, returns none and an error saying so.
struct ScheduleSet {
  std::vector<Schedule> schedules;
  std::string error;
};
ScheduleSet buildAllSchedules(ScheduleArgs args, size_t maxSteps = 50'000'000);

}  // namespace chorus::collectives
