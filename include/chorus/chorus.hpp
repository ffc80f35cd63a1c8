// chorus.hpp: the C++20 API of chorus, a header-only RAII wrapper over the C ABI (chorus.h).
//
// Nouns: Communicator (owns a chorusComm_t; move-only; destroyed with it), Request (a non-blocking
// operation in flight), UniqueId, Compressor (the state of compressed all-reduces of one
// buffer), Error (every failure, with the C result code and the message naming rank, peer, operation and sizes).
// Buffers are std::span of a supported element type; sizes are checked before anything is sent.
// Thread rules as in chorus.h: one thread at a time per Communicator.
#ifndef CHORUS_CHORUS_HPP_
#define CHORUS_CHORUS_HPP_

#include <chorus/chorus.h>

#include <chorus/error.hpp>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace chorus {

// 16-bit float storage types: the bits of an IEEE fp16 or bfloat16 value.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// The chorus type of a C++ element type.
template <typename T>
constexpr chorusDataType_t dataTypeOf() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, int8_t>)
    return chorusInt8;
  else if constexpr (std::is_same_v<U, uint8_t>)
    return chorusUint8;
  else if constexpr (std::is_same_v<U, int32_t>)
    return chorusInt32;
  else if constexpr (std::is_same_v<U, uint32_t>)
    return chorusUint32;
  else if constexpr (std::is_same_v<U, int64_t>)
    return chorusInt64;
  else if constexpr (std::is_same_v<U, uint64_t>)
    return chorusUint64;
  else if constexpr (std::is_same_v<U, Half>)
    return chorusFloat16;
  else if constexpr (std::is_same_v<U, float>)
    return chorusFloat32;
  else if constexpr (std::is_same_v<U, double>)
    return chorusFloat64;
  else if constexpr (std::is_same_v<U, BFloat16>)
    return chorusBfloat16;
  else
    static_assert(sizeof(T) == 0, "chorus: unsupported element type");
}

enum class ReduceOp { kSum = chorusSum, kProd = chorusProd, kMax = chorusMax, kMin = chorusMin, kAvg = chorusAvg };

namespace detail {
inline void check(chorusResult_t result, chorusComm_t comm = nullptr) {
  if (result != chorusSuccess) throw Error(result, chorusGetLastError(comm));
}
inline chorusRedOp_t toC(ReduceOp op) { return static_cast<chorusRedOp_t>(op); }
}  // namespace detail

// The runtime's cost model (see chorusPredictTime): microseconds of one call.
inline double predictMicroseconds(chorusCollective_t collective, int nranks, size_t bytes,
                                  const chorusLinkModel_t& link) {
  double us = 0.0;
  detail::check(chorusPredictTime(collective, nranks, bytes, &link, &us));
  return us;
}

class UniqueId {
 public:
  // Creates an id and starts the bootstrap root in this process (see chorusGetUniqueId).
  static UniqueId create() {
    UniqueId id;
    detail::check(chorusGetUniqueId(&id.id_));
    return id;
  }
  explicit UniqueId(const chorusUniqueId& raw) : id_(raw) {}
  const chorusUniqueId& raw() const { return id_; }

 private:
  UniqueId() = default;
  chorusUniqueId id_{};
};

// A non-blocking operation in flight (see chorusIAllReduce in chorus.h). Move-only. wait()
// throws the operation's error; the destructor waits too (ignoring errors), so the buffers an
// operation uses are never released under it by accident.
class Request {
 public:
  Request() = default;
  Request(chorusRequest_t request, chorusComm_t comm) : request_(request), comm_(comm) {}
  Request(Request&& other) noexcept
      : request_(std::exchange(other.request_, nullptr)), comm_(std::exchange(other.comm_, nullptr)) {}
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      if (request_ != nullptr) chorusWait(&request_);
      request_ = std::exchange(other.request_, nullptr);
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() {
    if (request_ != nullptr) chorusWait(&request_);
  }

  void wait() { detail::check(chorusWait(&request_), comm_); }
  // Progresses; true once the operation is complete.
  bool test() {
    int done = 0;
    detail::check(chorusTest(&request_, &done), comm_);
    return done != 0;
  }
  bool done() const { return request_ == nullptr; }

 private:
  chorusRequest_t request_ = nullptr;
  chorusComm_t comm_ = nullptr;
};

