// chorus-tune: measures the tuner's cost parameters on this machine (latency, bandwidth, reduce
// and copy speeds, per-message overhead) and each algorithm's correction per size, and appends
// them as a tuning file (CHORUS_TUNING_FILE) to the path --calibrate names. It takes collbench's
// flags and starts ranks as collbench does (-g N, or under a launcher); `collbench --calibrate
// FILE ...` runs it.
#include <chorus/chorus.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "bench/engine.h"
#include "bench/launch.h"
#include "bench/options.h"
#include "kernels/cpu/reduce.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/traits.h"
#include "src/collectives/tuner.h"

namespace {

using namespace chorus::bench;

std::string calibrateCorrections(Bench& bench, const chorus::collectives::CostParams& fitted,
                                 const std::string& prefix);

int calibrate(Bench& bench, const std::string& path) {
  using Clock = std::chrono::steady_clock;
  if (bench.nranks() < 2) {
    std::fprintf(stderr, "chorus-tune: the calibration needs at least 2 ranks (-g 2)\n");
    return 2;
  }
  // Calibrate with the rank count the tuning is for: the cost of a message depends on how many
  // ranks share the cores.
  // Measured as collectives run: every rank busy at once (ranks may share cores), each value
  // averaged over the ranks. alpha from barriers; then a ring shift (send to r+1, receive from
  // r-1, in a group) of `bytes` costs alpha + bytes * beta.
  auto average = [&](double mine) {
    double sum = 0;
    bench.call("allreduce", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, bench.comm(), nullptr));
    return sum / bench.nranks();
  };
  auto shift = [&](size_t bytes, int iters) {
    std::vector<char> out(std::max<size_t>(bytes, 1)), in(std::max<size_t>(bytes, 1));
    const int next = (bench.rank() + 1) % bench.nranks(), prev = (bench.rank() + bench.nranks() - 1) % bench.nranks();
    auto once = [&] {
      bench.call("group start", chorusGroupStart());
      bench.call("send", chorusSend(out.data(), bytes, chorusUint8, next, bench.comm(), nullptr));
      bench.call("recv", chorusRecv(in.data(), bytes, chorusUint8, prev, bench.comm(), nullptr));
      bench.call("group end", chorusGroupEnd());
    };
    for (int i = 0; i < iters / 10 + 1; ++i) once();
    bench.call("barrier", chorusBarrier(bench.comm(), nullptr));
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) once();
    return average(std::chrono::duration<double>(Clock::now() - start).count() / iters * 1e6);
  };
  // Timings on 2 cores shared by more ranks swing between runs: each value is the median of
  // several blocks of calls.
  auto medianUs = [&](int blocks, int calls, auto body) {
    std::vector<double> samples;
    for (int b = 0; b < blocks; ++b) {
      bench.call("barrier", chorusBarrier(bench.comm(), nullptr));
      const auto start = Clock::now();
      for (int i = 0; i < calls; ++i) body();
      samples.push_back(average(std::chrono::duration<double>(Clock::now() - start).count() / calls * 1e6));
    }
    return median(std::move(samples));
  };
  // alpha: a dissemination barrier is ceil(log2 n) rounds of one empty message each, in sequence.
  bench.call("barrier", chorusBarrier(bench.comm(), nullptr));
  const double barrierUs = medianUs(7, 300, [&] { bench.call("barrier", chorusBarrier(bench.comm(), nullptr)); });
  const double alphaUs = barrierUs / std::ceil(std::log2(static_cast<double>(bench.nranks())));
  // overhead: a pairwise all-to-all of one byte per peer posts its n-1 exchanges at once; their
  // latencies overlap, so the n-2 messages beyond the first add their overhead only.
  double overheadUs = alphaUs / 4;
  if (bench.nranks() >= 3) {
    std::vector<char> out(bench.nranks()), in(bench.nranks());
    bench.call("chorusCommSetAlgorithms", chorusCommSetAlgorithms(bench.comm(), "alltoall:pairwise"));
    const double fanUs = medianUs(7, 300, [&] {
      bench.call("alltoall", chorusAllToAll(out.data(), in.data(), 1, chorusUint8, bench.comm(), nullptr));
    });
    bench.call("chorusCommSetAlgorithms", chorusCommSetAlgorithms(bench.comm(), "alltoall:default"));
    overheadUs = std::max(fanUs - alphaUs, 0.05 * alphaUs) / (bench.nranks() - 2);
  }
  const size_t big = size_t{4} << 20;
  const double bigUs = shift(big, 30);
  const double betaGBps = static_cast<double>(big) / std::max(bigUs - alphaUs, 1e-3) / 1e3;
  // Local speeds on a buffer larger than the caches: reduce (fp32 sum) and copy.
  const size_t count = size_t{16} << 20 >> 2;
  std::vector<float> a(count, 1.0f), b(count, 2.0f);
  auto timeLocal = [&](auto body) {
    body();
    bench.call("barrier", chorusBarrier(bench.comm(), nullptr));
    const auto start = Clock::now();
    for (int i = 0; i < 5; ++i) body();
    return average(std::chrono::duration<double>(Clock::now() - start).count() / 5 * 1e6);
  };
  const double reduceUs =
      timeLocal([&] { chorus::kernels::reduce(a.data(), a.data(), b.data(), count, chorusFloat32, chorusSum); });
  const double copyUs = timeLocal([&] { std::memcpy(a.data(), b.data(), count * sizeof(float)); });
  const double bytes = static_cast<double>(count * sizeof(float));
  const char* transport = std::getenv("CHORUS_TRANSPORT");
  const bool tcp = transport != nullptr && std::string(transport) == "tcp";
  namespace cc = chorus::collectives;
  cc::CostParams fitted = cc::defaultCostParams(tcp);
  fitted.alphaUs = alphaUs;
  fitted.betaUsPerByte = 1e-3 / betaGBps;
  fitted.gammaUsPerByte = reduceUs / bytes;
  fitted.copyUsPerByte = copyUs / bytes;
  fitted.overheadUs = overheadUs;
  const std::string prefix = tcp ? "tcp" : "shm";
  std::string text =
      "# collbench --calibrate, " + std::to_string(bench.nranks()) +
      " ranks (barriers, all-to-all, ring shift, all ranks busy)\n" + prefix + " alpha_us=" + std::to_string(alphaUs) +
      " beta_GBps=" + std::to_string(betaGBps) + " gamma_GBps=" + std::to_string(bytes / reduceUs / 1e3) +
      " copy_GBps=" + std::to_string(bytes / copyUs / 1e3) + " overhead_us=" + std::to_string(overheadUs) + "\n";
  text += calibrateCorrections(bench, fitted, prefix);
  if (bench.rank() == 0) {
    std::ofstream out(path, std::ios::app);
    out << text;
    if (!out) {
      std::fprintf(stderr, "collbench: cannot write %s\n", path.c_str());
      return 2;
    }
    std::printf("# calibrated (appended to %s):\n%s", path.c_str(), text.c_str());
  }
  return 0;
}

