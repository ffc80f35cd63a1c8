// pipeline.cc: schedules, their simulation, the cut of the blocks into stages, and the runner.
#include "src/training/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <thread>
#include <tuple>

#include "chorus/error.hpp"
#include "src/training/mesh.h"

namespace chorus::training {

using Clock = std::chrono::steady_clock;

Schedule parseSchedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGpipe;
  if (name == "1f1b") return Schedule::kOneFOneB;
  if (name == "interleaved") return Schedule::kInterleaved;
  throw Error(chorusInvalidArgument,
              fmt::format("pipeline schedule '{}' is not one of gpipe, 1f1b, interleaved", name));
}

const char* scheduleName(Schedule schedule) {
  switch (schedule) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::kOneFOneB:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

std::vector<PipeAction> pipelineSchedule(Schedule schedule, int p, int s, int v, int m) {
  auto bad = [&](const std::string& what) {
    throw Error(chorusInvalidArgument, fmt::format("pipeline schedule {} with {} stages, {} chunk(s) per stage and "
                                                   "{} micro-batches: {}",
                                                   scheduleName(schedule), p, v, m, what));
  };
  if (p < 1 || s < 0 || s >= p) bad(fmt::format("stage {} does not exist", s));
  if (m < 1) bad("at least one micro-batch is needed");
  if (schedule != Schedule::kInterleaved && v != 1) bad("only the interleaved schedule has virtual stages");
  if (schedule == Schedule::kInterleaved) {
    if (v < 2 || p < 2) bad("the interleaved schedule needs at least 2 stages and 2 chunks per stage");
    if (m % p != 0) bad(fmt::format("the micro-batches must be a multiple of the {} stages", p));
  }
  std::vector<PipeAction> actions;
  if (schedule == Schedule::kGpipe) {
    for (int i = 0; i < m; ++i) actions.push_back({true, i, 0});
    for (int i = m - 1; i >= 0; --i) actions.push_back({false, i, 0});
    return actions;
  }
  // 1F1B, plain or over virtual stages: the k-th forward and backward of this rank (the same
  // order on every rank), `warmup` forwards, then one forward and one backward in turn.
  const int total = m * v;
  auto forwardAt = [&](int k) {
    const int group = k / (p * v), within = k % (p * v);
    return PipeAction{true, group * p + within % p, v == 1 ? 0 : within / p};
  };
  auto backwardAt = [&](int k) {
    PipeAction a = forwardAt(k);
    a.forward = false;
    a.chunk = v - 1 - a.chunk;
    return a;
  };
  int warmup = std::min(p - s - 1, m);
  if (v > 1) warmup = m == p ? total : std::min((p - s - 1) * 2 + (v - 1) * p, total);
  if (v == 1) {
    // Plain 1F1B: micro-batches in order.
    for (int i = 0; i < warmup; ++i) actions.push_back({true, i, 0});
    for (int i = 0; i < m - warmup; ++i) {
      actions.push_back({true, warmup + i, 0});
      actions.push_back({false, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) actions.push_back({false, i, 0});
    return actions;
  }
  for (int k = 0; k < warmup; ++k) actions.push_back(forwardAt(k));
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(forwardAt(warmup + k));
    actions.push_back(backwardAt(k));
  }
  for (int k = total - warmup; k < total; ++k) actions.push_back(backwardAt(k));
  return actions;
}

double ScheduleSimulation::idleShare() const {
  if (idle.empty() || makespan <= 0) return 0.0;
  double sum = 0.0;
  for (double x : idle) sum += x;
  return sum / static_cast<double>(idle.size()) / makespan;
}

ScheduleSimulation simulateSchedule(Schedule schedule, int p, int v, int m, double forward, double backward) {
  std::vector<std::vector<PipeAction>> actions(p);
  for (int s = 0; s < p; ++s) actions[s] = pipelineSchedule(schedule, p, s, v, m);
  const int stages = p * v;
  // When each (pass, micro, virtual stage) finished; absent until it has run.
  std::map<std::tuple<bool, int, int>, double> finished;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0), busy(p, 0.0);
  std::vector<int> inFlight(p, 0);
  ScheduleSimulation sim;
  sim.peakInFlight.assign(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < actions[s].size()) {
        const PipeAction& a = actions[s][next[s]];
        const int vs = a.chunk * p + s;
        double ready = clock[s];
        // Its input: the previous stage's forward, or the next stage's backward.
        const bool needs = a.forward ? vs > 0 : vs < stages - 1;
        if (needs) {
          const auto it = finished.find({a.forward, a.micro, a.forward ? vs - 1 : vs + 1});
          if (it == finished.end()) break;
          ready = std::max(ready, it->second);
        }
        const double cost = a.forward ? forward : backward;
        clock[s] = ready + cost;
        busy[s] += cost;
        finished[{a.forward, a.micro, vs}] = clock[s];
        inFlight[s] += a.forward ? 1 : -1;
        sim.peakInFlight[s] = std::max(sim.peakInFlight[s], inFlight[s]);
        ++next[s];
        progress = true;
      }
    }
  }
  sim.completes = true;
  for (int s = 0; s < p; ++s) sim.completes = sim.completes && next[s] == actions[s].size();
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < p; ++s) sim.idle.push_back(sim.makespan - busy[s]);
  return sim;
}

