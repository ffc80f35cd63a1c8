// job.h: a training job as its TOML file describes it (model, data, batch, optimiser, parallel
// layout, run length, output), with defaults, command-line overrides and checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/nn.h"
#include "src/training/data.h"
#include "src/training/gpt.h"
#include "src/training/offload.h"

namespace chorus::training {

struct Job {
  std::string name = "job";
  std::string path;  // the file it was read from
  GptConfig model;   // model.vocab = 0 in the file: the tokenizer's vocabulary
  DataSettings data;
  std::string dataDir;  // prepared shards; default <out>/data
  int micro = 8;        // sequences per rank per micro-batch
  int seq = 64;
  int accumulate = 1;  // micro-batches per step
  kernels::OptimizerSettings optimizer;
  float minLr = 0.0f;              // cosine decay from optimizer.lr to minLr after warmup
  int warmup = 0;                  // linear warmup steps
  float clip = 1.0f;               // global gradient norm clip; 0 = none
  bool stepInBackward = false;     // [optimizer] in_backward: each bucket's step during backward (clip 0)
  int ranks = 1;                   // the world: dp x tp x pp x cp
  int tp = 1;                      // tensor parallel ranks (Megatron); data parallel gets ranks / (tp pp cp)
  int pp = 1;                      // pipeline stages
  int vpp = 1;                     // model chunks per stage (virtual stages; the interleaved schedule)
  std::string schedule = "1f1b";   // gpipe, 1f1b or interleaved: the pipeline's order of micro-batches
  int cp = 1;                      // context parallel ranks: each holds seq / cp positions (ring attention)
  int ep = 1;                      // expert parallel ranks (MoE), carved from dp: dp % ep == 0, experts % ep == 0
  std::string recompute = "none";  // activation checkpointing: none, selective or full
  bool sequenceParallel = false;   // with tp > 1: layernorms and residuals on blocks of the rows
  // How the data-parallel ranks agree (SyncMode): "every_step" (gradients averaged each step),
  // "local:H" (local SGD: each rank steps alone, the parameters averaged every H steps) or
  // "diloco:H" (each rank's H inner steps, then an outer SGD step with Nesterov momentum on the
  // average of the ranks' parameter deltas: outer_lr, outer_momentum).
  std::string sync = "every_step";
  double outerLr = 0.7, outerMomentum = 0.9;
  int zero = 0;
  double bucketMb = 25.0;
  int inflightBuckets = 2;  // ZeRO-2/3: bucket reductions in flight before backward waits
  // [compress]: gradient compression of the data-parallel all-reduce (a chorusCompressorCreate
  // spec: none, fp16, bf16, qsgd:s, sign, topk:f, randomk:f, powersgd:r, with ,ef=0 and such), after
  // warmup uncompressed steps.
  std::string compress = "none";
  long compressWarmup = 0;
  // [precision]: the compute type (Compute: fp32, bf16, fp16); the gradients' type on the wire
  // (reduce: fp32, or bf16, half the bytes); fp16's dynamic loss scale: the first scale, doubled
  // after growth_interval steps without overflow, halved (and the step skipped) on one.
  std::string compute = "fp32";
  std::string reduce = "fp32";
  double lossScale = 65536.0;
  int growthInterval = 2000;
  // [offload]: where the optimizer state lives (OffloadTarget: none, host, file) and, with
  // zero = 3 and optimizer = "file", the parameter shard too; the files' directory (default
  // <out>/offload), the memory window they stream through, and the I/O engine (auto, io_uring,
  // threads).
  std::string offloadOptimizer = "none";
  std::string offloadParams = "none";
  std::string offloadPath;
  double offloadWindowMb = 64.0;
  std::string offloadIo = "auto";
  long steps = 100;
  uint64_t seed = 1;
  int evalEvery = 0;    // 0: only at the end
  int evalBatches = 4;  // validation batches, each of global-batch size
  int logEvery = 10;
  int checkpointEvery = 0;  // 0: none
  bool resume = false;      // continue from <out>/checkpoint.bin when it exists
  std::string out = "runs/job";
  std::string blasCoretype;    // OPENBLAS_CORETYPE for the ranks ("" = as the environment has it)
  bool flushDenormals = true;  // subnormal floats flushed to zero on the ranks (kernels::setFlushDenormals)
  double peakTflops = 0;       // the machine's declared GEMM peak for MFU (0: calibrated or measured, peak.h)
  // Where the model trains (Device: "cpu" or "cuda"); with cuda, rank r on GPU r % (the GPUs
  // visible), so several ranks may share one. The step during backward and ZeRO-3's parameters
  // offloaded to a file run on the CPU only so far (refused by name).
  std::string device = "cpu";
  // Time the device's calls (Backend::profile) from the second step on, outside evaluation; the
  // totals per call go to the banner's end and metrics.json. A device only (refused on the CPU).
  bool profile = false;
  // Draw OUT/loss.png from metrics.csv at the end (tools/plot, matplotlib); false skips it (a sweep of
  // many short runs, or a machine without matplotlib).
  bool plot = true;

  int dp() const { return ranks / (tp * pp * cp); }
  // The [offload] settings, parsed (checked by loadJob).
  OffloadSettings offload() const;
  long globalBatch() const { return static_cast<long>(micro) * dp() * accumulate; }
  // The learning rate of step (from 1): warmup, then cosine to minLr at the last step.
  float learningRate(long step) const;
};

struct SyncMode {
  enum Kind { kEveryStep, kLocal, kDiloco } kind = kEveryStep;
  int every = 1;  // H: the steps between syncs
  bool local() const { return kind != kEveryStep; }
};
// "every_step", "local:H", "diloco:H" (H >= 1); throws chorus::Error naming the text otherwise.
SyncMode parseSync(const std::string& text);

// Reads a job file; overrides are "section.key=value" (value in TOML syntax, e.g.
// parallel.zero=2, run.out="x"). Throws chorus::Error naming the file and key on any problem.
Job loadJob(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace chorus::training