// Each algorithm of each collective that has a choice, timed at sizes 2x apart (turn by turn,
// averaged over the ranks), in two passes and three more over the close calls (seven where the
// calls are short): its correction is the median of the passes' mean time per call over the
// formula's at each size. Returns the tuning file lines, one per algorithm.
std::string calibrateCorrections(Bench& bench, const chorus::collectives::CostParams& fitted,
                                 const std::string& prefix) {
  namespace cc = chorus::collectives;
  using Clock = std::chrono::steady_clock;
  // The communicator picks a forced algorithm's chunk from the model it loaded: the formula is
  // evaluated at that chunk.
  const bool tcp = prefix == "tcp";
  cc::CostParams inUse = cc::defaultCostParams(tcp);
  if (const char* file = std::getenv("CHORUS_TUNING_FILE"); file != nullptr && *file != '\0') {
    inUse = cc::loadCostParams(file, tcp, inUse);
  }
  // 2x apart: an algorithm's cost bends where its buffers leave L2 or L3, differently for each
  // algorithm, and 8x apart the interpolation stepped over such bends (a 2 MiB all-gather
  // predicted as fast by recursive doubling as by the ring, measured 1.5x slower). From 8 B, as
  // collbench's sweeps: below the first size the first correction holds, and from 128 B it chose
  // recursive doubling for a 64 B all-gather that Bruck did 12% faster.
  std::vector<size_t> sizes;
  for (size_t bytes = 8; bytes <= std::max(bench.options().calibrateUpTo, size_t{8}); bytes *= 2)
    sizes.push_back(bytes);
  // Two passes over every cell (collective, size, algorithm), sizes ascending then descending, then
  // three more over the close cells only: at a size where more than one algorithm had a pass within
  // kClose of the fastest's median, those algorithms. Each pass gives a mean per call over its
  // turns, and the time per call is the median of those means, as a run of collbench gives a row's
  // mean and tools/compare_algorithms the median of its runs. A mean within a pass: on ranks that
  // share cores one in ten of the ring's calls at 16-64 MiB takes twice as long, which a median of
  // calls hides and a user's run does not (each pass times at least ten calls of a close cell, so
  // most passes' means hold that tail). A median across passes: for seconds at a time the ring's
  // calls at 2 MiB take 1200 us instead of 400 (4 ranks on 2 cores), and such spells in some passes
  // put the ring's mean over all passes at 977 us, above recursive doubling's, where collbench's
  // rows then measured the ring at 433 us, 1.3x faster than recursive doubling. The close cells get
  // the most passes because there a call's time drifts by 10-20% between passes, and close cells of
  // calls under kShortCallUs four more, since they cost little: at a 32 KiB all-reduce (4 ranks on
  // 2 cores) recursive doubling over Rabenseifner measured 0.91-1.07 in single passes and 0.88-0.96
  // in collbench's tables, and of five passes the median chose Rabenseifner in one calibration of
  // three, 1.12x slower in that table. (The collbench rows and tables quoted here and below were
  // timed before collbench --turns was fixed to time its out-of-place column out of place: they
  // are in-place calls, while the calibration times out-of-place ones.)
  constexpr int kPasses = 2;
  constexpr int kClosePasses = 3;
  constexpr int kShortClosePasses = 4;
  constexpr double kShortCallUs = 1000;
  constexpr double kClose = 1.2;
  // Blocks as collbench's rows time them, many turns: each block at least kBlockUs long and,
  // where that fits in kLongBlockUs, at least kBlockCalls calls (nccl-tests' and collbench's
  // default iterations). Not longer: a slow spell lasts tens of milliseconds, so with blocks of
  // 10 ms and more at every size it fell on one algorithm's block and not the next one's, and
  // decided close calls (the ring and Rabenseifner at 256 KiB, 4 ranks on 2 cores, each measured
  // 2x the other in different calibrations). Not shorter: each block starts at a barrier, and
  // the ring takes several calls to settle into its pace after one (a 2 MiB all-gather, 4 ranks
  // on 2 cores: 530 us per call in blocks of six, 360 in blocks of twenty, where recursive
  // doubling takes 570 and 490), so with 4 ms blocks the tuner chose recursive doubling there,
  // 1.3x slower than the ring in collbench's rows.
  constexpr double kBlockUs = 4000;
  constexpr double kLongBlockUs = 20000;
  constexpr int kBlockCalls = 20;
  // Each algorithm is timed this long per pass, in at least so many turns. Ten turns per close
  // pass: from 8 MiB a call lasts longer than a block, and with five calls per pass the 64 MiB
  // ring's one-in-ten call at twice the time fell in some calibrations and not in others.
  constexpr double kSampleUs = 30000;
  constexpr int kMinTurns = 5;
  constexpr double kCloseSampleUs = 50000;
  constexpr int kCloseMinTurns = 10;
  constexpr int kMaxTurns = 50;
  const std::vector<cc::Collective> collectives = {cc::Collective::kAllReduce,     cc::Collective::kAllGather,
                                                   cc::Collective::kReduceScatter, cc::Collective::kAllToAll,
                                                   cc::Collective::kBroadcast,     cc::Collective::kReduce};
  const size_t n = static_cast<size_t>(bench.nranks());
  // Elements per call at each size (ops over n blocks split it over the ranks); sizes too small
  // for one element per rank are left out.
  auto countsOf = [&](cc::Collective collective) {
    std::vector<size_t> counts;
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float) / cc::wholeElements(collective, 1, static_cast<int>(n));
      if (count > 0) counts.push_back(count);
    }
    return counts;
  };
  // timed[c][s * algorithms + a]: the mean microseconds per call of each pass that timed it.
  std::vector<std::vector<std::vector<double>>> timed(collectives.size());
  // What the tuner takes: the median over the passes (two, five or nine of them).
  auto typical = [&](size_t c, size_t cell) { return median(timed[c][cell]); };
  // Algorithms the model rules out on these ranks (hierarchical ones on one host) are not timed.
  auto applies = [&](size_t c, size_t a) {
    const cc::Algorithm algorithm = cc::algorithmsFor(collectives[c])[a];
    return !std::isinf(
        cc::formulaUs(collectives[c], algorithm, bench.nranks(), size_t{1} << 20, size_t{1} << 19, inUse));
  };
  for (size_t c = 0; c < collectives.size(); ++c) {
    timed[c].resize(countsOf(collectives[c]).size() * cc::algorithmsFor(collectives[c]).size());
  }
  // Times the algorithms `which` of collective c at its size s, turn by turn, into timed.
  auto timeCell = [&](size_t c, size_t s, const std::vector<size_t>& which, double sampleUs, int minTurns) {
    const char* name = cc::collectiveName(collectives[c]);
    const OpInfo* info = findOp(name);
    const auto& algorithms = cc::algorithmsFor(collectives[c]);
    const size_t count = countsOf(collectives[c])[s];
    std::vector<std::string> names;
    for (size_t a : which) names.push_back(cc::algorithmName(algorithms[a]));
    bench.fillInputs(info->op, chorusFloat32, chorusSum, count, false);
    // One untimed call each, which also sizes the blocks and the turns (rank 0's word, so all
    // ranks agree): calls[k] per block of algorithm which[k], calls.back() turns.
    std::vector<int> calls(which.size() + 1, 1);
    double slowestBlockUs = 0;
    for (size_t k = 0; k < which.size(); ++k) {
      bench.call("chorusCommSetAlgorithms",
                 chorusCommSetAlgorithms(bench.comm(), (std::string(name) + ":" + names[k]).c_str()));
      bench.call("barrier", chorusBarrier(bench.comm(), nullptr));
      const auto start = Clock::now();
      bench.once(info->op, chorusFloat32, chorusSum, count);
      const double us = std::chrono::duration<double>(Clock::now() - start).count() * 1e6;
      const double perCall = std::max(us, 1.0);
      calls[k] = static_cast<int>(
          std::clamp(std::max(kBlockUs / perCall, std::min(double{kBlockCalls}, kLongBlockUs / perCall)), 1.0, 1000.0));
      slowestBlockUs = std::max(slowestBlockUs, calls[k] * us);
    }
    calls.back() =
        static_cast<int>(std::clamp(sampleUs / slowestBlockUs, static_cast<double>(minTurns), double{kMaxTurns}));
    bench.call("broadcast",
               chorusBroadcast(calls.data(), calls.data(), calls.size(), chorusInt32, 0, bench.comm(), nullptr));
    Bench::TurnPlan plan{{}, calls.back(), 0, false, false};
    for (size_t k = 0; k < which.size(); ++k) plan.iters.push_back(calls[k] * plan.turns);
    std::vector<Bench::Contestant> contestants;
    for (const std::string& algorithm : names) contestants.push_back({-1, algorithm});
    const auto results = bench.measureInTurns(name, info->op, contestants, chorusFloat32, chorusSum, count, plan);
    for (size_t k = 0; k < which.size(); ++k) {
      const std::vector<double>& turns = results[k].first.turnUs;
      // Each turn ran calls[k] calls, so the pass's mean per call is the mean of its turns.
      timed[c][s * algorithms.size() + which[k]].push_back(std::accumulate(turns.begin(), turns.end(), 0.0) /
                                                           static_cast<double>(turns.size()));
    }
  };
  // Passes over the sizes in `cells` (per collective, per size: the algorithms to time), the
  // sizes ascending in even passes and descending in odd ones.
  using Cells = std::vector<std::vector<std::vector<size_t>>>;
  auto runPasses = [&](int passes, const Cells& cells, double sampleUs, int minTurns) {
    for (int pass = 0; pass < passes; ++pass) {
      for (size_t c = 0; c < collectives.size(); ++c) {
        for (size_t i = 0; i < cells[c].size(); ++i) {
          const size_t s = pass % 2 == 0 ? i : cells[c].size() - 1 - i;
          if (!cells[c][s].empty()) timeCell(c, s, cells[c][s], sampleUs, minTurns);
        }
        const char* name = cc::collectiveName(collectives[c]);
        bench.call("chorusCommSetAlgorithms",
                   chorusCommSetAlgorithms(bench.comm(), (std::string(name) + ":default").c_str()));
      }
    }
  };
  Cells all(collectives.size());
  for (size_t c = 0; c < collectives.size(); ++c) {
    std::vector<size_t> every;
    for (size_t a = 0; a < cc::algorithmsFor(collectives[c]).size(); ++a) {
      if (applies(c, a)) every.push_back(a);
    }
    all[c].assign(countsOf(collectives[c]).size(), every);
  }
  runPasses(kPasses, all, kSampleUs, kMinTurns);
  // Rank 0's means pick the close cells, so all ranks time the same ones.
  Cells close(collectives.size()), closeAndShort(collectives.size());
  for (size_t c = 0; c < collectives.size(); ++c) {
    const size_t algos = cc::algorithmsFor(collectives[c]).size();
    const size_t sizesOfC = countsOf(collectives[c]).size();
    std::vector<int32_t> chosen(sizesOfC * algos, 0);
    for (size_t s = 0; s < sizesOfC; ++s) {
      double fastest = std::numeric_limits<double>::infinity();
      for (size_t a = 0; a < algos; ++a) {
        if (applies(c, a)) fastest = std::min(fastest, typical(c, s * algos + a));
      }
      // A contender is judged by its best pass: one pass in a slow spell doubled recursive
      // doubling's mean at a 32 KiB all-reduce (48 us against collbench's 24) and left it out.
      std::vector<size_t> contenders;
      for (size_t a = 0; a < algos; ++a) {
        if (!applies(c, a)) continue;
        const auto& passes = timed[c][s * algos + a];
        if (*std::min_element(passes.begin(), passes.end()) <= fastest * kClose) contenders.push_back(a);
      }
      if (contenders.size() > 1) {
        for (size_t a : contenders) chosen[s * algos + a] = fastest < kShortCallUs ? 2 : 1;
      }
    }
    bench.call("broadcast",
               chorusBroadcast(chosen.data(), chosen.data(), chosen.size(), chorusInt32, 0, bench.comm(), nullptr));
    close[c].resize(sizesOfC);
    closeAndShort[c].resize(sizesOfC);
    for (size_t s = 0; s < sizesOfC; ++s) {
      for (size_t a = 0; a < algos; ++a) {
        if (chosen[s * algos + a] != 0) close[c][s].push_back(a);
        if (chosen[s * algos + a] == 2) closeAndShort[c][s].push_back(a);
      }
    }
  }
  runPasses(kClosePasses, close, kCloseSampleUs, kCloseMinTurns);
  runPasses(kShortClosePasses, closeAndShort, kCloseSampleUs, kCloseMinTurns);
  std::string lines = "# corrections: measured time / formula's time per size, all ranks busy\n";
  for (size_t c = 0; c < collectives.size(); ++c) {
    const char* name = cc::collectiveName(collectives[c]);
    const size_t blocks = cc::wholeElements(collectives[c], 1, static_cast<int>(n));
    const auto& algorithms = cc::algorithmsFor(collectives[c]);
    const std::vector<size_t> counts = countsOf(collectives[c]);
    for (size_t a = 0; a < algorithms.size(); ++a) {
      if (!applies(c, a)) continue;
      std::vector<double> factors(counts.size());
      for (size_t s = 0; s < counts.size(); ++s) {
        const size_t bytes = counts[s] * sizeof(float) * blocks;
        const size_t chunk = cc::chooseChunkBytes(collectives[c], algorithms[a], bench.nranks(), bytes, inUse);
        factors[s] = typical(c, s * algorithms.size() + a) /
                     cc::formulaUs(collectives[c], algorithms[a], bench.nranks(), bytes, chunk, fitted);
      }
      // Each factor becomes the median of itself and its two neighbours (2x smaller and larger),
      // which keeps a step where buffers leave a cache and drops a lone spike: a 16 MiB ring
      // all-reduce calibrated at 22.2 ms between 8.3 at 8 MiB and 36.2 at 32 MiB, measured 18.2
      // in collbench's rows, and so lost to Rabenseifner (21.3 in both).
      std::vector<double> smooth = factors;
      for (size_t s = 1; s + 1 < factors.size(); ++s) smooth[s] = median({factors[s - 1], factors[s], factors[s + 1]});
      std::string bytesList, factorList;
      for (size_t s = 0; s < counts.size(); ++s) {
        const size_t bytes = counts[s] * sizeof(float) * blocks;
        char factor[32];
        // Significant digits, not decimals: a base fitted in a slow spell can put a factor far
        // below 0.001, and a factor written as 0 would make the file unreadable.
        std::snprintf(factor, sizeof(factor), "%.4g", smooth[s]);
        if (s > 0) {
          bytesList += ',';
          factorList += ',';
        }
        bytesList += std::to_string(bytes);
        factorList += factor;
      }
      lines += prefix + " " + name + ":" + cc::algorithmName(algorithms[a]) +
               " ranks=" + std::to_string(bench.nranks()) + " bytes=" + bytesList + " factors=" + factorList + "\n";
    }
  }
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int code = parseOptions(argc, argv, &o); code >= 0) return code;
  if (o.calibrate.empty()) {
    std::fprintf(stderr, "chorus-tune: --calibrate FILE names the tuning file to append to\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return runRanks(o, &argc, &argv, [&](chorusComm_t comm) {
    Bench bench(o, comm);
    const int code = calibrate(bench, o.calibrate);
    chorusCommDestroy(comm);
    return code;
  });
}
