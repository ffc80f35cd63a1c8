// engine.h: collbench's engine: buffers filled with the check patterns, calls timed and checked,
// rows printed as nccl-tests prints them, several contestants (chorus's algorithms, peers) timed
// turn by turn. collbench runs its sweep on it; chorus-tune (tools/chorus_tune.cc) its calibration.
// Through chorus's public API only.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/device_memory.h"
#include "bench/options.h"
#include "bench/peers.h"

namespace chorus::bench {

// The median of the values (the mean of the middle two when their number is even); 0 if none.
double median(std::vector<double> values);

// collbench's ops and the library's collective each is (infoOf says what that is).
struct OpInfo {
  const char* name;
  Op op;
  chorusCollective_t collective;
};
inline constexpr OpInfo kOps[] = {
    {"allreduce", Op::kAllReduce, chorusCollAllReduce},
    {"allgather", Op::kAllGather, chorusCollAllGather},
    {"reducescatter", Op::kReduceScatter, chorusCollReduceScatter},
    {"broadcast", Op::kBroadcast, chorusCollBroadcast},
    {"reduce", Op::kReduce, chorusCollReduce},
    {"sendrecv", Op::kSendRecv, chorusCollSend},
    {"alltoall", Op::kAllToAll, chorusCollAllToAll},
    {"alltoallv", Op::kAllToAllv, chorusCollAllToAllv},
    {"gather", Op::kGather, chorusCollGather},
    {"scatter", Op::kScatter, chorusCollScatter},
    {"barrier", Op::kBarrier, chorusCollBarrier},
};

const char* nameOf(Op op);

struct TypeInfo {
  const char* name;
  chorusDataType_t type;
};
// nccl-tests' names first, then chorus's.
inline constexpr TypeInfo kTypes[] = {
    {"int8", chorusInt8},       {"uint8", chorusUint8},       {"int32", chorusInt32},     {"uint32", chorusUint32},
    {"int64", chorusInt64},     {"uint64", chorusUint64},     {"half", chorusFloat16},    {"float", chorusFloat32},
    {"double", chorusFloat64},  {"bfloat16", chorusBfloat16}, {"float16", chorusFloat16}, {"float32", chorusFloat32},
    {"float64", chorusFloat64}, {"int", chorusInt32},
};
inline constexpr int kDistinctTypes = 10;  // the first ten entries are every type once

struct RedOpInfo {
  const char* name;
  chorusRedOp_t op;
};
inline constexpr RedOpInfo kRedOps[] = {
    {"sum", chorusSum}, {"prod", chorusProd}, {"max", chorusMax}, {"min", chorusMin}, {"avg", chorusAvg}};

const OpInfo* findOp(const std::string& name);

// alltoallv's counts (--zipf S): of the count x n elements each rank sends, peer p gets a share
// proportional to 1 / (p + 1)^S, rounded down, and the elements left over one each to the first
// peers: a Zipf law over the ranks, as tokens over experts whose popularity falls off (rank 0 the
// most sought, by every rank alike). S = 0: count to each, the all-to-all's counts.
std::vector<size_t> zipfCounts(size_t count, int nranks, double exponent);

struct Result {
  double timeUs = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
  std::vector<double> turnUs;  // --turns: this rank's microseconds per call in each turn
};

// Writes the --json document; false (with the reason on stderr) when the file cannot be written.
bool writeJson(const std::string& path, const nlohmann::json& doc);
// nccl-tests' column header, with an algo column after root when algorithms are named, then
// per peer its busbw and our out-of-place busbw over it, then the share of the bound.
void printColumnHeader(bool algoColumn, const std::vector<std::string>& peers = {}, bool bound = false);
// `tail`: the peer and bound columns, already formatted.
void printRow(size_t bytes, size_t count, chorusDataType_t type, const char* redop, int root, const char* algo,
              const Result& outOfPlace, const std::string& outWrong, const Result& inPlace, const std::string& inWrong,
              const std::string& tail = "");

// nccl-tests' bus bandwidth factor: busbw = algbw * factor.
double busFactor(Op op, int nranks);

// The copy bandwidth of all ranks at once (GB/s, summed over the ranks): memcpy's, the streaming
// copy's, and the faster, which is --bound's C. On device memory, summed over the GPUs (devices:
// how many), one rank timing each.
struct CopyRates {
  double GBps = 0;
  double memcpyGBps = 0;
  double streamingGBps = 0;
  int devices = 0;
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
      : o_(options),
        comm_(comm),
        calls_(comm),
        peers_(std::move(peers)),
        send_(o_.mem == "chorus"),
        recv_(o_.mem == "chorus") {
    chorusCommUserRank(comm, &rank_);
    chorusCommCount(comm, &nranks_);
    if (o_.mem == "device") {
      device_ = std::make_unique<chorus::bench::DeviceMemory>(rank_);
      stream_ = device_->stream();
    }
  }