class Communicator {
 public:
  // Collective: every rank calls with the same id and nranks (see chorusCommInitRankConfig).
  Communicator(const UniqueId& id, int nranks, int rank, const chorusConfig_t* config = nullptr) {
    detail::check(chorusCommInitRankConfig(&comm_, nranks, id.raw(), rank, config));
  }
  // From RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT or mpiexec (see chorusCommInitFromEnv).
  static Communicator fromEnvironment(const chorusConfig_t* config = nullptr) {
    chorusComm_t comm = nullptr;
    detail::check(chorusCommInitFromEnv(&comm, config));
    return Communicator(comm);
  }

  // An empty object (see operator bool), to be assigned later.
  Communicator() = default;
  Communicator(Communicator&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() { reset(); }

  int rank() const {
    int rank = 0;
    detail::check(chorusCommUserRank(comm_, &rank), comm_);
    return rank;
  }
  int size() const {
    int count = 0;
    detail::check(chorusCommCount(comm_, &count), comm_);
    return count;
  }
  chorusComm_t handle() const { return comm_; }

  // What this rank has sent on the communicator's links so far (chorusCommGetTraffic).
  chorusTraffic_t traffic() const {
    chorusTraffic_t sent{};
    detail::check(chorusCommGetTraffic(comm_, &sent), comm_);
    return sent;
  }

  // The live statistics as text (chorusCommGetStats): CHORUS_STATS_JSON or CHORUS_STATS_PROMETHEUS.
  std::string stats(int format = CHORUS_STATS_JSON) const {
    size_t size = 0;
    detail::check(chorusCommGetStats(comm_, format, nullptr, &size));
    std::string text(size, '\0');
    detail::check(chorusCommGetStats(comm_, format, text.data(), &size));
    text.resize(size - 1);
    return text;
  }

  // The blocking collectives below take host buffers (stream null: they return once complete) or
  // device buffers with a stream (a cudaStream_t; null: the legacy default stream), on which they
  // are enqueued, returning at once (see the stream rule in chorus.h).
  // out[i] = op over ranks of in[i]. in and out have equal sizes (or are the same span).
  template <typename T>
  void allReduce(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::kSum,
                 chorusStream_t stream = nullptr) {
    requireSize(out.size(), in.size(), "allReduce: out");
    detail::check(chorusAllReduce(in.data(), out.data(), in.size(), dataTypeOf<T>(), detail::toC(op), comm_, stream),
                  comm_);
  }
  template <typename T>
  void allReduce(std::span<T> inOut, ReduceOp op = ReduceOp::kSum, chorusStream_t stream = nullptr) {
    allReduce(std::span<const T>(inOut), inOut, op, stream);
  }
  // out holds size() * in.size() elements: rank r's input at r * in.size().
  template <typename T>
  void allGather(std::span<const T> in, std::span<T> out, chorusStream_t stream = nullptr) {
    requireSize(out.size(), in.size() * static_cast<size_t>(size()), "allGather: out");
    detail::check(chorusAllGather(in.data(), out.data(), in.size(), dataTypeOf<T>(), comm_, stream), comm_);
  }
  // in holds size() * out.size() elements; out gets block rank() reduced over ranks.
  template <typename T>
  void reduceScatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::kSum,
                     chorusStream_t stream = nullptr) {
    requireSize(in.size(), out.size() * static_cast<size_t>(size()), "reduceScatter: in");
    detail::check(
        chorusReduceScatter(in.data(), out.data(), out.size(), dataTypeOf<T>(), detail::toC(op), comm_, stream), comm_);
  }
  // In place: root's buffer is copied into everyone's.
  template <typename T>
  void broadcast(std::span<T> buffer, int root, chorusStream_t stream = nullptr) {
    detail::check(chorusBroadcast(buffer.data(), buffer.data(), buffer.size(), dataTypeOf<T>(), root, comm_, stream),
                  comm_);
  }
  // in and out hold size() blocks of in.size() / size() elements: block j of in goes to rank j,
  // block r of out comes from rank r.
  template <typename T>
  void allToAll(std::span<const T> in, std::span<T> out, chorusStream_t stream = nullptr) {
    requireSize(out.size(), in.size(), "allToAll: out");
    const size_t ranks = static_cast<size_t>(size());
    requireSize(in.size(), in.size() / ranks * ranks, "allToAll: in (a whole number of blocks per rank)");
    detail::check(chorusAllToAll(in.data(), out.data(), in.size() / ranks, dataTypeOf<T>(), comm_, stream), comm_);
  }
  // sendCounts[j] elements of in go to rank j, block after block in rank order; recvCounts[r]
  // come from rank r into out likewise (each pair's counts agree). The counts have size() entries.
  template <typename T>
  void allToAllv(std::span<const T> in, std::span<const size_t> sendCounts, std::span<T> out,
                 std::span<const size_t> recvCounts, chorusStream_t stream = nullptr) {
    const size_t ranks = static_cast<size_t>(size());
    requireSize(sendCounts.size(), ranks, "allToAllv: sendCounts");
    requireSize(recvCounts.size(), ranks, "allToAllv: recvCounts");
    std::vector<size_t> sendDispls(ranks, 0), recvDispls(ranks, 0);
    for (size_t r = 1; r < ranks; ++r) {
      sendDispls[r] = sendDispls[r - 1] + sendCounts[r - 1];
      recvDispls[r] = recvDispls[r - 1] + recvCounts[r - 1];
    }
    requireSize(in.size(), sendDispls.back() + sendCounts.back(), "allToAllv: in (the sum of sendCounts)");
    requireSize(out.size(), recvDispls.back() + recvCounts.back(), "allToAllv: out (the sum of recvCounts)");
    detail::check(chorusAllToAllv(in.data(), sendCounts.data(), sendDispls.data(), out.data(), recvCounts.data(),
                                  recvDispls.data(), dataTypeOf<T>(), comm_, stream),
                  comm_);
  }
  // out on root = op over ranks of in; out is ignored elsewhere (may be empty there).
  template <typename T>
  void reduce(std::span<const T> in, std::span<T> out, int root, ReduceOp op = ReduceOp::kSum,
              chorusStream_t stream = nullptr) {
    if (rank() == root) requireSize(out.size(), in.size(), "reduce: out");
    detail::check(
        chorusReduce(in.data(), out.data(), in.size(), dataTypeOf<T>(), detail::toC(op), root, comm_, stream), comm_);
  }
  template <typename T>
  void send(std::span<const T> data, int peer, chorusStream_t stream = nullptr) {
    detail::check(chorusSend(data.data(), data.size(), dataTypeOf<T>(), peer, comm_, stream), comm_);
  }
  template <typename T>
  void recv(std::span<T> data, int peer, chorusStream_t stream = nullptr) {
    detail::check(chorusRecv(data.data(), data.size(), dataTypeOf<T>(), peer, comm_, stream), comm_);
  }
  void barrier(chorusStream_t stream = nullptr) { detail::check(chorusBarrier(comm_, stream), comm_); }

