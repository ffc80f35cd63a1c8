// tuner.cc: the cost model's parameters and corrections, and the choice. Each algorithm's formula
// lives beside its builder (its descriptor, descriptor.h, which gives the notation).
#include "src/collectives/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "src/collectives/algorithm.h"
#include "src/collectives/descriptor.h"
#include "src/collectives/traits.h"

namespace chorus::collectives {

CostParams defaultCostParams(bool network) {
  CostParams p;
  if (network) {  // loopback-class TCP: higher latency, lower bandwidth
    p.alphaUs = 25;
    p.betaUsPerByte = 1.0 / 2000;
    p.overheadUs = 8;
  }
  return p;
}

namespace {

// "allreduce:ring ranks=4 bytes=1024,65536 factors=0.9,1.3" (after the transport word).
void readCorrection(const std::string& name, std::istringstream& words, const std::string& where, CostParams* params) {
  const size_t colon = name.find(':');
  Collective collective{};
  Algorithm algorithm{};
  if (colon == std::string::npos || !parseCollective(name.substr(0, colon), &collective) ||
      !parseAlgorithm(name.substr(colon + 1), &algorithm) || !appliesTo(algorithm, collective)) {
    throw std::invalid_argument(where + ": '" + name +
                                "' is neither key=value nor collective:algorithm (as allreduce:ring)");
  }
  Correction correction;
  std::string item;
  auto numbers = [&](const std::string& text) {
    std::vector<double> values;
    for (const std::string& word : splitCommas(text)) {
      char* end = nullptr;
      const double value = std::strtod(word.c_str(), &end);
      if (word.empty() || *end != '\0' || !(value > 0) || !std::isfinite(value)) {
        throw std::invalid_argument(where + ": '" + word + "' in '" + item + "' is not a positive number");
      }
      values.push_back(value);
    }
    return values;
  };
  while (words >> item) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "ranks") {
      const std::vector<double> ranks = numbers(value);
      if (ranks.size() != 1 || ranks[0] != std::floor(ranks[0])) {
        throw std::invalid_argument(where + ": '" + item + "' is not one whole number of ranks");
      }
      correction.nranks = static_cast<int>(ranks[0]);
    } else if (key == "bytes") {
      correction.bytes = numbers(value);
    } else if (key == "factors") {
      correction.factors = numbers(value);
    } else {
      throw std::invalid_argument(where + ": unknown key '" + key + "' for " + name + " (ranks, bytes, factors)");
    }
  }
  if (correction.nranks == 0 || correction.bytes.empty() || correction.bytes.size() != correction.factors.size() ||
      !std::is_sorted(correction.bytes.begin(), correction.bytes.end()) ||
      std::adjacent_find(correction.bytes.begin(), correction.bytes.end()) != correction.bytes.end()) {
    throw std::invalid_argument(
        where + ": " + name + " needs ranks=N, bytes= in ascending order and as many factors= (" +
        std::to_string(correction.bytes.size()) + " sizes, " + std::to_string(correction.factors.size()) + " factors)");
  }
  params->correction(collective, algorithm) = std::move(correction);
}

}  // namespace

CostParams loadCostParams(const std::string& path, bool network, CostParams base) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open tuning file '" + path + "'");
  return parseCostParams(in, path, network, base);
}

CostParams parseCostParams(std::istream& in, const std::string& path, bool network, CostParams base) {
  auto where = [&](int line) { return path + ":" + std::to_string(line); };
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string transport;
    if (!(words >> transport)) continue;
    if (transport != "shm" && transport != "tcp") {
      throw std::invalid_argument(where(number) + ": '" + transport + "' is not shm or tcp");
    }
    if ((transport == "tcp") != network) continue;
    std::string item;
    if (!(words >> item)) continue;
    if (item.find('=') == std::string::npos) {
      readCorrection(item, words, where(number), &base);  // "shm allreduce:ring ranks=4 ..."
      continue;
    }
    do {
      const size_t eq = item.find('=');
      double value = -1;
      try {
        if (eq != std::string::npos) value = std::stod(item.substr(eq + 1));
      } catch (const std::exception&) {
        value = -1;
      }
      const std::string key = item.substr(0, eq);
      if (eq == std::string::npos || value <= 0) {
        throw std::invalid_argument(where(number) + ": '" + item + "' is not key=positive number");
      }
      if (key == "alpha_us") {
        base.alphaUs = value;
      } else if (key == "beta_GBps") {
        base.betaUsPerByte = 1e-3 / value;
      } else if (key == "gamma_GBps") {
        base.gammaUsPerByte = 1e-3 / value;
      } else if (key == "copy_GBps") {
        base.copyUsPerByte = 1e-3 / value;
      } else if (key == "overhead_us") {
        base.overheadUs = value;
      } else {
        throw std::invalid_argument(where(number) + ": unknown key '" + key +
                                    "' (alpha_us, beta_GBps, gamma_GBps, copy_GBps, overhead_us)");
      }
    } while (words >> item);
  }
  return base;
}

