// job.cc: job files through toml++.
#include "src/training/job.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "chorus/error.hpp"
#include "src/training/backend.h"
#include "src/training/pipeline.h"

namespace chorus::training {

OffloadSettings Job::offload() const {
  OffloadSettings s;
  s.optimizer = parseOffloadTarget(offloadOptimizer);
  s.params = parseOffloadTarget(offloadParams);
  s.directory = offloadPath;
  s.windowBytes = static_cast<size_t>(offloadWindowMb * 1024 * 1024);
  s.io = parseOffloadIo(offloadIo);
  return s;
}

float Job::learningRate(long step) const {
  if (warmup > 0 && step <= warmup) return optimizer.lr * static_cast<float>(step) / static_cast<float>(warmup);
  if (steps <= warmup) return optimizer.lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(steps - warmup);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
  return static_cast<float>(minLr + (optimizer.lr - minLr) * cosine);
}

SyncMode parseSync(const std::string& text) {
  SyncMode mode;
  if (text == "every_step") return mode;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  int every = 0;
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      every = std::stoi(text.substr(colon + 1), &used);
      if (used != text.size() - colon - 1) every = 0;
    } catch (const std::exception&) {
      every = 0;
    }
  }
  if ((kind != "local" && kind != "diloco") || every < 1) {
    throw Error(chorusInvalidArgument,
                fmt::format("sync '{}' is not every_step, local:H or diloco:H (H steps, at least 1)", text));
  }
  mode.kind = kind == "local" ? SyncMode::kLocal : SyncMode::kDiloco;
  mode.every = every;
  return mode;
}

