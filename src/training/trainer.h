// trainer.h: runs a training job on this rank: data, model, data parallelism, the optimiser and
// learning-rate schedule, validation, checkpoints, the progress line and the metrics files.
// Rank 0 writes <out>/metrics.csv (a row per step as it ends) and <out>/checkpoint.bin.
#pragma once

#include <chorus/chorus.hpp>
#include <string>
#include <vector>

#include "src/training/data_parallel.h"
#include "src/training/gpt.h"
#include "src/training/job.h"
#include "src/training/peak.h"

namespace chorus::training {

struct StepRecord {
  long step = 0;
  double loss = 0.0;    // mean training loss over the global batch
  double valLoss = -1;  // validation loss when evaluated at this step, else -1
  double lr = 0.0;
  double gradNorm = 0.0;
  double seconds = 0.0;  // wall time of the step (forward, backward, reduction, update)
  double tokensPerSecond = 0.0;
  double mfu = 0.0;  // model flops per second over the measured GEMM peak of the machine
  // Bytes rank 0 sent on the data-parallel communicator during the step (the gradient reduction,
  // headers included; chorusCommGetTraffic), and whether the step's gradients were compressed.
  uint64_t dpBytes = 0;
  bool compressed = false;
  // MoE blocks (none: auxLoss -1): the mean aux loss over the step's blocks and micro-batches,
  // the most choices an expert got over the mean (1 = balanced; summed over the blocks), and the
  // share of choices dropped for capacity.
  double auxLoss = -1, expertBalance = 0, dropped = 0;
  // The loss scale the step's gradients carried (1 but with fp16), and whether the step was
  // skipped (its gradient overflowed: the parameters did not move).
  double lossScale = 1.0;
  bool skipped = false;
  // Local SGD / DiLoCo: the seconds the step spent bringing the ranks together (0: no sync).
  double syncSeconds = 0.0;
  bool synced = false;
};

// One rank's memory: the training state (StateBytes), activations and the process's resident set.
struct RankMemory {
  StateBytes state;
  size_t activations = 0;
  size_t residentPeak = 0;
};

struct TrainResult {
  std::vector<StepRecord> steps;       // this run's steps (after a resume: from the resumed step on)
  std::vector<RankMemory> memory;      // per rank
  std::vector<OverlapCounts> overlap;  // per rank: bucket reductions begun during backward
  std::vector<double> pipelineIdle;    // per rank: the share of its pipeline schedules' time spent waiting
  std::vector<MoeProfile> moePhases;   // per rank: the MoE layers' time per training step (empty without MoE)
  std::vector<LayerSpan> stages;       // the pipeline's cut of the blocks (empty without one)
  int buckets = 0;
  size_t largestBucketBytes = 0;
  GemmPeak peak;                          // what MFU is measured against
  long resumedFrom = 0;                   // the checkpoint's step, 0 when started fresh
  std::vector<double> compressionRatios;  // per bucket, by formula (empty without compression)
  uint64_t compressionPayloadBytes = 0;   // payload a compressed step sends from a rank, by formula
  // [run] profile: this rank's device time by call over the profiled steps (largest first).
  std::vector<Backend::CallTime> callTimes;
  long profiledSteps = 0;
};

// Bytes in the largest unit (B, KiB, ... TiB) that keeps the number at least 1: "7.2 MiB".
std::string humanBytes(double bytes, int decimals = 1);

// Runs the job. world: every rank of the job (its size must equal job.ranks; the device mesh's
// groups are split from it), or null for one rank. peak: the GEMM peak MFU is measured against.
// The data must have been prepared in job.dataDir (prepareData). The calling thread's subnormal
// mode is set as job.flushDenormals says (and stays so). Fault injection for tests: environment variable
// CHORUS_TRAIN_CRASH_IN_SAVE=N makes rank 0 die (SIGKILL) halfway through writing the checkpoint
// of step N.
TrainResult train(const Job& job, Communicator* world, const GemmPeak& peak);

}  // namespace chorus::training