double Correction::at(int ranks, double size) const {
  if (ranks != nranks || bytes.empty()) return 1;
  if (size <= bytes.front()) return factors.front();
  if (size >= bytes.back()) return factors.back();
  const size_t hi = static_cast<size_t>(std::upper_bound(bytes.begin(), bytes.end(), size) - bytes.begin());
  const double t = std::log(size / bytes[hi - 1]) / std::log(bytes[hi] / bytes[hi - 1]);
  return std::exp((1 - t) * std::log(factors[hi - 1]) + t * std::log(factors[hi]));
}

double predictUs(Collective collective, Algorithm algorithm, int nranks, size_t bytes, size_t chunkBytes,
                 const CostParams& params) {
  return formulaUs(collective, algorithm, nranks, bytes, chunkBytes, params) *
         params.correction(collective, algorithm).at(nranks, static_cast<double>(bytes));
}

Cost costOf(int nranks, size_t bytes, size_t chunkBytes, const CostParams& params) {
  Cost c;
  c.n = nranks;
  c.m = static_cast<double>(bytes);
  int p = 1;
  while (p * 2 <= nranks) p *= 2;
  c.p = p;
  c.lg = std::log2(c.p);
  c.L = std::ceil(std::log2(c.n));
  c.folds = p != nranks;
  c.chunk = static_cast<double>(std::max<size_t>(chunkBytes, 1));
  c.a = params.alphaUs;
  c.b = params.betaUsPerByte;
  c.g = params.gammaUsPerByte;
  c.cp = params.copyUsPerByte;
  c.o = params.overheadUs;
  c.twoLevels = params.hosts > 1 && nranks % params.hosts == 0;
  c.h = params.hosts;
  c.l = c.n / c.h;
  c.la = params.localAlphaUs;
  c.lb = params.localBetaUsPerByte;
  c.directFrom = static_cast<double>(params.directMinBytes);
  return c;
}

double onlyAlgorithmCost(const Cost& c) { return c.L * c.a + c.m * c.b; }

double formulaUs(Collective collective, Algorithm algorithm, int nranks, size_t bytes, size_t chunkBytes,
                 const CostParams& params) {
  // Nothing to move costs nothing, but a collective that moves no data by design (the barrier)
  // still costs its rounds.
  if (nranks <= 1 || (bytes == 0 && traitsOf(collective).input != Extent::kNone)) {
    return static_cast<double>(bytes) * params.copyUsPerByte;
  }
  const AlgorithmDescriptor* d = descriptorOf(collective, algorithm);
  if (d == nullptr) return kCannot;
  return d->cost(costOf(nranks, bytes, chunkBytes, params));
}

Algorithm chooseAlgorithm(Collective collective, int nranks, size_t bytes, size_t chunkBytes,
                          const CostParams& params) {
  const auto& candidates = algorithmsFor(collective);
  Algorithm best = candidates.front();
  double bestUs = std::numeric_limits<double>::infinity();
  for (Algorithm algorithm : candidates) {
    const double us = predictUs(collective, algorithm, nranks, bytes, chunkBytes, params);
    if (us < bestUs) {
      bestUs = us;
      best = algorithm;
    }
  }
  return best;
}

}  // namespace chorus::collectives

namespace chorus::collectives {

size_t chooseChunkBytes(Collective collective, Algorithm algorithm, int nranks, size_t bytes,
                        const CostParams& params) {
  size_t best = std::clamp(params.maxChunkBytes, kMinChunkBytes, kMaxChunkBytes);
  double bestUs = predictUs(collective, algorithm, nranks, bytes, best, params);
  for (size_t chunk = best / 2; chunk >= kMinChunkBytes; chunk /= 2) {
    const double us = predictUs(collective, algorithm, nranks, bytes, chunk, params);
    if (us < bestUs * (1 - 1e-9)) {
      bestUs = us;
      best = chunk;
    }
  }
  return best;
}

TunerChoice choose(Collective collective, int nranks, size_t bytes, const CostParams& params, size_t fixedChunkBytes) {
  TunerChoice best;
  best.predictedUs = std::numeric_limits<double>::infinity();
  for (Algorithm algorithm : algorithmsFor(collective)) {
    const size_t chunk =
        fixedChunkBytes > 0 ? fixedChunkBytes : chooseChunkBytes(collective, algorithm, nranks, bytes, params);
    const double us = predictUs(collective, algorithm, nranks, bytes, chunk, params);
    if (best.algorithm == Algorithm::kDefault || us < best.predictedUs) best = {algorithm, chunk, us};
  }
  return best;
}

}  // namespace chorus::collectives
