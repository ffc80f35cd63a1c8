// simulator.cc: the in-process execution of all ranks' schedules (see simulator.h): on data
// (correctness mode), then on a clock (timing mode).
#include "src/collectives/simulator.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <queue>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "kernels/cpu/reduce.h"

namespace chorus::collectives {
namespace {

struct Pending {
  size_t step;
  PlacedStep<const char*> placed;
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

// The issue rule's view of a step in flight (Pending, TimedStep): its ranges until it is done.
template <typename Entry>
const auto* placedIfPending(const Entry& entry) {
  return entry.done ? nullptr : &entry.placed;
}

// " rank r at step s (kind peer p);" for each rank with steps left (about 600 characters at most).
template <typename ScheduleOf, typename NextOf>
std::string unfinishedRanks(int n, ScheduleOf scheduleOf, NextOf nextOf) {
  std::string text;
  for (int r = 0; r < n && text.size() < 600; ++r) {
    const auto& steps = scheduleOf(r).steps;
    const size_t next = nextOf(r);
    if (next < steps.size()) {
      text += " rank " + std::to_string(r) + " at step " + std::to_string(next) + " (" +
              stepKindName(steps[next].kind) + " peer " + std::to_string(steps[next].peer) + ");";
    }
  }
  return text;
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
        Access accesses[4];
        for (int i = 0, count = stepAccesses(step, accesses); i < count; ++i) {
          const size_t limit = state.extent(accesses[i].span.buffer);
          if (accesses[i].span.offset + accesses[i].bytes > limit) {
            return fail("rank " + std::to_string(r) + " step " + std::to_string(state.next) + " (" +
                        stepKindName(step.kind) + ") reaches past its buffer: offset " +
                        std::to_string(accesses[i].span.offset) + " + " + std::to_string(accesses[i].bytes) +
                        " bytes > " + std::to_string(limit));
          }
        }
        const Pending pending{state.next, placeStep<const char*>(step, [&](BufferId b) { return state.base(b); })};
        if (mustWait(pending.placed, state.inFlight, placedIfPending<Pending>)) break;
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
          case StepKind::kReducePeers: {
            // Every rank's input read where it lies: the simulation holds them all.
            std::vector<const void*> from;
            std::vector<void*> to;
            reducePeersOperands(
                step, n, r, [&](int p) { return states[p].base(step.src.buffer); },
                [&](int p) { return states[p].base(step.dst.buffer); }, &from, &to);
            kernels::reduceMany(to.data(), static_cast<int>(to.size()), from.data(), n, step.bytes / size, type, op,
                                nullptr);
            *tmp = 1;
            break;
          }
          case StepKind::kAgree:
            break;  // call records are the executor's: the simulation runs calls the ranks agree on
          case StepKind::kFold: {
            std::vector<const void*> from(static_cast<size_t>(step.parts));
            for (int p = 0; p < step.parts; ++p) from[p] = p == r ? tmp : src + static_cast<size_t>(p) * step.bytes;
            void* to = dst;
            kernels::reduceMany(&to, 1, from.data(), step.parts, step.bytes / size, type, op, nullptr);
            break;
          }
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
      const std::string stuck = unfinishedRanks(
          n, [&](int r) -> const Schedule& { return states[r].rank->schedule; }, [&](int r) { return states[r].next; });
      return fail("deadlock: no rank can move;" + stuck);
    }
  }
  return result;
}

}  // namespace chorus::collectives

// ---- Timing mode -------------------------------------------------------------------------

