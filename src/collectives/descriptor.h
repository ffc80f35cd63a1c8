// descriptor.h: an algorithm described once, beside its builder: which collective it implements,
// how its schedule is built, what the tuner predicts it costs, and how it follows a rank order.
// Each algorithm's file defines its descriptors; algorithm.cc lists them in order of preference
// (the first of a collective is its default) and everything else (CHORUS_ALGO, the tuner, the
// simulator, chorusAlgorithmNames) reads that list.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "src/collectives/schedule.h"
#include "src/collectives/tuner.h"

namespace chorus::collectives {

// What a cost formula is given, in tuner.cc's notation: n ranks, p the largest power of two <= n
// (recursive algorithms fold the rest in and out), lg = log2 p, L = ceil(log2 n), m bytes, and the
// model's terms: a (alpha) per message, b (beta) per byte through the busiest link, g (gamma) per
// byte reduced, cp per byte copied locally, o per further message a rank has in flight at once.
// Two levels (hierarchical algorithms): h hosts of l ranks, local messages cost la + lb per byte.
struct Cost {
  double n = 1, m = 0, p = 1, lg = 0, L = 0, chunk = 1;
  bool folds = false;
  double a = 0, b = 0, g = 0, cp = 0, o = 0;
  bool twoLevels = false;  // several hosts of equal rank counts
  double h = 1, l = 1, la = 0, lb = 0;
  double directFrom = 0;  // the direct algorithm runs from this many bytes (0: it cannot run)

  // Folding the ranks past p in and out: two full-buffer messages and a reduction.
  double fold() const { return folds ? 2 * a + 2 * m * b + m * g : 0; }
  // One round in which every rank exchanges `bytes` with the rank `d` away in rank numbers
  // (recursive doubling and halving: r xor d; `shifted`, Bruck: r - d and r + d). On one level, a
  // message. On two levels of hosts of l consecutive ranks: xor partners d < l apart are on one
  // host (local prices; l a power of two); otherwise the round crosses hosts, and the ranks that
  // cross share their host's link: all l of them, or for a shift d < l the d at the host's edge.
  double exchange(double d, double bytes, bool shifted = false) const {
    if (!twoLevels) return a + bytes * b;
    if (d < l && !shifted) return la + bytes * lb;
    return a + std::min(d, l) * bytes * b;
  }
  // Chunked pipelines (chain): the first of k chunks crosses `hops` hops, a latency and its bytes
  // each; the other k-1 follow it through the busiest hop one after another, a message's bytes
  // and overhead each (the latency of one chunk overlaps the bytes of the next).
  double pipeline(double hops, double chunkCost, double bytesPerHop) const {
    const double k = std::ceil(bytesPerHop / chunk);
    const double piece = bytesPerHop / k;
    return hops * (a + piece * chunkCost) + (k - 1) * (piece * chunkCost + o);
  }
  // Ring steps: each step of a chunk waits for the step before it (a rank forwards what it just
  // received), and a rank posts one chunk's steps before the next chunk's, so chunks add latency
  // (k messages per step) but no overlap: `steps` steps of `bytesPerStep` bytes each.
  double ringSteps(double steps, double bytesPerStep, double perByte) const {
    const double k = std::ceil(bytesPerStep / chunk);
    return steps * (k * a + bytesPerStep * perByte);
  }
  // Two chains per chunk (hierarchical broadcast, reduce): the root's rail through `hops` network
  // hops, each host's ranks through `localHops` local ones, with `reduce` per byte at each hop.
  // The first chunk crosses them all; the others follow at the pace of the busiest rank, a rail
  // member whose port carries a chunk on both levels (two messages) and whose core spends `core`
  // per byte of each chunk (the root's copy for broadcast, two reductions for reduce); `copy`: per
  // byte the root copies before its host's chain may start (broadcast: its output).
  double twoLevelChain(double hops, double localHops, double reduce, double core, double copy) const {
    const double k = std::ceil(m / chunk);
    const double piece = m / k;
    const double network = a + piece * (b + reduce), within = la + piece * (lb + reduce);
    const double port = (hops > 0 ? b : 0) + (localHops > 0 ? lb : 0);
    return hops * network + localHops * within + piece * copy + (k - 1) * (piece * std::max(port, core) + 2 * o);
  }
};
Cost costOf(int nranks, size_t bytes, size_t chunkBytes, const CostParams& params);
// What a formula returns where its algorithm cannot run (hierarchical on one host).
inline constexpr double kCannot = std::numeric_limits<double>::infinity();
// The cost of a collective's only algorithm: it does not matter for the choice.
double onlyAlgorithmCost(const Cost& c);

// How an algorithm follows the rank order (ScheduleArgs::order).
enum class Follows : uint8_t {
  kPositions,  // whole-buffer data: built over positions, then each peer mapped to its rank
  kItself,     // handles the order itself (blocks stay at their ranks' offsets)
  kNumbers,    // pairs ranks by number: the order does not apply
};

// Which engine runs an algorithm: the executor (host buffers: a schedule), or the device engine
// (device buffers: enqueued on a stream by src/core/device.cc, which runs each device algorithm;
// its descriptor says which collectives it takes, in the engine's order of preference, and has
// no builder or cost).
enum class Engine : uint8_t { kHost, kDevice };

struct AlgorithmDescriptor {
  Collective collective;
  Algorithm algorithm;
  Schedule (*build)(const ScheduleArgs&);
  double (*cost)(const Cost&);  // microseconds of one call; kCannot where it cannot run
  Follows follows;
  Engine engine = Engine::kHost;
};

// Each algorithm file's descriptors, in its order of preference. algorithm.cc reads the files in
// an order that keeps every collective's list as the docs give it (its default first).
std::span<const AlgorithmDescriptor> ringAlgorithms();
std::span<const AlgorithmDescriptor> chainAlgorithms();
std::span<const AlgorithmDescriptor> pairwiseAlgorithms();
std::span<const AlgorithmDescriptor> treeAlgorithms();
std::span<const AlgorithmDescriptor> recursiveAlgorithms();
std::span<const AlgorithmDescriptor> bruckAlgorithms();
std::span<const AlgorithmDescriptor> hierarchicalAlgorithms();
std::span<const AlgorithmDescriptor> directAlgorithms();
std::span<const AlgorithmDescriptor> pointToPointAlgorithms();  // schedule.cc
std::span<const AlgorithmDescriptor> deviceAlgorithms();        // device_algorithms.cc

// The host descriptor of (collective, algorithm), the collective's default for kDefault; null
// where the algorithm does not implement the collective on host buffers.
const AlgorithmDescriptor* descriptorOf(Collective collective, Algorithm algorithm);

}  // namespace chorus::collectives
