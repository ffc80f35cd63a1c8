// algorithm.cc: the table of algorithms per collective, and the dispatch to their builders.
#include "src/collectives/algorithm.h"

#include <stdexcept>

namespace chorus::collectives {
namespace {

struct Entry {
  Collective collective;
  Algorithm algorithm;
  Schedule (*build)(const ScheduleArgs&);
};

// One line per (collective, algorithm); the first line of a collective is its default.
const Entry kEntries[] = {
    {Collective::kAllReduce, Algorithm::kRing, ringAllReduce},
    {Collective::kAllReduce, Algorithm::kTree, doubleTreeAllReduce},
    {Collective::kAllReduce, Algorithm::kRecursiveDoubling, recursiveDoublingAllReduce},
    {Collective::kAllReduce, Algorithm::kRabenseifner, rabenseifnerAllReduce},
    {Collective::kAllGather, Algorithm::kRing, ringAllGather},
    {Collective::kAllGather, Algorithm::kRecursiveDoubling, recursiveDoublingAllGather},
    {Collective::kAllGather, Algorithm::kBruck, bruckAllGather},
    {Collective::kReduceScatter, Algorithm::kRing, ringReduceScatter},
    {Collective::kReduceScatter, Algorithm::kRecursiveHalving, recursiveHalvingReduceScatter},
    {Collective::kBroadcast, Algorithm::kChain, chainBroadcast},
    {Collective::kBroadcast, Algorithm::kBinomial, binomialBroadcast},
    {Collective::kBroadcast, Algorithm::kScatterAllGather, scatterAllGatherBroadcast},
    {Collective::kReduce, Algorithm::kChain, chainReduce},
    {Collective::kReduce, Algorithm::kBinomial, binomialReduce},
    {Collective::kReduce, Algorithm::kReduceScatterGather, reduceScatterGatherReduce},
    {Collective::kSend, Algorithm::kPairwise, pointToPoint},
    {Collective::kRecv, Algorithm::kPairwise, pointToPoint},
    {Collective::kBarrier, Algorithm::kDissemination, disseminationBarrier},
    {Collective::kAllToAll, Algorithm::kPairwise, pairwiseAllToAll},
    {Collective::kAllToAll, Algorithm::kBruck, bruckAllToAll},
    {Collective::kAllToAllv, Algorithm::kPairwise, pairwiseAllToAllv},
    {Collective::kGather, Algorithm::kBinomial, binomialGather},
    {Collective::kScatter, Algorithm::kBinomial, binomialScatter},
};

struct Name {
  Algorithm algorithm;
  const char* name;
};
const Name kNames[] = {
    {Algorithm::kDefault, "default"},
    {Algorithm::kRing, "ring"},
    {Algorithm::kChain, "chain"},
    {Algorithm::kTree, "tree"},
    {Algorithm::kRecursiveDoubling, "recursive_doubling"},
    {Algorithm::kRabenseifner, "rabenseifner"},
    {Algorithm::kBruck, "bruck"},
    {Algorithm::kRecursiveHalving, "recursive_halving"},
    {Algorithm::kPairwise, "pairwise"},
    {Algorithm::kBinomial, "binomial"},
    {Algorithm::kScatterAllGather, "scatter_allgather"},
    {Algorithm::kReduceScatterGather, "reducescatter_gather"},
    {Algorithm::kDissemination, "dissemination"},
};
const Name kAliases[] = {{Algorithm::kRecursiveDoubling, "rd"},
                         {Algorithm::kRecursiveHalving, "rh"},
                         {Algorithm::kTree, "dbt"},
                         {Algorithm::kTree, "double_binary_tree"}};

const Entry* find(Collective collective, Algorithm algorithm) {
  for (const Entry& e : kEntries) {
    if (e.collective == collective && (e.algorithm == algorithm || algorithm == Algorithm::kDefault)) return &e;
  }
  return nullptr;
}

}  // namespace

const char* algorithmName(Algorithm algorithm) {
  for (const Name& n : kNames) {
    if (n.algorithm == algorithm) return n.name;
  }
  return "unknown";
}

bool parseAlgorithm(const std::string& text, Algorithm* out) {
  for (const Name& n : kNames) {
    if (text == n.name) return *out = n.algorithm, true;
  }
  for (const Name& n : kAliases) {
    if (text == n.name) return *out = n.algorithm, true;
  }
  return false;
}

bool parseCollective(const std::string& text, Collective* out) {
  for (int c = 0; c < kCollectiveCount; ++c) {
    if (text == collectiveName(static_cast<Collective>(c))) return *out = static_cast<Collective>(c), true;
  }
  return false;
}

const std::vector<Algorithm>& algorithmsFor(Collective collective) {
  static const auto table = [] {
    std::array<std::vector<Algorithm>, kCollectiveCount> t;
    for (const Entry& e : kEntries) t[static_cast<int>(e.collective)].push_back(e.algorithm);
    return t;
  }();
  return table[static_cast<int>(collective)];
}

bool appliesTo(Algorithm algorithm, Collective collective) {
  return algorithm == Algorithm::kDefault || find(collective, algorithm) != nullptr;
}

AlgorithmOverrides parseAlgorithmOverrides(const std::string& text) {
  AlgorithmOverrides overrides;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    Collective collective;
    Algorithm algorithm;
    if (colon == std::string::npos || !parseCollective(item.substr(0, colon), &collective) ||
        !parseAlgorithm(item.substr(colon + 1), &algorithm)) {
      throw std::invalid_argument("'" + item + "' is not collective:algorithm (e.g. allreduce:ring)");
    }
    if (!appliesTo(algorithm, collective)) {
      std::string known;
      for (Algorithm a : algorithmsFor(collective)) known += std::string(known.empty() ? "" : ", ") + algorithmName(a);
      throw std::invalid_argument("'" + item + "': " + algorithmName(algorithm) + " does not implement " +
                                  collectiveName(collective) + " (it has: " + known + ")");
    }
    overrides[static_cast<int>(collective)] = algorithm;
  }
  return overrides;
}

Schedule buildSchedule(const ScheduleArgs& args) {
  const Entry* entry = find(args.collective, args.algorithm);
  if (entry == nullptr) {
    throw std::invalid_argument(std::string(algorithmName(args.algorithm)) + " does not implement " +
                                collectiveName(args.collective));
  }
  Schedule schedule = entry->build(args);
  schedule.algorithm = algorithmName(entry->algorithm);
  return schedule;
}

}  // namespace chorus::collectives
