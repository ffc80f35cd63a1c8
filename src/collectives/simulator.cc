// simulator.cc: the in-process execution of all ranks' schedules (see simulator.h).
#include "src/collectives/simulator.h"

#include <cstring>
#include <deque>
#include <string>

#include "kernels/cpu/reduce.h"

namespace chorus::collectives {
namespace {

struct Range {
  const char* begin;
  const char* end;
  bool write;
};

struct Pending {
  size_t step;
  Range ranges[4];
  int rangeCount;
  bool done = false;
};

struct RankState {
  SimulatedRank* rank;
  size_t next = 0;
  std::vector<Pending> inFlight;
  char* base(BufferId id) {
    switch (id) {
      case BufferId::kInput:
        return rank->inPlace ? rank->output.data() + rank->inputOffset : rank->input.data();
      case BufferId::kOutput:
        return rank->output.data() + (rank->inPlace ? rank->outputOffset : 0);
      case BufferId::kScratch:
        return rank->scratch.data();
    }
    return nullptr;
  }
  size_t extent(BufferId id) const {
    switch (id) {
      case BufferId::kInput:
        return rank->inPlace ? rank->output.size() - rank->inputOffset : rank->input.size();
      case BufferId::kOutput:
        return rank->output.size() - (rank->inPlace ? rank->outputOffset : 0);
      case BufferId::kScratch:
        return rank->scratch.size();
    }
    return 0;
  }
};

struct Message {
  int rank;
  size_t step;
  const char* data;
  size_t bytes;
};

bool conflicts(const Pending& a, const Pending& b) {
  for (int i = 0; i < a.rangeCount; ++i) {
    for (int j = 0; j < b.rangeCount; ++j) {
      const Range& x = a.ranges[i];
      const Range& y = b.ranges[j];
      if ((x.write || y.write) && x.begin < y.end && y.begin < x.end) return true;
    }
  }
  return false;
}

}  // namespace

SimulationResult simulate(std::vector<SimulatedRank>& ranks, chorusDataType_t type, chorusRedOp_t op) {
  SimulationResult result;
  const int n = static_cast<int>(ranks.size());
  const size_t size = kernels::typeSize(type);
  std::vector<RankState> states(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].scratch.assign(ranks[r].schedule.scratchBytes, 0);
    states[r].rank = &ranks[r];
  }
  // Posted, unmatched sends and receives per ordered pair (src * n + dst).
  std::vector<std::deque<Message>> sends(static_cast<size_t>(n) * n);
  std::vector<std::deque<Message>> recvs(static_cast<size_t>(n) * n);
  // Pairs with something posted, so matching does not visit all n*n pairs every round.
  std::vector<size_t> active;
  std::vector<char> isActive(static_cast<size_t>(n) * n, 0);
  auto touch = [&](size_t pair) {
    if (!isActive[pair]) {
      isActive[pair] = 1;
      active.push_back(pair);
    }
  };
  auto fail = [&](const std::string& text) {
    result.ok = false;
    result.error = text;
    return result;
  };
  auto markDone = [&](RankState& state, size_t step) {
    for (size_t i = state.inFlight.size(); i-- > 0;) {  // recent steps are at the back
      if (state.inFlight[i].step == step) {
        state.inFlight[i].done = true;
        break;
      }
    }
  };