double bubbleShare(int stages, int chunks, int micros) {
  return (stages - 1.0) / (static_cast<double>(chunks) * micros + stages - 1.0);
}

std::vector<LayerSpan> balanceLayers(const GptConfig& config, int batch, int seq, int parts) {
  // FLOPs of forward + backward (as Gpt::flopsPerStep counts them).
  const double N = static_cast<double>(batch) * seq, C = config.width;
  std::vector<double> blocks(config.layers);
  for (int l = 0; l < config.layers; ++l) blocks[l] = 6.0 * N * config.matmulParameters(l) + 3.0 * N * 4.0 * seq * C;
  const double head = 6.0 * N * C * config.vocab;
  const double embedding = 6.0 * N * C;  // the lookup and its gradient: small next to a block
  return balanceLayers(blocks, embedding, head, parts);
}

std::vector<LayerSpan> balanceLayers(const std::vector<double>& blocks, double embedding, double head, int parts) {
  const int L = static_cast<int>(blocks.size());
  std::vector<double> before(L + 1, 0.0);  // before[j]: the cost of blocks [0, j)
  for (int l = 0; l < L; ++l) before[l + 1] = before[l] + blocks[l];
  if (parts < 1 || parts > L) {
    throw Error(
        chorusInvalidArgument,
        fmt::format("pipeline: {} stage(s) x chunks cannot each hold a block of the model's {} layers", parts, L));
  }
  auto cost = [&](int begin, int end) {
    return before[end] - before[begin] + (begin == 0 ? embedding : 0.0) + (end == L ? head : 0.0);
  };
  // best[k][j]: the least largest cost of cutting blocks [0, j) into k spans; from[k][j]: where
  // the last of them begins.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= parts; ++k) {
    for (int j = k; j <= L; ++j) {
      for (int i = k - 1; i < j; ++i) {
        const double worst = std::max(best[k - 1][i], cost(i, j));
        if (worst < best[k][j]) {
          best[k][j] = worst;
          from[k][j] = i;
        }
      }
    }
  }
  std::vector<LayerSpan> spans(parts);
  for (int k = parts, j = L; k >= 1; --k) {
    spans[k - 1] = {from[k][j], j};
    j = from[k][j];
  }
  return spans;
}

std::vector<LayerSpan> stageSpans(const std::vector<LayerSpan>& parts, int stages, int stage) {
  std::vector<LayerSpan> mine;
  for (size_t i = stage; i < parts.size(); i += stages) mine.push_back(parts[i]);
  return mine;
}

// ---- the runner ----

namespace {

// Which of three splits makes the directed link whose sender is `position` links from the ring's
// start (0 .. p - 1; p - 1 the link that wraps around): alternate links in two splits, so that a
// stage is in each split once at most (as the sender of one link or the receiver of the one
// before), and the wrap-around link of an odd ring in a third.
int splitOfLink(int position, int p) { return position == p - 1 && p % 2 == 1 ? 2 : position % 2; }

}  // namespace

