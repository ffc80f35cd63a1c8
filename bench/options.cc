// options.cc: collbench's command line (options.h).
#include "bench/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace chorus::bench {

size_t parseBytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  double scale = 1;
  switch (*end) {
    case 'K':
    case 'k':
      scale = 1024.0;
      ++end;
      break;
    case 'M':
    case 'm':
      scale = 1024.0 * 1024;
      ++end;
      break;
    case 'G':
    case 'g':
      scale = 1024.0 * 1024 * 1024;
      ++end;
      break;
    default:
      break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  // Finite and below 2^63 bytes, or the conversion to size_t is undefined.
  if (end == text.c_str() || *end != '\0' || !(value >= 0) || !(value * scale < 9.2e18)) {
    throw std::invalid_argument("bad size '" + text + "' (a number of bytes with an optional K, M or G)");
  }
  return static_cast<size_t>(value * scale);
}

bool writeOutput(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) std::fprintf(stderr, "collbench: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

size_t nextSize(const Options& o, size_t bytes) {
  if (bytes >= o.maxBytes) return 0;
  const size_t next =
      o.factorGiven ? static_cast<size_t>(static_cast<double>(bytes) * o.stepFactor) : bytes + o.stepBytes;
  return next <= bytes ? 0 : std::min(next, o.maxBytes);
}

int parseOptions(int argc, const char* const* argv, Options* o) {
  CLI::App app{"collbench: measure chorus collectives (nccl-tests flags and columns)"};
  app.add_option("-b,--minbytes", o->minBytesText, "smallest size in bytes (K, M, G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o->maxBytesText, "largest size in bytes")->capture_default_str();
  auto* factor = app.add_option("-f,--stepfactor", o->stepFactor, "multiply the size by this between rows");
  app.add_option("-i,--stepbytes", o->stepBytesText, "add this many bytes between rows (when -f is not given)")
      ->capture_default_str();
  app.add_option("-n,--iters", o->iters, "timed iterations per row")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--turns", o->turns,
                 "with several --algo or with --compare: split each one's -n iterations (chorus's algorithms', "
                 "each peer's) into this many blocks, timed round robin, so the machine's drift falls on all of "
                 "them alike")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o->warmup, "untimed iterations first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", o->check, "check results against closed-form values (0/1)")->capture_default_str();
  app.add_option("-d,--datatype", o->type, "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, or all")
      ->capture_default_str();
  app.add_option("-o,--redop", o->redop, "reduction: sum prod max min avg, or all")->capture_default_str();
  app.add_option("-r,--root", o->root, "root rank of broadcast and reduce")->capture_default_str();
  app.add_option("-z,--blocking", o->blocking,
                 "blocking collectives (0/1); chorus host calls always block, and with --mem device 1 waits for each "
                 "call's stream, 0 only at the end of each timed loop")
      ->capture_default_str();
  app.add_option("--coll,--collective", o->op,
                 "allreduce allgather reducescatter broadcast reduce sendrecv alltoall alltoallv gather scatter "
                 "barrier")
      ->capture_default_str();
  app.add_option("-g,--nranks", o->localRanks,
                 "ranks to start on this machine (forked); ignored under mpiexec or chorusrun")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--bind", o->bind,
                 "forked ranks: none, or core (rank r runs only on the r-th CPU this process may use, round robin, "
                 "as mpiexec -bind-to core places them)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "core"}));
  app.add_option("--json", o->json, "write every row to this JSON file");
  app.add_option("--calibrate", o->calibrate,
                 "measure the tuner's cost parameters (ring shifts and local reduce and copy, all ranks at once) and "
                 "append them to this tuning file, for CHORUS_TUNING_FILE");
  app.add_option("--calibrate-up-to", o->calibrateUpToText,
                 "the largest size --calibrate times each algorithm at (beyond it the tuner holds the last "
                 "correction)")
      ->capture_default_str();
  app.add_option(
      "--algo", o->algo,
      "force an algorithm (see chorusAlgorithmNames), a comma-separated list, or all: one row each per size");
  // --op selects the collective, as the chorus docs say; -o stays nccl-tests' reduction op.
  app.add_option("--op", o->op, "same as --coll; a comma-separated list runs each op's sweep in turn");
  app.add_option("--zipf", o->zipf,
                 "alltoallv: each rank sends peer p a share of its count x n elements proportional to "
                 "1 / (p + 1)^S (tokens to experts of Zipf popularity); 0: equal counts")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--simulate", o->simulate,
               "start no ranks: print each row's time as predicted by the timing simulator for -g ranks (up to "
               "tens of thousands) on the model in CHORUS_TUNING_FILE");
  app.add_option("--ranks-per-host", o->ranksPerHost,
                 "--simulate: consecutive ranks per host (the rest talk over the network model); default all on one")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--compare", o->compare,
                 "also time these peers on the same calls and buffers: gloo (its tcp transport), mpi (the MPI "
                 "collective of the same name; with -g N the ranks are started under mpiexec), or gloo,mpi");
  app.add_option("--gloo-store", o->glooStore,
                 "--compare gloo: make Gloo's rendezvous file store under this directory (default TMPDIR or /tmp; "
                 "ranks on several hosts need a shared one)");
  app.add_option("--mem", o->mem,
                 "where the buffers come from: host (the heap), chorus (chorusMemAlloc: shareable, so shm moves "
                 "large messages with one copy; docs/transports.md) or device (CUDA memory of device rank % devices, "
                 "calls on a "
                 "stream)")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "chorus", "device"}));
  app.add_flag("--deterministic", o->deterministic,
               "all-reduce, reduce-scatter, reduce: also time each size on a communicator with "
               "CHORUS_DETERMINISTIC=1 (every element folded in rank order), in a row of its own beside the "
               "default's (algo column: deterministic); not with --algo");
  app.add_flag("--stats", o->stats,
               "also time each size on a communicator with CHORUS_STATS=0 (no live statistics), in a row of its "
               "own beside the default's (algo column: stats-off): what the statistics cost; not with --algo");
  app.add_flag("--grouped", o->grouped,
               "alltoall, alltoallv: also time each size made of a send and a receive per peer (itself "
               "included) in one chorusGroupStart/End, as NCCL users write an all-to-all(v), in a row of its own "
               "beside the collective's (algo column: grouped); not with --algo");
  app.add_flag("--bound", o->bound,
               "measure the copy bandwidth of all ranks at once first and print each row's share of the bound "
               "(least traffic over copy bandwidth; docs/collbench.md)");
  app.add_option("--compress", o->compress,
                 "time the compressed all-reduce with this compressor (NAME[:param][,key=value...], e.g. powersgd:4, "
                 "topk:0.01, bf16; repeat for several) beside the fp32 all-reduce: wire bytes, ratio, effective busbw")
      ->take_all();
  app.add_flag("--inject-wrong", o->injectWrong, "test hook: spoil one received element before the check")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    o->minBytes = parseBytes(o->minBytesText);
    o->maxBytes = parseBytes(o->maxBytesText);
    o->stepBytes = parseBytes(o->stepBytesText);
    o->calibrateUpTo = parseBytes(o->calibrateUpToText);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "collbench: %s\n", e.what());
    return 2;
  }
  o->factorGiven = factor->count() > 0;
  if (o->factorGiven && o->stepFactor <= 1) {
    std::fprintf(stderr, "collbench: -f must be greater than 1\n");
    return 2;
  }
  if (o->maxBytes < o->minBytes) o->maxBytes = o->minBytes;
  if (o->mem == "device" && !o->simulate) {
    // Peers and the calibration take host buffers.
    const char* refused = !o->compare.empty() ? "--compare" : !o->calibrate.empty() ? "--calibrate" : nullptr;
    if (refused != nullptr) {
      std::fprintf(stderr, "collbench: %s takes host buffers; it cannot be used with --mem device\n", refused);
      return 2;
    }
  }
  return -1;
}

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> items;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

}  // namespace chorus::bench