  // Non-blocking forms: start the operation and return its Request (buffers in use until done).
  template <typename T>
  [[nodiscard]] Request iallReduce(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::kSum) {
    requireSize(out.size(), in.size(), "iallReduce: out");
    chorusRequest_t r = nullptr;
    detail::check(chorusIAllReduce(in.data(), out.data(), in.size(), dataTypeOf<T>(), detail::toC(op), comm_, &r),
                  comm_);
    return Request(r, comm_);
  }
  template <typename T>
  [[nodiscard]] Request iallReduce(std::span<T> inOut, ReduceOp op = ReduceOp::kSum) {
    return iallReduce(std::span<const T>(inOut), inOut, op);
  }
  template <typename T>
  [[nodiscard]] Request iallGather(std::span<const T> in, std::span<T> out) {
    requireSize(out.size(), in.size() * static_cast<size_t>(size()), "iallGather: out");
    chorusRequest_t r = nullptr;
    detail::check(chorusIAllGather(in.data(), out.data(), in.size(), dataTypeOf<T>(), comm_, &r), comm_);
    return Request(r, comm_);
  }
  template <typename T>
  [[nodiscard]] Request ireduceScatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::kSum) {
    requireSize(in.size(), out.size() * static_cast<size_t>(size()), "ireduceScatter: in");
    chorusRequest_t r = nullptr;
    detail::check(chorusIReduceScatter(in.data(), out.data(), out.size(), dataTypeOf<T>(), detail::toC(op), comm_, &r),
                  comm_);
    return Request(r, comm_);
  }
  template <typename T>
  [[nodiscard]] Request ibroadcast(std::span<T> buffer, int root) {
    chorusRequest_t r = nullptr;
    detail::check(chorusIBroadcast(buffer.data(), buffer.data(), buffer.size(), dataTypeOf<T>(), root, comm_, &r),
                  comm_);
    return Request(r, comm_);
  }
  template <typename T>
  [[nodiscard]] Request isend(std::span<const T> data, int peer) {
    chorusRequest_t r = nullptr;
    detail::check(chorusISend(data.data(), data.size(), dataTypeOf<T>(), peer, comm_, &r), comm_);
    return Request(r, comm_);
  }
  template <typename T>
  [[nodiscard]] Request irecv(std::span<T> data, int peer) {
    chorusRequest_t r = nullptr;
    detail::check(chorusIRecv(data.data(), data.size(), dataTypeOf<T>(), peer, comm_, &r), comm_);
    return Request(r, comm_);
  }
  [[nodiscard]] Request ibarrier() {
    chorusRequest_t r = nullptr;
    detail::check(chorusIBarrier(comm_, &r), comm_);
    return Request(r, comm_);
  }

  // Collective over every rank (see chorusCommSplit): the ranks passing the same color form one
  // new communicator, ordered by key; color CHORUS_SPLIT_NOCOLOR gives an empty Communicator.
  Communicator split(int color, int key, const chorusConfig_t* config = nullptr) {
    chorusComm_t made = nullptr;
    detail::check(chorusCommSplit(comm_, color, key, &made, config), comm_);
    return Communicator(made);
  }
  // Collective over the ranks not in `exclude` (see chorusCommShrink): a communicator of those
  // ranks; works on a communicator that has failed (a dead rank excluded).
  Communicator shrink(std::span<const int> exclude, const chorusConfig_t* config = nullptr) {
    chorusComm_t made = nullptr;
    detail::check(chorusCommShrink(comm_, exclude.data(), static_cast<int>(exclude.size()), &made, config), comm_);
    return Communicator(made);
  }
  // A fresh id for growing this communicator (see chorusCommGetUniqueId).
  chorusUniqueId growId() {
    chorusUniqueId id{};
    detail::check(chorusCommGetUniqueId(comm_, &id), comm_);
    return id;
  }
  // Collective over this communicator's ranks and the new ones (see chorusCommGrow): this rank's
  // part of the grown communicator of nranks, keeping its number.
  Communicator grow(int nranks, const chorusUniqueId& id, const chorusConfig_t* config = nullptr) {
    chorusComm_t made = nullptr;
    detail::check(chorusCommGrow(comm_, nranks, &id, -1, &made, config), comm_);
    return Communicator(made);
  }
  // A new rank's part of growing a communicator it is not in (see chorusCommGrow).
  static Communicator joinGrown(int nranks, const chorusUniqueId& id, int rank,
                                const chorusConfig_t* config = nullptr) {
    chorusComm_t made = nullptr;
    detail::check(chorusCommGrow(nullptr, nranks, &id, rank, &made, config), nullptr);
    return Communicator(made);
  }
  // False for an empty object (moved from, aborted, or a CHORUS_SPLIT_NOCOLOR split).
  explicit operator bool() const { return comm_ != nullptr; }

  // Progresses the operations in flight without blocking; throws chorus::Error with the failure
  // that ended the communicator, if one has (chorusCommGetAsyncError).
  void checkAsyncError() {
    chorusResult_t async = chorusSuccess;
    detail::check(chorusCommGetAsyncError(comm_, &async), comm_);
    detail::check(async, comm_);
  }

  // Aborts and releases the communicator; the object is empty afterwards.
  void abort() {
    if (comm_ != nullptr) chorusCommAbort(std::exchange(comm_, nullptr));
  }

 private:
  explicit Communicator(chorusComm_t comm) : comm_(comm) {}
  void reset() {
    if (comm_ != nullptr) chorusCommDestroy(std::exchange(comm_, nullptr));
  }
  static void requireSize(size_t got, size_t want, const char* what) {
    if (got != want) {
      throw Error(chorusInvalidArgument,
                  std::string(what) + " has " + std::to_string(got) + " elements, expected " + std::to_string(want));
    }
  }

  chorusComm_t comm_ = nullptr;
};