Pipeline::Pipeline(Gpt& model, Communicator& pp, Schedule schedule)
    : model_(model),
      activations_(pp),
      gradients_(pp.split(0, pp.rank())),
      schedule_(schedule),
      stages_(pp.size()),
      stage_(pp.rank()) {
  if (model_.backend().device() == Device::kCpu) return;
  // Activations go from stage s to s + 1, gradients from s to s - 1 (mod p: an interleaved
  // schedule's last virtual stage of a chunk feeds the first stage's next chunk). Each link's
  // colour is its sender's stage.
  const int p = stages_, r = stage_;
  for (const int direction : {1, -1}) {
    const int position = direction > 0 ? r : p - 1 - r;  // of the link this stage sends on
    const int before = (position + p - 1) % p;           // of the link it receives on
    const int sender = (r - direction + p) % p;          // that link's sender
    Communicator& out = links_[direction > 0 ? kActivationsOut : kGradientsOut];
    Communicator& in = links_[direction > 0 ? kActivationsIn : kGradientsIn];
    for (int k = 0; k < 3; ++k) {
      if (splitOfLink(position, p) == k) {
        out = pp.split(r, 0);
      } else if (splitOfLink(before, p) == k) {
        in = pp.split(sender, 1);
      } else {
        (void)pp.split(CHORUS_SPLIT_NOCOLOR, 0);
      }
    }
  }
}

Pipeline::~Pipeline() = default;

void Pipeline::checkAsyncErrors() {
  checkCommunicator(gradients_, "the pipeline's gradients");
  static constexpr const char* kLinks[] = {"activations to the next stage", "activations from the previous stage",
                                           "gradients to the previous stage", "gradients from the next stage"};
  for (int link = kActivationsOut; link <= kGradientsIn; ++link) {
    checkCommunicator(links_[link], fmt::format("the pipeline's link for {}", kLinks[link]));
  }
}

namespace {

int timeoutMs() {
  const char* env = std::getenv("CHORUS_TIMEOUT_MS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : 300000;
}

}  // namespace

// How the runner's messages travel. receive() gives the message's data for the chunk that reads
// it, which consumed() says has been started; send() takes data the chunk just produced (it may
// be written again once send returns); finish() ends the run's sends. What the compute queue
// waits for in receive() and finish() is the stage's idle time (the runner times it).
class Pipeline::Messages {
 public:
  virtual ~Messages() = default;
  virtual const float* receive(bool gradient, int micro) = 0;
  virtual void consumed() = 0;
  virtual void send(bool gradient, std::span<const float> data) = 0;
  virtual void finish() = 0;
};

namespace {

// On the CPU: non-blocking host calls on the two communicators (activations, gradients). Each
// send from a copy of its own, tested while the runner waits for a receive (each communicator
// progresses only inside calls on it); a receive waited for by spinning briefly, then sleeping
// between tests, so that ranks sharing cores leave them to the ones that compute.
class HostMessages final : public Pipeline::Messages {
 public:
  HostMessages(Communicator& activations, Communicator& gradients, int stage, int stages, size_t floats)
      : comms_{&activations, &gradients},
        stage_(stage),
        stages_(stages),
        prev_((stage + stages - 1) % stages),
        next_((stage + 1) % stages),
        limitMs_(timeoutMs()),
        input_(floats) {}
  const float* receive(bool gradient, int micro) override {
    const int from = gradient ? next_ : prev_;
    Request r = comms_[gradient]->irecv(std::span<float>(input_), from);
    await(r, fmt::format("the {} of micro-batch {} from stage {}", gradient ? "gradient" : "activations", micro, from));
    return input_.data();
  }
  void consumed() override {}
  void send(bool gradient, std::span<const float> data) override {
    Outgoing& o = outgoing_.emplace_back();
    o.data.assign(data.begin(), data.end());
    o.request = comms_[gradient]->isend(std::span<const float>(o.data), gradient ? prev_ : next_);
    reap();
  }
  void finish() override {
    while (!outgoing_.empty()) {
      Outgoing last = std::move(outgoing_.front());
      outgoing_.pop_front();
      if (!last.request.done()) await(last.request, "its sends to complete");
    }
  }

