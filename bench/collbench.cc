// collbench.cc: the chorus collective benchmark. nccl-tests' flags and columns (size, count,
// type, redop, root, then time, algbw, busbw and #wrong for out-of-place and in-place), with
// a correctness check against closed-form results, JSON output, and three ways to start:
// `collbench -g 4 ...` forks 4 local ranks itself; under `mpiexec -n 4 collbench ...` or
// `chorusrun -n 4 collbench ...` every process is one rank (chorusCommInitFromEnv).
#include <chorus/chorus.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "bench/device_memory.h"
#include "bench/options.h"
#include "bench/peers.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/reduce.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/simulator.h"
#include "src/collectives/tuner.h"
#include "tests/support/pattern.h"

namespace {

// The median of the values (the mean of the middle two when their number is even); 0 if none.
double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size();
  return (values[(m - 1) / 2] + values[m / 2]) / 2;
}

using chorus::bench::Op;
using chorus::bench::Options;
using chorus::bench::parseOptions;

struct OpInfo {
  const char* name;
  Op op;
  bool reduces;
  bool rooted;
};
constexpr OpInfo kOps[] = {
    {"allreduce", Op::kAllReduce, true, false},
    {"allgather", Op::kAllGather, false, false},
    {"reducescatter", Op::kReduceScatter, true, false},
    {"broadcast", Op::kBroadcast, false, true},
    {"reduce", Op::kReduce, true, true},
    {"sendrecv", Op::kSendRecv, false, false},
    {"alltoall", Op::kAllToAll, false, false},
    {"gather", Op::kGather, false, true},
    {"scatter", Op::kScatter, false, true},
    {"barrier", Op::kBarrier, false, false},
};

const char* nameOf(Op op) {
  for (const OpInfo& info : kOps) {
    if (info.op == op) return info.name;
  }
  return "?";
}

struct TypeInfo {
  const char* name;
  chorusDataType_t type;
};
// nccl-tests' names first, then chorus's.
constexpr TypeInfo kTypes[] = {
    {"int8", chorusInt8},       {"uint8", chorusUint8},       {"int32", chorusInt32},     {"uint32", chorusUint32},
    {"int64", chorusInt64},     {"uint64", chorusUint64},     {"half", chorusFloat16},    {"float", chorusFloat32},
    {"double", chorusFloat64},  {"bfloat16", chorusBfloat16}, {"float16", chorusFloat16}, {"float32", chorusFloat32},
    {"float64", chorusFloat64}, {"int", chorusInt32},
};
constexpr int kDistinctTypes = 10;  // the first ten entries are every type once

struct RedOpInfo {
  const char* name;
  chorusRedOp_t op;
};
constexpr RedOpInfo kRedOps[] = {
    {"sum", chorusSum}, {"prod", chorusProd}, {"max", chorusMax}, {"min", chorusMin}, {"avg", chorusAvg}};

// The peers --compare names, in order; empty (with the reason on stderr) when one is unknown.
std::vector<std::string> comparedPeers(const Options& o, bool* ok) {
  std::vector<std::string> peers;
  *ok = true;
  for (const std::string& name : chorus::collectives::splitCommas(o.compare)) {
    if (name.empty()) continue;
    if (name != "gloo" && name != "mpi") {
      std::fprintf(stderr, "collbench: --compare %s: unknown peer (gloo, mpi)\n", name.c_str());
      *ok = false;
    }
#ifndef CHORUS_COLLBENCH_GLOO
    if (name == "gloo") {
      std::fprintf(stderr, "collbench: --compare gloo: this collbench was built without Gloo (libgloo-dev)\n");
      *ok = false;
    }
#endif
#ifndef CHORUS_COLLBENCH_MPI
    if (name == "mpi") {
      std::fprintf(stderr, "collbench: --compare mpi: this collbench was built without MPI (libmpich-dev)\n");
      *ok = false;
    }
#endif
    if (std::find(peers.begin(), peers.end(), name) == peers.end()) peers.push_back(name);
  }
  return peers;
}

// The CPUs this process may run on, ascending (empty if the kernel will not say).
std::vector<int> allowedCpuList() {
  cpu_set_t allowed;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  return cpus;
}

// The same as text: "0-3", "0,2", "5".
std::string allowedCpus() {
  const std::vector<int> cpus = allowedCpuList();
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus[i]);
    if (j > i) text += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return text.empty() ? "?" : text;
}

// Pins this process to the rank-th CPU of those it may run on (round robin when ranks outnumber them).
bool bindToCore(int rank) {
  const std::vector<int> cpus = allowedCpuList();
  if (cpus.empty()) {
    std::perror("collbench: sched_getaffinity");
    return false;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  const int cpu = cpus[static_cast<size_t>(rank) % cpus.size()];
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) {
    std::fprintf(stderr, "collbench rank %d: cannot bind to CPU %d: %s\n", rank, cpu, std::strerror(errno));
    return false;
  }
  return true;
}

const OpInfo* findOp(const std::string& name) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

struct Result {
  double timeUs = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
  std::vector<double> turnUs;  // --turns: this rank's microseconds per call in each turn
};

// Writes the --json document; false (with the reason on stderr) when the file cannot be written.
bool writeJson(const std::string& path, const nlohmann::json& doc) {
  return chorus::bench::writeOutput(path, doc.dump(2) + "\n");
}

