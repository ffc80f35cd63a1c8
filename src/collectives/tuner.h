// tuner.h: picks an algorithm and a chunk size per (collective, ranks, bytes, transport) from an
// alpha-beta-gamma cost model: a message costs alpha plus beta per byte, reducing costs gamma per byte, a local
// copy `copy` per byte. The formulas follow Thakur, Rabenseifner and Gropp (2005) per algorithm.
// Pure functions; the parameters come from the caller (defaults per transport, or a file).
#pragma once

#include <array>
#include <istream>
#include <string>
#include <vector>

#include "src/collectives/algorithm.h"
#include "src/collectives/schedule.h"

namespace chorus::collectives {

// A measured correction to one algorithm's formula at one rank count, as collbench --calibrate
// writes it: measured time over predicted time at a few sizes. Between them the factor is
// interpolated (log factor linear in log size); beyond them the nearest one holds. What the
// formulas leave out (caches, ranks sharing cores, how well an algorithm's messages overlap)
// lands here.
struct Correction {
  int nranks = 0;             // applies to communicators of this many ranks only (0: to none)
  std::vector<double> bytes;  // ascending
  std::vector<double> factors;
  double at(int ranks, double size) const;  // 1 where it does not apply
};

struct CostParams {
  double alphaUs = 5;              // per message
  double betaUsPerByte = 2e-4;     // per byte on a link (5 GB/s)
  double gammaUsPerByte = 2.5e-4;  // per byte reduced (4 GB/s)
  double copyUsPerByte = 1e-4;     // per byte copied locally (10 GB/s)
  double overheadUs = 1.5;         // per extra message a rank has in flight at once (LogP's o)
  // The largest pipelining chunk chooseChunkBytes offers (a power of two, kMinChunkBytes to
  // kMaxChunkBytes): on shared memory half a FIFO, so that a rank's send of a ring chunk is out
  // before its peer's arrives and the receive-reduce can forward its result in the same pass.
  size_t maxChunkBytes = size_t{4} << 20;
  // Ranks spread over `hosts` hosts (1: all on one), and what a message costs within a host: the
  // hierarchical algorithms' local level (the fields above are then the network's).
  int hosts = 1;
  double localAlphaUs = 5;
  double localBetaUsPerByte = 2e-4;
  // The direct algorithm (every rank's buffers mapped, src/collectives/direct.cc) for calls of at
  // least this many bytes; 0: it cannot run (ranks not all on shm, or a call that cannot swap
  // buffer descriptors first: in a group, non-blocking).
  size_t directMinBytes = 0;
  std::array<std::array<Correction, static_cast<int>(Algorithm::kCount)>, kCollectiveCount> corrections;
  Correction& correction(Collective c, Algorithm a) { return corrections[static_cast<int>(c)][static_cast<int>(a)]; }
  const Correction& correction(Collective c, Algorithm a) const {
    return corrections[static_cast<int>(c)][static_cast<int>(a)];
  }
};

// Built-in defaults for shared memory and for TCP.
CostParams defaultCostParams(bool network);

// Reads "alpha_us=.. beta_GBps=.. gamma_GBps=.. copy_GBps=.. overhead_us=.." for "shm" or "tcp" from a tuning
// file (lines "shm alpha_us=4 beta_GBps=6 ..."; '#' starts a comment), and corrections from lines
// "shm allreduce:ring ranks=4 bytes=1024,65536 factors=0.9,1.3". Keys not given keep `base`; a
// later line wins over an earlier one. Throws std::invalid_argument naming the file and line on a
// malformed line.
CostParams loadCostParams(const std::string& path, bool network, CostParams base);
// The same, from text read from `in`; path names it in errors.
CostParams parseCostParams(std::istream& in, const std::string& path, bool network, CostParams base);

// Predicted time of one call, in microseconds: the algorithm's formula times its correction.
// bytes as the collective's user sees it: the buffer for all-reduce, broadcast and reduce; the
// whole n-block buffer for all-gather, reduce-scatter, all-to-all, gather and scatter.
double predictUs(Collective collective, Algorithm algorithm, int nranks, size_t bytes, size_t chunkBytes,
                 const CostParams& params);
// The formula alone (what a correction's factors are measured against).
double formulaUs(Collective collective, Algorithm algorithm, int nranks, size_t bytes, size_t chunkBytes,
                 const CostParams& params);

// The algorithm with the least predicted time among the collective's algorithms, at a given chunk.
Algorithm chooseAlgorithm(Collective collective, int nranks, size_t bytes, size_t chunkBytes, const CostParams& params);

// The pipelining chunk with the least predicted time for an algorithm, among the powers of two
// from kMinChunkBytes to kMaxChunkBytes, capped by params.maxChunkBytes (the larger on a tie:
// fewer messages).
inline constexpr size_t kMinChunkBytes = size_t{64} << 10;
inline constexpr size_t kMaxChunkBytes = size_t{4} << 20;
size_t chooseChunkBytes(Collective collective, Algorithm algorithm, int nranks, size_t bytes, const CostParams& params);

// Algorithm and chunk together: each algorithm at its best chunk (or at fixedChunkBytes when
// that is not 0, as CHORUS_CHUNK_BYTES asks), the fastest of them.
struct TunerChoice {
  Algorithm algorithm = Algorithm::kDefault;
  size_t chunkBytes = 0;
  double predictedUs = 0;
};
TunerChoice choose(Collective collective, int nranks, size_t bytes, const CostParams& params,
                   size_t fixedChunkBytes = 0);

}  // namespace chorus::collectives
