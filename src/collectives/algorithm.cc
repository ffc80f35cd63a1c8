// algorithm.cc: the list of algorithms (their descriptors), names, CHORUS_ALGO parsing, and the
// dispatch to their builders.
#include "src/collectives/algorithm.h"

#include <algorithm>
#include <exception>
#include <stdexcept>

#include "src/collectives/descriptor.h"
#include "src/collectives/traits.h"

namespace chorus::collectives {
namespace {

// Every algorithm, in order of preference: the first of a collective is its default. The files
// are read in an order that keeps each collective's list as docs/algorithms.md gives it (ring
// before tree, recursive and hierarchical; chain before the tree file's broadcast and reduce;
// pairwise before bruck), each file's descriptors in its own order.
const std::vector<const AlgorithmDescriptor*>& allAlgorithms() {
  static const auto all = [] {
    std::vector<const AlgorithmDescriptor*> list;
    for (auto file :
         {ringAlgorithms, chainAlgorithms, pairwiseAlgorithms, treeAlgorithms, recursiveAlgorithms, bruckAlgorithms,
          hierarchicalAlgorithms, directAlgorithms, pointToPointAlgorithms, deviceAlgorithms}) {
      for (const AlgorithmDescriptor& d : file()) list.push_back(&d);
    }
    return list;
  }();
  return all;
}

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
    {Algorithm::kHierarchical, "hierarchical"},
    {Algorithm::kDirect, "direct"},
    {Algorithm::kIpc, "ipc"},
    {Algorithm::kStaged, "staged"},
};
const Name kAliases[] = {{Algorithm::kRecursiveDoubling, "rd"},
                         {Algorithm::kRecursiveHalving, "rh"},
                         {Algorithm::kTree, "dbt"},
                         {Algorithm::kTree, "double_binary_tree"},
                         {Algorithm::kHierarchical, "hier"}};

}  // namespace

namespace {

const AlgorithmDescriptor* find(Engine engine, Collective collective, Algorithm algorithm) {
  for (const AlgorithmDescriptor* d : allAlgorithms()) {
    if (d->engine == engine && d->collective == collective &&
        (d->algorithm == algorithm || algorithm == Algorithm::kDefault)) {
      return d;
    }
  }
  return nullptr;
}

// Each collective's algorithms of one engine, in table order.
std::array<std::vector<Algorithm>, kCollectiveCount> listOf(Engine engine) {
  std::array<std::vector<Algorithm>, kCollectiveCount> t;
  for (const AlgorithmDescriptor* d : allAlgorithms()) {
    if (d->engine == engine) t[static_cast<int>(d->collective)].push_back(d->algorithm);
  }
  return t;
}

}  // namespace

const AlgorithmDescriptor* descriptorOf(Collective collective, Algorithm algorithm) {
  return find(Engine::kHost, collective, algorithm);
}

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
  static const auto table = listOf(Engine::kHost);
  return table[static_cast<int>(collective)];
}

const std::vector<Algorithm>& deviceAlgorithmsFor(Collective collective) {
  static const auto table = listOf(Engine::kDevice);
  return table[static_cast<int>(collective)];
}

bool runsOnHost(Algorithm algorithm, Collective collective) {
  return algorithm != Algorithm::kDefault && find(Engine::kHost, collective, algorithm) != nullptr;
}

bool runsOnDevice(Algorithm algorithm, Collective collective) {
  return algorithm != Algorithm::kDefault && find(Engine::kDevice, collective, algorithm) != nullptr;
}

bool appliesTo(Algorithm algorithm, Collective collective) {
  return algorithm == Algorithm::kDefault || runsOnHost(algorithm, collective) || runsOnDevice(algorithm, collective);
}

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> items;
  for (size_t start = 0;;) {
    const size_t end = std::min(text.find(',', start), text.size());
    items.push_back(text.substr(start, end - start));
    if (end == text.size()) return items;
    start = end + 1;
  }
}

AlgorithmOverrides parseAlgorithmOverrides(const std::string& text) {
  AlgorithmOverrides overrides;
  for (const std::string& item : splitCommas(text)) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    Collective collective;
    Algorithm algorithm;
    if (colon == std::string::npos || !parseCollective(item.substr(0, colon), &collective) ||
        !parseAlgorithm(item.substr(colon + 1), &algorithm)) {
      throw std::invalid_argument("'" + item + "' is not collective:algorithm (e.g. allreduce:ring)");
    }
    if (!appliesTo(algorithm, collective)) {
      auto names = [](const std::vector<Algorithm>& list) {
        std::string text;
        for (Algorithm a : list) text += std::string(text.empty() ? "" : ", ") + algorithmName(a);
        return text;
      };
      throw std::invalid_argument("'" + item + "': " + algorithmName(algorithm) + " does not implement " +
                                  collectiveName(collective) + " (it has: " + names(algorithmsFor(collective)) +
                                  "; on device buffers: " + names(deviceAlgorithmsFor(collective)) + ")");
    }
    overrides[static_cast<int>(collective)] = algorithm;
  }
  return overrides;
}

Schedule buildSchedule(const ScheduleArgs& args) {
  const AlgorithmDescriptor* entry = descriptorOf(args.collective, args.algorithm);
  if (entry == nullptr) {
    throw std::invalid_argument(std::string(algorithmName(args.algorithm)) + " does not implement " +
                                collectiveName(args.collective));
  }
  Schedule schedule;
  const bool ordered =
      args.deterministic && entry->algorithm != Algorithm::kDirect && traitsOf(args.collective).reduces;
  if (ordered) {
    schedule = orderedReduction(args);
  } else if (args.order == nullptr || entry->follows != Follows::kPositions) {
    schedule = entry->build(args);
  } else {
    ScheduleArgs positions = args;
    positions.order = nullptr;
    positions.rank = positionOf(args, args.rank);
    positions.root = positionOf(args, args.root);
    schedule = entry->build(positions);
    for (Step& step : schedule.steps) {
      if (step.peer >= 0) step.peer = rankAt(args, step.peer);
    }
  }
  if (!ordered) schedule.algorithm = algorithmName(entry->algorithm);  // the ordered one names itself
  if (args.recordBytes > 0 && args.nranks > 1) prependAgreement(schedule, args.nranks, args.rank, args.recordBytes);
  return schedule;
}

std::vector<int> parseRankOrder(const std::string& text) {
  std::vector<int> order;
  for (const std::string& item : splitCommas(text)) {
    size_t used = 0;
    int rank = -1;
    try {
      rank = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || rank < 0) {
      throw std::invalid_argument("'" + item + "' at position " + std::to_string(order.size()) +
                                  " is not a rank number");
    }
    order.push_back(rank);
  }
  std::vector<int> seen(order.size(), -1);
  for (size_t position = 0; position < order.size(); ++position) {
    const int rank = order[position];
    if (static_cast<size_t>(rank) >= order.size()) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " at position " + std::to_string(position) +
                                  " is out of range for an order of " + std::to_string(order.size()) + " ranks");
    }
    if (seen[rank] >= 0) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " appears at positions " +
                                  std::to_string(seen[rank]) + " and " + std::to_string(position));
    }
    seen[rank] = static_cast<int>(position);
  }
  return order;
}

int positionOf(const ScheduleArgs& args, int rank) {
  if (args.order == nullptr) return rank;
  for (int position = 0; position < args.nranks; ++position) {
    if (args.order[position] == rank) return position;
  }
  throw std::invalid_argument("rank order of " + std::to_string(args.nranks) + " ranks does not contain rank " +
                              std::to_string(rank));
}

}  // namespace chorus::collectives