 private:
  // A message sent whose send may still be in progress: its own copy of the data.
  struct Outgoing {
    std::vector<float> data;
    Request request;
  };
  void reap() {
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      it = it->request.done() || it->request.test() ? outgoing_.erase(it) : std::next(it);
    }
  }
  void await(Request& r, const std::string& what) {
    const auto begin = Clock::now();
    for (int round = 0; !r.test(); ++round) {
      reap();
      if (round > 64) std::this_thread::sleep_for(std::chrono::microseconds(round > 1024 ? 200 : 20));
      if (Clock::now() - begin > std::chrono::milliseconds(limitMs_)) {
        throw Error(chorusTimeout, fmt::format("pipeline stage {} of {}: nothing arrived for {} ms (CHORUS_TIMEOUT_MS) "
                                               "while waiting for {}",
                                               stage_, stages_, limitMs_, what));
      }
    }
  }
  Communicator* comms_[2];
  int stage_, stages_, prev_, next_, limitMs_;
  std::vector<float> input_;
  std::deque<Outgoing> outgoing_;
};

// Device buffers of one message each, reused once the device has run past their last use.
class MessageBuffers {
 public:
  MessageBuffers(Backend& backend, size_t floats) : backend_(backend), floats_(floats) {}
  // A buffer free for a new message; `fresh`: just made (zeroed on the compute queue, which work
  // on another queue must wait for before it writes the buffer).
  int take(bool* fresh) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (!e.taken && backend_.reached(e.lastUse)) {
        e.taken = true;
        e.lastUse.reset();
        *fresh = false;
        return static_cast<int>(i);
      }
    }
    entries_.push_back(Entry{Buffer<float>(backend_, floats_), nullptr, true});
    *fresh = true;
    return static_cast<int>(entries_.size() - 1);
  }
  std::span<float> operator[](int i) { return {entries_[i].buffer.data(), floats_}; }
  // Buffer i is free once the device has run past `lastUse`.
  void release(int i, Backend::Mark lastUse) {
    entries_[i].lastUse = std::move(lastUse);
    entries_[i].taken = false;
  }

 private:
  struct Entry {
    Buffer<float> buffer;
    Backend::Mark lastUse;
    bool taken = false;
  };
  Backend& backend_;
  size_t floats_;
  std::deque<Entry> entries_;
};

// On a device: device sends and receives on the links (pipeline.h), each link on its own
// communication lane. Nothing waits on the host: a receive goes into a buffer of its own and the
// compute queue waits for it before the chunk that reads it; a send goes from a copy the compute
// queue makes after the chunk that produced the data (so the chunk's slot, and the one input
// gradient, may be written again at once). The compute queue waits for nothing but arrivals, as
// the host runner waits for nothing but receives; finish() has it wait for the run's sends, so
// the step's work includes them.
class DeviceMessages final : public Pipeline::Messages {
 public:
  DeviceMessages(Backend& backend, Communicator* links, size_t floats)
      : backend_(backend), links_(links), incoming_(backend, floats), outgoing_(backend, floats) {}
  // links_: activations out, activations in, gradients out, gradients in (Pipeline::Link's order).
  const float* receive(bool gradient, int /*micro*/) override {
    const int link = gradient ? 3 : 1;
    bool fresh = false;
    received_ = incoming_.take(&fresh);
    if (fresh) backend_.wait(Backend::Queue::kComm, backend_.mark(Backend::Queue::kCompute), kLanes[link]);
    links_[link].recv(incoming_[received_], 0, stream(link));
    backend_.wait(Backend::Queue::kCompute, backend_.mark(Backend::Queue::kComm, kLanes[link]));
    return incoming_[received_].data();
  }
  void consumed() override {
    if (received_ >= 0) incoming_.release(std::exchange(received_, -1), backend_.mark(Backend::Queue::kCompute));
  }
  void send(bool gradient, std::span<const float> data) override {
    const int link = gradient ? 2 : 0;
    bool fresh = false;
    const int b = outgoing_.take(&fresh);
    backend_.copy(outgoing_[b].data(), data.data(), data.size() * sizeof(float));
    backend_.wait(Backend::Queue::kComm, backend_.mark(Backend::Queue::kCompute), kLanes[link]);
    links_[link].send(std::span<const float>(outgoing_[b]), 1, stream(link));
    lastSend_[link] = backend_.mark(Backend::Queue::kComm, kLanes[link]);
    outgoing_.release(b, lastSend_[link]);
  }
  void finish() override {
    for (Backend::Mark& m : lastSend_) backend_.wait(Backend::Queue::kCompute, std::exchange(m, nullptr));
  }

 private:
  static constexpr int kLanes[4] = {Backend::kActivationsOutLane, Backend::kActivationsInLane,
                                    Backend::kGradientsOutLane, Backend::kGradientsInLane};
  chorusStream_t stream(int link) {
    return static_cast<chorusStream_t>(backend_.stream(Backend::Queue::kComm, kLanes[link]));
  }
  Backend& backend_;
  Communicator* links_;
  MessageBuffers incoming_, outgoing_;
  int received_ = -1;
  Backend::Mark lastSend_[4];
};

}  // namespace

