// backend.h: what the model computes with and keeps its tensors in, for one kind of device: the
// transformer's kernels and their memory. The layers are written once, against Backend; the CPU
// backend runs kernels/cpu on host memory, the CUDA backend kernels/cuda (products through cuBLAS)
// on the current CUDA device's memory, every kernel in order on the legacy default stream, the
// stream chorus's collectives take for device buffers when given none, so the model's collectives
// on its device buffers are ordered with its kernels without further synchronization. Pointers a
// backend's functions take are in its memory unless they say host. A backend is used by one
// thread (it keeps scratch for the kernels that need some); errors throw chorus::Error naming the
// kernel and the device's error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/nn.h"

namespace chorus::training {

enum class Device { kCpu, kCuda };
// "cpu", "cuda"; throws chorus::Error naming the word otherwise.
Device parseDevice(const std::string& name);
const char* deviceName(Device device);
// Whether this build has the CUDA backend (CUDA was found at configure time).
bool cudaBackendBuilt();

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // e.g. "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string describe() const = 0;
  // Bytes the backend keeps as its kernels' scratch (grown to the most any call asked for).
  virtual size_t scratchBytes() const = 0;

  // ---- memory ----
  // bytes of zeros (null for 0); throws chorus::Error naming the size when there is no room.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void fill(float* p, size_t count, float value) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // rows rows of `width` bytes each: row i from src + i spitch to dst + i dpitch.
  virtual void copyRows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) = 0;
  // Between host memory and this backend's; toHost returns once the bytes are there (after the
  // work enqueued before it).
  virtual void toHost(void* host, const void* src, size_t bytes) = 0;
  virtual void fromHost(void* dst, const void* host, size_t bytes) = 0;

  // ---- the transformer's kernels: kernels/cpu/nn.h's, with its shapes and rules ----
  virtual void embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                                int v0, int vcount, const int* positions) = 0;
  virtual void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                                 int v0, int vcount, const int* positions) = 0;
  virtual void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                const float* bias, int n, int c) = 0;
  virtual void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                 const float* weight, const float* mean, const float* rstd, int n, int c) = 0;
  virtual void geluForward(float* out, const float* inp, size_t n) = 0;
  virtual void geluBackward(float* dinp, const float* inp, const float* dout, size_t n) = 0;
  virtual void residualForward(float* out, const float* a, const float* b, size_t n) = 0;
  // dst row i (width floats, rows dstStride apart) += src row i (srcStride apart; 0: one row added
  // to every row, a bias).
  virtual void addRows(float* dst, size_t dstStride, const float* src, size_t srcStride, size_t width, size_t rows) = 0;
  // out row i (width floats) += table row index[i] (index in this backend's memory).
  virtual void addIndexedRows(float* out, const float* table, const int* index, size_t width, size_t rows) = 0;
  // The linear layer (kernels/cpu/matmul.h), fp32 and 16-bit.
  virtual void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c,
                             int oc) = 0;
  virtual void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, int n, int c, int oc) = 0;
  virtual void matmulForward16(kernels::Float16 format, float* out, const uint16_t* inp, const uint16_t* weight,
                               const float* bias, int n, int c, int oc) = 0;
  virtual void matmulBackward16(kernels::Float16 format, float* dinp, float* dweight, float* dbias, const float* dout,
                                const uint16_t* inp, const uint16_t* weight, int n, int c, int oc) = 0;
  virtual void toFloat16(kernels::Float16 format, const float* in, uint16_t* out, size_t count) = 0;
  virtual void fromFloat16(kernels::Float16 format, const uint16_t* in, float* out, size_t count) = 0;

  // Causal attention of qkv(B, T, 3C) into out(B, T, C). What forward keeps for backward is the
  // backend's own (the CPU: the probabilities, B x heads x T x T, in the compute's type; CUDA: the
  // log-sum-exp of each row, B x heads x T floats): attentionKeptBytes of it. sixteen: qkv in the
  // format (uint16_t), else fp32. Backward adds into dqkv and reads the forward's out (see
  // attentionBackwardReadsOutput).
  virtual size_t attentionKeptBytes(bool sixteen, int B, int T, int C, int NH) const = 0;
  // Whether attentionBackward reads the forward's out (else it may be given null).
  virtual bool attentionBackwardReadsOutput() const = 0;
  virtual void attentionForward(bool sixteen, kernels::Float16 format, float* out, void* kept, const void* qkv, int B,
                                int T, int C, int NH) = 0;
  virtual void attentionBackward(bool sixteen, kernels::Float16 format, float* dqkv, const float* dout,
                                 const float* out, const void* qkv, const void* kept, int B, int T, int C, int NH) = 0;
  // Ring attention's blocks (kernels/cpu/nn.h's AttentionBlock), `batch` sequences at once: sequence
  // b's query rows (q, out, dout, dq) start b qRows rows after sequence 0's, its key rows (k, v,
  // dk, dv) b kvRows rows after, its statistics b statsApart floats after.
  struct Batch {
    int batch = 1;
    size_t qRows = 0, kvRows = 0, statsApart = 0;
  };
  virtual void attentionBlockForward(const kernels::AttentionBlock& blk, const Batch& bat, float* out, int outStride,
                                     float* rowMax, float* rowSum, int statStride) = 0;
  virtual void attentionBlockForward(const kernels::AttentionBlock16& blk, const Batch& bat, float* out, int outStride,
                                     float* rowMax, float* rowSum, int statStride) = 0;
  virtual void attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                                    int statStride, int Tq, int C, int NH, const Batch& bat) = 0;
  virtual void attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride,
                                   int Tq, int C, int NH, const Batch& bat) = 0;
  virtual void attentionBlockBackward(const kernels::AttentionBlock& blk, const Batch& bat, const float* dout,
                                      int doutStride, const float* lse, const float* delta, int statStride, float* dq,
                                      int dqStride, float* dk, float* dv, int dkvStride) = 0;
  virtual void attentionBlockBackward(const kernels::AttentionBlock16& blk, const Batch& bat, const float* dout,
                                      int doutStride, const float* lse, const float* delta, int statStride, float* dq,
                                      int dqStride, float* dk, float* dv, int dkvStride) = 0;

  // Softmax cross-entropy (targets in this backend's memory; kernels/cpu/nn.h's: the forward keeps
  // each row's maximum and exponential sum, backward recomputes the probabilities from the
  // logits); the functions that end the loss return its mean (on a device: waiting for it).
  virtual float crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets,
                                    int n, int v) = 0;
  virtual void crossEntropyShardMax(float* rowMax, const float* logits, int n, int v) = 0;
  virtual void crossEntropyShardExp(float* sums, float* targetLogits, const float* logits, const float* rowMax,
                                    const int* targets, int n, int v, int v0) = 0;
  virtual float crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits,
                                      int n) = 0;
  virtual void crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                                    const int* targets, int n, int v, float scale, int v0) = 0;
  // The loss's gradient and the (bias-free) 16-bit head's backward from it: crossEntropyBackward of
  // logits into logits (n x v), then matmulBackward16 with that as dout (dinp n x c, dweight v x c).
  // A backend may skip the fp32 gradient (the CUDA one rounds it to 16 bits as it computes it, the
  // operand matmulBackward16 would round it to): logits are then left as they were.
  virtual void crossEntropyHeadBackward16(kernels::Float16 format, float* dinp, float* dweight, float* logits,
                                          const float* rowMax, const float* sums, const int* targets,
                                          const uint16_t* inp, const uint16_t* weight, int n, int c, int v, float scale,
                                          int v0);

  // ---- an MoE layer's rows (kernels/cpu/moe.h's; row and gate in this backend's memory) ----
  virtual void moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C) = 0;
  virtual void moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C) = 0;
  virtual void moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C) = 0;
  virtual void moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row,
                                  const float* gate, int n, int k, int C) = 0;
  virtual void swigluForward(float* out, const float* inp, int n, int h) = 0;
  virtual void swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h) = 0;

  // ---- the training state's kernels (kernels/cpu/nn.h's) ----
  virtual void adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step,
                         const kernels::OptimizerSettings& s) = 0;
  virtual void sgdStep(float* param, const float* grad, float* m, size_t n, long step,
                       const kernels::OptimizerSettings& s) = 0;
  // The sum of squares of x(n), accumulated in double (on a device: waiting for it).
  virtual double sumOfSquares(const float* x, size_t n) = 0;
  virtual void scale(float* x, size_t n, float factor) = 0;

  // ---- queues of work: the kernels (kCompute) and the collectives on this backend's memory
  // (kComm), so that communication overlaps computation where the device allows ----
  // On the CPU nothing is queued (a call has finished when it returns): streams are null, marks
  // empty and waits do nothing. On CUDA kCompute is the legacy default stream (where every kernel
  // above runs) and kComm has lanes, each a stream of its own that does not wait for the compute
  // stream implicitly (nor it for them): one lane per communicator that enqueues there, so the
  // collectives of two communicators never share a stream (ranks may enqueue those in different
  // orders, and one stream would then order them against each other: a deadlock).
  enum class Queue { kCompute, kComm };
  static constexpr int kCommLanes = 8;
  // Who enqueues on which lane: data parallelism's two groups (all data-parallel ranks; the
  // experts' expert-data-parallel ranks), the MoE layers' expert-parallel exchanges, the
  // context-parallel ring's transfers, and a pipeline's four links (activations out to the next
  // stage and in from the previous one; gradients out to the previous stage and in from the next).
  enum Lane : int {
    kDenseLane = 0,
    kExpertDataLane = 1,
    kExpertParallelLane = 2,
    kContextParallelLane = 3,
    kActivationsOutLane = 4,
    kActivationsInLane = 5,
    kGradientsOutLane = 6,
    kGradientsInLane = 7,
  };
  // A point in a queue: the work enqueued on it before mark() was called.
  using Mark = std::shared_ptr<void>;
  // The queue's stream (lane < kCommLanes; kCompute has one), for chorus's collectives on device
  // buffers (a cudaStream_t; null on the CPU). These four may be called from any thread.
  virtual void* stream(Queue /*queue*/, int /*lane*/ = 0) { return nullptr; }
  virtual Mark mark(Queue /*queue*/, int /*lane*/ = 0) { return {}; }
  // bytes of host memory to dst on the queue's stream, after the work enqueued there before it;
  // the host bytes may be reused once it returns (on the CPU: a copy, done).
  virtual void fromHostOn(Queue /*queue*/, void* dst, const void* host, size_t bytes, int /*lane*/ = 0) {
    fromHost(dst, host, bytes);
  }
  // Work enqueued on the queue after this call waits for the mark (an empty mark: for nothing).
  virtual void wait(Queue /*queue*/, const Mark& /*mark*/, int /*lane*/ = 0) {}
  // Whether the device has run the work before the mark (without waiting; an empty mark: true).
  virtual bool reached(const Mark& /*mark*/) { return true; }
  // A mark that also keeps when the device got to it, for secondsBetween (on the CPU, where the
  // work before a call has finished when it is made: the moment of the call).
  virtual Mark timedMark(Queue queue, int lane = 0);
  // Seconds from timed mark `from` to timed mark `to` on the device's clock, once the device has
  // reached `to` (waiting for it).
  virtual double secondsBetween(const Mark& from, const Mark& to);
  // Makes the calling thread use this backend's device (a thread that enqueues collectives on its
  // memory, such as a communication thread, calls it first).
  virtual void bindThread() {}

  // ---- where a device's time goes, call by call ----
  // While profiling is on, the device's backends (all of this process's, on one timeline) time
  // each call on the compute queue from the end of the call before it to its own end: a call's
  // kernels, plus any gap in which the device waited (for the host, or for a communication mark it
  // was told to wait for: those waits are calls of their own). callTimes() returns the totals
  // since the first profile(true), by call name, largest first. The CPU backend has no queue to
  // time (its calls are the host's own time): profile(true) there throws.
  struct CallTime {
    std::string name;
    double seconds = 0.0;
    long calls = 0;
  };
  virtual void profile(bool on);
  virtual std::vector<CallTime> callTimes() { return {}; }
};

