// chorus-sim: the timing simulator's sweep. No ranks start: each row's time is the prediction of
// src/collectives/simulator.h for -g ranks (--ranks-per-host of them per host) on the cost model of
// CHORUS_TUNING_FILE (or the built-in defaults), printed in collbench's columns. It takes
// collbench's flags; `collbench --simulate ...` runs it.
#include <chorus/chorus.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/engine.h"
#include "bench/options.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/simulator.h"
#include "src/collectives/traits.h"
#include "src/collectives/tuner.h"

namespace {

using namespace chorus::bench;

// --simulate: no ranks are started. Each row's time is the timing simulator's prediction for
// nranks ranks (src/collectives/simulator.h) on the model of CHORUS_TUNING_FILE (or the built-in
// defaults): links within a host as shm (tcp when CHORUS_TRANSPORT=tcp), between hosts as tcp.
int simulateSweep(const Options& o) {
  namespace cc = chorus::collectives;
  const OpInfo* opInfo = findOp(o.op);
  const TypeInfo* typeInfo = nullptr;
  for (const TypeInfo& info : kTypes) {
    if (o.type == info.name) typeInfo = &info;
  }
  const RedOpInfo* redopInfo = nullptr;
  for (const RedOpInfo& info : kRedOps) {
    if (o.redop == info.name) redopInfo = &info;
  }
  cc::Collective collective{};
  const int n = o.localRanks;
  if (opInfo == nullptr || opInfo->op == Op::kSendRecv || opInfo->op == Op::kAllToAllv ||
      !cc::parseCollective(o.op, &collective) || typeInfo == nullptr || redopInfo == nullptr || o.root < 0 ||
      o.root >= n) {
    std::fprintf(stderr,
                 "collbench --simulate: --op '%s' (sendrecv and alltoallv are not simulated), -d '%s', -o '%s' (one of "
                 "each, not "
                 "'all') or root %d outside [0, %d) is not valid\n",
                 o.op.c_str(), o.type.c_str(), o.redop.c_str(), o.root, n);
    return 2;
  }
  const int perHost = o.ranksPerHost > 0 ? std::min(o.ranksPerHost, n) : n;
  const bool network = perHost < n;
  const char* transport = std::getenv("CHORUS_TRANSPORT");
  const bool tcpInside = transport != nullptr && std::string(transport) == "tcp";
  cc::CostParams shm = cc::defaultCostParams(false), tcp = cc::defaultCostParams(true);
  const char* tuning = std::getenv("CHORUS_TUNING_FILE");
  if (tuning != nullptr && *tuning != '\0') {
    try {
      shm = cc::loadCostParams(tuning, false, shm);
      tcp = cc::loadCostParams(tuning, true, tcp);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "collbench --simulate: CHORUS_TUNING_FILE: %s\n", e.what());
      return 2;
    }
  }
  const cc::CostParams& inside = tcpInside ? tcp : shm;
  cc::NetworkModel model;
  model.ranksPerHost = perHost;
  model.intraHost = {inside.alphaUs, inside.betaUsPerByte};
  model.interHost = {tcp.alphaUs, tcp.betaUsPerByte};
  model.gammaUsPerByte = inside.gammaUsPerByte;
  model.copyUsPerByte = inside.copyUsPerByte;
  // The tuner models the slowest transport in use, as a communicator does, and the hosts.
  cc::CostParams tunerModel = network || tcpInside ? tcp : shm;
  tunerModel.hosts = n % perHost == 0 ? n / perHost : 1;
  tunerModel.localAlphaUs = inside.alphaUs;
  tunerModel.localBetaUsPerByte = inside.betaUsPerByte;
  // CHORUS_CHUNK_BYTES fixes the chunk; otherwise the tuner picks it, as a communicator does.
  const char* chunkText = std::getenv("CHORUS_CHUNK_BYTES");
  const size_t fixedChunk = chunkText != nullptr && std::atoll(chunkText) > 0 ? std::atoll(chunkText) : 0;