// nccl-tests' column header, with an algo column after root when algorithms are named, then
// per peer its busbw and our out-of-place busbw over it, then the share of the bound.
void printColumnHeader(bool algoColumn, const std::vector<std::string>& peers = {}, bool bound = false) {
  auto line = [&](const char* a, const char* b, const char* c, const char* d, const char* e, const char* algo,
                  const char* f, const char* g, const char* h, const char* i, const char* j, const char* k,
                  const char* l, const char* m, int row) {
    std::printf("# %10s  %12s  %8s  %6s  %6s", a, b, c, d, e);
    if (algoColumn) std::printf("  %20s", algo);
    std::printf("  %9s  %7s  %7s  %6s  %9s  %7s  %7s  %6s", f, g, h, i, j, k, l, m);
    for (const std::string& peer : peers) {
      const std::string ratio = "x " + peer;
      const char* first = row == 0 ? peer.c_str() : row == 1 ? "busbw" : "(GB/s)";
      std::printf("  %7s  %7s", first, row == 1 ? ratio.c_str() : "");
    }
    if (bound) std::printf("  %6s", row == 1 ? "%bound" : "");
    std::printf("\n");
  };
  std::printf("#\n");
  line("", "", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", "", 0);
  line("size", "count", "type", "redop", "root", "algo", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
       "#wrong", 1);
  line("(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 2);
  std::fflush(stdout);
}

// `tail`: the peer and bound columns, already formatted.
void printRow(size_t bytes, size_t count, chorusDataType_t type, const char* redop, int root, const char* algo,
              const Result& outOfPlace, const std::string& outWrong, const Result& inPlace, const std::string& inWrong,
              const std::string& tail = "") {
  std::printf("  %10zu  %12zu  %8s  %6s  %6d", bytes, count, chorusTypeName(type), redop, root);
  if (algo != nullptr) std::printf("  %20s", algo);
  std::printf("  %9.2f  %7.2f  %7.2f  %6s  %9.2f  %7.2f  %7.2f  %6s%s\n", outOfPlace.timeUs, outOfPlace.algbw,
              outOfPlace.busbw, outWrong.c_str(), inPlace.timeUs, inPlace.algbw, inPlace.busbw, inWrong.c_str(),
              tail.c_str());
  std::fflush(stdout);
}

// Ops whose size is the whole buffer of n blocks, with count per rank (as nccl-tests).
bool spreads(Op op) {
  return op == Op::kAllGather || op == Op::kReduceScatter || op == Op::kAllToAll || op == Op::kGather ||
         op == Op::kScatter;
}

// nccl-tests' bus bandwidth factor: busbw = algbw * factor.
double busFactor(Op op, int nranks) {
  const double n = nranks;
  switch (op) {
    case Op::kAllReduce:
      return 2 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
    case Op::kGather:
    case Op::kScatter:
      return (n - 1) / n;
    default:
      return 1;
  }
}

// The least traffic a collective of `bytes` (nccl-tests' size) on n ranks needs, in copies of
// that size (a copy reads and writes each byte once): every input byte a rank needs read once and
// every output byte written once. An all-reduce reads n inputs and writes n outputs of the size:
// n copies; a reduce-scatter reads n inputs and writes n outputs of 1/n of it: (n + 1) / 2. The
// bound's time is copies * bytes over the copy bandwidth of all ranks at once (docs/collbench.md: --bound).
double boundCopies(Op op, int nranks) {
  const double n = nranks;
  switch (op) {
    case Op::kAllReduce:
    case Op::kAllGather:
    case Op::kAllToAll:
    case Op::kBroadcast:
    case Op::kSendRecv:
      return n;
    case Op::kReduceScatter:
    case Op::kReduce:
      return (n + 1) / 2;
    case Op::kGather:
    case Op::kScatter:
      return 1;
    default:
      return 0;  // a barrier moves no data
  }
}

// The copy bandwidth of all ranks at once (GB/s, summed over the ranks): memcpy's, the streaming
// copy's, and the faster, which is --bound's C.
struct CopyRates {
  double GBps = 0;
  double memcpyGBps = 0;
  double streamingGBps = 0;
};

// A buffer from the heap or from chorusMemAlloc (--mem chorus), kept across rows: assign grows it
// when a row needs more and fills the bytes the row uses.
class HostBuffer {
 public:
  explicit HostBuffer(bool shared) : shared_(shared) {}
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { release(); }

  void assign(size_t bytes, char value) {
    if (bytes > capacity_) {
      release();
      if (shared_) {
        if (chorusMemAlloc(reinterpret_cast<void**>(&data_), bytes) != chorusSuccess) {
          std::fprintf(stderr, "collbench: chorusMemAlloc of %zu bytes failed: %s\n", bytes,
                       chorusGetLastError(nullptr));
          std::exit(2);
        }
      } else {
        data_ = static_cast<char*>(std::malloc(bytes));
        if (data_ == nullptr) {
          std::fprintf(stderr, "collbench: cannot allocate %zu bytes\n", bytes);
          std::exit(2);
        }
      }
      capacity_ = bytes;
    }
    std::memset(data_, value, bytes);
  }
  char* data() const { return data_; }

 private:
  void release() {
    if (data_ == nullptr) return;
    if (shared_) {
      chorusMemFree(data_);
    } else {
      std::free(data_);
    }
    data_ = nullptr;
    capacity_ = 0;
  }
  bool shared_;
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

class Bench {
 public:
  Bench(const Options& options, chorusComm_t comm, std::vector<std::unique_ptr<chorus::bench::Peer>> peers = {})
      : o_(options), comm_(comm), peers_(std::move(peers)), send_(o_.mem == "chorus"), recv_(o_.mem == "chorus") {
    chorusCommUserRank(comm, &rank_);
    chorusCommCount(comm, &nranks_);
    if (o_.mem == "device") {
      device_ = std::make_unique<chorus::bench::DeviceMemory>(rank_);
      stream_ = device_->stream();
    }
  }

  int run();
  // Measures the tuner's cost parameters and writes them as a tuning file (rank 0).
  int calibrate(const std::string& path);
  std::string calibrateCorrections(const chorus::collectives::CostParams& fitted, const std::string& prefix);

 private:
  void die(const char* what, chorusResult_t result) {
    std::fprintf(stderr, "collbench rank %d: %s failed: %s: %s\n", rank_, what, chorusGetErrorString(result),
                 chorusGetLastError(comm_));
    std::exit(2);
  }
  void call(const char* what, chorusResult_t result) {
    if (result != chorusSuccess) die(what, result);
  }

  // Runs the op once on the buffers fillInputs or selectBuffers last chose. With device buffers
  // the call is enqueued on the stream; with -z 1 it is waited for.
  void once(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count);
  Result measure(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace);
  // What a turn times: one of chorus's algorithms ("" for the tuner's), or a peer's.
  struct Contestant {
    int peer = -1;  // index into peers_, or -1 for chorus
    std::string algorithm;
  };
  // Several contestants timed turn by turn (--turns, and the calibration): contestant a's
  // iters[a] calls split over the turns, each turn taking every contestant in order after all are
  // warmed up, so the machine's drift falls on all alike. Peers are timed out of place only.
  struct TurnPlan {
    std::vector<int> iters;  // per contestant, over all turns
    int turns = 1;
    int warmup = 0;
    bool inPlace = true;  // also time chorus's in-place form (else the second results stay empty)
    bool check = false;
  };
  std::vector<std::pair<Result, Result>> measureInTurns(const char* opName, Op op,
                                                        const std::vector<Contestant>& contestants,
                                                        chorusDataType_t type, chorusRedOp_t redop, size_t count,
                                                        const TurnPlan& plan);
  // Selects who once() calls: a peer and its algorithm, or chorus with an algorithm.
  void use(const char* opName, const Contestant& contestant);
  // Untimed calls of the selected contestant for about 2 ms (at least one), before its block.
  void settle(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count);
  // The row's columns from this rank's seconds over iters (averaged over the ranks, as nccl-tests).
  Result resultOf(Op op, chorusDataType_t type, size_t count, double seconds, int iters);
  uint64_t checkOnce(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace);
  void fillInputs(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace);
  // Points sendPtr_ and recvPtr_ into the buffers fillInputs sized, for the in-place form or not
  // (and callSend_ and callRecv_ at the same places of the device buffers with --mem device).
  void selectBuffers(Op op, size_t count, size_t typeSize, bool inPlace);
  // With device buffers: waits until every call enqueued so far is done (the end of a timed loop).
  void finishCalls() {
    if (device_) device_->synchronize();
  }
  // The device buffer's address of a host copy's byte (itself with host buffers).
  char* onDevice(char* host) const;
  double busFactor(Op op) const { return ::busFactor(op, nranks_); }
  // Every rank copies a buffer larger than the caches at once: the sum of their rates, GB/s.
  CopyRates measureCopyGBps();
  // The algorithms peer p runs at this row (none where it lacks the op, type or reduction, or at
  // sizes of no element per rank: Gloo divides by the count).
  std::vector<std::string> peerAlgorithms(size_t p, const OpInfo& info, chorusDataType_t type, chorusRedOp_t redop,
                                          size_t count);
  // Each peer's fastest algorithm at this row (out of place), checked as chorus is: the JSON
  // object of every peer's numbers, and (*best)[i] (time 0 where peer i cannot make the call).
  // timed (from measureInTurns) holds each peer algorithm's result in peerAlgorithms' order, peer
  // by peer; where it is null each is measured here, one after the other.
  nlohmann::json measurePeers(const OpInfo& info, chorusDataType_t type, chorusRedOp_t redop, size_t count,
                              std::vector<Result>* best, uint64_t* wrong, const std::vector<Result>* timed = nullptr);

  const Options& o_;
  chorusComm_t comm_;
  std::vector<std::unique_ptr<chorus::bench::Peer>> peers_;
  chorus::bench::Peer* peer_ = nullptr;  // once() calls this peer instead of chorus while set
  std::string peerAlgorithm_;
  int rank_ = 0;
  int nranks_ = 1;
  HostBuffer send_;  // with --mem device: the host copy of the device's buffer
  HostBuffer recv_;
  size_t sendBytes_ = 0;  // of send_ and recv_ in use by this row
  size_t recvBytes_ = 0;
  char* sendPtr_ = nullptr;  // where this call reads (may point into recv_ when in place)
  char* recvPtr_ = nullptr;
  std::unique_ptr<chorus::bench::DeviceMemory> device_;  // --mem device
  chorusStream_t stream_ = nullptr;                      // NULL with host buffers
  char* deviceSend_ = nullptr;
  char* deviceRecv_ = nullptr;
  char* callSend_ = nullptr;  // what chorus is given: sendPtr_ and recvPtr_, or their device places
  char* callRecv_ = nullptr;
};

// Buffers: send holds the call's input, recv its output; sizes per op in elements:
//   allreduce, broadcast, reduce, sendrecv: count in, count out
//   allgather, gather: count in, count*n out;  reducescatter, scatter: count*n in, count out;
//   alltoall: count*n in and out (count per peer).
void Bench::fillInputs(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace) {
  using chorus::pattern::store;
  const size_t size = chorusTypeSize(type);
  const size_t n = static_cast<size_t>(nranks_);
  const bool spreadIn = op == Op::kReduceScatter || op == Op::kScatter || op == Op::kAllToAll;
  const bool spreadOut = op == Op::kAllGather || op == Op::kGather || op == Op::kAllToAll;
  const size_t inCount = spreadIn ? count * n : count;
  const size_t outCount = spreadOut ? count * n : count;
  sendBytes_ = inCount * size + 64;
  recvBytes_ = std::max(outCount, inCount) * size + 64;
  send_.assign(sendBytes_, 0);
  recv_.assign(recvBytes_, 0);
  if (device_) {
    deviceSend_ = device_->reserve(0, sendBytes_);
    deviceRecv_ = device_->reserve(1, recvBytes_);
  }
  selectBuffers(op, count, size, inPlace);
  const bool reduces = op == Op::kAllReduce || op == Op::kReduceScatter || op == Op::kReduce;
  for (size_t i = 0; i < inCount; ++i) {
    store(sendPtr_, i, type,
          reduces ? chorus::pattern::reduceInput(redop, type, rank_, i) : chorus::pattern::moveInput(rank_, i));
  }
  if (device_) {
    device_->upload(deviceSend_, send_.data(), sendBytes_);
    device_->upload(deviceRecv_, recv_.data(), recvBytes_);
  }
}

char* Bench::onDevice(char* host) const {
  if (!device_) return host;
  const bool inSend = host >= send_.data() && host < send_.data() + sendBytes_;
  return inSend ? deviceSend_ + (host - send_.data()) : deviceRecv_ + (host - recv_.data());
}

void Bench::selectBuffers(Op op, size_t count, size_t size, bool inPlace) {
  sendPtr_ = send_.data();
  recvPtr_ = recv_.data();
  if (inPlace) {
    switch (op) {
      case Op::kAllGather:
        sendPtr_ = recv_.data() + rank_ * count * size;
        break;
      case Op::kReduceScatter:
        sendPtr_ = recv_.data();
        recvPtr_ = recv_.data() + rank_ * count * size;
        break;
      case Op::kGather:
        if (rank_ == o_.root) sendPtr_ = recv_.data() + rank_ * count * size;
        break;
      case Op::kScatter:
        if (rank_ == o_.root) recvPtr_ = send_.data() + rank_ * count * size;
        break;
      case Op::kAllToAll:
      case Op::kSendRecv:
      case Op::kBarrier:
        break;  // no in-place form: the in-place columns repeat the out-of-place call
      default:
        sendPtr_ = recv_.data();
        break;
    }
  }
  callSend_ = onDevice(sendPtr_);
  callRecv_ = onDevice(recvPtr_);
}

void Bench::once(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count) {
  if (peer_ != nullptr) {
    const chorus::bench::Call peerCall{op, nameOf(op), sendPtr_, recvPtr_, count, type, redop, o_.root};
    try {
      peer_->run(peerCall, peerAlgorithm_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "collbench rank %d: %s\n", rank_, e.what());
      std::exit(2);
    }
    return;
  }
  switch (op) {
    case Op::kAllReduce:
      call("allreduce", chorusAllReduce(callSend_, callRecv_, count, type, redop, comm_, stream_));
      break;
    case Op::kAllGather:
      call("allgather", chorusAllGather(callSend_, callRecv_, count, type, comm_, stream_));
      break;
    case Op::kReduceScatter:
      call("reducescatter", chorusReduceScatter(callSend_, callRecv_, count, type, redop, comm_, stream_));
      break;
    case Op::kBroadcast:
      call("broadcast", chorusBroadcast(callSend_, callRecv_, count, type, o_.root, comm_, stream_));
      break;
    case Op::kReduce:
      call("reduce", chorusReduce(callSend_, callRecv_, count, type, redop, o_.root, comm_, stream_));
      break;
    case Op::kAllToAll:
      call("alltoall", chorusAllToAll(callSend_, callRecv_, count, type, comm_, stream_));
      break;
    case Op::kGather:
      call("gather", chorusGather(callSend_, callRecv_, count, type, o_.root, comm_, stream_));
      break;
    case Op::kScatter:
      call("scatter", chorusScatter(callSend_, callRecv_, count, type, o_.root, comm_, stream_));
      break;
    case Op::kBarrier:
      call("barrier", chorusBarrier(comm_, stream_));
      break;
    case Op::kSendRecv: {
      const int next = (rank_ + 1) % nranks_;
      const int prev = (rank_ + nranks_ - 1) % nranks_;
      char* into = callRecv_;
      call("group start", chorusGroupStart());
      call("send", chorusSend(callSend_, count, type, next, comm_, stream_));
      call("recv", chorusRecv(into, count, type, prev, comm_, stream_));
      call("group end", chorusGroupEnd());
      break;
    }
  }
  if (o_.blocking) finishCalls();
}

uint64_t Bench::checkOnce(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace) {
  using namespace chorus::pattern;
  fillInputs(op, type, redop, count, inPlace);
  once(op, type, redop, count);
  if (device_) {
    finishCalls();
    device_->download(recv_.data(), deviceRecv_, recvBytes_);
  }
  if (o_.injectWrong && rank_ == (op == Op::kReduce || op == Op::kGather ? o_.root : 0) && count > 0) {
    recvPtr_[0] = static_cast<char>(~recvPtr_[0]);  // test hook: spoil one received element
  }
  const int n = nranks_;
  const int root = o_.root;
  uint64_t wrong = 0;
  switch (op) {
    case Op::kAllReduce:
      wrong = countWrong(recvPtr_, count, type, [&](size_t i) { return expectedReduce(redop, type, n, i); });
      break;
    case Op::kReduce:
      if (rank_ == root) {
        wrong = countWrong(recvPtr_, count, type, [&](size_t i) { return expectedReduce(redop, type, n, i); });
      }
      break;
    case Op::kReduceScatter:
      wrong = countWrong(recvPtr_, count, type,
                         [&](size_t i) { return expectedReduce(redop, type, n, rank_ * count + i); });
      break;
    case Op::kAllGather:
      wrong = countWrong(recvPtr_, count * n, type,
                         [&](size_t j) { return asStored(type, moveInput(static_cast<int>(j / count), j % count)); });
      break;
    case Op::kBroadcast:
      wrong = countWrong(recvPtr_, count, type, [&](size_t i) { return asStored(type, moveInput(root, i)); });
      break;
    case Op::kSendRecv: {
      const int prev = (rank_ + n - 1) % n;
      const char* got = recvPtr_;
      wrong = countWrong(got, count, type, [&](size_t i) { return asStored(type, moveInput(prev, i)); });
      break;
    }
    case Op::kAllToAll:
      wrong = countWrong(recvPtr_, count * n, type, [&](size_t j) {
        return asStored(type, moveInput(static_cast<int>(j / count), rank_ * count + j % count));
      });
      break;
    case Op::kGather:
      if (rank_ == root) {
        wrong = countWrong(recvPtr_, count * n, type,
                           [&](size_t j) { return asStored(type, moveInput(static_cast<int>(j / count), j % count)); });
      }
      break;
    case Op::kScatter:
      wrong = countWrong(recvPtr_, count, type,
                         [&](size_t i) { return asStored(type, moveInput(root, rank_ * count + i)); });
      break;
    case Op::kBarrier:
      break;  // nothing to check but that it returned
  }
  uint64_t total = 0;
  call("allreduce of #wrong", chorusAllReduce(&wrong, &total, 1, chorusUint64, chorusSum, comm_, nullptr));
  return total;
}

Result Bench::measure(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace) {
  Result result;
  fillInputs(op, type, redop, count, inPlace);
  for (int i = 0; i < o_.warmup; ++i) once(op, type, redop, count);
  finishCalls();
  call("barrier", chorusBarrier(comm_, nullptr));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o_.iters; ++i) once(op, type, redop, count);
  finishCalls();
  result = resultOf(op, type, count, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    o_.iters);
  if (o_.check) result.wrong = checkOnce(op, type, redop, count, inPlace);
  return result;
}

Result Bench::resultOf(Op op, chorusDataType_t type, size_t count, double seconds, int iters) {
  Result result;
  double mine = seconds / std::max(1, iters), sum = 0;
  call("allreduce of times", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
  const double avgSeconds = sum / nranks_;  // nccl-tests reports the rank average
  const size_t size = chorusTypeSize(type);
  const size_t n = static_cast<size_t>(nranks_);
  const size_t bytes = spreads(op) ? count * n * size : count * size;
  result.timeUs = avgSeconds * 1e6;
  result.algbw = avgSeconds > 0 ? static_cast<double>(bytes) / 1e9 / avgSeconds : 0;
  result.busbw = result.algbw * busFactor(op);
  return result;
}

CopyRates Bench::measureCopyGBps() {
  if (device_) {
    // Device memory: cudaMemcpyAsync device to device, timed by events, 256 MiB per rank (beyond
    // the L2 cache of the GPUs we know, 50-60 MiB); the fastest of 5 blocks.
    constexpr size_t kDeviceBytes = size_t{256} << 20;
    CopyRates result;
    for (int b = 0; b < 5; ++b) {
      call("barrier", chorusBarrier(comm_, nullptr));
      double mine = device_->copyBytesPerSecond(kDeviceBytes, 3) / 1e9, sum = 0;
      call("allreduce of copy rates", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
      result.memcpyGBps = std::max(result.memcpyGBps, sum);
    }
    result.GBps = result.memcpyGBps;
    return result;
  }
  // 64 MiB per rank: beyond the last-level cache of machines like ours (tens of MiB); on a
  // machine with a larger cache C is a cache speed and %bound comes out low. Each block times
  // memcpy and the streaming copy (kernels/cpu/copy.h) one after the other; each rate is its
  // fastest block (a bound: noise only slows a copy), and C is the faster of the two.
  constexpr size_t kBytes = size_t{64} << 20;
  constexpr int kBlocks = 5;
  constexpr int kCopies = 3;
  std::vector<char> from(kBytes, 1), to(kBytes, 0);
  std::memcpy(to.data(), from.data(), kBytes);  // both buffers' pages mapped before timing
  std::vector<double> rates[2];
  for (int b = 0; b < kBlocks; ++b) {
    for (int streaming = 0; streaming < 2; ++streaming) {
      call("barrier", chorusBarrier(comm_, nullptr));
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kCopies; ++i) {
        char* dst = (i % 2 == 0 ? to : from).data();
        const char* src = (i % 2 == 0 ? from : to).data();
        if (streaming != 0) {
          chorus::kernels::copyStreaming(dst, src, kBytes);
        } else {
          std::memcpy(dst, src, kBytes);
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double mine = kCopies * static_cast<double>(kBytes) / 1e9 / seconds, sum = 0;
      call("allreduce of copy rates", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
      rates[streaming].push_back(sum);
    }
  }
  CopyRates result;
  result.memcpyGBps = *std::max_element(rates[0].begin(), rates[0].end());
  result.streamingGBps = *std::max_element(rates[1].begin(), rates[1].end());
  result.GBps = std::max(result.memcpyGBps, result.streamingGBps);
  return result;
}

std::vector<std::string> Bench::peerAlgorithms(size_t p, const OpInfo& info, chorusDataType_t type, chorusRedOp_t redop,
                                               size_t count) {
  if (count == 0 && info.op != Op::kBarrier) return {};
  const chorus::bench::Call probe{info.op, info.name, nullptr, nullptr, count, type, redop, o_.root};
  return peers_[p]->algorithms(probe);
}

nlohmann::json Bench::measurePeers(const OpInfo& info, chorusDataType_t type, chorusRedOp_t redop, size_t count,
                                   std::vector<Result>* bestOfPeer, uint64_t* wrong, const std::vector<Result>* timed) {
  nlohmann::json all = nlohmann::json::object();
  bestOfPeer->assign(peers_.size(), Result{});
  size_t next = 0;  // into *timed
  for (size_t p = 0; p < peers_.size(); ++p) {
    const std::vector<std::string> algorithms = peerAlgorithms(p, info, type, redop, count);
    if (algorithms.empty()) continue;
    nlohmann::json byAlgorithm = nlohmann::json::object();
    Result best;
    std::string bestName;
    uint64_t peerWrong = 0;
    for (const std::string& algorithm : algorithms) {
      Result r;
      if (timed != nullptr) {
        r = (*timed)[next++];
      } else {
        use(info.name, {static_cast<int>(p), algorithm});
        r = measure(info.op, type, redop, count, false);
      }
      peerWrong += r.wrong;
      byAlgorithm[algorithm.empty() ? "default" : algorithm] = r.busbw;
      if (bestName.empty() || r.busbw > best.busbw) {
        best = r;
        bestName = algorithm.empty() ? "default" : algorithm;
      }
    }
    use(info.name, {});
    (*bestOfPeer)[p] = best;
    *wrong += peerWrong;
    if (peerWrong > 0 && rank_ == 0) {
      std::printf("# %s: %llu wrong values at %zu elements\n", peers_[p]->name(),
                  static_cast<unsigned long long>(peerWrong), count);
    }
    all[peers_[p]->name()] = {{"time_us", best.timeUs},   {"algbw_GBps", best.algbw},
                              {"busbw_GBps", best.busbw}, {"algo", bestName},
                              {"wrong", peerWrong},       {"algorithms_busbw_GBps", byAlgorithm}};
    if (!best.turnUs.empty()) all[peers_[p]->name()]["turn_time_us"] = best.turnUs;
  }
  return all;
}

void Bench::use(const char* opName, const Contestant& contestant) {
  if (contestant.peer >= 0) {
    peer_ = peers_[contestant.peer].get();
    peerAlgorithm_ = contestant.algorithm;
    return;
  }
  peer_ = nullptr;
  if (!contestant.algorithm.empty()) {
    call("chorusCommSetAlgorithms",
         chorusCommSetAlgorithms(comm_, (std::string(opName) + ":" + contestant.algorithm).c_str()));
  }
}

void Bench::settle(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count) {
  // The first calls after a switch pay for what the one before left behind: after MPICH's block
  // (its ranks spin), chorus's next 8-byte all-reduces on 4 ranks over 2 cores took 20-30 us
  // where the block after took 5; 100 untimed calls (about half a millisecond) brought them to
  // 5-6 in one run. It narrows the effect, not more: with 2 ms of them, single blocks of 20-30 us
  // still came in later runs, as bursts of the machine's noise do. Rank 0's clock decides, so
  // every rank makes the same calls.
  constexpr double kSettleUs = 2000;
  const auto start = std::chrono::steady_clock::now();
  int more = 0;
  do {
    once(op, type, redop, count);
    finishCalls();
    more = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() < kSettleUs;
    call("broadcast", chorusBroadcast(&more, &more, 1, chorusInt32, 0, comm_, nullptr));
  } while (more != 0);
}

std::vector<std::pair<Result, Result>> Bench::measureInTurns(const char* opName, Op op,
                                                             const std::vector<Contestant>& contestants,
                                                             chorusDataType_t type, chorusRedOp_t redop, size_t count,
                                                             const TurnPlan& plan) {
  auto sidesOf = [&](const Contestant& c) { return plan.inPlace && c.peer < 0 ? 2 : 1; };
  for (const Contestant& contestant : contestants) {  // every one warmed up before any is timed
    use(opName, contestant);
    const int sides = sidesOf(contestant);
    for (int side = 0; side < sides; ++side) {
      fillInputs(op, type, redop, count, side == 1);
      for (int i = 0; i < plan.warmup; ++i) once(op, type, redop, count);
      finishCalls();
    }
  }
  std::vector<double> seconds(2 * contestants.size(), 0);  // [2a]: out of place, [2a + 1]: in place
  std::vector<std::vector<double>> turnUs(2 * contestants.size());
  const int turns = std::min(plan.turns, *std::min_element(plan.iters.begin(), plan.iters.end()));
  for (int t = 0; t < turns; ++t) {
    for (size_t a = 0; a < contestants.size(); ++a) {
      const int iters = plan.iters[a] * (t + 1) / turns - plan.iters[a] * t / turns;
      use(opName, contestants[a]);
      const int sides = sidesOf(contestants[a]);
      for (int side = 0; side < sides; ++side) {
        // Both forms were filled above; the warm-up left the pointers at the last one.
        selectBuffers(op, count, chorusTypeSize(type), side == 1);
        settle(op, type, redop, count);
        call("barrier", chorusBarrier(comm_, nullptr));
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) once(op, type, redop, count);
        finishCalls();
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        seconds[2 * a + side] += elapsed;
        turnUs[2 * a + side].push_back(elapsed * 1e6 / iters);
      }
    }
  }
  std::vector<std::pair<Result, Result>> results(contestants.size());
  for (size_t a = 0; a < contestants.size(); ++a) {
    for (int side = 0; side < sidesOf(contestants[a]); ++side) {
      Result& result = side == 0 ? results[a].first : results[a].second;
      result = resultOf(op, type, count, seconds[2 * a + side], plan.iters[a]);
      // Each turn's time, averaged over the ranks as the row's time is.
      std::vector<double>& mine = turnUs[2 * a + side];
      result.turnUs.resize(mine.size());
      call("allreduce of turn times",
           chorusAllReduce(mine.data(), result.turnUs.data(), mine.size(), chorusFloat64, chorusSum, comm_, nullptr));
      for (double& us : result.turnUs) us /= nranks_;
    }
    if (plan.check) {
      use(opName, contestants[a]);
      results[a].first.wrong = checkOnce(op, type, redop, count, false);
      if (sidesOf(contestants[a]) == 2) results[a].second.wrong = checkOnce(op, type, redop, count, true);
    }
  }
  peer_ = nullptr;
  return results;
}

int Bench::run() {
  const OpInfo* opInfo = findOp(o_.op);
  std::vector<chorusDataType_t> types;
  for (int i = 0; i < static_cast<int>(sizeof(kTypes) / sizeof(kTypes[0])); ++i) {
    if (o_.type == "all" ? i < kDistinctTypes : o_.type == kTypes[i].name) types.push_back(kTypes[i].type);
  }
  std::vector<chorusRedOp_t> redops;
  for (const RedOpInfo& info : kRedOps) {
    if (o_.redop == "all" || o_.redop == info.name) redops.push_back(info.op);
  }
  if (opInfo == nullptr || types.empty() || redops.empty() || o_.root < 0 || o_.root >= nranks_) {
    if (rank_ == 0) {
      std::fprintf(stderr, "collbench: unknown --op '%s', -d '%s' or -o '%s', or root %d outside [0, %d)\n",
                   o_.op.c_str(), o_.type.c_str(), o_.redop.c_str(), o_.root, nranks_);
    }
    return 2;
  }
  if (!opInfo->reduces) redops = {chorusSum};

  const bool print = rank_ == 0;
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  if (print) {
    std::printf(
        "# collbench (chorus) op: %s  nranks: %d  minBytes: %zu  maxBytes: %zu  step: %s  warmup iters: %d  "
        "iters: %d  validation: %d  blocking: %d\n#\n",
        opInfo->name, nranks_, o_.minBytes, o_.maxBytes,
        o_.factorGiven ? (std::to_string(static_cast<int>(o_.stepFactor)) + "(factor)").c_str()
                       : (std::to_string(o_.stepBytes) + "(bytes)").c_str(),
        o_.warmup, o_.iters, o_.check, o_.blocking);
  }
  // One line per rank, like nccl-tests' device list, gathered to rank 0 so lines do not interleave.
  struct RankLine {
    int32_t pid;
    char host[60];
    char cpus[64];
    char device[64];
  } mine{static_cast<int32_t>(getpid()), {}, {}, {}};
  std::memcpy(mine.host, host, sizeof(mine.host) - 1);
  std::snprintf(mine.cpus, sizeof(mine.cpus), "%s", allowedCpus().c_str());
  if (device_) std::snprintf(mine.device, sizeof(mine.device), " %s", device_->describe().c_str());
  std::vector<RankLine> lines(static_cast<size_t>(nranks_));
  call("allgather of rank lines", chorusAllGather(&mine, lines.data(), sizeof(RankLine), chorusUint8, comm_, nullptr));
  if (print) {
    const char* transport = std::getenv("CHORUS_TRANSPORT");
    for (int r = 0; r < nranks_; ++r) {
      std::printf("#  Rank %3d Pid %7d on %10s cpus %s transport %s%s\n", r, lines[r].pid, lines[r].host, lines[r].cpus,
                  transport ? transport : "auto", lines[r].device);
    }
    if (device_) {
      std::printf("#  Buffers: device memory (--mem device), calls on one stream per rank, %s\n",
                  o_.blocking ? "each waited for (-z 1)" : "waited for at the end of each timed loop (-z 0)");
    } else {
      std::printf("#  Buffers: %s\n", o_.mem == "chorus" ? "chorusMemAlloc (--mem chorus)" : "the heap (--mem host)");
    }
  }
  std::vector<std::string> peerNames;
  for (const auto& peer : peers_) peerNames.push_back(peer->name());
  if (!peers_.empty() && print) {
    std::printf(
        "#  Peers: %s, each timed out of place on the same buffers %s; x PEER is chorus's\n"
        "#  out-of-place busbw over the peer's (its fastest algorithm)\n",
        o_.compare.c_str(), o_.turns > 1 ? "in turns with chorus (--turns)" : "before chorus");
  }
  double copyGBps = 0;
  CopyRates copyRates;
  if (o_.bound && device_) {
    copyRates = measureCopyGBps();
    copyGBps = copyRates.GBps;
    if (print) {
      std::printf(
          "#  Bound: copy bandwidth %.2f GB/s (%d ranks each copying 256 MiB device to device at once, summed, fastest "
          "of 5); %%bound = out-of-place algbw * copies / copy bandwidth, copies = %g for %s (docs/collbench.md)\n",
          copyGBps, nranks_, boundCopies(opInfo->op, nranks_), opInfo->name);
    }
  } else if (o_.bound) {
    copyRates = measureCopyGBps();
    copyGBps = copyRates.GBps;
    if (print) {
      std::printf(
          "#  Bound: copy bandwidth %.2f GB/s (%d ranks each copying 64 MiB at once, summed, fastest of 5; the faster "
          "of memcpy "
          "%.2f and streaming stores %.2f); %%bound = out-of-place algbw * copies / copy bandwidth, copies = %g for %s "
          "(docs/collbench.md)\n",
          copyGBps, nranks_, copyRates.memcpyGBps, copyRates.streamingGBps, boundCopies(opInfo->op, nranks_),
          opInfo->name);
    }
  }
  if (print) printColumnHeader(!o_.algo.empty(), peerNames, o_.bound);

  // --algo: one algorithm, or all of the collective's, measured side by side per size.
  std::vector<std::string> algos{""};
  if (!o_.algo.empty()) {
    const char* names = opInfo->op == Op::kSendRecv ? nullptr : chorusAlgorithmNames(opInfo->name);
    if (names == nullptr) {
      if (print) std::fprintf(stderr, "collbench: --algo does not apply to %s\n", opInfo->name);
      return 2;
    }
    algos.clear();
    for (const std::string& name : chorus::collectives::splitCommas(o_.algo == "all" ? names : o_.algo)) {
      if (!name.empty()) algos.push_back(name);
    }
    for (const std::string& algo : algos) {
      const std::string spec = std::string(opInfo->name) + ":" + algo;
      if (chorusCommSetAlgorithms(comm_, spec.c_str()) != chorusSuccess) {
        if (print) std::fprintf(stderr, "collbench: --algo %s: %s\n", algo.c_str(), chorusGetLastError(comm_));
        return 2;
      }
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<std::pair<double, size_t>>> peerRatios(peers_.size());  // (ratio, size) per row
  uint64_t totalWrong = 0;
  double busbwSum = 0;
  int busbwCount = 0;
  const size_t n = static_cast<size_t>(nranks_);
  for (chorusDataType_t type : types) {
    for (chorusRedOp_t redop : redops) {
      const size_t size = chorusTypeSize(type);
      size_t bytes = o_.minBytes;
      for (;;) {
        // Elements per call, as nccl-tests: ops over n blocks split the size over ranks.
        size_t count = opInfo->op == Op::kBarrier ? 0 : bytes / size;
        if (spreads(opInfo->op)) count /= n;
        const size_t shownBytes = spreads(opInfo->op) ? count * n * size : count * size;
        // --turns: chorus's algorithms and every peer's, timed round robin.
        std::vector<std::pair<Result, Result>> inTurns;
        std::vector<Result> peersInTurns;
        if (o_.turns > 1 && (algos.size() > 1 || !peers_.empty())) {
          std::vector<Contestant> contestants;
          for (const std::string& algo : algos) contestants.push_back({-1, algo});
          for (size_t p = 0; p < peers_.size(); ++p) {
            for (const std::string& algorithm : peerAlgorithms(p, *opInfo, type, redop, count)) {
              contestants.push_back({static_cast<int>(p), algorithm});
            }
          }
          const TurnPlan plan{std::vector<int>(contestants.size(), o_.iters), o_.turns, o_.warmup, true, o_.check != 0};
          inTurns = measureInTurns(opInfo->name, opInfo->op, contestants, type, redop, count, plan);
          for (size_t k = algos.size(); k < inTurns.size(); ++k) peersInTurns.push_back(inTurns[k].first);
          inTurns.resize(algos.size());
        }
        std::vector<Result> peerBest;
        nlohmann::json peerJson;
        if (!peers_.empty()) {
          peerJson = measurePeers(*opInfo, type, redop, count, &peerBest, &totalWrong,
                                  inTurns.empty() ? nullptr : &peersInTurns);
        }
        for (size_t a = 0; a < algos.size(); ++a) {
          const std::string& algo = algos[a];
          if (!algo.empty() && inTurns.empty()) {
            call("chorusCommSetAlgorithms",
                 chorusCommSetAlgorithms(comm_, (std::string(opInfo->name) + ":" + algo).c_str()));
          }
          const Result outOfPlace = inTurns.empty() ? measure(opInfo->op, type, redop, count, false) : inTurns[a].first;
          const Result inPlace = inTurns.empty() ? measure(opInfo->op, type, redop, count, true) : inTurns[a].second;
          totalWrong += outOfPlace.wrong + inPlace.wrong;
          busbwSum += outOfPlace.busbw + inPlace.busbw;
          busbwCount += 2;
          if (!print) continue;
          // The peers' columns: their busbw and chorus's over it (as times: a barrier moves no bytes).
          std::string tail;
          char cell[64];
          for (size_t p = 0; p < peerBest.size(); ++p) {
            const double ratio =
                peerBest[p].timeUs > 0 && outOfPlace.timeUs > 0 ? peerBest[p].timeUs / outOfPlace.timeUs : 0;
            if (ratio > 0) {
              std::snprintf(cell, sizeof(cell), "  %7.2f  %7.2f", peerBest[p].busbw, ratio);
              peerRatios[p].push_back({ratio, shownBytes});
              peerJson[peerNames[p]]["chorus_over_peer"] = ratio;
            } else {
              std::snprintf(cell, sizeof(cell), "  %7s  %7s", "N/A", "N/A");
            }
            tail += cell;
          }
          const double copies = boundCopies(opInfo->op, nranks_);
          const double boundPct = copyGBps > 0 ? 100 * outOfPlace.algbw * copies / copyGBps : 0;
          if (o_.bound) {
            if (copies > 0) {
              std::snprintf(cell, sizeof(cell), "  %6.1f", boundPct);
            } else {
              std::snprintf(cell, sizeof(cell), "  %6s", "N/A");
            }
            tail += cell;
          }
          printRow(shownBytes, count, type, opInfo->reduces ? chorusOpName(redop) : "none",
                   opInfo->rooted ? o_.root : -1, o_.algo.empty() ? nullptr : algo.c_str(), outOfPlace,
                   o_.check ? std::to_string(outOfPlace.wrong) : "N/A", inPlace,
                   o_.check ? std::to_string(inPlace.wrong) : "N/A", tail);
          auto side = [&](const Result& r) {
            nlohmann::json j = {{"time_us", r.timeUs}, {"algbw_GBps", r.algbw}, {"busbw_GBps", r.busbw}};
            if (o_.check) j["wrong"] = r.wrong;
            if (!r.turnUs.empty()) j["turn_time_us"] = r.turnUs;
            return j;
          };
          nlohmann::json row = {{"op", opInfo->name},
                                {"size_bytes", shownBytes},
                                {"count", count},
                                {"type", chorusTypeName(type)},
                                {"redop", opInfo->reduces ? chorusOpName(redop) : "none"},
                                {"root", opInfo->rooted ? o_.root : -1},
                                {"algo", algo.empty() ? "default" : algo},
                                {"nranks", nranks_},
                                {"out_of_place", side(outOfPlace)},
                                {"in_place", side(inPlace)}};
          if (!peers_.empty()) row["peers"] = peerJson;
          if (o_.bound && copies > 0) row["bound_pct"] = boundPct;
          rows.push_back(std::move(row));
        }
        if (opInfo->op == Op::kBarrier) break;  // one row: a barrier has no size
        bytes = nextSize(o_, bytes);
        if (bytes == 0) break;
      }
    }
  }
  const double avgBusbw = busbwCount ? busbwSum / busbwCount : 0;
  if (print) {
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(totalWrong),
                totalWrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g \n", avgBusbw);
    for (size_t p = 0; p < peers_.size(); ++p) {
      if (peerRatios[p].empty()) {
        std::printf("# x %-5s: no row (%s cannot make these calls)\n", peerNames[p].c_str(), peerNames[p].c_str());
        continue;
      }
      const auto lowest = *std::min_element(peerRatios[p].begin(), peerRatios[p].end());
      std::vector<double> ratios;
      for (const auto& r : peerRatios[p]) ratios.push_back(r.first);
      std::printf("# x %-5s: lowest %.2f (at %zu B), median %.2f over %zu rows\n", peerNames[p].c_str(), lowest.first,
                  lowest.second, median(ratios), ratios.size());
    }
    std::printf("#\n");
    std::fflush(stdout);
    if (!o_.json.empty()) {
      nlohmann::json doc = {
          {"tool", "collbench"},        {"op", opInfo->name},  {"nranks", nranks_}, {"iters", o_.iters},
          {"turns", o_.turns},          {"warmup", o_.warmup}, {"check", o_.check}, {"wrong_total", totalWrong},
          {"avg_busbw_GBps", avgBusbw}, {"mem", o_.mem},       {"rows", rows}};
      if (o_.bound) {
        doc["copy_GBps"] = copyGBps;
        doc["copy_memcpy_GBps"] = copyRates.memcpyGBps;
        doc["copy_streaming_GBps"] = copyRates.streamingGBps;
      }
      if (!peers_.empty()) doc["peers"] = peerNames;
      if (!writeJson(o_.json, doc)) return 2;
    }
  }
  return totalWrong == 0 ? 0 : 1;
}

int Bench::calibrate(const std::string& path) {
  using Clock = std::chrono::steady_clock;
  if (nranks_ < 2) {
    std::fprintf(stderr, "collbench --calibrate needs at least 2 ranks (-g 2)\n");
    return 2;
  }
  // Calibrate with the rank count the tuning is for: the cost of a message depends on how many
  // ranks share the cores.
  // Measured as collectives run: every rank busy at once (ranks may share cores), each value
  // averaged over the ranks. alpha from barriers; then a ring shift (send to r+1, receive from
  // r-1, in a group) of `bytes` costs alpha + bytes * beta.
  auto average = [&](double mine) {
    double sum = 0;
    call("allreduce", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
    return sum / nranks_;
  };
  auto shift = [&](size_t bytes, int iters) {
    std::vector<char> out(std::max<size_t>(bytes, 1)), in(std::max<size_t>(bytes, 1));
    const int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
    auto once = [&] {
      call("group start", chorusGroupStart());
      call("send", chorusSend(out.data(), bytes, chorusUint8, next, comm_, nullptr));
      call("recv", chorusRecv(in.data(), bytes, chorusUint8, prev, comm_, nullptr));
      call("group end", chorusGroupEnd());
    };
    for (int i = 0; i < iters / 10 + 1; ++i) once();
    call("barrier", chorusBarrier(comm_, nullptr));
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) once();
    return average(std::chrono::duration<double>(Clock::now() - start).count() / iters * 1e6);
  };
  // Timings on 2 cores shared by more ranks swing between runs: each value is the median of
  // several blocks of calls.
  auto medianUs = [&](int blocks, int calls, auto body) {
    std::vector<double> samples;
    for (int b = 0; b < blocks; ++b) {
      call("barrier", chorusBarrier(comm_, nullptr));
      const auto start = Clock::now();
      for (int i = 0; i < calls; ++i) body();
      samples.push_back(average(std::chrono::duration<double>(Clock::now() - start).count() / calls * 1e6));
    }
    return median(std::move(samples));
  };
  // alpha: a dissemination barrier is ceil(log2 n) rounds of one empty message each, in sequence.
  call("barrier", chorusBarrier(comm_, nullptr));
  const double barrierUs = medianUs(7, 300, [&] { call("barrier", chorusBarrier(comm_, nullptr)); });
  const double alphaUs = barrierUs / std::ceil(std::log2(static_cast<double>(nranks_)));
  // overhead: a pairwise all-to-all of one byte per peer posts its n-1 exchanges at once; their
  // latencies overlap, so the n-2 messages beyond the first add their overhead only.
  double overheadUs = alphaUs / 4;
  if (nranks_ >= 3) {
    std::vector<char> out(nranks_), in(nranks_);
    call("chorusCommSetAlgorithms", chorusCommSetAlgorithms(comm_, "alltoall:pairwise"));
    const double fanUs = medianUs(
        7, 300, [&] { call("alltoall", chorusAllToAll(out.data(), in.data(), 1, chorusUint8, comm_, nullptr)); });
    call("chorusCommSetAlgorithms", chorusCommSetAlgorithms(comm_, "alltoall:default"));
    overheadUs = std::max(fanUs - alphaUs, 0.05 * alphaUs) / (nranks_ - 2);
  }
  const size_t big = size_t{4} << 20;
  const double bigUs = shift(big, 30);
  const double betaGBps = static_cast<double>(big) / std::max(bigUs - alphaUs, 1e-3) / 1e3;
  // Local speeds on a buffer larger than the caches: reduce (fp32 sum) and copy.
  const size_t count = size_t{16} << 20 >> 2;
  std::vector<float> a(count, 1.0f), b(count, 2.0f);
  auto timeLocal = [&](auto body) {
    body();
    call("barrier", chorusBarrier(comm_, nullptr));
    const auto start = Clock::now();
    for (int i = 0; i < 5; ++i) body();
    return average(std::chrono::duration<double>(Clock::now() - start).count() / 5 * 1e6);
  };
  const double reduceUs =
      timeLocal([&] { chorus::kernels::reduce(a.data(), a.data(), b.data(), count, chorusFloat32, chorusSum); });
  const double copyUs = timeLocal([&] { std::memcpy(a.data(), b.data(), count * sizeof(float)); });
  const double bytes = static_cast<double>(count * sizeof(float));
  const char* transport = std::getenv("CHORUS_TRANSPORT");
  const bool tcp = transport != nullptr && std::string(transport) == "tcp";
  namespace cc = chorus::collectives;
  cc::CostParams fitted = cc::defaultCostParams(tcp);
  fitted.alphaUs = alphaUs;
  fitted.betaUsPerByte = 1e-3 / betaGBps;
  fitted.gammaUsPerByte = reduceUs / bytes;
  fitted.copyUsPerByte = copyUs / bytes;
  fitted.overheadUs = overheadUs;
  const std::string prefix = tcp ? "tcp" : "shm";
  std::string text =
      "# collbench --calibrate, " + std::to_string(nranks_) +
      " ranks (barriers, all-to-all, ring shift, all ranks busy)\n" + prefix + " alpha_us=" + std::to_string(alphaUs) +
      " beta_GBps=" + std::to_string(betaGBps) + " gamma_GBps=" + std::to_string(bytes / reduceUs / 1e3) +
      " copy_GBps=" + std::to_string(bytes / copyUs / 1e3) + " overhead_us=" + std::to_string(overheadUs) + "\n";
  text += calibrateCorrections(fitted, prefix);
  if (rank_ == 0) {
    std::ofstream out(path, std::ios::app);
    out << text;
    if (!out) {
      std::fprintf(stderr, "collbench: cannot write %s\n", path.c_str());
      return 2;
    }
    std::printf("# calibrated (appended to %s):\n%s", path.c_str(), text.c_str());
  }
  return 0;
}

// Each algorithm of each collective that has a choice, timed at sizes 2x apart (turn by turn,
// averaged over the ranks), in two passes and three more over the close calls (seven where the
// calls are short): its correction is the median of the passes' mean time per call over the
// formula's at each size. Returns the tuning file lines, one per algorithm.
std::string Bench::calibrateCorrections(const chorus::collectives::CostParams& fitted, const std::string& prefix) {
  namespace cc = chorus::collectives;
  using Clock = std::chrono::steady_clock;
  // The communicator picks a forced algorithm's chunk from the model it loaded: the formula is
  // evaluated at that chunk.
  const bool tcp = prefix == "tcp";
  cc::CostParams inUse = cc::defaultCostParams(tcp);
  if (const char* file = std::getenv("CHORUS_TUNING_FILE"); file != nullptr && *file != '\0') {
    inUse = cc::loadCostParams(file, tcp, inUse);
  }
  // 2x apart: an algorithm's cost bends where its buffers leave L2 or L3, differently for each
  // algorithm, and 8x apart the interpolation stepped over such bends (a 2 MiB all-gather
  // predicted as fast by recursive doubling as by the ring, measured 1.5x slower). From 8 B, as
  // collbench's sweeps: below the first size the first correction holds, and from 128 B it chose
  // recursive doubling for a 64 B all-gather that Bruck did 12% faster.
  std::vector<size_t> sizes;
  for (size_t bytes = 8; bytes <= std::max(o_.calibrateUpTo, size_t{8}); bytes *= 2) sizes.push_back(bytes);
  // Two passes over every cell (collective, size, algorithm), sizes ascending then descending, then
  // three more over the close cells only: at a size where more than one algorithm had a pass within
  // kClose of the fastest's median, those algorithms. Each pass gives a mean per call over its
  // turns, and the time per call is the median of those means, as a run of collbench gives a row's
  // mean and tools/compare_algorithms the median of its runs. A mean within a pass: on ranks that
  // share cores one in ten of the ring's calls at 16-64 MiB takes twice as long, which a median of
  // calls hides and a user's run does not (each pass times at least ten calls of a close cell, so
  // most passes' means hold that tail). A median across passes: for seconds at a time the ring's
  // calls at 2 MiB take 1200 us instead of 400 (4 ranks on 2 cores), and such spells in some passes
  // put the ring's mean over all passes at 977 us, above recursive doubling's, where collbench's
  // rows then measured the ring at 433 us, 1.3x faster than recursive doubling. The close cells get
  // the most passes because there a call's time drifts by 10-20% between passes, and close cells of
  // calls under kShortCallUs four more, since they cost little: at a 32 KiB all-reduce (4 ranks on
  // 2 cores) recursive doubling over Rabenseifner measured 0.91-1.07 in single passes and 0.88-0.96
  // in collbench's tables, and of five passes the median chose Rabenseifner in one calibration of
  // three, 1.12x slower in that table. (The collbench rows and tables quoted here and below were
  // timed before collbench --turns was fixed to time its out-of-place column out of place: they
  // are in-place calls, while the calibration times out-of-place ones.)
  constexpr int kPasses = 2;
  constexpr int kClosePasses = 3;
  constexpr int kShortClosePasses = 4;
  constexpr double kShortCallUs = 1000;
  constexpr double kClose = 1.2;
  // Blocks as collbench's rows time them, many turns: each block at least kBlockUs long and,
  // where that fits in kLongBlockUs, at least kBlockCalls calls (nccl-tests' and collbench's
  // default iterations). Not longer: a slow spell lasts tens of milliseconds, so with blocks of
  // 10 ms and more at every size it fell on one algorithm's block and not the next one's, and
  // decided close calls (the ring and Rabenseifner at 256 KiB, 4 ranks on 2 cores, each measured
  // 2x the other in different calibrations). Not shorter: each block starts at a barrier, and
  // the ring takes several calls to settle into its pace after one (a 2 MiB all-gather, 4 ranks
  // on 2 cores: 530 us per call in blocks of six, 360 in blocks of twenty, where recursive
  // doubling takes 570 and 490), so with 4 ms blocks the tuner chose recursive doubling there,
  // 1.3x slower than the ring in collbench's rows.
  constexpr double kBlockUs = 4000;
  constexpr double kLongBlockUs = 20000;
  constexpr int kBlockCalls = 20;
  // Each algorithm is timed this long per pass, in at least so many turns. Ten turns per close
  // pass: from 8 MiB a call lasts longer than a block, and with five calls per pass the 64 MiB
  // ring's one-in-ten call at twice the time fell in some calibrations and not in others.
  constexpr double kSampleUs = 30000;
  constexpr int kMinTurns = 5;
  constexpr double kCloseSampleUs = 50000;
  constexpr int kCloseMinTurns = 10;
  constexpr int kMaxTurns = 50;
  const std::vector<cc::Collective> collectives = {cc::Collective::kAllReduce,     cc::Collective::kAllGather,
                                                   cc::Collective::kReduceScatter, cc::Collective::kAllToAll,
                                                   cc::Collective::kBroadcast,     cc::Collective::kReduce};
  const size_t n = static_cast<size_t>(nranks_);
  // Elements per call at each size (ops over n blocks split it over the ranks); sizes too small
  // for one element per rank are left out.
  auto countsOf = [&](cc::Collective collective) {
    std::vector<size_t> counts;
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float) / (spreads(findOp(cc::collectiveName(collective))->op) ? n : 1);
      if (count > 0) counts.push_back(count);
    }
    return counts;
  };
  // timed[c][s * algorithms + a]: the mean microseconds per call of each pass that timed it.
  std::vector<std::vector<std::vector<double>>> timed(collectives.size());
  // What the tuner takes: the median over the passes (two, five or nine of them).
  auto typical = [&](size_t c, size_t cell) { return median(timed[c][cell]); };
  // Algorithms the model rules out on these ranks (hierarchical ones on one host) are not timed.
  auto applies = [&](size_t c, size_t a) {
    const cc::Algorithm algorithm = cc::algorithmsFor(collectives[c])[a];
    return !std::isinf(cc::formulaUs(collectives[c], algorithm, nranks_, size_t{1} << 20, size_t{1} << 19, inUse));
  };
  for (size_t c = 0; c < collectives.size(); ++c) {
    timed[c].resize(countsOf(collectives[c]).size() * cc::algorithmsFor(collectives[c]).size());
  }
  // Times the algorithms `which` of collective c at its size s, turn by turn, into timed.
  auto timeCell = [&](size_t c, size_t s, const std::vector<size_t>& which, double sampleUs, int minTurns) {
    const char* name = cc::collectiveName(collectives[c]);
    const OpInfo* info = findOp(name);
    const auto& algorithms = cc::algorithmsFor(collectives[c]);
    const size_t count = countsOf(collectives[c])[s];
    std::vector<std::string> names;
    for (size_t a : which) names.push_back(cc::algorithmName(algorithms[a]));
    fillInputs(info->op, chorusFloat32, chorusSum, count, false);
    // One untimed call each, which also sizes the blocks and the turns (rank 0's word, so all
    // ranks agree): calls[k] per block of algorithm which[k], calls.back() turns.
    std::vector<int> calls(which.size() + 1, 1);
    double slowestBlockUs = 0;
    for (size_t k = 0; k < which.size(); ++k) {
      call("chorusCommSetAlgorithms", chorusCommSetAlgorithms(comm_, (std::string(name) + ":" + names[k]).c_str()));
      call("barrier", chorusBarrier(comm_, nullptr));
      const auto start = Clock::now();
      once(info->op, chorusFloat32, chorusSum, count);
      const double us = std::chrono::duration<double>(Clock::now() - start).count() * 1e6;
      const double perCall = std::max(us, 1.0);
      calls[k] = static_cast<int>(
          std::clamp(std::max(kBlockUs / perCall, std::min(double{kBlockCalls}, kLongBlockUs / perCall)), 1.0, 1000.0));
      slowestBlockUs = std::max(slowestBlockUs, calls[k] * us);
    }
    calls.back() =
        static_cast<int>(std::clamp(sampleUs / slowestBlockUs, static_cast<double>(minTurns), double{kMaxTurns}));
    call("broadcast", chorusBroadcast(calls.data(), calls.data(), calls.size(), chorusInt32, 0, comm_, nullptr));
    TurnPlan plan{{}, calls.back(), 0, false, false};
    for (size_t k = 0; k < which.size(); ++k) plan.iters.push_back(calls[k] * plan.turns);
    std::vector<Contestant> contestants;
    for (const std::string& algorithm : names) contestants.push_back({-1, algorithm});
    const auto results = measureInTurns(name, info->op, contestants, chorusFloat32, chorusSum, count, plan);
    for (size_t k = 0; k < which.size(); ++k) {
      const std::vector<double>& turns = results[k].first.turnUs;
      // Each turn ran calls[k] calls, so the pass's mean per call is the mean of its turns.
      timed[c][s * algorithms.size() + which[k]].push_back(std::accumulate(turns.begin(), turns.end(), 0.0) /
                                                           static_cast<double>(turns.size()));
    }
  };
  // Passes over the sizes in `cells` (per collective, per size: the algorithms to time), the
  // sizes ascending in even passes and descending in odd ones.
  using Cells = std::vector<std::vector<std::vector<size_t>>>;
  auto runPasses = [&](int passes, const Cells& cells, double sampleUs, int minTurns) {
    for (int pass = 0; pass < passes; ++pass) {
      for (size_t c = 0; c < collectives.size(); ++c) {
        for (size_t i = 0; i < cells[c].size(); ++i) {
          const size_t s = pass % 2 == 0 ? i : cells[c].size() - 1 - i;
          if (!cells[c][s].empty()) timeCell(c, s, cells[c][s], sampleUs, minTurns);
        }
        const char* name = cc::collectiveName(collectives[c]);
        call("chorusCommSetAlgorithms", chorusCommSetAlgorithms(comm_, (std::string(name) + ":default").c_str()));
      }
    }
  };
  Cells all(collectives.size());
  for (size_t c = 0; c < collectives.size(); ++c) {
    std::vector<size_t> every;
    for (size_t a = 0; a < cc::algorithmsFor(collectives[c]).size(); ++a) {
      if (applies(c, a)) every.push_back(a);
    }
    all[c].assign(countsOf(collectives[c]).size(), every);
  }
  runPasses(kPasses, all, kSampleUs, kMinTurns);
  // Rank 0's means pick the close cells, so all ranks time the same ones.
  Cells close(collectives.size()), closeAndShort(collectives.size());
  for (size_t c = 0; c < collectives.size(); ++c) {
    const size_t algos = cc::algorithmsFor(collectives[c]).size();
    const size_t sizesOfC = countsOf(collectives[c]).size();
    std::vector<int32_t> chosen(sizesOfC * algos, 0);
    for (size_t s = 0; s < sizesOfC; ++s) {
      double fastest = std::numeric_limits<double>::infinity();
      for (size_t a = 0; a < algos; ++a) {
        if (applies(c, a)) fastest = std::min(fastest, typical(c, s * algos + a));
      }
      // A contender is judged by its best pass: one pass in a slow spell doubled recursive
      // doubling's mean at a 32 KiB all-reduce (48 us against collbench's 24) and left it out.
      std::vector<size_t> contenders;
      for (size_t a = 0; a < algos; ++a) {
        if (!applies(c, a)) continue;
        const auto& passes = timed[c][s * algos + a];
        if (*std::min_element(passes.begin(), passes.end()) <= fastest * kClose) contenders.push_back(a);
      }
      if (contenders.size() > 1) {
        for (size_t a : contenders) chosen[s * algos + a] = fastest < kShortCallUs ? 2 : 1;
      }
    }
    call("broadcast", chorusBroadcast(chosen.data(), chosen.data(), chosen.size(), chorusInt32, 0, comm_, nullptr));
    close[c].resize(sizesOfC);
    closeAndShort[c].resize(sizesOfC);
    for (size_t s = 0; s < sizesOfC; ++s) {
      for (size_t a = 0; a < algos; ++a) {
        if (chosen[s * algos + a] != 0) close[c][s].push_back(a);
        if (chosen[s * algos + a] == 2) closeAndShort[c][s].push_back(a);
      }
    }
  }
  runPasses(kClosePasses, close, kCloseSampleUs, kCloseMinTurns);
  runPasses(kShortClosePasses, closeAndShort, kCloseSampleUs, kCloseMinTurns);
  std::string lines = "# corrections: measured time / formula's time per size, all ranks busy\n";
  for (size_t c = 0; c < collectives.size(); ++c) {
    const char* name = cc::collectiveName(collectives[c]);
    const bool spread = spreads(findOp(name)->op);
    const auto& algorithms = cc::algorithmsFor(collectives[c]);
    const std::vector<size_t> counts = countsOf(collectives[c]);
    for (size_t a = 0; a < algorithms.size(); ++a) {
      if (!applies(c, a)) continue;
      std::vector<double> factors(counts.size());
      for (size_t s = 0; s < counts.size(); ++s) {
        const size_t bytes = counts[s] * sizeof(float) * (spread ? n : 1);
        const size_t chunk = cc::chooseChunkBytes(collectives[c], algorithms[a], nranks_, bytes, inUse);
        factors[s] = typical(c, s * algorithms.size() + a) /
                     cc::formulaUs(collectives[c], algorithms[a], nranks_, bytes, chunk, fitted);
      }
      // Each factor becomes the median of itself and its two neighbours (2x smaller and larger),
      // which keeps a step where buffers leave a cache and drops a lone spike: a 16 MiB ring
      // all-reduce calibrated at 22.2 ms between 8.3 at 8 MiB and 36.2 at 32 MiB, measured 18.2
      // in collbench's rows, and so lost to Rabenseifner (21.3 in both).
      std::vector<double> smooth = factors;
      for (size_t s = 1; s + 1 < factors.size(); ++s) smooth[s] = median({factors[s - 1], factors[s], factors[s + 1]});
      std::string bytesList, factorList;
      for (size_t s = 0; s < counts.size(); ++s) {
        const size_t bytes = counts[s] * sizeof(float) * (spread ? n : 1);
        char factor[32];
        // Significant digits, not decimals: a base fitted in a slow spell can put a factor far
        // below 0.001, and a factor written as 0 would make the file unreadable.
        std::snprintf(factor, sizeof(factor), "%.4g", smooth[s]);
        if (s > 0) {
          bytesList += ',';
          factorList += ',';
        }
        bytesList += std::to_string(bytes);
        factorList += factor;
      }
      lines += prefix + " " + name + ":" + cc::algorithmName(algorithms[a]) + " ranks=" + std::to_string(nranks_) +
               " bytes=" + bytesList + " factors=" + factorList + "\n";
    }
  }
  return lines;
}

// --simulate: no ranks are started. Each row's time is the timing simulator's prediction for
// nranks ranks (src/collectives/simulator.h) on the model of CHORUS_TUNING_FILE (or the built-in
// defaults): links within a host as shm (tcp when CHORUS_TRANSPORT=tcp), between hosts as tcp.
int simulateSweep(const Options& o) {
  namespace cc = chorus::collectives;
  const OpInfo* opInfo = findOp(o.op);
  const TypeInfo* typeInfo = nullptr;
  for (const TypeInfo& info : kTypes) {
    if (o.type == info.name) typeInfo = &info;
  }
  const RedOpInfo* redopInfo = nullptr;
  for (const RedOpInfo& info : kRedOps) {
    if (o.redop == info.name) redopInfo = &info;
  }
  cc::Collective collective{};
  const int n = o.localRanks;
  if (opInfo == nullptr || opInfo->op == Op::kSendRecv || !cc::parseCollective(o.op, &collective) ||
      typeInfo == nullptr || redopInfo == nullptr || o.root < 0 || o.root >= n) {
    std::fprintf(stderr,
                 "collbench --simulate: --op '%s' (sendrecv is not simulated), -d '%s', -o '%s' (one of each, not "
                 "'all') or root %d outside [0, %d) is not valid\n",
                 o.op.c_str(), o.type.c_str(), o.redop.c_str(), o.root, n);
    return 2;
  }
  const int perHost = o.ranksPerHost > 0 ? std::min(o.ranksPerHost, n) : n;
  const bool network = perHost < n;
  const char* transport = std::getenv("CHORUS_TRANSPORT");
  const bool tcpInside = transport != nullptr && std::string(transport) == "tcp";
  cc::CostParams shm = cc::defaultCostParams(false), tcp = cc::defaultCostParams(true);
  const char* tuning = std::getenv("CHORUS_TUNING_FILE");
  if (tuning != nullptr && *tuning != '\0') {
    try {
      shm = cc::loadCostParams(tuning, false, shm);
      tcp = cc::loadCostParams(tuning, true, tcp);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "collbench --simulate: CHORUS_TUNING_FILE: %s\n", e.what());
      return 2;
    }
  }
  const cc::CostParams& inside = tcpInside ? tcp : shm;
  cc::NetworkModel model;
  model.ranksPerHost = perHost;
  model.intraHost = {inside.alphaUs, inside.betaUsPerByte};
  model.interHost = {tcp.alphaUs, tcp.betaUsPerByte};
  model.gammaUsPerByte = inside.gammaUsPerByte;
  model.copyUsPerByte = inside.copyUsPerByte;
  // The tuner models the slowest transport in use, as a communicator does, and the hosts.
  cc::CostParams tunerModel = network || tcpInside ? tcp : shm;
  tunerModel.hosts = n % perHost == 0 ? n / perHost : 1;
  tunerModel.localAlphaUs = inside.alphaUs;
  tunerModel.localBetaUsPerByte = inside.betaUsPerByte;
  // CHORUS_CHUNK_BYTES fixes the chunk; otherwise the tuner picks it, as a communicator does.
  const char* chunkText = std::getenv("CHORUS_CHUNK_BYTES");
  const size_t fixedChunk = chunkText != nullptr && std::atoll(chunkText) > 0 ? std::atoll(chunkText) : 0;

  std::vector<cc::Algorithm> algos{cc::Algorithm::kDefault};
  if (!o.algo.empty() && o.algo != "default") {
    algos.clear();
    if (o.algo == "all") {
      algos = cc::algorithmsFor(collective);
    } else {
      for (const std::string& name : cc::splitCommas(o.algo)) {
        cc::Algorithm a{};
        if (name.empty()) continue;
        if (name == "default") {
          a = cc::Algorithm::kDefault;
        } else if (!cc::parseAlgorithm(name, &a) || !cc::appliesTo(a, collective)) {
          std::fprintf(stderr, "collbench --simulate: --algo %s does not apply to %s (it has: %s)\n", name.c_str(),
                       o.op.c_str(), chorusAlgorithmNames(o.op.c_str()));
          return 2;
        }
        algos.push_back(a);
      }
    }
  }
  std::printf(
      "# collbench (chorus) --simulate op: %s  nranks: %d  ranks per host: %d  minBytes: %zu  maxBytes: %zu  "
      "chunk: %s\n# model: within a host alpha %.3g us beta %.3g GB/s; between hosts alpha %.3g us beta %.3g GB/s; "
      "reduce %.3g GB/s, copy %.3g GB/s (%s)\n",
      opInfo->name, n, perHost, o.minBytes, o.maxBytes,
      fixedChunk > 0 ? std::to_string(fixedChunk).c_str() : "the tuner's", model.intraHost.alphaUs,
      1e-3 / model.intraHost.betaUsPerByte, model.interHost.alphaUs, 1e-3 / model.interHost.betaUsPerByte,
      1e-3 / model.gammaUsPerByte, 1e-3 / model.copyUsPerByte,
      tuning != nullptr && *tuning != '\0' ? tuning : "built-in defaults");
  printColumnHeader(true);
  nlohmann::json rows = nlohmann::json::array();
  const size_t size = chorusTypeSize(typeInfo->type);
  int failures = 0;
  int standIns = 0;  // rows where one host's ranks stood for all
  for (size_t bytes = o.minBytes;;) {
    size_t count = opInfo->op == Op::kBarrier ? 0 : bytes / size;
    if (spreads(opInfo->op)) count /= static_cast<size_t>(n);
    const size_t shownBytes = spreads(opInfo->op) ? count * n * size : count * size;
    for (cc::Algorithm algo : algos) {
      cc::ScheduleArgs args;
      args.collective = collective;
      args.nranks = n;
      args.count = count;
      args.typeSize = size;
      args.root = o.root;
      args.divide = opInfo->reduces && redopInfo->op == chorusAvg;
      if (algo == cc::Algorithm::kDefault) {
        const cc::TunerChoice choice = cc::choose(collective, n, shownBytes, tunerModel, fixedChunk);
        args.algorithm = choice.algorithm;
        args.chunkBytes = choice.chunkBytes;
      } else {
        args.algorithm = algo;
        args.chunkBytes =
            fixedChunk > 0 ? fixedChunk : cc::chooseChunkBytes(collective, algo, n, shownBytes, tunerModel);
      }
      std::string name = cc::algorithmName(args.algorithm);
      if (algo == cc::Algorithm::kDefault) name = "default:" + name;
      const cc::ScheduleSet set = cc::buildAllSchedules(args, perHost < n ? perHost : 0);
      cc::TimingResult timing;
      if (!set.error.empty()) {
        timing.ok = false;
        timing.error = set.error;
      } else {
        timing = cc::simulateTime(set.schedules, model, set.nranks);
      }
      const int simulated = static_cast<int>(set.schedules.size());
      if (timing.ok && simulated < n) ++standIns;
      if (!timing.ok) {
        std::printf("# %10zu  %20s  not simulated: %s\n", shownBytes, name.c_str(), timing.error.c_str());
        ++failures;
        continue;
      }
      Result predicted;
      predicted.timeUs = timing.timeUs;
      predicted.algbw = timing.timeUs > 0 ? static_cast<double>(shownBytes) / 1e3 / timing.timeUs : 0;
      predicted.busbw = predicted.algbw * busFactor(opInfo->op, n);
      printRow(shownBytes, count, typeInfo->type, opInfo->reduces ? chorusOpName(redopInfo->op) : "none",
               opInfo->rooted ? o.root : -1, name.c_str(), predicted, "sim", predicted, "sim");
      const nlohmann::json side = {
          {"time_us", predicted.timeUs}, {"algbw_GBps", predicted.algbw}, {"busbw_GBps", predicted.busbw}};
      rows.push_back({{"op", opInfo->name},
                      {"size_bytes", shownBytes},
                      {"count", count},
                      {"type", chorusTypeName(typeInfo->type)},
                      {"algo", name},
                      {"nranks", n},
                      {"ranks_per_host", perHost},
                      {"chunk_bytes", args.chunkBytes},
                      {"messages", timing.messages},
                      {"steps", timing.steps},
                      {"simulated_ranks", simulated},
                      {"out_of_place", side},
                      {"in_place", side}});
    }
    if (opInfo->op == Op::kBarrier) break;
    bytes = nextSize(o, bytes);
    if (bytes == 0) break;
  }
  std::printf("# Predicted by the timing simulator; #wrong is not checked (sim)\n");
  if (standIns > 0) {
    std::printf(
        "# %d rows too large to hold every rank's steps: one host's ranks simulated, standing for all (their\n"
        "# schedules checked to be shifted copies; simulated_ranks in --json)\n",
        standIns);
  }
  std::printf("#\n");
  if (!o.json.empty()) {
    const nlohmann::json doc = {
        {"tool", "collbench"}, {"simulated", true}, {"op", opInfo->name}, {"nranks", n}, {"rows", rows}};
    if (!writeJson(o.json, doc)) return 2;
  }
  return failures == 0 ? 0 : 1;
}

bool launchedAsRank() {
  for (const char* name : {"CHORUS_RANK", "RANK", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  // A task of an srun step of several tasks (one task forks -g ranks itself).
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  return std::getenv("SLURM_PROCID") != nullptr && tasks != nullptr && std::string(tasks) != "1";
}

#ifdef CHORUS_COLLBENCH_GLOO
// Gloo's ranks meet through a file store: a fresh directory rank 0 makes (under --gloo-store, or
// TMPDIR, or /tmp), which every rank must see. Removed once the mesh stands.
std::unique_ptr<chorus::bench::Peer> startGloo(const Options& o, chorusComm_t comm, int rank, int nranks) {
  char dir[512] = {};
  if (rank == 0) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = !o.glooStore.empty() ? o.glooStore : tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    std::snprintf(dir, sizeof(dir), "%s/collbench-gloo-XXXXXX", base.c_str());
    if (mkdtemp(dir) == nullptr) {
      std::fprintf(stderr, "collbench: --compare gloo: cannot make a store directory under %s: %s\n", base.c_str(),
                   std::strerror(errno));
      dir[0] = '\0';
    }
  }
  if (chorusBroadcast(dir, dir, sizeof(dir), chorusUint8, 0, comm, nullptr) != chorusSuccess) return nullptr;
  struct stat st {};
  int visible = dir[0] != '\0' && stat(dir, &st) == 0 && S_ISDIR(st.st_mode), everywhere = 0;
  if (chorusAllReduce(&visible, &everywhere, 1, chorusInt32, chorusMin, comm, nullptr) != chorusSuccess) return nullptr;
  if (!everywhere) {
    if (!visible && dir[0] != '\0') {
      std::fprintf(stderr,
                   "collbench rank %d: --compare gloo: the store directory %s is not visible here (ranks on several "
                   "hosts need --gloo-store on a shared filesystem)\n",
                   rank, dir);
    }
    return nullptr;
  }
  std::unique_ptr<chorus::bench::Peer> peer;
  try {
    peer = chorus::bench::makeGlooPeer(rank, nranks, dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collbench: %s\n", e.what());
  }
  int up = peer != nullptr, all = 0;
  chorusAllReduce(&up, &all, 1, chorusInt32, chorusMin, comm, nullptr);
  if (rank == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  return all ? std::move(peer) : nullptr;
}
#endif

// The peers --compare names, started on every rank; false (the reason on stderr) when one fails
// on any rank.
bool startPeers(const Options& o, chorusComm_t comm, std::vector<std::unique_ptr<chorus::bench::Peer>>* peers) {
  int rank = 0, nranks = 1;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &nranks);
  bool known = true;
  for (const std::string& name : comparedPeers(o, &known)) {
    std::unique_ptr<chorus::bench::Peer> peer;
#ifdef CHORUS_COLLBENCH_GLOO
    if (name == "gloo") peer = startGloo(o, comm, rank, nranks);
#endif
#ifdef CHORUS_COLLBENCH_MPI
    if (name == "mpi") {
      try {
        peer = chorus::bench::makeMpiPeer(rank, nranks);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "collbench: %s\n", e.what());
      }
    }
#endif
    int up = peer != nullptr, all = 0;
    if (chorusAllReduce(&up, &all, 1, chorusInt32, chorusMin, comm, nullptr) != chorusSuccess || !all) return false;
    peers->push_back(std::move(peer));
  }
  return known;
}

#ifdef CHORUS_COLLBENCH_MPI
// -g N --compare mpi: runs this collbench again as N ranks of mpiexec, with the same arguments
// (-g is ignored there); --bind core becomes mpiexec's -bind-to core. Returns only on failure.
int execUnderMpiexec(const Options& o, int argc, char** argv) {
  char self[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    std::perror("collbench: readlink /proc/self/exe");
    return 2;
  }
  std::vector<std::string> args = {CHORUS_MPIEXEC_PATH, "-n", std::to_string(o.localRanks)};
  if (o.bind == "core") args.insert(args.end(), {"-bind-to", "core"});
  args.push_back(self);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  std::fflush(stdout);
  execv(pointers[0], pointers.data());
  std::fprintf(stderr, "collbench: --compare mpi: cannot start %s: %s\n", pointers[0], std::strerror(errno));
  return 2;
}
#endif

int runRank(const Options& options, chorusComm_t comm) {
  int code = 2;
  if (!options.calibrate.empty()) {
    code = Bench(options, comm).calibrate(options.calibrate);
  } else {
    std::vector<std::unique_ptr<chorus::bench::Peer>> peers;
    if (!options.compress.empty()) {
      code = chorus::bench::runCompressed(options, comm);
    } else if (startPeers(options, comm, &peers)) {
      code = Bench(options, comm, std::move(peers)).run();
    }
  }
  chorusCommDestroy(comm);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int code = parseOptions(argc, argv, &o); code >= 0) return code;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (o.simulate) return simulateSweep(o);
  bool peersKnown = true;
  const std::vector<std::string> peerNames = comparedPeers(o, &peersKnown);
  if (!peersKnown) return 2;
  if (std::find(peerNames.begin(), peerNames.end(), "mpi") != peerNames.end()) {
#ifdef CHORUS_COLLBENCH_MPI
    // MPI's ranks are mpiexec's processes: chorus meets over MPI then, and -g starts them so.
    if (std::getenv("PMI_RANK") != nullptr) {
      return chorus::bench::runWithMpi(&argc, &argv, [&](chorusComm_t comm) { return runRank(o, comm); });
    }
    if (launchedAsRank()) {
      std::fprintf(stderr, "collbench: --compare mpi: start collbench under mpiexec, or with -g N (not chorusrun)\n");
      return 2;
    }
    return execUnderMpiexec(o, argc, argv);
#endif
  }

  if (launchedAsRank()) {
    chorusComm_t comm = nullptr;
    const chorusResult_t result = chorusCommInitFromEnv(&comm, nullptr);
    if (result != chorusSuccess) {
      std::fprintf(stderr, "collbench: init from the environment failed: %s\n", chorusGetLastError(nullptr));
      return 2;
    }
    return runRank(o, comm);
  }

  // Start the ranks ourselves: one unique id, one forked process per rank.
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) {
    std::fprintf(stderr, "collbench: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < o.localRanks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("collbench: fork");
      return 2;
    }
    if (pid == 0) {
      if (o.bind == "core" && !bindToCore(rank)) _exit(2);
      chorusComm_t comm = nullptr;
      if (chorusCommInitRank(&comm, o.localRanks, id, rank) != chorusSuccess) {
        std::fprintf(stderr, "collbench rank %d: init failed: %s\n", rank, chorusGetLastError(nullptr));
        _exit(2);
      }
      const int code = runRank(o, comm);
      std::fflush(stdout);
      _exit(code);
    }
    pids.push_back(pid);
  }
  // Wait for every rank. When one fails, the others get a grace period to finish on their own
  // (after a wrong value every rank fails, and rank 0 still prints the footer), then are stopped.
  int firstFailure = 0;
  size_t remaining = pids.size();
  auto stopAt = std::chrono::steady_clock::time_point::max();
  while (remaining > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      if (std::chrono::steady_clock::now() > stopAt) {
        for (pid_t pid : pids) {
          if (pid > 0) kill(pid, SIGKILL);
        }
        stopAt = std::chrono::steady_clock::time_point::max();
      }
      usleep(2000);
      continue;
    }
    --remaining;
    for (pid_t& pid : pids) {
      if (pid == done) pid = -1;  // reaped: never signal a reused pid
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && firstFailure == 0) {
      firstFailure = code;
      std::fprintf(stderr, "collbench: rank process %d failed with status %d\n", done, code);
      stopAt = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  return firstFailure;
}
