// schedule.cc: shared pieces of schedules: names, access ranges, point-to-point.
#include "src/collectives/schedule.h"

#include <algorithm>

#include "src/collectives/descriptor.h"
#include "src/collectives/traits.h"

namespace chorus::collectives {

const char* collectiveName(Collective collective) { return traitsOf(collective).name; }

const char* stepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kSend:
      return "send";
    case StepKind::kRecv:
      return "recv";
    case StepKind::kRecvReduce:
      return "recv-reduce";
    case StepKind::kCopy:
      return "copy";
    case StepKind::kDivide:
      return "divide";
    case StepKind::kReduce:
      return "reduce";
    case StepKind::kReducePeers:
      return "reduce-peers";
    case StepKind::kAgree:
      return "agree";
    case StepKind::kFold:
      return "fold";
  }
  return "unknown";
}

int stepAccesses(const Step& step, Access out[4]) {
  int n = 0;
  switch (step.kind) {
    case StepKind::kSend:
      out[n++] = {step.src, step.bytes, false};
      break;
    case StepKind::kRecv:
      out[n++] = {step.dst, step.bytes, true};
      break;
    case StepKind::kRecvReduce:
      out[n++] = {step.src, step.bytes, false};
      out[n++] = {step.tmp, step.bytes, true};
      out[n++] = {step.dst, step.bytes, true};
      break;
    case StepKind::kCopy:
      out[n++] = {step.src, step.bytes, false};
      out[n++] = {step.dst, step.bytes, true};
      break;
    case StepKind::kReduce:
      out[n++] = {step.src, step.bytes, false};
      out[n++] = {step.tmp, step.bytes, false};
      out[n++] = {step.dst, step.bytes, true};
      break;
    case StepKind::kDivide:
      out[n++] = {step.dst, step.bytes, true};
      break;
    case StepKind::kReducePeers:  // this rank's share of it (the peers' are ordered by the ranks' meetings)
      out[n++] = {step.src, step.bytes, false};
      out[n++] = {step.dst, step.bytes, true};
      out[n++] = {step.tmp, 1, true};
      break;
    case StepKind::kAgree:
      out[n++] = {step.src, step.bytes, false};
      out[n++] = {step.tmp, step.bytes, false};
      out[n++] = {step.dst, step.bytes, true};
      break;
    case StepKind::kFold:
      out[n++] = {step.src, step.bytes * static_cast<size_t>(step.parts), false};
      out[n++] = {step.tmp, step.bytes, false};
      out[n++] = {step.dst, step.bytes, true};
      break;
  }
  return n;
}

void prependAgreement(Schedule& schedule, int nranks, int rank, size_t recordBytes) {
  // Records on cache lines after the schedule's scratch: this rank's after each round (round 0's
  // its own), then what each round received.
  const size_t stride = (recordBytes + 63) / 64 * 64;
  const size_t base = (schedule.scratchBytes + 63) / 64 * 64;
  const std::vector<DisseminationRound> exchange = disseminationRounds(nranks, rank);
  const int rounds = static_cast<int>(exchange.size());
  auto known = [&](int round) { return at(BufferId::kScratch, base + static_cast<size_t>(round) * stride); };
  auto received = [&](int round) {
    return at(BufferId::kScratch, base + static_cast<size_t>(rounds + 1 + round) * stride);
  };
  std::vector<Step> steps;
  for (int k = 0; k < rounds; ++k) {
    steps.push_back(sendStep(exchange[k].to, known(k), recordBytes));
    steps.push_back(recvStep(exchange[k].from, received(k), recordBytes));
    steps.push_back(agreeStep(known(k), received(k), known(k + 1), recordBytes, k + 1 == rounds));
  }
  schedule.agreementSteps = steps.size();
  schedule.recordOffset = known(0).offset;
  schedule.scratchBytes = base + static_cast<size_t>(2 * rounds + 1) * stride;
  schedule.steps.insert(schedule.steps.begin(), steps.begin(), steps.end());
}

Schedule pointToPoint(const ScheduleArgs& args) {
  // One message of count elements to or from the peer (args.root); count 0 posts nothing.
  Schedule schedule;
  if (args.count == 0) return schedule;
  Step step;
  step.peer = args.root;
  step.bytes = args.count * args.typeSize;
  if (args.collective == Collective::kSend) {
    step.kind = StepKind::kSend;
    step.src = {BufferId::kInput, 0};
  } else {
    step.kind = StepKind::kRecv;
    step.dst = {BufferId::kOutput, 0};
  }
  schedule.steps.push_back(step);
  return schedule;
}

// Sends and receives: one message each (their cost is the message's, chorusPredictTime).
std::span<const AlgorithmDescriptor> pointToPointAlgorithms() {
  static constexpr AlgorithmDescriptor kAll[] = {
      {Collective::kSend, Algorithm::kPairwise, pointToPoint, onlyAlgorithmCost, Follows::kNumbers},
      {Collective::kRecv, Algorithm::kPairwise, pointToPoint, onlyAlgorithmCost, Follows::kNumbers},
  };
  return kAll;
}

}  // namespace chorus::collectives
