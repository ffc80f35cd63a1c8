// chorus-plan: what a training layout costs before it runs (memory per rank, pipeline bubble,
// FLOPs, communication per collective, step time), or, with --search, every layout of the machine
// that fits, fastest first. See src/training/planner.h for the model.
//
//   chorus-plan --model llama3-8b --micro 1 --global 512 --tp 4 --pp 2 --zero 1 --machine dgx-h100 --devices 64
//   chorus-plan --job jobs/tiny-dp2-tp2-pp2.toml --vocab 1024 --machine local
//   chorus-plan --model gpt2-1.5b --global 64 --machine dgx-h100 --devices 16 --search --json
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "chorus/error.hpp"
#include "src/topology/discover.h"
#include "src/topology/topology.h"
#include "src/training/job.h"
#include "src/training/planner.h"
#include "src/training/trainer.h"

namespace tr = chorus::training;

namespace {

// This host as the machine: `devices` ranks sharing its cores and memory, the GEMM speed measured
// now, shared memory's link costs (its latency a scheduler wake-up when the ranks outnumber the cores).
tr::Machine localMachine(int devices) {
  tr::Machine m;
  m.name = "local";
  m.devices = devices > 0 ? devices : 8;
  m.devicesPerNode = m.devices;
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  m.memoryBytes = memory / m.devices;
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  m.peakFlops = tr::measureGemmGflops(cores, 512, 1.0) * 1e9 / m.devices;
  m.efficiency = 0.5;
  // A message between ranks that outnumber the cores waits for its peer to be given one: about a
  // scheduler wake-up, not shared memory's few microseconds.
  m.intraAlphaUs = m.interAlphaUs = m.devices > cores ? 100 : 5;
  m.intraGBps = m.interGBps = 5;
  m.reduceGBps = 4;
  m.sharedCores = true;
  return m;
}

// The links from a topology file (chorus, NCCL or hwloc XML): the devices are its GPUs (or, without
// GPUs, its CPU nodes); the intra- and inter-node links those of the widest paths between two of
// them on one host and on two hosts. The rest comes from base.
tr::Machine machineFromTopology(const std::string& path, tr::Machine base) {
  namespace topo = chorus::topology;
  const topo::Topology t = topo::readTopologyFile(path);
  std::vector<std::vector<int>> perHost(t.hosts.size());
  int devices = 0;
  for (const topo::NodeKind kind : {topo::NodeKind::kGpu, topo::NodeKind::kCpu}) {
    devices = 0;
    for (size_t h = 0; h < t.hosts.size(); ++h) {
      perHost[h] = t.nodesOf(static_cast<int>(h), kind);
      devices += static_cast<int>(perHost[h].size());
    }
    if (devices > 0) break;
  }
  if (devices == 0) throw chorus::Error(chorusInvalidArgument, "topology " + path + " has no GPUs or CPUs");
  base.name = path;
  base.devices = devices;
  base.devicesPerNode = static_cast<int>(perHost[0].size());
  if (perHost[0].size() >= 2) {
    const topo::Path p = topo::widestPath(t, perHost[0][0], perHost[0][1]);
    base.intraGBps = p.bandwidth;
    base.intraAlphaUs = std::max(p.latencyUs, 0.5);
  }
  if (perHost.size() >= 2 && !perHost[1].empty()) {
    const topo::Path p = topo::widestPath(t, perHost[0][0], perHost[1][0]);
    base.interGBps = p.bandwidth;
    base.interAlphaUs = std::max(p.latencyUs, 0.5);
  }
  return base;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-plan: the memory, FLOPs, communication and step time of a training layout"};
  std::string preset, jobPath, machineName = "dgx-h100", topology, precisionName = "fp32", compute = "fp32",
                               reduce = "fp32", sync = "every_step", recompute = "none", schedule = "1f1b",
                               offload = "none", offloadParams = "none";
  double offloadWindowMb = 64;
  tr::ModelShape shape;
  bool gated = false, untied = false, rope = false, noBiases = false, rmsnorm = false;
  int vocab = 0, micro = 1, dp = 0, tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, zero = 0, devices = 0, top = 10;
  bool gatedExperts = false;
  long global = 0;
  bool sp = false, dropout = false, search = false, json = false, sharedCores = false;
  double memoryGib = 0, peakTflops = 0, efficiency = 0, intraGBps = 0, intraUs = 0, interGBps = 0, interUs = 0,
         reduceGBps = 0;
  int perNode = 0;
  app.add_option("--model", preset, std::string("a preset: ") + tr::kModelPresets);
  app.add_option("--layers", shape.layers);
  app.add_option("--hidden", shape.hidden);
  app.add_option("--heads", shape.heads);
  app.add_option("--kv-heads", shape.kvHeads, "grouped-query attention's key/value heads (default: heads)");
  app.add_option("--ffn", shape.ffn, "MLP hidden units (default: 4 hidden)");
  app.add_option("--seq", shape.seq);
  app.add_option("--context", shape.context, "rows of the learned position table (default: seq)");
  app.add_option("--vocab", vocab);
  app.add_flag("--gated", gated, "SwiGLU MLP (three matrices)");
  app.add_flag("--untied", untied, "an output head of its own");
  app.add_flag("--rope", rope, "rotary positions (no position table)");
  app.add_flag("--no-biases", noBiases);
  app.add_flag("--rmsnorm", rmsnorm);
  app.add_option("--experts", shape.experts, "routed experts of each MoE block (0: a dense model)");
  app.add_option("--top-k", shape.topK, "experts each token uses");
  app.add_option("--expert-ffn", shape.expertFfn, "an expert's hidden units (default: ffn)");
  app.add_option("--shared-experts", shape.sharedExperts, "experts every token uses (DeepSeek-MoE)");
  app.add_option("--moe-every", shape.moeEvery, "every k-th block (after --first-dense) is an MoE block");
  app.add_option("--first-dense", shape.firstDense, "the first blocks stay dense");
  app.add_flag("--gated-experts", gatedExperts, "SwiGLU experts");
  app.add_option("--job", jobPath, "take the model, batch and layout from a chorus-train job file");
  app.add_option("--micro", micro, "sequences per rank per micro-batch");
  app.add_option("--global", global, "sequences per step (default: micro x dp)");
  app.add_option("--dp", dp, "data-parallel ranks (default: devices / (tp pp cp))");
  app.add_option("--tp", tp);
  app.add_option("--pp", pp);
  app.add_option("--vpp", vpp, "model chunks per pipeline stage (the interleaved schedule)");
  app.add_option("--cp", cp);
  app.add_option("--ep", ep, "expert-parallel ranks, carved from dp");
  app.add_option("--schedule", schedule, "gpipe, 1f1b or interleaved");
  app.add_option("--zero", zero);
  app.add_flag("--sp", sp, "sequence parallelism (with tp)");
  app.add_option("--recompute", recompute, "none, selective or full");
  app.add_option("--precision", precisionName, "fp32 or bf16 (mixed)");
  app.add_option("--compute", compute,
                 "chorus-train's compute type: fp32, or bf16 / fp16 (the linear layers' activations in 16 bits)");
  app.add_option("--reduce", reduce, "chorus-train's gradient reduction type: fp32 or bf16");
  app.add_option("--sync", sync, "chorus-train's [parallel] sync: every_step, local:H or diloco:H");
  app.add_option("--offload", offload, "chorus-train's [offload] optimizer: none, host or file");
  app.add_option("--offload-params", offloadParams, "chorus-train's [offload] params: none or file (ZeRO-3)");
  app.add_option("--offload-window-mb", offloadWindowMb, "chorus-train's [offload] window_mb");
  app.add_flag("--dropout", dropout, "count dropout masks (as Korthikanti et al. do)");
  app.add_option("--machine", machineName, "dgx-h100, or local (this host's cores shared by the ranks)");
  app.add_option("--topology", topology, "links from a topology file (chorus, NCCL or hwloc XML)");
  app.add_option("--devices", devices);
  app.add_option("--per-node", perNode, "devices per node");
  app.add_option("--memory-gib", memoryGib, "memory per device");
  app.add_option("--peak-tflops", peakTflops, "peak per device");
  app.add_option("--efficiency", efficiency, "share of peak a step's compute reaches");
  app.add_option("--intra-gbps", intraGBps);
  app.add_option("--intra-us", intraUs);
  app.add_option("--inter-gbps", interGBps);
  app.add_option("--inter-us", interUs);
  app.add_option("--reduce-gbps", reduceGBps);
  app.add_flag("--shared-cores", sharedCores, "the devices share a node's cores (ranks on a CPU host)");
  app.add_flag("--search", search, "rank every layout that fits by predicted tokens/s");
  app.add_option("--top", top, "layouts --search shows");
  app.add_flag("--json", json);
  CLI11_PARSE(app, argc, argv);
  try {
    tr::PlanLayout layout;
    if (!jobPath.empty()) {
      const tr::Job job = tr::loadJob(jobPath);
      shape = tr::shapeOf(job.model, job.seq);
      shape.name = job.name;
      layout.dp = job.dp(), layout.tp = job.tp, layout.pp = job.pp, layout.vpp = job.vpp, layout.cp = job.cp;
      layout.ep = job.ep;
      layout.zero = job.zero, layout.sequenceParallel = job.sequenceParallel;
      layout.recompute = tr::parseRecompute(job.recompute), layout.schedule = tr::parseSchedule(job.schedule);
      layout.micro = job.micro, layout.globalBatch = job.globalBatch();
      compute = job.compute, reduce = job.reduce, sync = job.sync;
      offload = job.offloadOptimizer, offloadParams = job.offloadParams, offloadWindowMb = job.offloadWindowMb;
      if (devices == 0) devices = job.ranks;
    } else {
      if (!preset.empty()) {
        const tr::ModelShape p = tr::modelPreset(preset);
        // Explicit sizes given with a preset replace its own.
        for (auto [given, field] : {std::pair{app.count("--layers"), &tr::ModelShape::layers},
                                    {app.count("--hidden"), &tr::ModelShape::hidden},
                                    {app.count("--heads"), &tr::ModelShape::heads},
                                    {app.count("--kv-heads"), &tr::ModelShape::kvHeads},
                                    {app.count("--ffn"), &tr::ModelShape::ffn},
                                    {app.count("--seq"), &tr::ModelShape::seq},
                                    {app.count("--context"), &tr::ModelShape::context}}) {
          if (!given) shape.*field = p.*field;
        }
        shape.name = p.name, shape.vocab = p.vocab;
        shape.gated = p.gated, shape.tied = p.tied, shape.learnedPositions = p.learnedPositions;
        shape.biases = p.biases, shape.layerNorm = p.layerNorm;
        for (auto [given, field] : {std::pair{app.count("--experts"), &tr::ModelShape::experts},
                                    {app.count("--top-k"), &tr::ModelShape::topK},
                                    {app.count("--expert-ffn"), &tr::ModelShape::expertFfn},
                                    {app.count("--shared-experts"), &tr::ModelShape::sharedExperts},
                                    {app.count("--moe-every"), &tr::ModelShape::moeEvery},
                                    {app.count("--first-dense"), &tr::ModelShape::firstDense}}) {
          if (!given) shape.*field = p.*field;
        }
        shape.gatedExperts = p.gatedExperts;
      } else {
        shape.name = "custom";
      }
      shape.gated |= gated, shape.tied &= !untied, shape.learnedPositions &= !rope, shape.biases &= !noBiases;
      shape.layerNorm &= !rmsnorm;
      shape.gatedExperts |= gatedExperts;
      layout.ep = ep;
      layout.tp = tp, layout.pp = pp, layout.vpp = vpp, layout.cp = cp, layout.zero = zero;
      layout.sequenceParallel = sp, layout.recompute = tr::parseRecompute(recompute);
      layout.schedule = tr::parseSchedule(schedule), layout.micro = micro, layout.globalBatch = global;
    }
    if (vocab > 0) shape.vocab = vocab;
    if (shape.vocab <= 0) throw chorus::Error(chorusInvalidArgument, "the model's vocab is 0: give --vocab");
    layout.dropout = dropout;
    const tr::Precision precision = tr::withCompute(tr::parsePrecision(precisionName), compute, reduce);
    const tr::SyncMode syncMode = tr::parseSync(sync);
    layout.syncEvery = syncMode.local() ? syncMode.every : 0;
    layout.diloco = syncMode.kind == tr::SyncMode::kDiloco;
    layout.offloadOptimizer = tr::parseOffloadTarget(offload);
    layout.offloadParams = tr::parseOffloadTarget(offloadParams) == tr::OffloadTarget::kFile;
    layout.offloadWindowBytes = offloadWindowMb * 1024 * 1024;
    tr::Machine machine = machineName == "local" ? localMachine(devices) : tr::machinePreset(machineName, devices);
    if (!topology.empty()) machine = machineFromTopology(topology, machine);
    if (perNode > 0) machine.devicesPerNode = perNode;
    if (memoryGib > 0) machine.memoryBytes = memoryGib * (1ull << 30);
    if (peakTflops > 0) machine.peakFlops = peakTflops * 1e12;
    if (efficiency > 0) machine.efficiency = efficiency;
    if (intraGBps > 0) machine.intraGBps = intraGBps;
    if (intraUs > 0) machine.intraAlphaUs = intraUs;
    if (interGBps > 0) machine.interGBps = interGBps;
    if (interUs > 0) machine.interAlphaUs = interUs;
    if (reduceGBps > 0) machine.reduceGBps = reduceGBps;
    machine.sharedCores |= sharedCores;
    if (jobPath.empty()) {
      const int rest = layout.tp * layout.pp * layout.cp;
      layout.dp = dp > 0 ? dp : std::max(1, machine.devices / rest);
      if (layout.globalBatch == 0) layout.globalBatch = static_cast<long>(layout.micro) * layout.dp;
    }

    if (search) {
      const auto plans = tr::searchLayouts(shape, layout, machine, precision);
      if (json) {
        nlohmann::json all = nlohmann::json::array();
        for (const auto& p : plans) all.push_back(tr::planJson(p));
        std::printf("%s\n", all.dump(2).c_str());
        return 0;
      }
      std::printf("%zu layouts of %d devices fit; the fastest %d:\n", plans.size(), machine.devices,
                  std::min<int>(top, static_cast<int>(plans.size())));
      std::printf("  %4s  %-60s  %12s  %8s  %10s  %12s\n", "rank", "layout", "tokens/s", "MFU", "step ms",
                  "peak memory");
      for (int i = 0; i < std::min<int>(top, static_cast<int>(plans.size())); ++i) {
        const auto& p = plans[i];
        std::printf("  %4d  %-60s  %12.4g  %7.1f%%  %10.3f  %9.2f GiB\n", i + 1, p.layout.describe().c_str(),
                    p.tokensPerSecond, 100 * p.mfu, 1e3 * p.stepSeconds, p.peakBytes() / (1ull << 30));
      }
      return plans.empty() ? 1 : 0;
    }
    const tr::Plan plan = tr::makePlan(shape, layout, machine, precision);
    if (json) {
      std::printf("%s\n", tr::planJson(plan).dump(2).c_str());
    } else {
      std::printf("%s", tr::describePlan(plan).c_str());
    }
    return plan.fits ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-plan: %s\n", e.what());
    return 1;
  }
}
