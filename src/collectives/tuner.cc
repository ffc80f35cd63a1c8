// tuner.cc: the cost model per algorithm, and the choice.
//
// Notation: n ranks, p the largest power of two <= n (recursive algorithms fold the rest in and
// out, which costs two more full-buffer messages and a reduction), L = ceil(log2 n), m bytes,
// k = ceil(m / chunk) pipeline chunks. Terms: a*alpha for a messages in sequence, b*beta for b
// bytes through the busiest link, g*gamma for g bytes reduced, c*copy for local copies, and
// o*overhead for each further message a rank has in flight at once (their latencies overlap).
#include "src/collectives/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "src/collectives/algorithm.h"

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

double formulaUs(Collective collective, Algorithm algorithm, int nranks, size_t bytes, size_t chunkBytes,
                 const CostParams& c) {
  const double n = nranks;
  const double m = static_cast<double>(bytes);
  if (nranks <= 1 || bytes == 0) return m * c.copyUsPerByte;
  int pi = 1;
  while (pi * 2 <= nranks) pi *= 2;
  const double p = pi;
  const double lg = std::log2(p);
  const double L = std::ceil(std::log2(n));
  const bool folds = pi != nranks;
  const double chunk = static_cast<double>(std::max<size_t>(chunkBytes, 1));
  const double a = c.alphaUs, b = c.betaUsPerByte, g = c.gammaUsPerByte, cp = c.copyUsPerByte;
  // Chunked pipelines (chain, tree): k chunks through `hops` hops cost (hops + k - 1) chunk-times.
  auto pipeline = [&](double hops, double chunkCost, double bytesPerHop) {
    const double k = std::ceil(bytesPerHop / chunk);
    const double piece = bytesPerHop / k;
    return (hops + k - 1) * (a + piece * chunkCost);
  };
  // Ring steps: each step of a chunk waits for the step before it (a rank forwards what it just
  // received), and a rank posts one chunk's steps before the next chunk's, so chunks add latency
  // (k messages per step) but no overlap: `steps` steps of `bytesPerStep` bytes each.
  auto ringSteps = [&](double steps, double bytesPerStep, double perByte) {
    const double k = std::ceil(bytesPerStep / chunk);
    return steps * (k * a + bytesPerStep * perByte);
  };
  const double o = c.overheadUs;
  // Two levels (the hierarchical algorithms): h hosts of l ranks, local messages cost la + lb per
  // byte. A host's l ranks cross the network at once, sharing its link.
  const bool twoLevels = c.hosts > 1 && nranks % c.hosts == 0;
  const double h = c.hosts, l = n / h, la = c.localAlphaUs, lb = c.localBetaUsPerByte;
  // A chain through `hops` network hops, then `localHops` local ones (broadcast, reduce), with
  // `reduce` per byte at each hop: chunks move one hop per step, paced by the slower level.
  auto twoLevelChain = [&](double hops, double localHops, double reduce) {
    const double k = std::ceil(m / chunk);
    const double network = a + m / k * (b + reduce), within = la + m / k * (lb + reduce);
    return hops * network + localHops * within + (k - 1) * std::max(network, within);
  };
  const double fold = folds ? 2 * a + 2 * m * b + m * g : 0;
  switch (collective) {
    case Collective::kAllReduce:
      switch (algorithm) {
        case Algorithm::kRing:
          return ringSteps(2 * (n - 1), m / n, b) + (n - 1) * m / n * g;
        case Algorithm::kRecursiveDoubling:
          return lg * (a + m * b + m * g) + fold + m * cp;
        case Algorithm::kRabenseifner:
          return 2 * lg * a + 2 * (p - 1) / p * m * b + (p - 1) / p * m * g + fold + m * cp;
        // Each half of the buffer goes up and down one of the two trees; a rank is interior in one
        // (two children's chunks in and one out going up, one in and two out coming down) and a
        // leaf in the other (one out, one in): five transfers and two reductions per byte of a
        // half, through its one port. Each level waits for the one below, chunk by chunk (as the
        // ring's steps do), so the 2L levels cost k latencies each.
        case Algorithm::kTree: {
          const double k = std::ceil(m / 2 / chunk);
          return 2 * L * k * a + m / 2 * (5 * b + 2 * g);
        }
        // A ring within each host of l ranks (local costs), and for each chunk a rank owns, a ring
        // of one rank per host over it. A host's l ranks cross the network at once, sharing its
        // link: 2(h-1)/h of the buffer goes through it. Only across hosts of equal rank counts.
        case Algorithm::kHierarchical: {
          if (!twoLevels) break;
          const double k = std::ceil(m / l / chunk);
          const double local = 2 * (l - 1) * (k * la + m / l * lb);
          const double across = 2 * (h - 1) * k * a + 2 * (h - 1) / h * m * b;
          return local + across + ((l - 1) / l * m + (h - 1) / h * m / l) * g;
        }
        default:
          break;
      }
      break;
    case Collective::kAllGather:
      switch (algorithm) {
        case Algorithm::kRing:
          return ringSteps(n - 1, m / n, b) + m / n * cp;
        // Rounds overlap (a round's first chunks need nothing from the one before): lg latencies,
        // and each further chunk message the overhead of one more in flight.
        case Algorithm::kRecursiveDoubling: {
          const double block = m / n;
          double messages = 0;
          for (double d = 1; d < p; d *= 2) {
            if (d * block <= chunk) {
              messages += 1;  // all it holds in one message
              continue;
            }
            messages += std::ceil(block / chunk);
            for (double e = 1; e < d; e *= 2) messages += std::ceil(e * block / chunk);
          }
          return lg * a + (messages - lg) * o + (n - 1) / n * m * b + (folds ? 2 * a + m * b : 0) + m / n * cp;
        }
        case Algorithm::kBruck:
          return L * a + (n - 1) / n * m * b + 2 * m * cp;
        // The rail's ring (h-1 steps of a block), then h ring all-gathers within the host.
        case Algorithm::kHierarchical: {
          if (!twoLevels) break;
          const double k = std::ceil(m / n / chunk);
          return (h - 1) * k * a + (h - 1) / h * m * b + (l - 1) * h * k * la + (l - 1) / l * m * lb + m / n * cp;
        }
        default:
          break;
      }
      break;
    case Collective::kReduceScatter:
      switch (algorithm) {
        case Algorithm::kRing:
          return ringSteps(n - 1, m / n, b + g);
        case Algorithm::kRecursiveHalving:
          return lg * a + (p - 1) / p * m * (b + g) + fold + 2 * m * cp;
        // h ring reduce-scatters within the host, then the rail's ring over the partial sums.
        case Algorithm::kHierarchical: {
          if (!twoLevels) break;
          const double k = std::ceil(m / n / chunk);
          return (l - 1) * h * k * la + (l - 1) / l * m * (lb + g) + (h - 1) * k * a + (h - 1) / h * m * b +
                 (h - 1) / h * m / l * g;
        }
        default:
          break;
      }
      break;
    case Collective::kBroadcast:
      switch (algorithm) {
        case Algorithm::kChain:
          return pipeline(n - 1, b, m) + m * cp;
        case Algorithm::kBinomial:
          return L * (std::ceil(m / chunk) * a + m * b) + m * cp;
        case Algorithm::kScatterAllGather:
          return (L + n - 1) * a + 2 * (n - 1) / n * m * b + m * cp;
        case Algorithm::kHierarchical:
          if (!twoLevels) break;
          return twoLevelChain(h - 1, l - 1, 0) + m * cp;
        default:
          break;
      }
      break;
    case Collective::kReduce:
      switch (algorithm) {
        case Algorithm::kChain:
          return pipeline(n - 1, b + g, m);
        case Algorithm::kBinomial:
          return L * (std::ceil(m / chunk) * a + m * (b + g));
        case Algorithm::kReduceScatterGather:
          return 2 * (n - 1) * a + (n - 1) / n * m * (2 * b + g) + m * cp;
        case Algorithm::kHierarchical:
          if (!twoLevels) break;
          return twoLevelChain(h - 1, l - 1, g);
        default:
          break;
      }
      break;
    case Collective::kAllToAll:
      switch (algorithm) {
        // Every exchange is posted at once: one latency, plus the overhead of each further message.
        case Algorithm::kPairwise:
          return a + (n - 2) * o + (n - 1) / n * m * b + m / n * cp;
        case Algorithm::kBruck:
          return L * a + L * m / 2 * b + (2 + L) * m * cp;
        default:
          break;
      }
      break;
    default:
      // One algorithm only: its cost does not matter for the choice.
      return L * a + m * b;
  }
  return std::numeric_limits<double>::infinity();
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
