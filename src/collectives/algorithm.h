// algorithm.h: which algorithms implement which collective, their names, the built-in default,
// and the CHORUS_ALGO override syntax ("allreduce:ring,allgather:bruck"). Pure functions.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "src/collectives/schedule.h"

namespace chorus::collectives {

inline constexpr int kCollectiveCount = static_cast<int>(Collective::kScatter) + 1;

const char* algorithmName(Algorithm algorithm);
// Accepts the names algorithmName gives and short aliases (rd, rh, dbt). Returns false if unknown.
bool parseAlgorithm(const std::string& text, Algorithm* out);
bool parseCollective(const std::string& text, Collective* out);

// The algorithms that implement a collective on host buffers; the first is the built-in default.
const std::vector<Algorithm>& algorithmsFor(Collective collective);
// Those that implement it on device buffers (the device engine's), in its order of preference.
const std::vector<Algorithm>& deviceAlgorithmsFor(Collective collective);
// Whether the algorithm implements the collective on host buffers (host) or on device buffers
// (device); appliesTo: on either (kDefault: always).
bool runsOnHost(Algorithm algorithm, Collective collective);
bool runsOnDevice(Algorithm algorithm, Collective collective);
bool appliesTo(Algorithm algorithm, Collective collective);

// The items of a comma-separated list, empty ones included ("a,,b" -> a, "", b; "" -> one "").
std::vector<std::string> splitCommas(const std::string& text);

// Per-collective overrides from text like "allreduce:ring,allgather:bruck,reduce:default": the
// algorithm of each collective named (kDefault for "default"), nothing for the others. A host or
// a device algorithm; each engine follows the override where the algorithm is one of its own
// (direct is both) and chooses itself otherwise. Throws std::invalid_argument naming the bad entry.
using AlgorithmOverrides = std::array<std::optional<Algorithm>, kCollectiveCount>;
AlgorithmOverrides parseAlgorithmOverrides(const std::string& text);

// A rank order from text like "0,2,1,3" (CHORUS_RANK_ORDER): each of 0..k-1 once, for k ranks.
// Throws std::invalid_argument naming the bad entry, the repeated or the missing rank.
std::vector<int> parseRankOrder(const std::string& text);

}  // namespace chorus::collectives
