// trainer.cc: the training loop.
#include "src/training/trainer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "chorus/error.hpp"
#include "kernels/cpu/matmul.h"
#include "src/training/loss_scale.h"
#include "src/training/mesh.h"
#include "src/training/pipeline.h"

namespace chorus::training {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

size_t residentPeakBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

// ---- checkpoints: "CHCK", uint32 header length, the JSON header, then params, m, v (fp32), each
// of the model's whole size; under local steps more arrays of that size follow (DiLoCo's outer
// momentum, then the other data-parallel ranks' m and v: see train()) ----

void writeAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(chorusSystemError, "checkpoint: writing " + path + ": " + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// Written to path.tmp, flushed to disk, then renamed over path (and the directory flushed): a
// crash at any moment leaves either the old checkpoint or the new one, whole.
void saveCheckpoint(const std::string& path, const nlohmann::json& header, const std::vector<float>& params,
                    const std::vector<float>& m, const std::vector<float>& v, bool crashHalfway,
                    const std::vector<std::vector<float>>& more = {}) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(chorusSystemError, "checkpoint: cannot create " + tmp + ": " + std::strerror(errno));
  const std::string text = header.dump();
  const uint32_t length = static_cast<uint32_t>(text.size());
  writeAll(fd, "CHCK", 4, tmp);
  writeAll(fd, &length, 4, tmp);
  writeAll(fd, text.data(), text.size(), tmp);
  writeAll(fd, params.data(), params.size() * sizeof(float), tmp);
  if (crashHalfway) {
    ::fsync(fd);
    ::kill(::getpid(), SIGKILL);
  }
  writeAll(fd, m.data(), m.size() * sizeof(float), tmp);
  writeAll(fd, v.data(), v.size() * sizeof(float), tmp);
  for (const auto& a : more) writeAll(fd, a.data(), a.size() * sizeof(float), tmp);
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    throw Error(chorusSystemError, "checkpoint: flushing " + tmp + ": " + std::strerror(errno));
  }
  fs::rename(tmp, path);
  const int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

// A checkpoint's header, and where its arrays begin: each of `total` floats.
struct CheckpointFile {
  std::string path;
  nlohmann::json header;
  size_t dataOffset = 0, total = 0;
};

// Reads the header; throws naming the file when it is not a chorus checkpoint or holds another
// parameter count than total.
CheckpointFile openCheckpoint(const std::string& path, size_t total) {
  std::ifstream f(path, std::ios::binary);
  char magic[4];
  uint32_t length = 0;
  if (!f.read(magic, 4) || std::memcmp(magic, "CHCK", 4) != 0 || !f.read(reinterpret_cast<char*>(&length), 4)) {
    throw Error(chorusInvalidArgument, "checkpoint " + path + " is not a chorus checkpoint");
  }
  std::string text(length, '\0');
  f.read(text.data(), length);
  nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || header.value("parameters", size_t{0}) != total) {
    throw Error(chorusInvalidArgument,
                fmt::format("checkpoint {} holds {} parameters; this model has {}", path,
                            header.is_discarded() ? 0 : header.value("parameters", size_t{0}), total));
  }
  return CheckpointFile{path, std::move(header), 8 + static_cast<size_t>(length), total};
}

// Array `index` of the checkpoint: 0 params, 1 m, 2 v, then the local steps' ones (see train()).
void readCheckpointArray(const CheckpointFile& c, size_t index, std::vector<float>& out) {
  std::ifstream f(c.path, std::ios::binary);
  out.resize(c.total);
  f.seekg(static_cast<std::streamoff>(c.dataOffset + index * c.total * sizeof(float)));
  if (!f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(c.total * sizeof(float)))) {
    throw Error(chorusInvalidArgument, fmt::format("checkpoint {} is truncated (array {})", c.path, index));
  }
}

}  // namespace

std::string humanBytes(double bytes, int decimals) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.{}f} {}", bytes, decimals, units[u]);
}