// A backend for the device; kCuda uses the calling thread's current CUDA device. Throws
// chorus::Error where the build has no CUDA or no device can be used.
std::unique_ptr<Backend> makeBackend(Device device);
// Makes the calling thread's current device the one rank `rank` of a job trains on: GPU
// rank % (the GPUs visible here), so several ranks may share one. Returns that GPU's index (0 on
// the CPU). Throws as makeBackend where the build has no CUDA or there is no device.
int useDeviceOfRank(Device device, int rank);

// count elements of T in a backend's memory, zeroed, freed by the backend; move-only. A range of
// contiguous elements (std::span takes it), which only the backend's functions may touch where
// the backend is a device's.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, size_t count)
      : backend_(&backend),
        data_(static_cast<T*>(backend.allocate(count * sizeof(T)))),
        size_(count),
        capacity_(count) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = other.backend_;
      data_ = other.data_;
      size_ = other.size_;
      capacity_ = other.capacity_;
      other.data_ = nullptr;
      other.size_ = other.capacity_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  // Holds count elements from now on, in backend's memory: the memory it has is kept when it has
  // room (its elements as they were), else replaced by count zeroed elements. For buffers whose
  // length changes from use to use (an MoE layer's rows), without an allocation each time.
  void ensure(Backend& backend, size_t count) {
    if (count > capacity_ || backend_ != &backend) {
      *this = Buffer(backend, count);
      return;
    }
    size_ = count;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void reset() {
    if (data_ != nullptr) backend_->release(data_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace chorus::training