double Pipeline::train(int micros, const Fill& fill, DataParallel& dp, float lossScale) {
  return run(pipelineSchedule(schedule_, stages_, stage_, model_.chunks(), micros), fill, &dp, dp, lossScale);
}

double Pipeline::evaluate(int micros, const Fill& fill, UnitAccess& access) {
  std::vector<PipeAction> forwards;
  for (const auto& a : pipelineSchedule(schedule_, stages_, stage_, model_.chunks(), micros)) {
    if (a.forward) forwards.push_back(a);
  }
  return run(forwards, fill, nullptr, access, 1.0f);
}

double Pipeline::run(const std::vector<PipeAction>& actions, const Fill& fill, DataParallel* dp, UnitAccess& access,
                     float lossScale) {
  Backend& backend = model_.backend();
  const bool timed = dp != nullptr;  // training steps' time; validation's is no step's
  foldTimes(false);
  const Backend::Mark began = timed ? backend.timedMark(Backend::Queue::kCompute) : nullptr;
  // The compute queue's wait for what `wait` waits for: from the work before it to the end of the wait.
  auto idleWhile = [&](auto wait) {
    if (!timed) return wait();
    Backend::Mark from = backend.timedMark(Backend::Queue::kCompute);
    auto result = wait();
    spans_.push_back({std::move(from), backend.timedMark(Backend::Queue::kCompute), true});
    return result;
  };
  const int virtualStages = stages_ * model_.chunks();
  const size_t rowsTokens = static_cast<size_t>(model_.batch()) * model_.seq();
  std::vector<int> tokens(rowsTokens), targets(rowsTokens);
  std::unique_ptr<Messages> messages;
  if (backend.device() == Device::kCpu) {
    messages = std::make_unique<HostMessages>(activations_, gradients_, stage_, stages_, model_.boundaryFloats());
  } else {
    messages = std::make_unique<DeviceMessages>(backend, links_, model_.boundaryFloats());
  }
  // Each chunk's free activation slots, and the slot of each micro-batch in flight.
  std::vector<std::vector<int>> freeSlots(model_.chunks());
  std::vector<int> slotsMade(model_.chunks(), 0);
  std::map<std::pair<int, int>, int> slotOfMicro;
  size_t lastBackward = actions.size();
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!actions[i].forward) lastBackward = i;
  }

  double loss = 0.0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    const int vs = a.chunk * stages_ + stage_;
    const bool firstStage = vs == 0, lastStage = vs == virtualStages - 1;
    if (a.forward) {
      if (firstStage || lastStage) fill(a.micro, tokens.data(), targets.data());
      const float* in = firstStage ? nullptr : idleWhile([&] { return messages->receive(false, a.micro); });
      int slot = 0;
      if (dp != nullptr) {
        auto& free = freeSlots[a.chunk];
        if (free.empty()) free.push_back(slotsMade[a.chunk]++);
        slot = free.back();
        free.pop_back();
        slotOfMicro[{a.chunk, a.micro}] = slot;
      }
      loss += model_.forwardChunk(a.chunk, slot, tokens.data(), in, targets.data(), access);
      messages->consumed();
      if (!lastStage) messages->send(false, model_.chunkOutput(a.chunk, slot));
    } else {
      const float* dout = lastStage ? nullptr : idleWhile([&] { return messages->receive(true, a.micro); });
      const auto at = slotOfMicro.find({a.chunk, a.micro});
      dp->beginMicro(i == lastBackward);
      model_.backwardChunk(a.chunk, at->second, dout, access, lossScale);
      messages->consumed();
      freeSlots[a.chunk].push_back(at->second);
      slotOfMicro.erase(at);
      if (!firstStage) messages->send(true, model_.inputGradient());
    }
  }
  idleWhile([&] {
    messages->finish();
    return 0;
  });
  if (timed) {
    spans_.push_back({began, backend.timedMark(Backend::Queue::kCompute), false});
    ++times_.steps;
  }
  return loss;
}

const PipelineTimes& Pipeline::times() {
  foldTimes(true);
  return times_;
}

void Pipeline::foldTimes(bool wait) {
  Backend& backend = model_.backend();
  while (!spans_.empty() && (wait || backend.reached(spans_.front().to))) {
    const Span& s = spans_.front();
    (s.idle ? times_.idleSeconds : times_.seconds) += backend.secondsBetween(s.from, s.to);
    spans_.pop_front();
  }
}

}  // namespace chorus::training
