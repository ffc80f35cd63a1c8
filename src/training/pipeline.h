// pipeline.h: pipeline parallelism for the GPT model: the blocks cut into stages of balanced
// modelled cost, the schedules that order each stage's forwards and backwards (GPipe, 1F1B,
// interleaved 1F1B with virtual stages, as Narayanan et al. 2021 describe them), a simulation of a
// schedule's idle time, and the runner that executes a schedule on one rank: activations go to the
// next stage and their gradients back by chorus send/recv, and the time each stage waits is
// measured.
#pragma once

#include <chorus/chorus.hpp>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "src/training/data_parallel.h"
#include "src/training/gpt.h"

namespace chorus::training {

enum class Schedule { kGpipe, kOneFOneB, kInterleaved };
// "gpipe", "1f1b", "interleaved"; throws chorus::Error naming the word otherwise.
Schedule parseSchedule(const std::string& name);
const char* scheduleName(Schedule schedule);

// One forward or backward of micro-batch `micro` through the rank's model chunk `chunk` (chunk c of
// pipeline rank s is virtual stage c * stages + s).
struct PipeAction {
  bool forward = true;
  int micro = 0, chunk = 0;
  bool operator==(const PipeAction&) const = default;
};

// The actions of pipeline rank `stage` of `stages`, holding `chunks` model chunks, for one step of
// `micros` micro-batches, in order:
//   GPipe: every forward, then every backward (last micro-batch first); chunks = 1.
//   1F1B: stages - 1 - stage forwards to fill the pipeline, then one forward and one backward in
//     turn, then the remaining backwards; chunks = 1.
//   Interleaved: 1F1B over virtual stages, the micro-batches in groups of `stages` per chunk;
//     chunks >= 2 and micros a multiple of stages.
// Every rank runs its forwards in one global order and its backwards in another, so messages
// between two ranks match in the order they are sent. Throws chorus::Error naming what does not fit.
std::vector<PipeAction> pipelineSchedule(Schedule schedule, int stages, int stage, int chunks, int micros);

// A schedule played out with forward time `forward` and backward time `backward` on every chunk
// and instant messages; each rank starts an action once its input has arrived.
struct ScheduleSimulation {
  bool completes = false;         // false: some rank waits for a message never sent (deadlock)
  double makespan = 0.0;          // the step's time
  std::vector<double> idle;       // per stage: the makespan less its busy time
  std::vector<int> peakInFlight;  // per stage: the most micro-batches whose activations it held at once
  double idleShare() const;       // mean idle / makespan
};
ScheduleSimulation simulateSchedule(Schedule schedule, int stages, int chunks, int micros, double forward = 1.0,
                                    double backward = 2.0);
// The published bubble: idle share (p - 1) / (v m + p - 1) of a step (Narayanan et al.'s bubble
// time fraction (p - 1) / (v m) of the ideal time), v = chunks per rank (1 for GPipe and 1F1B).
double bubbleShare(int stages, int chunks, int micros);

// The modelled cost (FLOPs of forward + backward, as Gpt::flopsPerStep counts them: an MoE block
// its router and active experts) of each block and of the embedding and head, and the cut of the
// blocks into `parts` contiguous spans (each at least one block) whose largest cost (the first
// span with the embedding, the last with the head) is least.
std::vector<LayerSpan> balanceLayers(const GptConfig& config, int batch, int seq, int parts);
// The same for blocks of the given costs, the first span also costing `embedding` and the last `head`.
std::vector<LayerSpan> balanceLayers(const std::vector<double>& blocks, double embedding, double head, int parts);
// Pipeline rank `stage`'s spans of the cut: parts stage, stage + stages, ...
std::vector<LayerSpan> stageSpans(const std::vector<LayerSpan>& parts, int stages, int stage);

// Time of this rank's pipeline steps on its device's clock (the compute queue's, on a GPU): from
// the start of each step's schedule to its end, and the part the compute queue spent waiting for
// messages (activations, gradients, and its own sends' completion at the end).
struct PipelineTimes {
  double seconds = 0.0, idleSeconds = 0.0;
  long steps = 0;
};

class Pipeline {
 public:
  // Collective over the pp group `pp` (its rank is the stage): makes a second communicator over
  // the same ranks, so that activations and gradients travel on separate ones. The model holds
  // this stage's chunks (Gpt spans = stageSpans(...)). On a device it also makes the links
  // (below).
  Pipeline(Gpt& model, Communicator& pp, Schedule schedule);
  ~Pipeline();
  int stages() const { return stages_; }
  int stage() const { return stage_; }

  // Fills micro-batch `micro`'s tokens and targets (batch x seq each).
  using Fill = std::function<void(int micro, int* tokens, int* targets)>;
  // One step's `micros` micro-batches through this stage, forward and backward, the gradients
  // (scaled by lossScale) accumulated through dp. Returns the sum of the micro-batches' losses on
  // the last stage, 0 on the others.
  double train(int micros, const Fill& fill, DataParallel& dp, float lossScale);
  // Forward only (validation); the same return.
  double evaluate(int micros, const Fill& fill, UnitAccess& access);
  // The steps' times so far (waiting for the device to finish them).
  const PipelineTimes& times();
  // checkCommunicator (mesh.h) of the communicators the pipeline made: the gradients' and, on a
  // device, the links.
  void checkAsyncErrors();

  // How the runner's messages travel: host calls on the CPU, device calls on a device (pipeline.cc).
  class Messages;

 private:
  double run(const std::vector<PipeAction>& actions, const Fill& fill, DataParallel* dp, UnitAccess& access,
             float lossScale);
  Gpt& model_;
  Communicator& activations_;
  Communicator gradients_;
  // On a device the messages are device sends and receives, and a device send holds its stream
  // until the peer receives; on one stream for both, a stage that sends before it receives (the
  // interleaved schedule's ring of stages) could wait on a peer that waits on it. So each
  // directed link (this stage to the next for activations, and from the previous one; to the
  // previous for gradients, and from the next) is a two-rank communicator of its own (sender rank
  // 0, receiver 1) on a communication lane of its own: each lane only sends or only receives, in
  // the order the schedule gives, as the host's non-blocking sends do. Empty on the CPU.
  enum Link { kActivationsOut, kActivationsIn, kGradientsOut, kGradientsIn };
  Communicator links_[4];
  Schedule schedule_;
  int stages_, stage_;
  PipelineTimes times_;
  // Spans of the steps not yet added to times_ (timed marks of the compute queue: a step's whole
  // schedule, or one of its waits for messages), added once the device has run past them, so
  // that timing a step never makes the host wait for the device.
  struct Span {
    Backend::Mark from, to;
    bool idle;
  };
  std::deque<Span> spans_;
  // Adds the spans the device has run past to times_ (wait: all of them, waiting for the device).
  void foldTimes(bool wait);
};

}  // namespace chorus::training