// The persistent state of compressed all-reduces of one buffer of fp32 tensors (see
// chorusCompressorCreate): spec such as "powersgd:4" or "topk:0.01"; counts and rows per tensor
// (rows empty: every tensor a vector). Move-only; destroyed with the object.
class Compressor {
 public:
  Compressor(const Communicator& comm, const std::string& spec, std::span<const size_t> counts,
             std::span<const size_t> rows = {}) {
    if (!rows.empty() && rows.size() != counts.size()) {
      throw Error(chorusInvalidArgument, "Compressor: " + std::to_string(rows.size()) + " rows for " +
                                             std::to_string(counts.size()) + " tensors");
    }
    detail::check(chorusCompressorCreate(comm.handle(), spec.c_str(), static_cast<int>(counts.size()), counts.data(),
                                         rows.empty() ? nullptr : rows.data(), &compressor_));
  }
  Compressor() = default;
  Compressor(Compressor&& other) noexcept : compressor_(std::exchange(other.compressor_, nullptr)) {}
  Compressor& operator=(Compressor&& other) noexcept {
    if (this != &other) {
      reset();
      compressor_ = std::exchange(other.compressor_, nullptr);
    }
    return *this;
  }
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  ~Compressor() { reset(); }
  explicit operator bool() const { return compressor_ != nullptr; }