namespace chorus::collectives {
namespace {

// A step's byte ranges in a virtual address space per rank: buffer b lives at (b + 1) << 48.
struct TimedStep {
  size_t step;
  PlacedStep<uint64_t> placed;
  bool done;
};
uint64_t virtualBase(BufferId buffer) { return (static_cast<uint64_t>(buffer) + 1) << 48; }

enum class EventKind : uint8_t { kReady, kSend, kArrive, kDone };
struct Event {
  double time;
  uint64_t sequence;  // ties run in the order they were scheduled
  EventKind kind;
  int rank;  // kReady, kDone: the rank; kSend, kArrive: the sender
  int peer;  // kSend, kArrive: the receiver
  size_t step;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

struct TimedRank {
  size_t next = 0;
  std::vector<TimedStep> inFlight;
  double clock = 0;  // the rank's thread: when it can post its next step
  double coreFree = 0;
  std::deque<std::pair<int, size_t>> outbox;  // sends posted and not yet started: (peer, step)
  double recvPortFree = 0;
  double finished = 0;
  bool blocked = false;
};

struct PendingRecv {
  size_t step;
  double postedAt;
};
struct PairQueue {
  std::deque<double> arrivals;    // messages arrived before their receive was posted
  std::deque<PendingRecv> recvs;  // receives posted before their message arrived
};

}  // namespace

TimingResult simulateTime(const std::vector<Schedule>& schedules, const NetworkModel& model, int nranks) {
  TimingResult result;
  const int period = static_cast<int>(schedules.size());  // the ranks simulated
  const int n = std::max(nranks, period);                 // the ranks they stand for
  const int perHost = model.ranksPerHost > 0 && model.ranksPerHost < n ? model.ranksPerHost : n;
  const int hosts = (n + perHost - 1) / perHost;
  auto fail = [&](const std::string& text) {
    result.ok = false;
    result.error = text;
    return result;
  };
  if (period < n && (period == 0 || n % period != 0 || (perHost < n && period % perHost != 0))) {
    return fail(std::to_string(period) + " schedules cannot stand for " + std::to_string(n) + " ranks of " +
                std::to_string(perHost) + " per host: they must be whole hosts and divide the ranks");
  }
  std::vector<TimedRank> ranks(period);
  std::vector<double> nicOutFree(hosts, 0), nicInFree(hosts, 0);
  std::unordered_map<uint64_t, PairQueue> pairs;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  uint64_t sequence = 0;
  auto push = [&](double time, EventKind kind, int rank, int peer, size_t step) {
    events.push({time, sequence++, kind, rank, peer, step});
  };
  auto pairOf = [&](int src, int dst) -> PairQueue& {
    return pairs[static_cast<uint64_t>(src) * static_cast<uint64_t>(n) + static_cast<uint64_t>(dst)];
  };
  // A receive whose message is in: a recv-reduce then reduces on the rank's core.
  auto receive = [&](int rank, size_t step, double at) {
    const Step& s = schedules[rank].steps[step];
    double done = at;
    if (s.kind == StepKind::kRecvReduce) {
      TimedRank& state = ranks[rank];
      done = std::max(at, state.coreFree) + static_cast<double>(s.bytes) * model.gammaUsPerByte;
      state.coreFree = done;
    }
    push(done, EventKind::kDone, rank, -1, step);
  };

  for (int r = 0; r < period; ++r) push(0, EventKind::kReady, r, -1, 0);
  while (!events.empty()) {
    const Event event = events.top();
    events.pop();
    switch (event.kind) {
      case EventKind::kReady: {
        TimedRank& state = ranks[event.rank];
        const auto& steps = schedules[event.rank].steps;
        double now = std::max(event.time, state.clock);
        std::erase_if(state.inFlight, [](const TimedStep& t) { return t.done; });
        while (state.next < steps.size()) {
          const Step& step = steps[state.next];
          const TimedStep timed{state.next, placeStep<uint64_t>(step, virtualBase), false};
          if (mustWait(timed.placed, state.inFlight, placedIfPending<TimedStep>)) {
            state.blocked = true;
            break;
          }
          ++result.steps;
          switch (step.kind) {
            case StepKind::kCopy:
            case StepKind::kDivide:
            case StepKind::kReduce:
            case StepKind::kReducePeers:
            case StepKind::kAgree:
            case StepKind::kFold: {
              const double perByte = step.kind == StepKind::kCopy ? model.copyUsPerByte : model.gammaUsPerByte;
              // A reduce-peers step folds n slices of its bytes, a fold its parts.
              const double folded =
                  step.kind == StepKind::kReducePeers ? n : (step.kind == StepKind::kFold ? step.parts : 1);
              now = std::max(now, state.coreFree) + folded * static_cast<double>(step.bytes) * perByte;
              state.coreFree = now;
              state.finished = std::max(state.finished, now);
              break;
            }
            case StepKind::kSend:
              if (step.peer < 0 || step.peer >= n) {
                return fail("rank " + std::to_string(event.rank) + " sends to rank " + std::to_string(step.peer));
              }
              state.inFlight.push_back(timed);
              // The port sends one message at a time, in posting order: a send starts when the
              // one before it has left.
              state.outbox.push_back({step.peer, state.next});
              if (state.outbox.size() == 1) push(now, EventKind::kSend, event.rank, step.peer, state.next);
              break;
            case StepKind::kRecv:
            case StepKind::kRecvReduce: {
              if (step.peer < 0 || step.peer >= n) {
                return fail("rank " + std::to_string(event.rank) + " receives from rank " + std::to_string(step.peer));
              }
              state.inFlight.push_back(timed);
              PairQueue& pair = pairOf(step.peer, event.rank);
              if (!pair.arrivals.empty()) {
                const double arrived = pair.arrivals.front();
                pair.arrivals.pop_front();
                receive(event.rank, state.next, std::max(arrived, now));
              } else {
                pair.recvs.push_back({state.next, now});
              }
              break;
            }
          }
          ++state.next;
        }
        state.clock = now;
        break;
      }
      case EventKind::kSend: {
        const Step& step = schedules[event.rank].steps[event.step];
        const int srcHost = event.rank / perHost;
        const int dstHost = event.peer / perHost;
        const bool across = srcHost != dstHost;
        const LinkCost& link = across ? model.interHost : model.intraHost;
        // The receiver, or the simulated rank standing for it (the same when all are simulated).
        const int stand = event.peer % period;
        TimedRank& src = ranks[event.rank];
        TimedRank& dst = ranks[stand];
        // The sender's port (and its host's NIC) pushes its messages one after another; the
        // receiver's port (and its host's NIC) takes in one message's bytes at a time, so a
        // message lands no sooner than bytes * beta after the previous one into the same port.
        // Each send is handled at the time it starts, so ports and NICs take messages in the
        // order they start, whichever rank's event came first.
        if (across && nicOutFree[srcHost] > event.time) {  // the host's NIC is busy: wait for it
          push(nicOutFree[srcHost], EventKind::kSend, event.rank, event.peer, event.step);
          break;
        }
        const double busy = static_cast<double>(step.bytes) * link.betaUsPerByte;
        const double start = event.time;
        if (across) nicOutFree[srcHost] = start + busy;
        src.outbox.pop_front();
        if (!src.outbox.empty()) {
          push(start + busy, EventKind::kSend, event.rank, src.outbox.front().first, src.outbox.front().second);
        }
        double arrival = std::max(start + link.alphaUs + busy, dst.recvPortFree + busy);
        const int standHost = stand / perHost;
        if (across) arrival = std::max(arrival, nicInFree[standHost] + busy);
        dst.recvPortFree = arrival;
        if (across) nicInFree[standHost] = arrival;
        ++result.messages;
        push(start + busy, EventKind::kDone, event.rank, -1, event.step);
        push(arrival, EventKind::kArrive, event.rank, event.peer, event.step);
        break;
      }
      case EventKind::kArrive: {
        // Shifted so the receiver is a simulated rank: the sender moves by the same amount.
        const int stand = event.peer % period;
        const int sender = mod(event.rank - (event.peer - stand), n);
        PairQueue& pair = pairOf(sender, stand);
        if (!pair.recvs.empty()) {
          const PendingRecv recv = pair.recvs.front();
          pair.recvs.pop_front();
          const Step& sent = schedules[event.rank].steps[event.step];
          const Step& expected = schedules[stand].steps[recv.step];
          if (sent.bytes != expected.bytes) {
            return fail("rank " + std::to_string(sender) + " step " + std::to_string(event.step) + " sends " +
                        std::to_string(sent.bytes) + " bytes to rank " + std::to_string(stand) + ", whose step " +
                        std::to_string(recv.step) + " receives " + std::to_string(expected.bytes));
          }
          receive(stand, recv.step, std::max(event.time, recv.postedAt));
        } else {
          pair.arrivals.push_back(event.time);
        }
        break;
      }
      case EventKind::kDone: {
        TimedRank& state = ranks[event.rank];
        for (size_t i = state.inFlight.size(); i-- > 0;) {
          if (state.inFlight[i].step == event.step) {
            state.inFlight[i].done = true;
            break;
          }
        }
        state.finished = std::max(state.finished, event.time);
        if (state.blocked) {
          state.blocked = false;
          push(event.time, EventKind::kReady, event.rank, -1, 0);
        }
        break;
      }
    }
  }
  for (int r = 0; r < period; ++r) result.timeUs = std::max(result.timeUs, ranks[r].finished);
  result.messages *= static_cast<size_t>(n / period);
  result.steps *= static_cast<size_t>(n / period);
  const std::string stuck = unfinishedRanks(
      period, [&](int r) -> const Schedule& { return schedules[r]; }, [&](int r) { return ranks[r].next; });
  if (!stuck.empty()) return fail("deadlock: no rank can move;" + stuck);
  for (auto& [key, pair] : pairs) {
    if (!pair.arrivals.empty() || !pair.recvs.empty()) {
      return fail("rank " + std::to_string(key / n) + " and rank " + std::to_string(key % n) +
                  " disagree on how many messages pass between them");
    }
  }
  return result;
}

namespace {

// A step's byte range, for comparing two schedules' ranges.
struct NamedRange {
  BufferId buffer;
  size_t offset;
  size_t bytes;
  bool operator==(const NamedRange&) const = default;
};
struct NamedRangeHash {
  size_t operator()(const NamedRange& r) const {
    return std::hash<size_t>()(r.offset * 31 + r.bytes) ^ (static_cast<size_t>(r.buffer) << 60);
  }
};

// A schedule's distinct non-empty byte ranges, sorted, and the pairs of them that overlap.
struct RangeGraph {
  std::vector<NamedRange> ranges;
  std::vector<std::pair<size_t, size_t>> overlaps;  // indices into ranges, first < second
  size_t indexOf(const NamedRange& range) const {
    return static_cast<size_t>(std::lower_bound(ranges.begin(), ranges.end(), range, before) - ranges.begin());
  }
  static bool before(const NamedRange& a, const NamedRange& b) {
    return std::tie(a.buffer, a.offset, a.bytes) < std::tie(b.buffer, b.offset, b.bytes);
  }
};

RangeGraph rangeGraph(const Schedule& schedule) {
  RangeGraph graph;
  for (const Step& step : schedule.steps) {
    Access accesses[4];
    const int count = stepAccesses(step, accesses);
    for (int i = 0; i < count; ++i) {
      if (accesses[i].bytes > 0) {
        graph.ranges.push_back({accesses[i].span.buffer, accesses[i].span.offset, accesses[i].bytes});
      }
    }
  }
  std::sort(graph.ranges.begin(), graph.ranges.end(), RangeGraph::before);
  graph.ranges.erase(std::unique(graph.ranges.begin(), graph.ranges.end()), graph.ranges.end());
  const auto& r = graph.ranges;
  for (size_t i = 0; i < r.size(); ++i) {
    for (size_t j = i + 1; j < r.size() && r[j].buffer == r[i].buffer && r[j].offset < r[i].offset + r[i].bytes; ++j) {
      graph.overlaps.push_back({i, j});
    }
  }
  return graph;
}

}  // namespace

bool isShiftedCopy(const Schedule& stand, const Schedule& other, int shift, int nranks, std::string* why) {
  auto no = [&](const std::string& text) {
    if (why != nullptr) *why = text;
    return false;
  };
  if (stand.steps.size() != other.steps.size()) {
    return no(std::to_string(other.steps.size()) + " steps against " + std::to_string(stand.steps.size()));
  }
  std::unordered_map<NamedRange, NamedRange, NamedRangeHash> forward, backward;
  for (size_t i = 0; i < stand.steps.size(); ++i) {
    const Step& a = stand.steps[i];
    const Step& b = other.steps[i];
    const int shifted = a.peer < 0 ? -1 : mod(a.peer + shift, nranks);
    if (a.kind != b.kind || a.bytes != b.bytes || shifted != b.peer) {
      return no("step " + std::to_string(i) + " is " + stepKindName(b.kind) + " of " + std::to_string(b.bytes) +
                " bytes with peer " + std::to_string(b.peer) + ", not " + stepKindName(a.kind) + " of " +
                std::to_string(a.bytes) + " bytes with peer " + std::to_string(shifted));
    }
    Access mine[4], theirs[4];
    const int count = stepAccesses(a, mine);
    stepAccesses(b, theirs);
    for (int k = 0; k < count; ++k) {
      const NamedRange x{mine[k].span.buffer, mine[k].span.offset, mine[k].bytes};
      const NamedRange y{theirs[k].span.buffer, theirs[k].span.offset, theirs[k].bytes};
      if (x.buffer != y.buffer || x.bytes != y.bytes) return no("step " + std::to_string(i) + " uses other buffers");
      if (x.bytes == 0) continue;
      const auto [f, newF] = forward.emplace(x, y);
      const auto [g, newG] = backward.emplace(y, x);
      if (!(f->second == y) || !(g->second == x)) {
        return no("step " + std::to_string(i) + " maps byte ranges differently from earlier steps");
      }
    }
  }
  // Renamed ranges must overlap exactly where the originals do, so the same steps wait on each other.
  const RangeGraph mine = rangeGraph(stand);
  const RangeGraph theirs = rangeGraph(other);
  std::vector<std::pair<size_t, size_t>> renamed;
  for (const auto& [i, j] : theirs.overlaps) {
    const size_t a = mine.indexOf(backward.at(theirs.ranges[i]));
    const size_t b = mine.indexOf(backward.at(theirs.ranges[j]));
    renamed.push_back({std::min(a, b), std::max(a, b)});
  }
  std::sort(renamed.begin(), renamed.end());
  if (renamed != mine.overlaps) return no("its byte ranges overlap differently");
  return true;
}

ScheduleSet buildAllSchedules(ScheduleArgs args, int ranksPerHost, size_t maxSteps) {
  ScheduleSet set;
  const int n = args.nranks;
  set.nranks = n;
  args.rank = 0;
  std::vector<int> hosts;  // consecutive ranks per host, for the hierarchical algorithms
  if (ranksPerHost > 0 && ranksPerHost < n && args.hosts == nullptr) {
    for (int r = 0; r < n; ++r) hosts.push_back(r / ranksPerHost);
    args.hosts = hosts.data();
  }
  const Schedule first = buildSchedule(args);
  const std::string what =
      std::string(first.algorithm) + " " + collectiveName(args.collective) + " at " + std::to_string(n) + " ranks";
  auto refuse = [&](const std::string& text) {
    set.schedules.clear();
    set.error = text;
    return set;
  };
  const size_t estimate = first.steps.size() * static_cast<size_t>(n);
  const int period = ranksPerHost > 0 && ranksPerHost < n ? ranksPerHost : 1;
  if (estimate > maxSteps) {
    // One host for all, if the other ranks' schedules are shifted copies of its ranks'.
    const std::string tooMany = what + " has about " + std::to_string(estimate) +
                                " steps in all, more than the simulator holds (" + std::to_string(maxSteps) + ")";
    if (n % period != 0 || first.steps.size() * static_cast<size_t>(period) > maxSteps) {
      return refuse(tooMany + "; use fewer ranks or larger chunks");
    }
    set.schedules.push_back(first);
    for (int r = 1; r < period; ++r) {
      args.rank = r;
      set.schedules.push_back(buildSchedule(args));
    }
    std::vector<int> checked;
    for (int r = period; r < std::min(n, 2 * period); ++r) checked.push_back(r);
    for (int r = std::max(period, n - period); r < n; ++r) checked.push_back(r);
    for (int i = 1; i < 32; ++i) checked.push_back(static_cast<int>(static_cast<int64_t>(n) * i / 32 + i) % n);
    for (int r : checked) {
      args.rank = r;
      std::string why;
      if (r >= period && !isShiftedCopy(set.schedules[r % period], buildSchedule(args), r - r % period, n, &why)) {
        return refuse(tooMany + ", and rank " + std::to_string(r) + "'s schedule is not rank " +
                      std::to_string(r % period) + "'s shifted (" + why +
                      "), so one host cannot stand for all; use fewer ranks or larger chunks");
      }
    }
    return set;
  }
  set.schedules.reserve(n);
  set.schedules.push_back(first);
  size_t total = first.steps.size();
  for (int r = 1; r < n; ++r) {
    args.rank = r;
    set.schedules.push_back(buildSchedule(args));
    total += set.schedules.back().steps.size();
    if (total > maxSteps) return refuse(what + " needs more than " + std::to_string(maxSteps) + " steps");
  }
  return set;
}

}  // namespace chorus::collectives