  std::vector<cc::Algorithm> algos{cc::Algorithm::kDefault};
  if (!o.algo.empty() && o.algo != "default") {
    algos.clear();
    if (o.algo == "all") {
      algos = cc::algorithmsFor(collective);
    } else {
      for (const std::string& name : cc::splitCommas(o.algo)) {
        cc::Algorithm a{};
        if (name.empty()) continue;
        if (name == "default") {
          a = cc::Algorithm::kDefault;
        } else if (!cc::parseAlgorithm(name, &a) || !cc::appliesTo(a, collective)) {
          std::fprintf(stderr, "collbench --simulate: --algo %s does not apply to %s (it has: %s)\n", name.c_str(),
                       o.op.c_str(), chorusAlgorithmNames(o.op.c_str()));
          return 2;
        }
        algos.push_back(a);
      }
    }
  }
  std::printf(
      "# collbench (chorus) --simulate op: %s  nranks: %d  ranks per host: %d  minBytes: %zu  maxBytes: %zu  "
      "chunk: %s\n# model: within a host alpha %.3g us beta %.3g GB/s; between hosts alpha %.3g us beta %.3g GB/s; "
      "reduce %.3g GB/s, copy %.3g GB/s (%s)\n",
      opInfo->name, n, perHost, o.minBytes, o.maxBytes,
      fixedChunk > 0 ? std::to_string(fixedChunk).c_str() : "the tuner's", model.intraHost.alphaUs,
      1e-3 / model.intraHost.betaUsPerByte, model.interHost.alphaUs, 1e-3 / model.interHost.betaUsPerByte,
      1e-3 / model.gammaUsPerByte, 1e-3 / model.copyUsPerByte,
      tuning != nullptr && *tuning != '\0' ? tuning : "built-in defaults");
  printColumnHeader(true);
  nlohmann::json rows = nlohmann::json::array();
  const size_t size = chorusTypeSize(typeInfo->type);
  int failures = 0;
  int standIns = 0;  // rows where one host's ranks stood for all
  for (size_t bytes = o.minBytes;;) {
    const size_t blocks = cc::wholeElements(collective, 1, n);  // n where the size is n blocks
    const size_t count = opInfo->op == Op::kBarrier ? 0 : bytes / size / blocks;
    const size_t shownBytes = count * blocks * size;
    for (cc::Algorithm algo : algos) {
      cc::ScheduleArgs args;
      args.collective = collective;
      args.nranks = n;
      args.count = count;
      args.typeSize = size;
      args.root = o.root;
      args.divide = cc::traitsOf(collective).reduces && redopInfo->op == chorusAvg;
      if (algo == cc::Algorithm::kDefault) {
        const cc::TunerChoice choice = cc::choose(collective, n, shownBytes, tunerModel, fixedChunk);
        args.algorithm = choice.algorithm;
        args.chunkBytes = choice.chunkBytes;
      } else {
        args.algorithm = algo;
        args.chunkBytes =
            fixedChunk > 0 ? fixedChunk : cc::chooseChunkBytes(collective, algo, n, shownBytes, tunerModel);
      }
      std::string name = cc::algorithmName(args.algorithm);
      if (algo == cc::Algorithm::kDefault) name = "default:" + name;
      if (args.algorithm == cc::Algorithm::kDirect && perHost < n) {
        // It maps every rank's buffers: shared memory, one host.
        std::printf("# %10zu  %20s  not simulated: the direct algorithm runs only with every rank on one host\n",
                    shownBytes, name.c_str());
        continue;
      }
      const cc::ScheduleSet set = cc::buildAllSchedules(args, perHost < n ? perHost : 0);
      cc::TimingResult timing;
      if (!set.error.empty()) {
        timing.ok = false;
        timing.error = set.error;
      } else {
        timing = cc::simulateTime(set.schedules, model, set.nranks);
      }
      const int simulated = static_cast<int>(set.schedules.size());
      if (timing.ok && simulated < n) ++standIns;
      if (!timing.ok) {
        std::printf("# %10zu  %20s  not simulated: %s\n", shownBytes, name.c_str(), timing.error.c_str());
        ++failures;
        continue;
      }
      Result predicted;
      predicted.timeUs = timing.timeUs;
      predicted.algbw = timing.timeUs > 0 ? static_cast<double>(shownBytes) / 1e3 / timing.timeUs : 0;
      predicted.busbw = predicted.algbw * busFactor(opInfo->op, n);
      printRow(shownBytes, count, typeInfo->type,
               cc::traitsOf(collective).reduces ? chorusOpName(redopInfo->op) : "none",
               cc::traitsOf(collective).rooted ? o.root : -1, name.c_str(), predicted, "sim", predicted, "sim");
      const nlohmann::json side = {
          {"time_us", predicted.timeUs}, {"algbw_GBps", predicted.algbw}, {"busbw_GBps", predicted.busbw}};
      rows.push_back(
          {{"op", opInfo->name},
           {"size_bytes", shownBytes},
           {"count", count},
           {"type", chorusTypeName(typeInfo->type)},
           {"algo", name},
           {"nranks", n},
           {"ranks_per_host", perHost},
           {"chunk_bytes", args.chunkBytes},
           {"messages", timing.messages},
           {"steps", timing.steps},
           {"simulated_ranks", simulated},
           // The algorithm's closed form on the tuner's model of the same machine, the
           // cost the tuner weighs (tests/unit/simulator_test.cc compares the two).
           {"closed_form_us", cc::formulaUs(collective, args.algorithm, n, shownBytes, args.chunkBytes, tunerModel)},
           {"out_of_place", side},
           {"in_place", side}});
    }
    if (opInfo->op == Op::kBarrier) break;
    bytes = nextSize(o, bytes);
    if (bytes == 0) break;
  }
  std::printf("# Predicted by the timing simulator; #wrong is not checked (sim)\n");
  if (standIns > 0) {
    std::printf(
        "# %d rows too large to hold every rank's steps: one host's ranks simulated, standing for all (their\n"
        "# schedules checked to be shifted copies; simulated_ranks in --json)\n",
        standIns);
  }
  std::printf("#\n");
  if (!o.json.empty()) {
    const nlohmann::json doc = {
        {"tool", "collbench"}, {"simulated", true}, {"op", opInfo->name}, {"nranks", n}, {"rows", rows}};
    if (!writeJson(o.json, doc)) return 2;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int code = parseOptions(argc, argv, &o); code >= 0) return code;
  return simulateSweep(o);
}
