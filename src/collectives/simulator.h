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

// With nranks larger than schedules.size() = P (a multiple of ranksPerHost, dividing nranks), the
// schedules are ranks 0..P-1 only, standing for all: rank r runs rank (r mod P)'s schedule with
// every peer shifted by r - r mod P. The machine is the same seen from every block of P ranks, so
// every rank's times equal its stand-in's: a message from stand-in j to rank q lands, by the
// same shift, at stand-in q mod P from rank j - (q - q mod P). buildAllSchedules checks the
// ranks are such shifted copies before it returns a set like that.
TimingResult simulateTime(const std::vector<Schedule>& schedules, const NetworkModel& model, int nranks = 0);

// Every rank's schedule of one call (args.rank is set per rank). When they would hold more than
// maxSteps steps in all, the schedules of one host (of ranksPerHost ranks, or of one rank when
// ranksPerHost is 0) stand for all, if the other ranks' schedules are shifted copies of theirs
// (checked on the second and the last host and on ranks spread between); otherwise returns none
// and an error saying so.
struct ScheduleSet {
  std::vector<Schedule> schedules;
  int nranks = 0;  // ranks the set stands for; more than schedules.size() when one host stands for all
  std::string error;
};
ScheduleSet buildAllSchedules(ScheduleArgs args, int ranksPerHost = 0, size_t maxSteps = 50'000'000);

// Whether `other` is `stand` with every peer shifted by `shift` (mod nranks) and its byte ranges
// renamed one to one (same kinds, sizes and buffers; in each, any two ranges are identical or
// disjoint), so both ranks wait on the same steps and send the same bytes. Says why not in *why.
bool isShiftedCopy(const Schedule& stand, const Schedule& other, int shift, int nranks, std::string* why);

}  // namespace chorus::collectives