Job loadJob(const std::string& path, const std::vector<std::string>& overrides) {
  auto fail = [&](const std::string& what) -> Error {
    return Error(chorusInvalidArgument, "job " + path + ": " + what);
  };
  // The file, over the chain of files its `base` keys name (each relative to the file naming it):
  // a key in a file replaces the base's, section by section.
  toml::table root;
  std::vector<std::string> chain;
  for (std::string file = path; !file.empty();) {
    if (std::find(chain.begin(), chain.end(), file) != chain.end()) throw fail("base " + file + " names itself");
    chain.push_back(file);
    toml::table table;
    try {
      table = toml::parse_file(file);
    } catch (const toml::parse_error& e) {
      throw Error(chorusInvalidArgument, fmt::format("job {}: {} (line {}, column {})", file, e.description(),
                                                     e.source().begin.line, e.source().begin.column));
    }
    for (const auto& [key, node] : table) {
      if (!node.is_table() || !root.contains(key)) {
        if (!root.contains(key)) root.insert(key, node);
        continue;
      }
      for (const auto& [inner, value] : *node.as_table()) {
        if (!root[key].as_table()->contains(inner)) root[key].as_table()->insert(inner, value);
      }
    }
    const auto base = table["base"].value<std::string>();
    file = base ? (std::filesystem::path(file).parent_path() / *base).string() : "";
  }
  root.erase("base");
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    const auto dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
      throw fail("override '" + o + "' is not section.key=value");
    }
    const std::string section = o.substr(0, dot), key = o.substr(dot + 1, eq - dot - 1);
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + o.substr(eq + 1));
    } catch (const toml::parse_error& e) {
      throw fail("override '" + o + "': " + std::string(e.description()));
    }
    if (!root.contains(section)) root.insert(section, toml::table{});
    auto* table = root[section].as_table();
    if (table == nullptr) throw fail("override '" + o + "': " + section + " is not a table");
    table->insert_or_assign(key, *parsed["v"].node());
  }
  // Every key read is known; what the file holds beyond them is an error (checked after the reads).
  std::map<std::string, std::set<std::string>> known;
  auto get = [&]<typename T>(const char* section, const char* key, T& into) {
    known[section].insert(key);
    auto node = root[section][key];
    if (!node) return;
    if constexpr (std::is_same_v<T, std::string>) {
      auto v = node.template value<std::string>();
      if (!v) throw fail(fmt::format("[{}] {} must be a string", section, key));
      into = *v;
    } else if constexpr (std::is_same_v<T, bool>) {
      auto v = node.template value<bool>();
      if (!v) throw fail(fmt::format("[{}] {} must be true or false", section, key));
      into = *v;
    } else if constexpr (std::is_floating_point_v<T>) {
      auto v = node.template value<double>();
      if (!v) throw fail(fmt::format("[{}] {} must be a number", section, key));
      into = static_cast<T>(*v);
    } else {
      auto v = node.template value<int64_t>();
      if (!v) throw fail(fmt::format("[{}] {} must be an integer", section, key));
      into = static_cast<T>(*v);
    }
  };

  Job job;
  job.path = path;
  known[""].insert("name");
  if (auto n = root["name"].value<std::string>()) job.name = *n;
  std::string preset;
  get("model", "preset", preset);
  if (preset == "gpt2-124m") {
    job.model = GptConfig::gpt2_124m();
  } else if (!preset.empty()) {
    throw fail("[model] preset '" + preset + "' is not gpt2-124m");
  }
  job.model.vocab = preset.empty() ? 0 : job.model.vocab;
  get("model", "layers", job.model.layers);
  get("model", "heads", job.model.heads);
  get("model", "width", job.model.width);
  get("model", "context", job.model.context);
  get("model", "vocab", job.model.vocab);
  // Mixture of experts: experts > 0 makes every moe_every-th block's MLP a mixture.
  get("model", "experts", job.model.moe.experts);
  get("model", "top_k", job.model.moe.topK);
  get("model", "expert_hidden", job.model.moe.hidden);
  get("model", "capacity_factor", job.model.moe.capacityFactor);
  get("model", "aux_loss", job.model.moe.auxCoef);
  get("model", "z_loss", job.model.moe.zCoef);
  get("model", "swiglu", job.model.moe.swiglu);
  get("model", "moe_every", job.model.moeEvery);
  get("model", "dispatch_chunks", job.model.moe.chunks);
  get("data", "corpus", job.data.corpus);
  get("data", "tokenizer", job.data.tokenizer);
  get("data", "bpe_vocab", job.data.bpeVocab);
  get("data", "val_every", job.data.valEvery);
  get("data", "shard_tokens", job.data.shardTokens);
  get("data", "dir", job.dataDir);
  get("batch", "micro", job.micro);
  get("batch", "seq", job.seq);
  get("batch", "accumulate", job.accumulate);
  std::string optimizer = "adamw";
  get("optimizer", "name", optimizer);
  get("optimizer", "lr", job.optimizer.lr);
  get("optimizer", "momentum", job.optimizer.momentum);
  get("optimizer", "nesterov", job.optimizer.nesterov);
  get("optimizer", "min_lr", job.minLr);
  get("optimizer", "warmup", job.warmup);
  get("optimizer", "beta1", job.optimizer.beta1);
  get("optimizer", "beta2", job.optimizer.beta2);
  get("optimizer", "eps", job.optimizer.eps);
  get("optimizer", "weight_decay", job.optimizer.weightDecay);
  get("optimizer", "clip", job.clip);
  get("optimizer", "in_backward", job.stepInBackward);
  get("parallel", "ranks", job.ranks);
  get("parallel", "tp", job.tp);
  get("parallel", "sequence_parallel", job.sequenceParallel);
  get("parallel", "pp", job.pp);
  get("parallel", "vpp", job.vpp);
  get("parallel", "schedule", job.schedule);
  get("parallel", "cp", job.cp);
  get("parallel", "ep", job.ep);
  get("parallel", "recompute", job.recompute);
  get("parallel", "sync", job.sync);
  get("parallel", "outer_lr", job.outerLr);
  get("parallel", "outer_momentum", job.outerMomentum);
  get("parallel", "zero", job.zero);
  get("parallel", "bucket_mb", job.bucketMb);
  get("parallel", "inflight_buckets", job.inflightBuckets);
  get("compress", "name", job.compress);
  get("compress", "warmup_steps", job.compressWarmup);
  get("precision", "compute", job.compute);
  get("precision", "reduce", job.reduce);
  get("precision", "loss_scale", job.lossScale);
  get("precision", "growth_interval", job.growthInterval);
  get("offload", "optimizer", job.offloadOptimizer);
  get("offload", "params", job.offloadParams);
  get("offload", "path", job.offloadPath);
  get("offload", "window_mb", job.offloadWindowMb);
  get("offload", "io", job.offloadIo);
  get("run", "steps", job.steps);
  get("run", "seed", job.seed);
  get("run", "eval_every", job.evalEvery);
  get("run", "eval_batches", job.evalBatches);
  get("run", "log_every", job.logEvery);
  get("run", "checkpoint_every", job.checkpointEvery);
  get("run", "resume", job.resume);
  get("run", "out", job.out);
  get("run", "blas_coretype", job.blasCoretype);
  get("run", "peak_tflops", job.peakTflops);
  get("run", "device", job.device);
  get("run", "profile", job.profile);
  get("run", "plot", job.plot);
  get("run", "flush_denormals", job.flushDenormals);
  if (job.dataDir.empty()) job.dataDir = job.out + "/data";
  if (job.offloadPath.empty()) job.offloadPath = job.out + "/offload";
  for (const auto& [k, node] : root) {
    const std::string key(k.str());
    if (node.is_table()) {
      auto it = known.find(key);
      if (it == known.end() || key.empty()) throw fail("unknown section [" + key + "]");
      for (const auto& [inner, value] : *node.as_table()) {
        if (!it->second.count(std::string(inner.str()))) {
          throw fail(fmt::format("unknown key '{}' in [{}]", inner.str(), key));
        }
      }
    } else if (!known[""].count(key)) {
      throw fail("unknown key '" + key + "'");
    }
  }

  auto atLeast = [&](const char* what, double value, double least) {
    if (value < least) throw fail(fmt::format("{} = {} (at least {})", what, value, least));
  };
  atLeast("[batch] micro", job.micro, 1);
  atLeast("[batch] seq", job.seq, 1);
  atLeast("[batch] accumulate", job.accumulate, 1);
  atLeast("[parallel] ranks", job.ranks, 1);
  atLeast("[parallel] tp", job.tp, 1);
  atLeast("[parallel] pp", job.pp, 1);
  atLeast("[parallel] vpp", job.vpp, 1);
  atLeast("[parallel] cp", job.cp, 1);
  atLeast("[parallel] ep", job.ep, 1);
  if (job.ranks % (job.tp * job.pp * job.cp) != 0) {
    throw fail(fmt::format("[parallel] ranks = {} is not a multiple of tp x pp x cp = {} x {} x {}", job.ranks, job.tp,
                           job.pp, job.cp));
  }
  if (job.cp > 1 && job.seq % (2 * job.cp) != 0) {
    throw fail(
        fmt::format("[batch] seq = {} with [parallel] cp = {}: context parallelism cuts each sequence into "
                    "2 x cp equal chunks, so seq must be a multiple of {}",
                    job.seq, job.cp, 2 * job.cp));
  }
  parseRecompute(job.recompute);
  SyncMode sync;
  try {
    sync = parseSync(job.sync);
  } catch (const Error& e) {
    throw fail(fmt::format("[parallel] {}", e.what()));
  }
  if (sync.local()) {
    auto refuse = [&](const std::string& why) {
      throw fail(fmt::format("[parallel] sync = \"{}\" {}", job.sync, why));
    };
    if (job.zero != 0)
      refuse(fmt::format("with zero = {}: each rank keeps its whole optimizer state (zero = 0)", job.zero));
    if (job.ep > 1) refuse(fmt::format("with ep = {}: expert parallelism exchanges tokens every step", job.ep));
    if (job.cp > 1) refuse(fmt::format("with cp = {}: context-parallel ranks share sequences, so every step", job.cp));
    if (job.compress != "none" && sync.kind == SyncMode::kLocal) {
      refuse("with [compress]: the gradients are not reduced (diloco:H compresses its parameter delta)");
    }
    if (job.checkpointEvery % sync.every != 0) {
      refuse(fmt::format("with [run] checkpoint_every = {}: checkpoint where the ranks agree (a multiple of {})",
                         job.checkpointEvery, sync.every));
    }
    if (job.evalEvery % sync.every != 0) {
      refuse(fmt::format("with [run] eval_every = {}: evaluate where the ranks agree (a multiple of {})", job.evalEvery,
                         sync.every));
    }
    if (!(job.outerLr > 0)) refuse(fmt::format("with outer_lr = {} (positive)", job.outerLr));
    if (!(job.outerMomentum >= 0 && job.outerMomentum < 1)) {
      refuse(fmt::format("with outer_momentum = {} (in [0, 1))", job.outerMomentum));
    }
  }
  try {
    parseCompute(job.compute);
  } catch (const Error& e) {
    throw fail(fmt::format("[precision] compute: {}", e.what()));
  }
  if (job.reduce != "fp32" && job.reduce != "bf16") {
    throw fail(fmt::format("[precision] reduce = \"{}\" is not fp32 or bf16", job.reduce));
  }
  if (!(job.lossScale >= 1.0)) throw fail(fmt::format("[precision] loss_scale = {} (at least 1)", job.lossScale));
  atLeast("[precision] growth_interval", job.growthInterval, 1);
  if (job.reduce == "bf16" && job.compress != "none") {
    throw fail(
        fmt::format("[precision] reduce = \"bf16\" with [compress] name = \"{}\": gradients are either "
                    "compressed or reduced in bf16 (the bf16 compressor is the latter with error feedback)",
                    job.compress));
  }
  if (job.stepInBackward) {
    // Each bucket's step begins while backward computes the rest, so it cannot wait for anything
    // that needs the whole gradient or a later exchange.
    auto refuse = [&](const std::string& why) { throw fail("[optimizer] in_backward = true " + why); };
    if (job.clip != 0.0f) {
      refuse(
          fmt::format("with clip = {}: clipping scales every gradient by the global norm, known only after "
                      "backward; set clip = 0",
                      job.clip));
    }
    if (job.compute == "fp16") {
      refuse(
          "with [precision] compute = \"fp16\": the loss scale skips a step whose gradient overflowed, known "
          "only after backward");
    }
    if (job.pp > 1) {
      refuse(fmt::format("with pp = {}: the pipeline's tied embedding is summed over its ends after backward", job.pp));
    }
    if (sync.local()) refuse(fmt::format("with [parallel] sync = \"{}\": the ranks step on their own", job.sync));
  }
  OffloadSettings offload;
  try {
    offload = job.offload();
  } catch (const Error& e) {
    throw fail(fmt::format("[offload] {}", e.what()));
  }
  if (offload.params == OffloadTarget::kFile && job.stepInBackward) {
    throw fail(
        "[optimizer] in_backward = true with [offload] params = \"file\": backward's gathers read the parameter "
        "shard from the file that the steps write");
  }
  if (offload.params == OffloadTarget::kFile && (job.zero != 3 || offload.optimizer != OffloadTarget::kFile)) {
    throw fail(
        fmt::format("[offload] params = \"file\" with zero = {} and optimizer = \"{}\": the parameter shard "
                    "goes to the file beside the optimizer state, so zero = 3 and optimizer = \"file\"",
                    job.zero, job.offloadOptimizer));
  }
  if (!(job.offloadWindowMb > 0)) throw fail(fmt::format("[offload] window_mb = {} (positive)", job.offloadWindowMb));
  const Schedule schedule = parseSchedule(job.schedule);
  if ((schedule == Schedule::kInterleaved) != (job.vpp > 1)) {
    throw fail(
        fmt::format("[parallel] schedule = \"{}\" with vpp = {}: the interleaved schedule and only it runs "
                    "virtual stages (vpp >= 2)",
                    job.schedule, job.vpp));
  }
  if (job.pp > 1) {
    if (job.zero > 1) {
      throw fail(
          fmt::format("[parallel] zero = {} with pp = {}: pipeline parallelism takes ZeRO 0 or 1 (stages 2 "
                      "and 3 reduce or gather per micro-batch, which the pipeline's interleaved micro-batches "
                      "do not allow)",
                      job.zero, job.pp));
    }
    // Checks the schedule against the micro-batches and the cut against the layers now, not on the ranks.
    pipelineSchedule(schedule, job.pp, 0, job.vpp, job.accumulate);
    if (job.model.layers < job.pp * job.vpp) {
      throw fail(fmt::format("[model] layers = {} cannot give each of pp x vpp = {} x {} pipeline chunks a block",
                             job.model.layers, job.pp, job.vpp));
    }
  }
  atLeast("[run] steps", static_cast<double>(job.steps), 1);
  atLeast("[run] log_every", job.logEvery, 1);
  atLeast("[run] eval_batches", job.evalBatches, 1);
  atLeast("[run] peak_tflops", job.peakTflops, 0);
  atLeast("[parallel] bucket_mb", job.bucketMb, 0);
  atLeast("[parallel] inflight_buckets", job.inflightBuckets, 1);
  if (job.zero < 0 || job.zero > 3) throw fail(fmt::format("[parallel] zero = {} is not 0, 1, 2 or 3", job.zero));
  atLeast("[compress] warmup_steps", static_cast<double>(job.compressWarmup), 0);
  if (job.compress.empty())
    throw fail("[compress] name is empty (none, fp16, bf16, qsgd, sign, topk, randomk, powersgd)");
  if (job.compress != "none" && job.zero != 0) {
    throw fail(
        fmt::format("[compress] name = \"{}\" with [parallel] zero = {}: compressed gradients are all-reduced, "
                    "which ZeRO's reduce-scatter replaces; use zero = 0",
                    job.compress, job.zero));
  }
  if (job.model.context < job.seq) {
    throw fail(fmt::format("[batch] seq = {} exceeds [model] context = {}", job.seq, job.model.context));
  }
  atLeast("[model] moe_every", job.model.moeEvery, 1);
  try {
    job.model.moe.validate(job.model.width);
  } catch (const Error& e) {
    throw fail(fmt::format("[model] {}", e.what()));
  }
  if (job.ep > 1) {
    if (!job.model.moe.enabled()) {
      throw fail(
          fmt::format("[parallel] ep = {} without experts: expert parallelism splits the experts of MoE "
                      "blocks ([model] experts)",
                      job.ep));
    }
    if (job.dp() % job.ep != 0) {
      throw fail(
          fmt::format("[parallel] ep = {} does not divide the {} data-parallel ranks (ranks / (tp pp cp)) "
                      "it is carved from",
                      job.ep, job.dp()));
    }
    if (job.model.moe.experts % job.ep != 0) {
      throw fail(fmt::format("[parallel] ep = {} does not divide [model] experts = {}", job.ep, job.model.moe.experts));
    }
    if (job.compress != "none") {
      throw fail(
          fmt::format("[compress] name = \"{}\" with [parallel] ep = {}: gradient compression runs "
                      "without expert parallelism",
                      job.compress, job.ep));
    }
  }
  try {
    parseDevice(job.device);
  } catch (const Error& e) {
    throw fail(fmt::format("[run] {}", e.what()));
  }
  if (job.profile && job.device == "cpu") {
    throw fail("[run] profile = true times a device's calls: it needs device = \"cuda\" (on the CPU, use perf)");
  }
  if (!(job.optimizer.lr > 0)) throw fail("[optimizer] lr must be positive");
  if (optimizer == "adamw") {
    job.optimizer.kind = kernels::Optimizer::kAdamW;
  } else if (optimizer == "sgd") {
    job.optimizer.kind = kernels::Optimizer::kSgd;
  } else {
    throw fail(fmt::format("[optimizer] name = \"{}\": adamw or sgd (with momentum)", optimizer));
  }
  if (!(job.optimizer.momentum >= 0 && job.optimizer.momentum < 1)) {
    throw fail(fmt::format("[optimizer] momentum = {} is not in [0, 1)", job.optimizer.momentum));
  }
  return job;
}

}  // namespace chorus::training
