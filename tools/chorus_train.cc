// chorus_train.cc: chorus-train, the training job runner.
//
//   chorus-train JOB.toml [--ranks N] [--tp T] [--pp P] [--cp C] [--ep E] [--zero S] [--steps N] [--out DIR] [--resume]
//   [--device cpu|cuda] [--profile] [--peak-tflops X] [--no-plot] [--set sec.key=value]...
//   chorus-train --calibrate
//
// Started by hand, it prepares the job's data, finds this machine's GEMM peak (for MFU: peak.h), starts
// the ranks through chorusrun (each rank runs chorus-train again, as a worker) and, when they are
// done, draws the loss curve (tools/plot). Started by a launcher (RANK in the environment: chorusrun,
// torchrun-style, srun with the same variables), it is one rank of the job.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chorus/chorus.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/matmul.h"
#include "src/training/pipeline.h"
#include "src/training/trainer.h"

namespace fs = std::filesystem;
using namespace chorus::training;

namespace {

fs::path selfDir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

// A helper program: next to chorus-train as `installed` (cmake --install), else the source
// tree's tools/<name>.
std::string findTool(const std::string& name, const std::string& installed) {
  const fs::path near = selfDir() / installed;
  if (fs::exists(near)) return near.string();
  return std::string(CHORUS_SOURCE_TOOLS) + "/" + name;
}

// Rank 0 writes metrics.json (the trainer wrote metrics.csv step by step).
void writeMetrics(const Job& job, const TrainResult& r, size_t parameters, const std::string& tokenizer, int vocab) {
  // Throughput over the steps after the first two (start-up), as the median step.
  std::vector<double> times;
  for (size_t i = 2; i < r.steps.size(); ++i) times.push_back(r.steps[i].seconds);
  if (times.empty()) {
    for (const auto& s : r.steps) times.push_back(s.seconds);
  }
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0.0 : times[times.size() / 2];
  nlohmann::json j;
  j["job"] = job.name;
  j["file"] = job.path;
  j["model"] = {{"layers", job.model.layers},   {"heads", job.model.heads}, {"width", job.model.width},
                {"context", job.model.context}, {"vocab", vocab},           {"parameters", parameters}};
  if (job.model.moe.enabled()) {
    const auto& m = job.model.moe;
    j["model"]["moe"] = {{"experts", m.experts},
                         {"top_k", m.topK},
                         {"expert_hidden", m.hiddenFor(job.model.width)},
                         {"capacity_factor", m.capacityFactor},
                         {"aux_loss_coefficient", m.auxCoef},
                         {"z_loss_coefficient", m.zCoef},
                         {"swiglu", m.swiglu},
                         {"every", job.model.moeEvery},
                         {"dispatch_chunks", m.chunks}};
    if (!r.steps.empty()) {
      j["moe"] = {{"last_aux_loss", r.steps.back().auxLoss},
                  {"last_expert_balance", r.steps.back().expertBalance},
                  {"last_dropped_share", r.steps.back().dropped}};
    }
    // Where each rank's MoE layers spent a training step (forward and backward), in ms; the
    // chunks over the whole run.
    for (const auto& t : r.moePhases) {
      j["moe"]["phases_per_rank"].push_back({{"route_ms", 1e3 * t.route},
                                             {"dispatch_ms", 1e3 * t.dispatch},
                                             {"experts_ms", 1e3 * t.experts},
                                             {"combine_ms", 1e3 * t.combine},
                                             {"exchange_wait_ms", 1e3 * t.wait},
                                             {"chunks", t.chunks},
                                             {"chunks_overlapped", t.overlapped}});
    }
    for (const auto& s : r.steps) {
      j["moe"]["per_step"].push_back({{"step", s.step},
                                      {"aux_loss", s.auxLoss},
                                      {"expert_balance", s.expertBalance},
                                      {"dropped_share", s.dropped}});
    }
  }
  j["tokenizer"] = tokenizer;
  j["ranks"] = job.ranks;
  j["layout"] = {{"dp", job.dp()},
                 {"tp", job.tp},
                 {"pp", job.pp},
                 {"cp", job.cp},
                 {"ep", job.ep},
                 {"sequence_parallel", job.sequenceParallel},
                 {"recompute", job.recompute},
                 {"sync", job.sync}};
  if (job.pp > 1) {
    nlohmann::json cut = nlohmann::json::array();
    for (const auto& s : r.stages) cut.push_back({s.begin, s.end});
    j["pipeline"] = {{"schedule", job.schedule},
                     {"vpp", job.vpp},
                     {"micro_batches", job.accumulate},
                     {"blocks_per_chunk", cut},
                     {"idle_share_per_rank", r.pipelineIdle},
                     {"formula_idle_share", chorus::training::bubbleShare(job.pp, job.vpp, job.accumulate)}};
  }
  j["zero"] = job.zero;
  j["precision"] = {{"compute", job.compute}, {"reduce", job.reduce}};
  j["offload"] = {{"optimizer", job.offloadOptimizer}, {"params", job.offloadParams}};
  if (job.offloadOptimizer == "file") {
    j["offload"]["window_bytes"] = job.offload().windowBytes;
    j["offload"]["io"] = job.offloadIo;
  }
  if (job.compute == "fp16") {
    long skipped = 0;
    for (const auto& s : r.steps) skipped += s.skipped ? 1 : 0;
    j["precision"]["loss_scale"] = r.steps.empty() ? job.lossScale : r.steps.back().lossScale;
    j["precision"]["skipped_steps"] = skipped;
  }
  j["global_batch"] = job.globalBatch();
  j["micro"] = job.micro;
  j["accumulate"] = job.accumulate;
  j["seq"] = job.seq;
  j["blas"] = chorus::kernels::blasDescription();
  j["peak_gflops"] = r.peak.gflops;
  j["peak_source"] = r.peak.describe();
  j["median_step_seconds"] = median;
  j["tokens_per_s"] = median > 0 ? job.globalBatch() * job.seq / median : 0.0;
  j["resumed_from"] = r.resumedFrom;
  if (!r.steps.empty()) {
    j["first_loss"] = r.steps.front().loss;
    j["last_loss"] = r.steps.back().loss;
    j["final_val_loss"] = r.steps.back().valLoss;
    double mfu = 0.0;
    for (const auto& s : r.steps) mfu += s.mfu;
    j["mean_mfu"] = mfu / r.steps.size();
  }
  for (const auto& m : r.memory) {
    j["memory_per_rank"].push_back({{"params_bytes", m.state.params},
                                    {"grads_bytes", m.state.grads},
                                    {"optimizer_bytes", m.state.optimizer},
                                    {"offloaded_bytes", m.state.offloaded},
                                    {"transient_peak_bytes", m.state.transientPeak},
                                    {"activation_bytes", m.activations},
                                    {"resident_peak_bytes", m.residentPeak}});
  }
  j["buckets"] = {{"count", r.buckets}, {"largest_bytes", r.largestBucketBytes}, {"inflight", job.inflightBuckets}};
  for (const auto& o : r.overlap) {
    j["reductions_per_rank"].push_back({{"reductions", o.reductions},
                                        {"begun_during_backward", o.overlapped},
                                        {"bucket_steps", o.steps},
                                        {"steps_begun_during_backward", o.stepsOverlapped}});
  }
  // Gradient compression: the bytes rank 0 sent on the data-parallel communicator per step (median
  // over the compressed steps, and over the uncompressed ones), the ratio of each bucket's compressor.
  auto medianBytes = [&](bool compressed) {
    std::vector<double> bytes;
    for (const auto& s : r.steps) {
      if (s.compressed == compressed) bytes.push_back(double(s.dpBytes));
    }
    std::sort(bytes.begin(), bytes.end());
    return bytes.empty() ? 0.0 : bytes[bytes.size() / 2];
  };
  j["compress"] = {{"name", job.compress},
                   {"warmup_steps", job.compressWarmup},
                   {"dp_bytes_per_step", medianBytes(true)},
                   {"dp_bytes_per_uncompressed_step", medianBytes(false)},
                   {"payload_bytes_per_step", r.compressionPayloadBytes},
                   {"bucket_ratios", r.compressionRatios}};
  for (const auto& s : r.steps) {
    if (s.valLoss >= 0) j["val_losses"].push_back({s.step, s.valLoss});
  }
  for (const auto& s : r.steps) j["losses"].push_back({s.step, s.loss});
  if (job.profile) {
    // Rank 0's device time by call, per profiled step.
    const double steps = std::max<double>(1.0, static_cast<double>(r.profiledSteps));
    j["profile"] = {{"steps", r.profiledSteps}, {"calls", nlohmann::json::array()}};
    for (const auto& c : r.callTimes) {
      j["profile"]["calls"].push_back(
          {{"name", c.name}, {"ms_per_step", 1e3 * c.seconds / steps}, {"calls_per_step", c.calls / steps}});
    }
  }
  std::ofstream(job.out + "/metrics.json") << j.dump(1) << "\n";
}

// [run] profile: where rank 0's device time went per step, the largest calls first.
void printProfile(const TrainResult& r) {
  const double steps = std::max<double>(1.0, static_cast<double>(r.profiledSteps));
  double total = 0.0;
  for (const auto& c : r.callTimes) total += c.seconds;
  std::printf("chorus-train: rank 0's device time per step over %ld profiled steps: %.2f ms\n", r.profiledSteps,
              1e3 * total / steps);
  for (const auto& c : r.callTimes) {
    std::printf("  %-32s %9.3f ms %5.1f%%  (%.1f calls)\n", c.name.c_str(), 1e3 * c.seconds / steps,
                total > 0 ? 100.0 * c.seconds / total : 0.0, c.calls / steps);
  }
}

int worker(const Job& job) {
  const int world = std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1;
  std::optional<chorus::Communicator> comm;
  if (world > 1) comm.emplace(chorus::Communicator::fromEnvironment());
  const int rank = comm ? comm->rank() : 0;
  std::optional<GemmPeak> peak = importedPeak();
  PreparedData data;
  if (rank == 0) {
    data = prepareData(job.data, job.dataDir);  // reused when the launcher prepared it
    if (!peak) peak = findPeak(job);
  }
  if (comm) comm->barrier();  // the data is there for every rank
  const TrainResult result = train(job, comm ? &*comm : nullptr, peak.value_or(GemmPeak{}));
  if (rank == 0) {
    const Tokenizer tok = Tokenizer::load(job.dataDir + "/tokenizer.json");
    const int vocab = job.model.vocab > 0 ? job.model.vocab : tok.vocab();
    GptConfig config = job.model;
    config.vocab = vocab;
    writeMetrics(job, result, ParamLayout(config).total(), tok.kind(), vocab);
    if (job.profile) printProfile(result);
    if (!result.moePhases.empty()) {
      chorus::training::MoeProfile mean;
      for (const auto& t : result.moePhases) mean.add(t);
      const double n = static_cast<double>(result.moePhases.size());
      std::printf(
          "chorus-train: MoE layers per step (mean of %zu ranks): route %.2f ms, dispatch %.2f ms, experts %.2f ms, "
          "combine %.2f ms (waiting on exchanges %.2f ms); chunks computed while the next was in flight, all ranks and "
          "steps: %ld of %ld\n",
          result.moePhases.size(), 1e3 * mean.route / n, 1e3 * mean.dispatch / n, 1e3 * mean.experts / n,
          1e3 * mean.combine / n, 1e3 * mean.wait / n, mean.overlapped, mean.chunks);
    }
  }
  return 0;
}

int launch(const Job& job, const std::vector<std::string>& args) {
  fs::create_directories(job.out);
  const PreparedData data = prepareData(job.data, job.dataDir);
  std::printf("chorus-train: data in %s%s: %zu train / %zu val tokens, vocab %d\n", job.dataDir.c_str(),
              data.reused ? " (prepared before)" : "", data.trainTokens, data.valTokens, data.vocab);
  const GemmPeak peak = findPeak(job);
  std::printf("chorus-train: GEMM peak for MFU: %.1f GFLOP/s, %s (%s)\n", peak.gflops, peak.describe().c_str(),
              job.device == "cpu"
                  ? fmt::format("{} threads, {}", usableCpus(), chorus::kernels::blasDescription()).c_str()
                  : ("device " + job.device).c_str());
  std::fflush(stdout);
  exportPeak(peak);

  std::vector<std::string> command = {"/usr/bin/env",
                                      "python3",
                                      findTool("chorusrun", "chorusrun"),
                                      "-n",
                                      std::to_string(job.ranks),
                                      "--",
                                      fs::read_symlink("/proc/self/exe").string()};
  command.insert(command.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    execv(argv[0], argv.data());
    std::perror("chorus-train: exec chorusrun");
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0) {
    std::fprintf(stderr, "chorus-train: the ranks failed (status %d)\n", code);
    return code;
  }
  if (!job.plot) {
    std::printf("chorus-train: metrics in %s/metrics.csv and metrics.json\n", job.out.c_str());
    return 0;
  }
  const std::string png = job.out + "/loss.png";
  const std::string plotter = findTool("plot", "chorus-plot");
  const std::string plot = fmt::format("/usr/bin/python3 {} train {}/metrics.csv -o {}", plotter, job.out, png);
  if (std::system(plot.c_str()) == 0) {
    std::printf("chorus-train: metrics in %s/metrics.csv and metrics.json, loss curve in %s (drawn by %s)\n",
                job.out.c_str(), png.c_str(), plotter.c_str());
  } else {
    std::printf("chorus-train: metrics in %s/metrics.csv and metrics.json (the loss curve could not be drawn)\n",
                job.out.c_str());
  }
  return 0;
}

}  // namespace