  ~Bench() {
    for (auto& [row, comm] : variants_) chorusCommDestroy(comm);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  // The sweep the options ask for: every size, type, op and root, printed (rank 0) and checked.
  int run();

  // The engine, for the calibration (chorus-tune) as well.
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  chorusComm_t comm() const { return comm_; }
  const Options& options() const { return o_; }
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
  // What a turn times: one of chorus's algorithms ("" for the tuner's; kDeterministicRow: the
  // tuner's on the deterministic communicator), or a peer's.
  struct Contestant {
    int peer = -1;  // index into peers_, or -1 for chorus
    std::string algorithm;
  };
  static constexpr const char* kDeterministicRow = "deterministic";
  static constexpr const char* kNoStatsRow = "stats-off";
  static constexpr const char* kGroupedRow = "grouped";  // alltoall(v) as grouped sends and receives
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
  // Sizes the buffers for a call of count elements (per op: engine.cc) and fills the inputs with
  // the check pattern.
  void fillInputs(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace);

 private:
  // Untimed calls of the selected contestant for about 2 ms (at least one), before its block.
  void settle(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count);
  // What one --op of the list adds to the run: its rows (JSON), wrong values, busbw, copy rates.
  struct Sweep {
    nlohmann::json rows = nlohmann::json::array();
    uint64_t wrong = 0;
    double busbwSum = 0;
    int busbwCount = 0;
    CopyRates copy;
  };
  int runOp(const std::string& name, Sweep& sweep);
  // alltoall(v): the counts and displacements for count (zipfCounts with the exponent: 0 for an
  // all-to-all; every rank sends alike, so a rank receives sendCounts_[rank] from each).
  void setVectorCounts(size_t count, double exponent);
  // The row's columns from this rank's seconds over iters (averaged over the ranks, as nccl-tests).
  Result resultOf(Op op, chorusDataType_t type, size_t count, double seconds, int iters);
  uint64_t checkOnce(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace);
  // Points sendPtr_ and recvPtr_ into the buffers fillInputs sized, for the in-place form or not
  // (and callSend_ and callRecv_ at the same places of the device buffers with --mem device).
  void selectBuffers(Op op, size_t count, size_t typeSize, bool inPlace);
  // With device buffers: waits until every call enqueued so far is done (the end of a timed loop).
  void finishCalls() {
    if (device_) device_->synchronize();
  }
  // The device buffer's address of a host copy's byte (itself with host buffers).
  char* onDevice(char* host) const;
  double busFactor(Op op) const { return bench::busFactor(op, nranks_); }
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
  // The rows of --deterministic and --stats: communicators of comm_'s ranks made otherwise
  // (CHORUS_DETERMINISTIC=1, CHORUS_STATS=0), by row name; made by run(), gone with the bench.
  std::map<std::string, chorusComm_t> variants_;
  chorusComm_t variant(const std::string& row);
  // The communicator once() calls on: comm_ or a variant.
  chorusComm_t calls_ = nullptr;
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
  std::vector<size_t> sendCounts_, sendDispls_, recvCounts_, recvDispls_;  // alltoall(v)'s, in elements
  bool grouped_ = false;  // once() makes an alltoall(v) of grouped sends and receives (kGroupedRow)
};

}  // namespace chorus::bench
