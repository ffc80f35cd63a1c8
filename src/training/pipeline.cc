// pipeline.cc: schedules, their simulation, the cut of the blocks into stages, and the runner.
#include "src/training/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include "chorus/error.hpp"

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

Pipeline::Pipeline(Gpt& model, Communicator& pp, Schedule schedule)
    : model_(model),
      activations_(pp),
      gradients_(pp.split(0, pp.rank())),
      schedule_(schedule),
      stages_(pp.size()),
      stage_(pp.rank()) {}

Pipeline::~Pipeline() = default;

namespace {

// A message this rank has sent and whose send may still be in progress: its own copy of the data.
struct Outgoing {
  std::vector<float> data;
  Request request;
};

int timeoutMs() {
  const char* env = std::getenv("CHORUS_TIMEOUT_MS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : 300000;
}

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
  const auto start = Clock::now();
  const int virtualStages = stages_ * model_.chunks();
  const size_t rowsTokens = static_cast<size_t>(model_.batch()) * model_.seq();
  std::vector<int> tokens(rowsTokens), targets(rowsTokens);
  std::vector<float> input(model_.boundaryFloats()), doutput(model_.boundaryFloats());
  // On a device the messages go through host memory: what arrives is copied to the device for the
  // chunk, what leaves is copied from it (the model's boundary is in its backend's memory). Device
  // sends would not do: one holds its stream until the peer receives, and the interleaved
  // schedule's stages form a ring in which each rank may send before it receives.
  Backend& backend = model_.backend();
  const bool staged = backend.device() != Device::kCpu;
  Buffer<float> inputOn, doutputOn;
  if (staged) {
    inputOn = Buffer<float>(backend, input.size());
    doutputOn = Buffer<float>(backend, doutput.size());
  }
  auto arrived = [&](std::vector<float>& host, Buffer<float>& on) -> const float* {
    if (!staged) return host.data();
    backend.fromHost(on.data(), host.data(), host.size() * sizeof(float));
    return on.data();
  };
  std::deque<Outgoing> outgoing;
  // Each chunk's free activation slots, and the slot of each micro-batch in flight.
  std::vector<std::vector<int>> freeSlots(model_.chunks());
  std::vector<int> slotsMade(model_.chunks(), 0);
  std::map<std::pair<int, int>, int> slotOfMicro;
  size_t lastBackward = actions.size();
  for (size_t i = 0; i < actions.size(); ++i) {
    if (!actions[i].forward) lastBackward = i;
  }
  double idle = 0.0;
  const int limitMs = timeoutMs();

  auto reapSends = [&] {
    for (auto it = outgoing.begin(); it != outgoing.end();) {
      it = it->request.done() || it->request.test() ? outgoing.erase(it) : std::next(it);
    }
  };
  // Waits for r, keeping this rank's sends on both communicators moving (each progresses only
  // inside calls on its own communicator): test in turn, briefly spinning, then sleeping between
  // tests so that ranks sharing cores leave them to the ones that compute.
  auto await = [&](Request& r, const std::string& what) {
    const auto begin = Clock::now();
    for (int round = 0; !r.test(); ++round) {
      reapSends();
      if (round > 64) std::this_thread::sleep_for(std::chrono::microseconds(round > 1024 ? 200 : 20));
      if (Clock::now() - begin > std::chrono::milliseconds(limitMs)) {
        throw Error(chorusTimeout, fmt::format("pipeline stage {} of {}: nothing arrived for {} ms (CHORUS_TIMEOUT_MS) "
                                               "while waiting for {}",
                                               stage_, stages_, limitMs, what));
      }
    }
    idle += std::chrono::duration<double>(Clock::now() - begin).count();
  };
  auto send = [&](Communicator& comm, std::span<const float> data, int peer) {
    Outgoing& o = outgoing.emplace_back();
    o.data.resize(data.size());
    backend.toHost(o.data.data(), data.data(), data.size() * sizeof(float));
    o.request = comm.isend(std::span<const float>(o.data), peer);
  };

  double loss = 0.0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    const int vs = a.chunk * stages_ + stage_;
    const bool firstStage = vs == 0, lastStage = vs == virtualStages - 1;
    const int prev = (stage_ + stages_ - 1) % stages_, next = (stage_ + 1) % stages_;
    if (a.forward) {
      if (firstStage || lastStage) fill(a.micro, tokens.data(), targets.data());
      const float* in = input.data();
      if (!firstStage) {
        Request r = activations_.irecv(std::span<float>(input), prev);
        await(r, fmt::format("the activations of micro-batch {} from stage {}", a.micro, prev));
        in = arrived(input, inputOn);
      }
      int slot = 0;
      if (dp != nullptr) {
        auto& free = freeSlots[a.chunk];
        if (free.empty()) free.push_back(slotsMade[a.chunk]++);
        slot = free.back();
        free.pop_back();
        slotOfMicro[{a.chunk, a.micro}] = slot;
      }
      loss += model_.forwardChunk(a.chunk, slot, tokens.data(), in, targets.data(), access);
      if (!lastStage) send(activations_, model_.chunkOutput(a.chunk, slot), next);
    } else {
      const float* dout = doutput.data();
      if (!lastStage) {
        Request r = gradients_.irecv(std::span<float>(doutput), next);
        await(r, fmt::format("the gradient of micro-batch {} from stage {}", a.micro, next));
        dout = arrived(doutput, doutputOn);
      }
      const auto at = slotOfMicro.find({a.chunk, a.micro});
      dp->beginMicro(i == lastBackward);
      model_.backwardChunk(a.chunk, at->second, dout, access, lossScale);
      freeSlots[a.chunk].push_back(at->second);
      slotOfMicro.erase(at);
      if (!firstStage) send(gradients_, model_.inputGradient(), prev);
    }
    reapSends();
  }
  while (!outgoing.empty()) {
    Outgoing last = std::move(outgoing.front());
    outgoing.pop_front();
    if (!last.request.done()) await(last.request, "its sends to complete");
  }
  if (dp != nullptr) {
    times_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    times_.idleSeconds += idle;
    ++times_.steps;
  }
  return loss;
}

}  // namespace chorus::training
