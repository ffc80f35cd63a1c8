// options.h: collbench's command line (nccl-tests' flags and ours), parsed apart from the
// benchmark so the fuzz target (tests/fuzz) drives the very parser users do.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus::bench {

struct Options {
  std::string minBytesText = "32M";
  std::string maxBytesText = "32M";
  size_t minBytes = 0;
  size_t maxBytes = 0;
  double stepFactor = 1;
  std::string stepBytesText = "1M";
  size_t stepBytes = 0;
  bool factorGiven = false;
  int iters = 20;
  int warmup = 5;
  int turns = 1;  // with several algorithms: blocks each one's iterations are split into, taken round robin
  int check = 1;
  std::string type = "float";
  std::string redop = "sum";
  int root = 0;
  int blocking = 1;
  std::string op = "allreduce";  // or a comma-separated list, swept one after the other
  double zipf = 1.0;             // alltoallv's counts: the Zipf exponent (zipfCounts)
  int localRanks = 1;
  std::string bind = "none";  // forked ranks: "core" pins rank r to the r-th allowed CPU, round robin
  std::string json;
  std::string algo;
  std::string calibrate;
  std::string calibrateUpToText = "64M";
  size_t calibrateUpTo = 0;  // the calibration's largest size, parsed from calibrateUpToText
  bool simulate = false;
  int ranksPerHost = 0;
  bool injectWrong = false;
  std::string compare;                // peers timed beside chorus: "gloo", "mpi", "gloo,mpi"
  std::string glooStore;              // where Gloo's file store is made (a directory every rank sees)
  bool deterministic = false;         // reductions also on a CHORUS_DETERMINISTIC communicator, a row each
  bool stats = false;                 // also on a CHORUS_STATS=0 communicator: what the statistics cost
  bool grouped = false;               // alltoall(v): also as a group of sends and receives, a row of its own
  bool bound = false;                 // measure the copy bandwidth and print each row's share of the bound
  std::string mem = "host";           // where the buffers come from: host (the heap) or chorus (chorusMemAlloc)
  std::vector<std::string> compress;  // compressor specs: compressed all-reduce beside fp32 (compressed.cc)
};

// Parses the command line into *o. Returns -1 to go on, else the exit code for main: 0 after
// --help, 2 after a bad flag or value (the message is on stderr).
int parseOptions(int argc, const char* const* argv, Options* o);

// Writes text to path (--json); false, with the reason on stderr, when it cannot.
bool writeOutput(const std::string& path, const std::string& text);

// The row after `bytes` in the -b/-e/-f/-i sweep, or 0 after the last.
size_t nextSize(const Options& o, size_t bytes);

// --compress: each compressor's all-reduce timed beside the fp32 all-reduce, with the bytes the
// transports sent (compressed.cc). Returns the exit code.
int runCompressed(const Options& o, chorusComm_t comm);

// "a,b,,c" -> {"a", "b", "", "c"} (--compare, --algo lists; callers skip empty items).
std::vector<std::string> splitCommas(const std::string& text);

// "32M", "1.5K", "4096", "1GB" -> bytes. Throws std::invalid_argument for anything else,
// negative or at least 2^63 bytes.
size_t parseBytes(const std::string& text);

}  // namespace chorus::bench