  // inOut = the sum (kSum) or mean (kAvg) over ranks, compressed (chorusCompressedAllReduce): on
  // host buffers (stream null: returns once complete) or device buffers with a stream (enqueued).
  void allReduce(std::span<float> inOut, const Communicator& comm, ReduceOp op = ReduceOp::kAvg,
                 chorusStream_t stream = nullptr) {
    allReduce(std::span<const float>(inOut), inOut, comm, op, stream);
  }
  void allReduce(std::span<const float> in, std::span<float> out, const Communicator& comm,
                 ReduceOp op = ReduceOp::kAvg, chorusStream_t stream = nullptr) {
    if (out.size() != in.size()) {
      throw Error(chorusInvalidArgument, "Compressor::allReduce: out has " + std::to_string(out.size()) +
                                             " elements, in " + std::to_string(in.size()));
    }
    detail::check(chorusCompressedAllReduce(in.data(), out.data(), in.size(), chorusFloat32, detail::toC(op),
                                            compressor_, comm.handle(), stream),
                  comm.handle());
  }
  chorusCompressorInfo_t info() const {
    chorusCompressorInfo_t out{};
    detail::check(chorusCompressorGetInfo(compressor_, &out));
    return out;
  }
  // The error-feedback memory and this rank's last contribution (chorusCompressorGetResidual).
  void residual(std::span<float> error, std::span<float> contribution) const {
    const size_t count = info().count;
    if ((!error.empty() && error.size() != count) || (!contribution.empty() && contribution.size() != count)) {
      throw Error(chorusInvalidArgument, "Compressor::residual: spans must be empty or hold " + std::to_string(count));
    }
    detail::check(chorusCompressorGetResidual(compressor_, error.empty() ? nullptr : error.data(),
                                              contribution.empty() ? nullptr : contribution.data(), count));
  }
  // The second hop's error-feedback memory on this rank's shard (chorusCompressorGetOwnerResidual).
  void ownerResidual(std::span<float> error) const {
    detail::check(chorusCompressorGetOwnerResidual(compressor_, error.data(), error.size()));
  }

 private:
  void reset() {
    if (compressor_ != nullptr) chorusCompressorDestroy(std::exchange(compressor_, nullptr));
  }
  chorusCompressor_t compressor_ = nullptr;
};

// Runs body between chorusGroupStart and chorusGroupEnd; the calls in it run together at the
// end. Throws the group's error. If body throws, the group is still ended (the calls collected
// so far run, as chorus has no way to cancel a group) and body's exception propagates.
inline void group(const std::function<void()>& body) {
  detail::check(chorusGroupStart());
  try {
    body();
  } catch (...) {
    chorusGroupEnd();
    throw;
  }
  detail::check(chorusGroupEnd());
}

}  // namespace chorus

#endif  // CHORUS_CHORUS_HPP_