TrainResult train(const Job& job, Communicator* world, const GemmPeak& peak) {
  const int worldSize = world ? world->size() : 1;
  if (worldSize != job.ranks) {
    throw Error(chorusInvalidArgument,
                fmt::format("train: the job asks for {} ranks, the communicator has {}", job.ranks, worldSize));
  }
  // This thread and those it starts (data parallelism's communication threads) flush subnormals.
  kernels::setFlushDenormals(job.flushDenormals);
  // The mesh: tensor parallel over tp neighbouring ranks, then context parallel, data parallel over
  // ranks / (tp pp cp), the pipeline's stages slowest. The cp ranks of a dp rank share its
  // sequences (each holding some positions), so gradients are averaged over dp and cp together.
  const MeshShape shape{job.dp(), job.tp, job.pp, job.cp, job.ep};
  std::optional<DeviceMesh> mesh;
  if (world) mesh.emplace(*world, shape);
  Communicator* dpComm = mesh ? mesh->group(job.cp > 1 ? "dpcp" : "dp") : nullptr;
  Communicator* tpComm = mesh ? mesh->group("tp") : nullptr;
  Communicator* ppComm = mesh ? mesh->group("pp") : nullptr;
  Communicator* cpComm = mesh ? mesh->group("cp") : nullptr;
  Communicator* epComm = mesh ? mesh->group("ep") : nullptr;
  const int ranks = shape.dp;  // data-parallel ranks: the batch is split over them
  const int rank = mesh ? mesh->coords().dp : 0;
  const bool leader = !world || world->rank() == 0;
  const char* localRanks = std::getenv("LOCAL_WORLD_SIZE");
  const int perHost = localRanks ? std::max(1, std::atoi(localRanks)) : worldSize;
  const int blasThreads = std::max(1, usableCpus() / perHost);

  // Data (prepared already) and the model.
  const auto trainTokens = loadSplit(job.dataDir, "train");
  const auto valTokens = loadSplit(job.dataDir, "val");
  const Tokenizer tokenizer = Tokenizer::load(job.dataDir + "/tokenizer.json");
  GptConfig config = job.model;
  if (config.vocab == 0) config.vocab = tokenizer.vocab();
  if (config.vocab < tokenizer.vocab()) {
    throw Error(chorusInvalidArgument, fmt::format("job {}: [model] vocab = {} is below the tokenizer's {}", job.path,
                                                   config.vocab, tokenizer.vocab()));
  }
  // Pipeline: the blocks cut into pp x vpp chunks of balanced modelled cost; this stage's chunks.
  std::vector<LayerSpan> cut, spans;
  if (job.pp > 1) {
    cut = balanceLayers(config, job.micro, job.seq, job.pp * job.vpp);
    spans = stageSpans(cut, job.pp, mesh->coords().pp);
  }
  // The device: rank r on GPU r % (the GPUs here), before anything is made on it.
  const Device device = parseDevice(job.device);
  useDeviceOfRank(device, world ? world->rank() : 0);
  // MoE exchanges in chunks run on a communication thread of the ep group, overlapping the experts.
  std::unique_ptr<CommWorker> epWorker;
  if (epComm && config.moe.chunks > 1)
    epWorker = std::make_unique<CommWorker>(*epComm, CommWorker::delayFromEnvironment());
  Gpt model(config, job.micro, job.seq, TensorParallel{tpComm, job.sequenceParallel}, spans,
            parseRecompute(job.recompute), ContextParallel{cpComm}, ExpertParallel{epComm, epWorker.get()},
            parseCompute(job.compute), device);
  LossScale lossScale(model.compute() == Compute::kFp16, job.lossScale, job.growthInterval);
  const Sampler sampler(&trainTokens, job.seq, job.seed);
  const Sampler valWindows(&valTokens, job.seq, 0);
  DataParallelSettings parallel;
  parallel.zeroStage = job.zero;
  parallel.bucketBytes = static_cast<size_t>(job.bucketMb * 1024 * 1024);
  parallel.inflightBuckets = job.inflightBuckets;
  parallel.compressor = job.compress;
  parallel.compressFrom = job.compressWarmup + 1;
  parallel.optimizer = job.optimizer.kind;
  parallel.reduceBf16 = job.reduce == "bf16";
  const SyncMode sync = parseSync(job.sync);
  parallel.localSteps = sync.local();
  parallel.offload = job.offload();
  parallel.offloadFile = fmt::format("rank{}.state", world ? world->rank() : 0);
  parallel.stepInBackward = job.stepInBackward;
  parallel.device = device;
  // Sums over the model-parallel ranks (tp, then pp), on the training thread.
  auto modelParallelSum = [tpComm, ppComm](std::span<double> x) {
    if (tpComm) tpComm->allReduce(x);
    if (ppComm) ppComm->allReduce(x);
  };
  if (tpComm || ppComm) {
    parallel.modelParallelSum = [modelParallelSum](double value) {
      modelParallelSum(std::span<double>(&value, 1));
      return value;
    };
  }
  if (epComm) {
    parallel.expertComm = mesh->group("edpcp");
    parallel.expertParallelSum = [epComm](double value) {
      epComm->allReduce(std::span<double>(&value, 1));
      return value;
    };
  }
  if (Communicator* ends = mesh ? mesh->group("embedding") : nullptr) {
    parallel.tiedSum = [ends](std::span<float> grad) { ends->allReduce(grad); };
  }
  DataParallel dp(model.layout(), dpComm, parallel, job.seed);
  std::optional<Pipeline> pipeline;
  if (job.pp > 1) pipeline.emplace(model, *ppComm, parseSchedule(job.schedule));
  // Checkpoints hold the whole model in the one-rank layout, whatever the layout that wrote them:
  // each tp rank places its shard (the replicated tensors from tp rank 0 only, the tied head's
  // copy from none), each ep rank its experts (the rest from ep rank 0 only), and the tp, pp and ep
  // groups sum them. So a checkpoint resumes under any layout.
  const ParamLayout& layout = model.layout();
  auto toWhole = [&](const std::vector<float>& local, std::vector<float>& whole) {
    whole.assign(layout.globalTotal(), 0.0f);
    layout.toGlobal(local.data(), whole.data(), true);
    if (tpComm) tpComm->allReduce(std::span<float>(whole));
    if (ppComm) ppComm->allReduce(std::span<float>(whole));
    if (epComm) epComm->allReduce(std::span<float>(whole));
  };
  auto wholeState = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& v) {
    std::vector<float> local[3];
    dp.gatherState(local[0], local[1], local[2]);
    toWhole(local[0], p);
    toWhole(local[1], m);
    toWhole(local[2], v);
  };
  kernels::setBlasThreads(blasThreads);

  TrainResult result;
  result.peak = peak;
  const std::string ckptPath = job.out + "/checkpoint.bin";
  if (leader) fs::create_directories(job.out);
  long start = 1;
  std::vector<float> resumedMomentum;  // DiLoCo's outer momentum from a checkpoint (this rank's layout)
  long resumedOuterSteps = 0;
  if (job.resume && fs::exists(ckptPath)) {
    const CheckpointFile ckpt = openCheckpoint(ckptPath, layout.globalTotal());
    const nlohmann::json& header = ckpt.header;
    // The arrays this rank loads: the parameters, and m and v, which under local steps are each
    // data-parallel rank's own (rank 0's the usual ones, the others' after DiLoCo's outer momentum),
    // kept only when the run that wrote them had the same sync and ranks.
    size_t mIndex = 1;
    if (header.contains("inner_states")) {
      const int states = header.at("inner_states");
      if (header.at("sync") != job.sync || states != ranks) {
        throw Error(chorusInvalidArgument,
                    fmt::format("checkpoint {}: written under sync = \"{}\" with each of {} data-parallel ranks' own "
                                "optimizer state; this run has sync = \"{}\" and {} data-parallel rank(s): resume "
                                "it with the same sync and ranks",
                                ckptPath, header.at("sync").get<std::string>(), states, job.sync, ranks));
      }
      const bool diloco = header.value("outer_momentum", false);
      if (rank > 0) mIndex = 3 + (diloco ? 1 : 0) + 2 * static_cast<size_t>(rank - 1);
      if (diloco && sync.kind == SyncMode::kDiloco) {
        std::vector<float> momentum;
        readCheckpointArray(ckpt, 3, momentum);
        resumedMomentum.resize(layout.total());
        layout.fromGlobal(momentum.data(), resumedMomentum.data());
        resumedOuterSteps = header.value("outer_steps", 0L);
      }
    }
    std::vector<float> local[3];
    const size_t indices[3] = {0, mIndex, mIndex + 1};
    for (int i = 0; i < 3; ++i) {
      std::vector<float> whole;
      readCheckpointArray(ckpt, indices[i], whole);
      local[i].resize(layout.total());
      layout.fromGlobal(whole.data(), local[i].data());
    }
    dp.loadState(local[0], local[1], local[2]);
    result.resumedFrom = header.at("step");
    start = result.resumedFrom + 1;
    dp.setNextStep(start);
    if (header.value("compute", std::string("fp32")) != job.compute) {
      throw Error(chorusInvalidArgument,
                  fmt::format("checkpoint {}: written by a {} run, resumed by a {} one", ckptPath,
                              header.value("compute", std::string("fp32")), job.compute));
    }
    if (header.contains("loss_scale")) {
      lossScale.restore(header.at("loss_scale"), header.at("skipped_steps"), header.at("clean_steps"));
    }
    if (header.at("global_batch") != job.globalBatch() || header.at("seed") != job.seed) {
      throw Error(chorusInvalidArgument,
                  fmt::format("checkpoint {}: global batch {} and seed {} differ from the job's {} and {}; its data "
                              "position would not continue",
                              ckptPath, header.at("global_batch").dump(), header.at("seed").dump(), job.globalBatch(),
                              job.seed));
    }
    if (leader) std::printf("resumed from %s at step %ld\n", ckptPath.c_str(), result.resumedFrom);
  }

  long outerSteps = 0;
  if (sync.kind == SyncMode::kDiloco) {
    dp.anchorParameters();  // a checkpoint is written where the ranks agree: its parameters are the anchor
    if (!resumedMomentum.empty()) {
      dp.loadOuterMomentum(resumedMomentum);
      outerSteps = resumedOuterSteps;
    }
  }
  double syncSecondsTotal = 0;

  std::string pipelineText;
  if (job.pp > 1) {
    pipelineText = fmt::format(" ({}, {} chunk(s) per stage; blocks", job.schedule, job.vpp);
    for (const auto& c : cut) pipelineText += fmt::format(" [{},{})", c.begin, c.end);
    pipelineText += ")";
  }
  if (leader) {
    std::printf(
        "%s: %s, %zu parameters (%zu on rank 0); %d rank(s) as %s, ZeRO-%d, %d bucket(s); batch %d x %d dp "
        "rank(s) x %d micro-batch(es) = %ld sequences of %d; %zu train / %zu val tokens (%s tokenizer, vocab %d); "
        "%s\n",
        job.name.c_str(), config.describe().c_str(), layout.globalTotal(), layout.total(), worldSize,
        (shape.describe() + (job.sequenceParallel && job.tp > 1 ? " sp" : "") + pipelineText +
         (job.recompute != "none" ? ", recompute " + job.recompute : "") +
         (job.compute != "fp32"
              ? fmt::format(", {} compute ({})", job.compute,
                            kernels::gemm16Description(job.compute == "fp16" ? kernels::Float16::kFp16
                                                                             : kernels::Float16::kBf16))
              : "") +
         (job.reduce != "fp32" ? ", gradients reduced in " + job.reduce : "") +
         (job.offloadOptimizer != "none"
              ? fmt::format(", optimizer state{} offloaded to {}", job.offloadParams == "file" ? " and parameters" : "",
                            dp.stateDescription())
              : ""))
            .c_str(),
        job.zero, dp.buckets(), job.micro, ranks, job.accumulate, job.globalBatch(), job.seq, trainTokens.size(),
        valTokens.size(), tokenizer.kind().c_str(), tokenizer.vocab(),
        (device == Device::kCpu ? fmt::format("BLAS {}, {} thread(s) per rank", kernels::blasDescription(), blasThreads)
                                : fmt::format("on {} (rank 0's; rank r on GPU r % GPUs)", model.backend().describe()))
            .c_str());
    std::fflush(stdout);
  }

  // metrics.csv, a row per step as it ends (a resumed run keeps the rows up to its checkpoint).
  std::ofstream csv;
  if (leader) {
    const std::string csvPath = job.out + "/metrics.csv";
    std::vector<std::string> kept;
    if (result.resumedFrom > 0) {
      std::ifstream in(csvPath);
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line)) {
        if (!line.empty() && std::stol(line.substr(0, line.find(','))) <= result.resumedFrom) kept.push_back(line);
      }
    }
    csv.open(csvPath, std::ios::trunc);
    csv << "step,loss,val_loss,lr,grad_norm,seconds,tokens_per_s,mfu,dp_bytes,compressed,aux_loss,expert_balance,"
           "dropped,loss_scale,skipped,sync_ms\n";
    for (const auto& line : kept) csv << line << "\n";
    csv.flush();
  }

  // Batches are sampled as whole sequences; a cp rank keeps its positions of each (all without cp).
  std::vector<int> wholeInputs(static_cast<size_t>(job.micro) * job.seq), wholeTargets(wholeInputs.size());
  std::vector<int> inputs(static_cast<size_t>(job.micro) * model.seq()), targets(inputs.size());
  const auto positions = model.positions();
  auto keepPositions = [&](int* in, int* out) {
    for (int b = 0; b < job.micro; ++b) {
      for (size_t t = 0; t < positions.size(); ++t) {
        in[b * positions.size() + t] = wholeInputs[static_cast<size_t>(b) * job.seq + positions[t]];
        out[b * positions.size() + t] = wholeTargets[static_cast<size_t>(b) * job.seq + positions[t]];
      }
    }
  };
  // Validation: the first evalBatches x (global batch) windows of the validation stream, in
  // micro-batch chunks dealt round-robin to the ranks, so the set does not depend on the layout.
  auto evaluate = [&]() {
    const long chunks = static_cast<long>(job.evalBatches) * ranks * job.accumulate;
    // This rank's i-th micro-batch is chunk rank + i ranks.
    auto fill = [&](long i, int* in, int* out) {
      const long c = rank + i * ranks;
      for (int j = 0; j < job.micro; ++j) {
        const uint64_t k = static_cast<uint64_t>(c) * job.micro + j;
        const size_t at = (k % valWindows.windows()) * job.seq;
        std::memcpy(wholeInputs.data() + static_cast<size_t>(j) * job.seq, valTokens.data() + at,
                    job.seq * sizeof(int));
        std::memcpy(wholeTargets.data() + static_cast<size_t>(j) * job.seq, valTokens.data() + at + 1,
                    job.seq * sizeof(int));
      }
      keepPositions(in, out);
    };
    std::vector<double> sum = {0.0};
    if (pipeline) {
      sum[0] = pipeline->evaluate(
          static_cast<int>(chunks / ranks), [&](int i, int* in, int* out) { fill(i, in, out); }, dp);
      ppComm->allReduce(std::span<double>(sum));  // the loss is known on the last stage
    } else {
      for (long i = 0; i < chunks / ranks; ++i) {
        fill(i, inputs.data(), targets.data());
        dp.beginMicro(true, true);
        sum[0] += model.forward(inputs.data(), targets.data(), dp);
      }
    }
    dp.sumOverRanks(sum);  // over dp and cp: each cp rank's loss is the mean over its positions
    return sum[0] / static_cast<double>(chunks * job.cp);
  };

  // The step's MoE statistics over every rank: the blocks of every stage, the micro-batches of
  // every dp (and cp) rank; the tp ranks see the same choices (with sequence parallelism each its
  // rows' drops, summed).
  auto moeStep = [&](const Gpt::MoeSummary& t, StepRecord& r) {
    std::vector<double> v = {t.aux, double(t.layers), double(t.dropped)};
    for (long c : t.expertChoices) v.push_back(double(c));
    v.resize(3 + config.moe.experts, 0.0);
    if (job.sequenceParallel && tpComm) tpComm->allReduce(std::span<double>(v.data() + 2, 1));
    if (ppComm) ppComm->allReduce(std::span<double>(v));
    dp.sumOverRanks(v);
    double total = 0, most = 0;
    for (int e = 0; e < config.moe.experts; ++e) {
      total += v[3 + e];
      most = std::max(most, v[3 + e]);
    }
    r.auxLoss = v[1] > 0 ? v[0] / v[1] : 0.0;
    r.expertBalance = total > 0 ? most / (total / config.moe.experts) : 0.0;
    r.dropped = total > 0 ? v[2] / total : 0.0;
  };
  const double flopsPerStep = model.flopsPerStep() * job.accumulate * ranks;
  const int crashAt =
      std::getenv("CHORUS_TRAIN_CRASH_IN_SAVE") ? std::atoi(std::getenv("CHORUS_TRAIN_CRASH_IN_SAVE")) : -1;
  // Every communicator of the run, for a failure that no call has reported: a device call fails on
  // its stream, which goes on with what the call left in its buffers. Checked at each step's end
  // (the device past the step: its losses are on the host) and again before a checkpoint is
  // written, so that no failed step is logged, saved or counted as done.
  auto checkCommunicators = [&](long step) {
    try {
      if (world) checkCommunicator(*world, "the world");
      if (mesh) mesh->checkAsyncErrors();
      if (pipeline) pipeline->checkAsyncErrors();
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("train: step {}: {}", step, e.what()));
    }
  };
  uint64_t dpSent = dp.wireBytes();
  MoeProfile moeTime;  // the MoE layers' time over the training steps
  const char* stragglerText = std::getenv("CHORUS_TRAIN_STRAGGLER_MS");
  const int stragglerMs = stragglerText ? std::max(0, std::atoi(stragglerText)) : 0;
  for (long step = start; step <= job.steps; ++step) {
    const auto t0 = Clock::now();
    // The emulated straggler (CHORUS_TRAIN_STRAGGLER_MS): a different data-parallel rank each step.
    if (stragglerMs > 0 && step % ranks == rank) std::this_thread::sleep_for(std::chrono::milliseconds(stragglerMs));
    const bool compressed = dp.compressing();
    auto optimizer = job.optimizer;
    optimizer.lr = job.learningRate(step);
    double lossSum = 0.0;
    if (pipeline) {
      lossSum = pipeline->train(
          job.accumulate,
          [&](int micro, int* in, int* out) {
            sampler.fill(step - 1, micro, rank, ranks, job.micro, job.accumulate, wholeInputs.data(),
                         wholeTargets.data());
            keepPositions(in, out);
          },
          dp, static_cast<float>(lossScale.scale()) / static_cast<float>(job.accumulate));
      ppComm->allReduce(std::span<double>(&lossSum, 1));  // the loss is known on the last stage
    } else {
      for (int micro = 0; micro < job.accumulate; ++micro) {
        sampler.fill(step - 1, micro, rank, ranks, job.micro, job.accumulate, wholeInputs.data(), wholeTargets.data());
        keepPositions(inputs.data(), targets.data());
        dp.beginMicro(micro == job.accumulate - 1);
        if (job.stepInBackward && micro == job.accumulate - 1) dp.armStep(optimizer, step, lossScale.skipped());
        lossSum += model.forward(inputs.data(), targets.data(), dp);
        model.backward(dp, static_cast<float>(lossScale.scale()) / static_cast<float>(job.accumulate));
      }
    }
    StepRecord r;
    if (config.moe.enabled()) moeStep(model.takeMoeTotals(), r);
    moeTime.add(model.takeMoeProfile());
    r.step = step;
    r.lr = optimizer.lr;
    r.lossScale = lossScale.scale();
    r.gradNorm = dp.step(optimizer, step, job.clip, static_cast<float>(lossScale.scale()), lossScale.skipped());
    r.skipped = !lossScale.update(r.gradNorm);
    // Local SGD / DiLoCo: every H steps, and at the last, the ranks agree again.
    if (sync.local() && (step % sync.every == 0 || step == job.steps)) {
      const auto ts = Clock::now();
      if (sync.kind == SyncMode::kDiloco) {
        kernels::OptimizerSettings outer;
        outer.kind = kernels::Optimizer::kSgd;
        outer.lr = static_cast<float>(job.outerLr);
        outer.momentum = static_cast<float>(job.outerMomentum);
        outer.nesterov = job.outerMomentum > 0;
        outer.weightDecay = 0.0f;
        dp.syncParameters(&outer, ++outerSteps);
      } else {
        dp.syncParameters(nullptr, 0);
      }
      r.synced = true;
      r.syncSeconds = std::chrono::duration<double>(Clock::now() - ts).count();
      syncSecondsTotal += r.syncSeconds;
    }
    r.compressed = compressed;
    const uint64_t sentNow = dp.wireBytes();
    r.dpBytes = sentNow - dpSent;
    dpSent = sentNow;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.loss = dp.average(lossSum / job.accumulate);
    r.seconds = ranks > 1 ? dp.average(r.seconds) : r.seconds;
    r.tokensPerSecond = static_cast<double>(job.globalBatch()) * job.seq / r.seconds;
    r.mfu = peak.gflops > 0 ? flopsPerStep / r.seconds / (peak.gflops * 1e9) : 0.0;
    if ((job.evalEvery > 0 && step % job.evalEvery == 0) || step == job.steps) {
      if (job.profile) model.backend().profile(false);  // evaluation is no step's
      r.valLoss = evaluate();
      if (job.profile && step > start) model.backend().profile(true);
      model.takeMoeTotals();  // validation's routing is not the step's
      model.takeMoeProfile();
    }
    checkCommunicators(step);
    result.steps.push_back(r);
    // Profiling from the second step on: the first makes the buffers, plans and handles.
    if (job.profile && step == start) model.backend().profile(true);
    if (leader) {
      csv << fmt::format("{},{:.7f},{},{:.6g},{:.8g},{:.6f},{:.1f},{:.5f},{},{},{},{},{},{}\n", r.step, r.loss,
                         r.valLoss >= 0 ? fmt::format("{:.7f}", r.valLoss) : "", r.lr, r.gradNorm, r.seconds,
                         r.tokensPerSecond, r.mfu, r.dpBytes, r.compressed ? 1 : 0,
                         r.auxLoss >= 0 ? fmt::format("{:.6f},{:.4f},{:.6f}", r.auxLoss, r.expertBalance, r.dropped)
                                        : std::string(",,"),
                         r.lossScale, r.skipped ? 1 : 0, r.synced ? fmt::format("{:.3f}", 1e3 * r.syncSeconds) : "");
      csv.flush();
    }

    if (job.checkpointEvery > 0 && (step % job.checkpointEvery == 0 || step == job.steps)) {
      std::vector<float> p, m, v;
      wholeState(p, m, v);
      // Local steps: the other data-parallel ranks' m and v, each from its replica's first rank (tp
      // and pp rank 0; wholeState gave every rank of a replica the whole), and DiLoCo's outer momentum.
      std::vector<std::vector<float>> more;
      if (sync.local()) {
        if (sync.kind == SyncMode::kDiloco) {
          std::vector<float> local, momentum;
          dp.outerMomentum(local);
          toWhole(local, momentum);
          more.push_back(std::move(momentum));
        }
        const MeshCoords here = mesh ? mesh->coords() : MeshCoords{};
        if (here.dp > 0 && here.tp == 0 && here.pp == 0 && here.cp == 0) {
          world->send(std::span<const float>(m), 0);
          world->send(std::span<const float>(v), 0);
        }
        if (leader) {
          for (int d = 1; d < ranks; ++d) {
            const int from = rankOf(MeshCoords{d, 0, 0, 0}, shape);
            for (int k = 0; k < 2; ++k) {
              more.emplace_back(layout.globalTotal());
              world->recv(std::span<float>(more.back()), from);
            }
          }
        }
      }
      if (leader) {
        nlohmann::json header = {{"step", step},
                                 {"parameters", layout.globalTotal()},
                                 {"config", config.describe()},
                                 {"global_batch", job.globalBatch()},
                                 {"seed", job.seed},
                                 {"samples_consumed", step * job.globalBatch()},
                                 {"sampler_epoch", step * job.globalBatch() / static_cast<long>(sampler.windows())},
                                 {"compute", job.compute},
                                 {"loss_scale", lossScale.scale()},
                                 {"skipped_steps", lossScale.skipped()},
                                 {"clean_steps", lossScale.cleanRun()}};
        if (sync.local()) {
          header["sync"] = job.sync;
          header["inner_states"] = ranks;
          header["outer_momentum"] = sync.kind == SyncMode::kDiloco;
          header["outer_steps"] = outerSteps;
        }
        checkCommunicators(step);  // the state gathered: every call of the step has finished
        saveCheckpoint(ckptPath, header, p, m, v, step == crashAt, more);
      }
    }
    if (leader && (step % job.logEvery == 0 || step == start || step == job.steps)) {
      const auto b = dp.bytes();
      std::string extraText = r.auxLoss >= 0 ? fmt::format(" | aux {:.3f} | balance {:.2f} | dropped {:.1f}%",
                                                           r.auxLoss, r.expertBalance, 100 * r.dropped)
                                             : "";
      if (sync.local()) {
        extraText +=
            fmt::format(" | sync {:.1f} ms/step", 1e3 * syncSecondsTotal / static_cast<double>(step - start + 1));
      }
      if (lossScale.dynamic()) extraText += fmt::format(" | scale {:g} | skipped {}", r.lossScale, lossScale.skipped());
      std::printf(
          "step %5ld/%ld | loss %.4f%s%s | lr %.2e | norm %.3f | %.0f tok/s | %s | %.0f ms | state/rank %s "
          "(params %s, grads %s, optimizer %s%s) | RSS %s\n",
          step, job.steps, r.loss, r.valLoss >= 0 ? fmt::format(" val {:.4f}", r.valLoss).c_str() : "",
          extraText.c_str(), r.lr, r.gradNorm, r.tokensPerSecond, mfuText(r.mfu, peak.source).c_str(), 1000 * r.seconds,
          humanBytes(b.persistent()).c_str(), humanBytes(b.params).c_str(), humanBytes(b.grads).c_str(),
          humanBytes(b.optimizer).c_str(),
          b.offloaded ? fmt::format(", {} in a file", humanBytes(b.offloaded)).c_str() : "",
          humanBytes(residentPeakBytes()).c_str());
      std::fflush(stdout);
    }
  }

  // Memory of every rank, gathered to all.
  const auto b = dp.bytes();
  std::vector<double> mine = {double(b.params),
                              double(b.grads),
                              double(b.optimizer),
                              double(b.transientPeak),
                              double(model.activationBytes()),
                              double(residentPeakBytes()),
                              double(dp.overlap().reductions),
                              double(dp.overlap().overlapped),
                              pipeline ? pipeline->times().seconds : 0.0,
                              pipeline ? pipeline->times().idleSeconds : 0.0,
                              moeTime.route,
                              moeTime.dispatch,
                              moeTime.experts,
                              moeTime.combine,
                              moeTime.wait,
                              double(moeTime.chunks),
                              double(moeTime.overlapped),
                              double(b.offloaded),
                              double(dp.overlap().steps),
                              double(dp.overlap().stepsOverlapped)};
  std::vector<double> all(mine.size() * worldSize, 0.0);
  const int worldRank = world ? world->rank() : 0;
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<long>(worldRank * mine.size()));
  if (world) world->allReduce(std::span<double>(all));
  for (int r = 0; r < worldSize; ++r) {
    RankMemory mem;
    const double* x = all.data() + r * mine.size();
    mem.state = StateBytes{size_t(x[0]), size_t(x[1]), size_t(x[2]), size_t(x[3]), size_t(x[17])};
    mem.activations = size_t(x[4]);
    mem.residentPeak = size_t(x[5]);
    result.memory.push_back(mem);
    result.overlap.push_back({long(x[6]), long(x[7]), long(x[18]), long(x[19])});
    result.pipelineIdle.push_back(x[8] > 0 ? x[9] / x[8] : 0.0);
    if (config.moe.enabled()) {
      const double steps = std::max<double>(1.0, static_cast<double>(result.steps.size()));
      result.moePhases.push_back(MoeProfile{x[10] / steps, x[11] / steps, x[12] / steps, x[13] / steps, x[14] / steps,
                                            long(x[15]), long(x[16])});
    }
  }
  result.stages = cut;
  result.buckets = dp.buckets();
  result.largestBucketBytes = dp.largestBucketBytes();
  result.compressionRatios = dp.compressionRatios();
  result.compressionPayloadBytes = dp.compressionPayloadBytes();
  if (job.profile) {
    model.backend().profile(false);
    result.callTimes = model.backend().callTimes();
    result.profiledSteps = static_cast<long>(result.steps.size()) - 1;
  }
  return result;
}

}  // namespace chorus::training
