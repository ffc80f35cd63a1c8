// tuner.h: picks an algorithm per (collective, ranks, bytes, transport) from an alpha-beta-gamma
// cost model: a message costs alpha plus beta per byte, reducing costs gamma per byte, a local
// copy `copy` per byte. The formulas follow Thakur, Rabenseifner and Gropp (2005) per algorithm.
// Pure functions; the parameters come from the caller (defaults per transport, or a file).
#pragma once

#include <string>

#include "src/collectives/schedule.h"

namespace chorus::collectives {

struct CostParams {
  double alphaUs = 5;              // per message
  double betaUsPerByte = 2e-4;     // per byte on a link (5 GB/s)
  double gammaUsPerByte = 2.5e-4;  // per byte reduced (4 GB/s)
  double copyUsPerByte = 1e-4;     // per byte copied locally (10 GB/s)
};

// Built-in defaults for shared memory and for TCP.
CostParams defaultCostParams(bool network);

// Reads "alpha_us=.. beta_GBps=.. gamma_GBps=.. copy_GBps=.." for "shm" or "tcp" from a tuning
// file (lines "shm alpha_us=4 beta_GBps=6 ..."; '#' starts a comment). Keys not given keep
// `base`. Throws std::invalid_argument naming the file and line on a malformed line.
CostParams loadCostParams(const std::string& path, bool network, CostParams base);

// Predicted time of one call, in microseconds. bytes as the collective's user sees it: the
// buffer for all-reduce, broadcast and reduce; the whole n-block buffer for all-gather,
// reduce-scatter, all-to-all, gather and scatter.
double predictUs(Collective collective, Algorithm algorithm, int nranks, size_t bytes, size_t chunkBytes,
                 const CostParams& params);

// The algorithm with the least predicted time among the collective's algorithms.
Algorithm chooseAlgorithm(Collective collective, int nranks, size_t bytes, size_t chunkBytes, const CostParams& params);

}  // namespace chorus::collectives