// The OpenBLAS kernels this program runs (and the ranks, which inherit the environment): the job's
// [run] blas_coretype, else OPENBLAS_CORETYPE as the environment has it, else, where OpenBLAS took
// this CPU for an older one, the kernels its instructions allow (said once, by the launcher).
std::string blasCoreToRun(const std::string& declared) {
  if (!declared.empty()) return declared;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const std::string better = chorus::kernels::betterBlasCore();
  if (!better.empty() && std::getenv("RANK") == nullptr) {
    std::printf(
        "chorus-train: OpenBLAS took this CPU for %s; running its %s kernels instead (OPENBLAS_CORETYPE=%s; "
        "[run] blas_coretype or the variable chooses others)\n",
        chorus::kernels::blasCore().c_str(), better.c_str(), better.c_str());
    std::fflush(stdout);
  }
  return better;
}

int main(int argc, char** argv) {
  CLI::App app{"chorus-train: train a GPT on chorus as a job file describes"};
  std::string jobPath;
  std::vector<std::string> sets;
  int ranks = 0, zero = -1, tp = 0, pp = 0, cp = 0, ep = 0;
  long steps = 0;
  std::string out, compress, precision, offload, device;
  bool resume = false, calibrate = false, profile = false, noPlot = false;
  double peakTflops = 0;
  app.add_option("job", jobPath, "the job file (TOML)");
  app.add_option("--ranks", ranks, "ranks in all (overrides [parallel] ranks)");
  app.add_option("--tp", tp, "tensor-parallel ranks; data parallel gets ranks / (tp pp cp) (overrides [parallel] tp)");
  app.add_option("--pp", pp, "pipeline stages (overrides [parallel] pp)");
  app.add_option("--cp", cp, "context-parallel ranks (overrides [parallel] cp)");
  app.add_option("--ep", ep, "expert-parallel ranks, carved from data parallel (overrides [parallel] ep)");
  app.add_option("--zero", zero, "ZeRO stage 0..3 (overrides [parallel] zero)");
  app.add_option("--steps", steps, "steps to run (overrides [run] steps)");
  app.add_option("--out", out, "output directory (overrides [run] out)");
  app.add_option("--compress", compress,
                 "gradient compressor of the data-parallel all-reduce, e.g. powersgd:4, bf16, topk:0.01,ef=0 "
                 "(overrides [compress] name)");
  app.add_option("--precision", precision,
                 "compute precision: fp32, bf16 or fp16 (fp16 with a dynamic loss scale) (overrides [precision] "
                 "compute)");
  app.add_option("--offload", offload,
                 "where the optimizer state lives: none, host or file (overrides [offload] optimizer)");
  app.add_option("--device", device,
                 "where the model trains: cpu or cuda (rank r on GPU r % GPUs) (overrides [run] device)");
  app.add_flag("--resume", resume, "continue from the output directory's checkpoint");
  app.add_flag("--profile", profile,
               "time the device's calls from the second step on and print where its time went (sets [run] profile)");
  app.add_option("--peak-tflops", peakTflops, "this machine's GEMM peak for MFU (overrides [run] peak_tflops)");
  app.add_flag("--no-plot", noPlot, "do not draw OUT/loss.png at the end (sets [run] plot = false)");
  app.add_flag("--calibrate", calibrate,
               "measure this machine's GEMM peaks (fp32, bf16, fp16; run it with nothing else on the cores) and keep "
               "them for MFU "
               "in the calibration file ($CHORUS_CALIBRATION, else ~/.cache/chorus/gemm-peaks.json); no job");
  app.add_option("--set", sets, "any key: --set section.key=value (TOML value)");
  CLI11_PARSE(app, argc, argv);
  if (calibrate) {
    try {
      chorus::kernels::runWithBlasCore(blasCoreToRun(""), argv);
      for (const char* precision : {"fp32", "bf16", "fp16"}) {
        const double gflops = measureGemmGflops(usableCpus(), 1024, 5.0, precision);
        saveCalibratedPeak(calibrationFile(), precision, gflops);
        std::printf("chorus-train: %s GEMM peak of %s: %.1f GFLOP/s, kept in %s\n", precision, machineKey().c_str(),
                    gflops, calibrationFile().c_str());
      }
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "chorus-train: %s\n", e.what());
      return 1;
    }
  }
  if (jobPath.empty()) {
    std::fprintf(stderr, "chorus-train: a job file is needed (or --calibrate)\n");
    return 2;
  }
  if (peakTflops > 0) sets.push_back(fmt::format("run.peak_tflops={}", peakTflops));
  if (ranks > 0) sets.push_back(fmt::format("parallel.ranks={}", ranks));
  if (zero >= 0) sets.push_back(fmt::format("parallel.zero={}", zero));
  if (tp > 0) sets.push_back(fmt::format("parallel.tp={}", tp));
  if (pp > 0) sets.push_back(fmt::format("parallel.pp={}", pp));
  if (cp > 0) sets.push_back(fmt::format("parallel.cp={}", cp));
  if (ep > 0) sets.push_back(fmt::format("parallel.ep={}", ep));
  if (steps > 0) sets.push_back(fmt::format("run.steps={}", steps));
  if (!out.empty()) sets.push_back(fmt::format("run.out={}", nlohmann::json(out).dump()));
  if (resume) sets.push_back("run.resume=true");
  if (profile) sets.push_back("run.profile=true");
  if (noPlot) sets.push_back("run.plot=false");
  if (!device.empty()) sets.push_back(fmt::format("run.device={}", nlohmann::json(device).dump()));
  if (!precision.empty()) sets.push_back(fmt::format("precision.compute={}", nlohmann::json(precision).dump()));
  if (!offload.empty()) sets.push_back(fmt::format("offload.optimizer={}", nlohmann::json(offload).dump()));
  if (!compress.empty()) sets.push_back(fmt::format("compress.name={}", nlohmann::json(compress).dump()));
  try {
    const Job job = loadJob(jobPath, sets);
    chorus::kernels::runWithBlasCore(blasCoreToRun(job.blasCoretype), argv);
    if (std::getenv("RANK") != nullptr) return worker(job);
    std::vector<std::string> args(argv + 1, argv + argc);
    return launch(job, args);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "chorus-train%s: %s\n", rank ? fmt::format(" rank {}", rank).c_str() : "", e.what());
    return 1;
  }
}