  for (;;) {
    bool moved = false;
    bool finished = true;
    ++result.rounds;
    for (int r = 0; r < n; ++r) {
      RankState& state = states[r];
      const auto& steps = state.rank->schedule.steps;
      std::erase_if(state.inFlight, [](const Pending& p) { return p.done; });
      while (state.next < steps.size()) {
        const Step& step = steps[state.next];
        Pending pending{state.next, {}, 0};
        Access accesses[4];
        pending.rangeCount = stepAccesses(step, accesses);
        for (int i = 0; i < pending.rangeCount; ++i) {
          const BufferId buffer = accesses[i].span.buffer;
          const size_t limit = state.extent(buffer);
          if (accesses[i].span.offset + accesses[i].bytes > limit) {
            return fail("rank " + std::to_string(r) + " step " + std::to_string(state.next) + " (" +
                        stepKindName(step.kind) + ") reaches past its buffer: offset " +
                        std::to_string(accesses[i].span.offset) + " + " + std::to_string(accesses[i].bytes) +
                        " bytes > " + std::to_string(limit));
          }
          const char* begin = state.base(buffer) + accesses[i].span.offset;
          pending.ranges[i] = {begin, begin + accesses[i].bytes, accesses[i].write};
        }
        bool blocked = false;
        for (const Pending& p : state.inFlight) blocked = blocked || (!p.done && conflicts(p, pending));
        if (blocked) break;
        char* src = state.base(step.src.buffer) + step.src.offset;
        char* dst = state.base(step.dst.buffer) + step.dst.offset;
        char* tmp = state.base(step.tmp.buffer) + step.tmp.offset;
        switch (step.kind) {
          case StepKind::kSend:
            if (step.peer < 0 || step.peer >= n)
              return fail("rank " + std::to_string(r) + " sends to rank " + std::to_string(step.peer));
            sends[static_cast<size_t>(r) * n + step.peer].push_back({r, state.next, src, step.bytes});
            touch(static_cast<size_t>(r) * n + step.peer);
            state.inFlight.push_back(pending);
            break;
          case StepKind::kRecv:
          case StepKind::kRecvReduce:
            if (step.peer < 0 || step.peer >= n)
              return fail("rank " + std::to_string(r) + " receives from rank " + std::to_string(step.peer));
            recvs[static_cast<size_t>(step.peer) * n + r].push_back({r, state.next, nullptr, step.bytes});
            touch(static_cast<size_t>(step.peer) * n + r);
            state.inFlight.push_back(pending);
            break;
          case StepKind::kCopy:
            if (src != dst) std::memmove(dst, src, step.bytes);
            break;
          case StepKind::kDivide:
            kernels::divide(dst, step.bytes / size, type, n);
            break;
          case StepKind::kReduce:
            kernels::reduce(dst, src, tmp, step.bytes / size, type, op);
            break;
        }
        ++state.next;
        moved = true;
      }
      finished = finished && state.next == steps.size();
    }
    // Match sends with posted receives, in posting order per pair.
    std::vector<size_t> stillActive;
    for (size_t pair : active) {
      const int src = static_cast<int>(pair / n);
      const int dst = static_cast<int>(pair % n);
      auto& sq = sends[pair];
      auto& rq = recvs[pair];
      while (!sq.empty() && !rq.empty()) {
        const Message send = sq.front();
        const Message recv = rq.front();
        sq.pop_front();
        rq.pop_front();
        if (send.bytes != recv.bytes) {
          return fail("rank " + std::to_string(src) + " step " + std::to_string(send.step) + " sends " +
                      std::to_string(send.bytes) + " bytes to rank " + std::to_string(dst) + ", whose step " +
                      std::to_string(recv.step) + " receives " + std::to_string(recv.bytes));
        }
        RankState& receiver = states[dst];
        const Step& step = receiver.rank->schedule.steps[recv.step];
        const Span landing = step.kind == StepKind::kRecv ? step.dst : step.tmp;
        char* into = receiver.base(landing.buffer) + landing.offset;
        if (send.bytes > 0) std::memcpy(into, send.data, send.bytes);
        if (step.kind == StepKind::kRecvReduce) {
          kernels::reduce(receiver.base(step.dst.buffer) + step.dst.offset,
                          receiver.base(step.src.buffer) + step.src.offset, into, step.bytes / size, type, op);
        }
        markDone(states[src], send.step);
        markDone(receiver, recv.step);
        ++result.messages;
        moved = true;
      }
      if (sq.empty() && rq.empty()) {
        isActive[pair] = 0;
      } else {
        stillActive.push_back(pair);
      }
    }
    active.swap(stillActive);
    if (finished) {
      bool quiet = true;
      for (RankState& state : states) {
        for (const Pending& p : state.inFlight) quiet = quiet && p.done;
      }
      if (quiet) break;
    }
    if (!moved) {
      std::string stuck;
      for (int r = 0; r < n && stuck.size() < 600; ++r) {
        const auto& steps = states[r].rank->schedule.steps;
        if (states[r].next < steps.size()) {
          const Step& step = steps[states[r].next];
          stuck += " rank " + std::to_string(r) + " at step " + std::to_string(states[r].next) + " (" +
                   stepKindName(step.kind) + " peer " + std::to_string(step.peer) + ");";
        }
      }
      return fail("deadlock: no rank can move;" + stuck);
    }
  }
  return result;
}

}  // namespace chorus::collectives
