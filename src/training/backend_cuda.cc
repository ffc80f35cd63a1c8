// backend_cuda.cc: the CUDA backend: kernels/cuda (products through cuBLAS) on the current
// device's memory, every kernel and copy on the legacy default stream, so that they run in the
// order the model calls them and chorus's collectives on the same buffers (given no stream, they
// take that stream too) fall in line. Built where CUDA was found (CHORUS_HAVE_CUDA_BACKEND).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "chorus/error.hpp"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/reduce.h"
#include "src/training/backend.h"

namespace chorus::training {

std::unique_ptr<Backend> makeCudaBackend();
int useCudaDeviceOfRank(int rank);

namespace {

namespace kn = chorus::kernels;
namespace kc = chorus::kernels::cuda;

// Throws for a failed call, naming it and the device's error.
void check(int code, const char* what) {
  if (code != 0) {
    throw Error(chorusUnhandledCudaError, fmt::format("cuda backend: {}: {}", what, kc::errorName(code)));
  }
}
void check(cudaError_t code, const char* what) { check(static_cast<int>(code), what); }

chorusDataType_t typeOf(kn::Float16 format) { return format == kn::Float16::kBf16 ? chorusBfloat16 : chorusFloat16; }

// The device's calls on the compute queue, timed while profiling is on (Backend::profile): an
// event recorded after each call, the time between two consecutive events the later call's. One
// per process: every CUDA backend's calls go on the one legacy default stream.
class Timeline {
 public:
  static Timeline& get() {
    static Timeline timeline;
    return timeline;
  }
  void enable(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (on == on_.load()) return;
    on_ = on;
    if (on) push(nullptr);  // a start: the next call's time counts from here
  }
  // After a call on the compute queue.
  void after(const char* what) {
    if (!on_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!on_.load()) return;
    push(what);
    if (points_.size() >= kFoldEvery) fold();
  }
  std::vector<Backend::CallTime> totals() {
    std::lock_guard<std::mutex> lock(mutex_);
    fold();
    std::vector<Backend::CallTime> out;
    for (const auto& [name, t] : totals_) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
    return out;
  }

 private:
  static constexpr size_t kFoldEvery = 4096;  // points kept before they are added up
  struct Point {
    const char* what;  // null: a start (profiling began or resumed; no call ends there)
    cudaEvent_t event;
  };
  void push(const char* what) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreate(&event), "cudaEventCreate");
    check(cudaEventRecord(event, nullptr), "cudaEventRecord");
    points_.push_back({what, event});
  }
  // Waits for the last point, adds up the times between points and keeps the last one as the
  // start of what comes next.
  void fold() {
    if (points_.size() < 2) return;
    check(cudaEventSynchronize(points_.back().event), "cudaEventSynchronize");
    for (size_t i = 1; i < points_.size(); ++i) {
      if (points_[i].what == nullptr) continue;
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, points_[i - 1].event, points_[i].event), "cudaEventElapsedTime");
      Backend::CallTime& t = totals_[points_[i].what];
      t.name = points_[i].what;
      t.seconds += ms / 1e3;
      ++t.calls;
    }
    for (size_t i = 0; i + 1 < points_.size(); ++i) cudaEventDestroy(points_[i].event);
    points_.erase(points_.begin(), points_.end() - 1);
  }
  std::mutex mutex_;
  std::atomic<bool> on_{false};
  std::vector<Point> points_;
  std::map<std::string, Backend::CallTime> totals_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    check(cudaGetDevice(&device_), "cudaGetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    name_ = prop.name;
  }
  ~CudaBackend() override {
    dropKept();
    for (Scratch& s : scratch_) cudaFree(s.data);
    for (cudaStream_t s : comm_) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }
  Device device() const override { return Device::kCuda; }
  std::string describe() const override { return fmt::format("cuda:{} ({})", device_, name_); }
  size_t scratchBytes() const override { return scratch_[0].bytes + scratch_[1].bytes; }

  // Released blocks are kept for the next allocation of the same size (cudaFree waits for the whole
  // device, which would stall the communication stream's work behind every freed buffer: ZeRO's
  // per-micro-batch gradients and gathers). A block is released only once the work that uses it
  // is ordered before the compute queue's next (data parallelism waits for the collectives' marks
  // first), and a reused block is zeroed on that queue. Without room, the kept blocks go first.
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = takeKept(bytes);
    if (p == nullptr && cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      dropKept();
      if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        throw Error(chorusUnhandledCudaError,
                    fmt::format("cuda backend: no room for {} bytes on device {} ({})", bytes, device_, name_));
      }
    }
    {
      std::lock_guard<std::mutex> lock(blocksMutex_);
      sizes_[p] = bytes;
    }
    zero(p, bytes);
    return p;
  }
  void release(void* p) noexcept override {
    std::lock_guard<std::mutex> lock(blocksMutex_);
    const auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      cudaFree(p);
      return;
    }
    kept_.emplace(it->second, p);
    sizes_.erase(it);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes > 0) done(cudaMemsetAsync(p, 0, bytes, nullptr), "cudaMemsetAsync");
  }
  void fill(float* p, size_t count, float value) override { done(kc::fill(p, count, value, nullptr), "fill"); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) done(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
  }
  void copyRows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override {
    if (width * rows == 0) return;
    done(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, nullptr),
         "cudaMemcpy2DAsync");
  }
  void toHost(void* host, const void* src, size_t bytes) override {
    if (bytes > 0) done(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }
  void fromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) done(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy from the host");
  }

  void embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int v0,
                        int vcount, const int* positions) override {
    done(kc::embeddingForward(out, tokens, wte, wpe, B, T, C, v0, vcount, positions, nullptr), "embeddingForward");
  }
  void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0,
                         int vcount, const int* positions) override {
    void* rows = scratch<char>(0, kc::embeddingBackwardScratchBytes(B * T, vcount));
    done(kc::embeddingBackward(dwte, dwpe, dout, tokens, B, T, C, v0, vcount, positions, rows, nullptr),
         "embeddingBackward");
  }
  void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                        int n, int c) override {
    done(kc::layernormForward(out, mean, rstd, inp, weight, bias, n, c, nullptr), "layernormForward");
  }
  void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int n, int c) override {
    float* partial = scratch<float>(0, kc::layernormBackwardScratchFloats(n, c));
    done(kc::layernormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c, partial, nullptr),
         "layernormBackward");
  }
  void geluForward(float* out, const float* inp, size_t n) override {
    done(kc::geluForward(out, inp, n, nullptr), "geluForward");
  }
  void geluBackward(float* dinp, const float* inp, const float* dout, size_t n) override {
    done(kc::geluBackward(dinp, inp, dout, n, nullptr), "geluBackward");
  }
  void residualForward(float* out, const float* a, const float* b, size_t n) override {
    done(kc::residualForward(out, a, b, n, nullptr), "residualForward");
  }
  void addRows(float* dst, size_t dstStride, const float* src, size_t srcStride, size_t width, size_t rows) override {
    done(kc::addRows(dst, dstStride, src, srcStride, width, rows, nullptr), "addRows");
  }
  void addIndexedRows(float* out, const float* table, const int* index, size_t width, size_t rows) override {
    done(kc::addIndexedRows(out, table, index, width, rows, nullptr), "addIndexedRows");
  }
  void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c,
                     int oc) override {
    done(kc::matmulForward(out, inp, weight, bias, n, c, oc, nullptr), "matmulForward");
  }
  void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int n, int c, int oc) override {
    void* partial = scratch<char>(0, kc::matmulBackwardScratchBytes(n, oc));
    done(kc::matmulBackward(dinp, dweight, dbias, dout, inp, weight, n, c, oc, partial, nullptr), "matmulBackward");
  }
  void matmulForward16(kn::Float16 format, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                       int n, int c, int oc) override {
    done(kc::matmulForward16(format, out, inp, weight, bias, n, c, oc, nullptr), "matmulForward16");
  }
  void matmulBackward16(kn::Float16 format, float* dinp, float* dweight, float* dbias, const float* dout,
                        const uint16_t* inp, const uint16_t* weight, int n, int c, int oc) override {
    void* partial = scratch<char>(0, kc::matmulBackward16ScratchBytes(n, oc));
    done(kc::matmulBackward16(format, dinp, dweight, dbias, dout, inp, weight, n, c, oc, partial, nullptr),
         "matmulBackward16");
  }
  void toFloat16(kn::Float16 format, const float* in, uint16_t* out, size_t count) override {
    done(kc::cast(out, typeOf(format), in, chorusFloat32, count, nullptr), "cast to 16 bits");
  }
  void fromFloat16(kn::Float16 format, const uint16_t* in, float* out, size_t count) override {
    done(kc::cast(out, chorusFloat32, in, typeOf(format), count, nullptr), "cast from 16 bits");
  }

  bool attentionBackwardReadsOutput() const override { return true; }  // for each row's delta
  // Kept: each row's log-sum-exp (the fused kernels rebuild the probabilities from it).
  size_t attentionKeptBytes(bool /*sixteen*/, int B, int T, int /*C*/, int NH) const override {
    return static_cast<size_t>(B) * NH * T * sizeof(float);
  }
  void attentionForward(bool sixteen, kn::Float16 format, float* out, void* kept, const void* qkv, int B, int T, int C,
                        int NH) override {
    float* rowSum = scratch<float>(0, static_cast<size_t>(B) * NH * T);
    auto* lse = static_cast<float*>(kept);
    done(sixteen
             ? kc::attentionForward16(format, out, lse, rowSum, static_cast<const uint16_t*>(qkv), B, T, C, NH, nullptr)
             : kc::attentionForward(out, lse, rowSum, static_cast<const float*>(qkv), B, T, C, NH, nullptr),
         "attentionForward");
  }
  void attentionBackward(bool sixteen, kn::Float16 format, float* dqkv, const float* dout, const float* out,
                         const void* qkv, const void* kept, int B, int T, int C, int NH) override {
    float* delta = scratch<float>(0, static_cast<size_t>(B) * NH * T);
    const auto* lse = static_cast<const float*>(kept);
    done(sixteen
             ? kc::attentionBackward16(format, dqkv, delta, dout, out, static_cast<const uint16_t*>(qkv), lse, B, T, C,
                                       NH, nullptr)
             : kc::attentionBackward(dqkv, delta, dout, out, static_cast<const float*>(qkv), lse, B, T, C, NH, nullptr),
         "attentionBackward");
  }

  void attentionBlockForward(const kn::AttentionBlock& blk, const Batch& bat, float* out, int outStride, float* rowMax,
                             float* rowSum, int statStride) override {
    blockForward(blk, bat, out, outStride, rowMax, rowSum, statStride);
  }
  void attentionBlockForward(const kn::AttentionBlock16& blk, const Batch& bat, float* out, int outStride,
                             float* rowMax, float* rowSum, int statStride) override {
    blockForward(blk, bat, out, outStride, rowMax, rowSum, statStride);
  }
  void attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                            int statStride, int Tq, int C, int NH, const Batch& bat) override {
    done(kc::attentionBlockFinish(out, outStride, lse, rowMax, rowSum, statStride, Tq, C, NH, batchOf(bat), nullptr),
         "attentionBlockFinish");
  }
  void attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                           int NH, const Batch& bat) override {
    done(kc::attentionBlockDelta(delta, statStride, dout, out, stride, Tq, C, NH, batchOf(bat), nullptr),
         "attentionBlockDelta");
  }
  void attentionBlockBackward(const kn::AttentionBlock& blk, const Batch& bat, const float* dout, int doutStride,
                              const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                              float* dv, int dkvStride) override {
    blockBackward(blk, bat, dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv, dkvStride);
  }
  void attentionBlockBackward(const kn::AttentionBlock16& blk, const Batch& bat, const float* dout, int doutStride,
                              const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                              float* dv, int dkvStride) override {
    blockBackward(blk, bat, dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv, dkvStride);
  }

  float crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets, int n,
                            int v) override {
    done(kc::crossEntropyForward(rowMax, sums, losses, logits, targets, n, v, nullptr), "crossEntropyForward");
    return meanOf(losses, n);
  }
  void crossEntropyShardMax(float* rowMax, const float* logits, int n, int v) override {
    done(kc::crossEntropyShardMax(rowMax, logits, n, v, nullptr), "crossEntropyShardMax");
  }
  void crossEntropyShardExp(float* sums, float* targetLogits, const float* logits, const float* rowMax,
                            const int* targets, int n, int v, int v0) override {
    done(kc::crossEntropyShardExp(sums, targetLogits, logits, rowMax, targets, n, v, v0, nullptr),
         "crossEntropyShardExp");
  }
  float crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits,
                              int n) override {
    done(kc::crossEntropyShardLoss(losses, sums, rowMax, targetLogits, n, nullptr), "crossEntropyShardLoss");
    return meanOf(losses, n);
  }
  void crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                            const int* targets, int n, int v, float scale, int v0) override {
    done(kc::crossEntropyBackward(dlogits, logits, rowMax, sums, targets, n, v, scale, v0, nullptr),
         "crossEntropyBackward");
  }
  void crossEntropyHeadBackward16(kn::Float16 format, float* dinp, float* dweight, float* logits, const float* rowMax,
                                  const float* sums, const int* targets, const uint16_t* inp, const uint16_t* weight,
                                  int n, int c, int v, float scale, int v0) override {
    // The gradient rounded to 16 bits as it is made, in the products' own scratch (what
    // matmulBackward16 rounds dout into): no fp32 gradient written, read and rounded after.
    auto* dlogits = scratch<uint16_t>(0, kc::matmulBackward16ScratchBytes(n, v) / sizeof(uint16_t));
    done(kc::crossEntropyBackward16(format, dlogits, logits, rowMax, sums, targets, n, v, scale, v0, nullptr),
         "crossEntropyBackward16");
    done(kc::matmulBackward16Rounded(format, dinp, dweight, dlogits, inp, weight, n, c, v, nullptr),
         "matmulBackward16Rounded");
  }

  void moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C) override {
    done(kc::moeDispatch(buffer, x, row, n, k, C, nullptr), "moeDispatch");
  }
  void moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C) override {
    done(kc::moeDispatchBackward(dx, dbuffer, row, n, k, C, nullptr), "moeDispatchBackward");
  }
  void moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C) override {
    done(kc::moeCombine(out, y, row, gate, n, k, C, nullptr), "moeCombine");
  }
  void moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                          int n, int k, int C) override {
    done(kc::moeCombineBackward(dy, dgate, dout, y, row, gate, n, k, C, nullptr), "moeCombineBackward");
  }
  void swigluForward(float* out, const float* inp, int n, int h) override {
    done(kc::swigluForward(out, inp, n, h, nullptr), "swigluForward");
  }
  void swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h) override {
    done(kc::swigluBackward(dinp, inp, dout, n, h, nullptr), "swigluBackward");
  }

  void adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step,
                 const kn::OptimizerSettings& s) override {
    done(kc::adamwStep(param, grad, m, v, n, step, s, nullptr), "adamwStep");
  }
  void sgdStep(float* param, const float* grad, float* m, size_t n, long step,
               const kn::OptimizerSettings& s) override {
    done(kc::sgdStep(param, grad, m, n, step, s, nullptr), "sgdStep");
  }
  double sumOfSquares(const float* x, size_t n) override {
    auto* sums = scratch<double>(1, kc::sumScratchDoubles() + 1);
    done(kc::sumOfSquares(sums + kc::sumScratchDoubles(), x, n, sums, nullptr), "sumOfSquares");
    double host = 0.0;
    toHost(&host, sums + kc::sumScratchDoubles(), sizeof(host));
    return host;
  }
  void scale(float* x, size_t n, float factor) override { done(kc::scale(x, n, factor, nullptr), "scale"); }

  void* stream(Queue queue, int lane) override { return queue == Queue::kCompute ? nullptr : commStream(lane); }
  Mark mark(Queue queue, int lane) override {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    Mark mark(event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
    check(cudaEventRecord(event, static_cast<cudaStream_t>(stream(queue, lane))), "cudaEventRecord");
    return mark;
  }
  void fromHostOn(Queue queue, void* dst, const void* host, size_t bytes, int lane) override {
    // From pageable memory the call returns once the bytes are staged: host may be reused then.
    if (bytes > 0) {
      check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream(queue, lane))),
            "cudaMemcpyAsync from the host");
    }
  }
  void wait(Queue queue, const Mark& mark, int lane) override {
    if (mark == nullptr) return;
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream(queue, lane)), static_cast<cudaEvent_t>(mark.get()), 0),
          "cudaStreamWaitEvent");
    if (queue == Queue::kCompute) Timeline::get().after("wait for communication");
  }
  Mark timedMark(Queue queue, int lane) override {
    cudaEvent_t event = nullptr;
    check(cudaEventCreate(&event), "cudaEventCreate");
    Mark mark(event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
    check(cudaEventRecord(event, static_cast<cudaStream_t>(stream(queue, lane))), "cudaEventRecord");
    return mark;
  }
  double secondsBetween(const Mark& from, const Mark& to) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(to.get())), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from.get()), static_cast<cudaEvent_t>(to.get())),
          "cudaEventElapsedTime");
    return ms / 1e3;
  }
  bool reached(const Mark& mark) override {
    if (mark == nullptr) return true;
    const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(mark.get()));
    if (state == cudaErrorNotReady) return false;
    check(state, "cudaEventQuery");
    return true;
  }
  void bindThread() override { check(cudaSetDevice(device_), "cudaSetDevice"); }
  void profile(bool on) override { Timeline::get().enable(on); }
  std::vector<CallTime> callTimes() override { return Timeline::get().totals(); }

 private:
  // A call on the compute queue: checked, and timed while profiling.
  static void done(int code, const char* what) {
    check(code, what);
    Timeline::get().after(what);
  }
  static void done(cudaError_t code, const char* what) { done(static_cast<int>(code), what); }
  void* takeKept(size_t bytes) {
    std::lock_guard<std::mutex> lock(blocksMutex_);
    const auto it = kept_.find(bytes);
    if (it == kept_.end()) return nullptr;
    void* p = it->second;
    kept_.erase(it);
    return p;
  }
  void dropKept() {
    std::lock_guard<std::mutex> lock(blocksMutex_);
    for (const auto& [bytes, p] : kept_) cudaFree(p);
    kept_.clear();
  }
  // A communication lane's stream, made at first use; it does not wait for the legacy default
  // stream (nor it for this one) but where a mark says.
  cudaStream_t commStream(int lane) {
    if (lane < 0 || lane >= kCommLanes) {
      throw Error(chorusInvalidUsage,
                  fmt::format("cuda backend: communication lane {} (0 to {})", lane, kCommLanes - 1));
    }
    std::lock_guard<std::mutex> lock(commMutex_);
    cudaStream_t& s = comm_[lane];
    if (s == nullptr) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }
  // Device memory kept between calls, grown as asked: slot 0 for the kernels' own scratch, slot 1
  // for the mean's sums and result.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };
  template <typename T>
  T* scratch(int slot, size_t count) {
    Scratch& s = scratch_[slot];
    const size_t bytes = count * sizeof(T);
    if (s.bytes < bytes) {
      cudaFree(s.data);  // waits for the work that may still use it
      s.data = nullptr;
      s.bytes = 0;
      check(cudaMalloc(&s.data, bytes), "cudaMalloc of scratch");
      s.bytes = bytes;
    }
    return static_cast<T*>(s.data);
  }
  // The mean of the losses, in double then float as the CPU's, waited for.
  float meanOf(const float* losses, int n) {
    auto* sums = scratch<double>(1, kc::sumScratchDoubles() + 1);
    auto* mean = reinterpret_cast<float*>(sums + kc::sumScratchDoubles());
    done(kc::meanOf(mean, losses, n, sums, nullptr), "meanOf");
    float host = 0.0f;
    toHost(&host, mean, sizeof(host));
    return host;
  }
  // The block kernels for fp32 and 16-bit blocks alike.
  template <typename Element>
  void blockForward(const kn::AttentionBlockOf<Element>& blk, const Batch& bat, float* out, int outStride,
                    float* rowMax, float* rowSum, int statStride) {
    done(kc::attentionBlockForward(blk, batchOf(bat), out, outStride, rowMax, rowSum, statStride, nullptr),
         "attentionBlockForward");
  }
  template <typename Element>
  void blockBackward(const kn::AttentionBlockOf<Element>& blk, const Batch& bat, const float* dout, int doutStride,
                     const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                     float* dv, int dkvStride) {
    done(kc::attentionBlockBackward(blk, batchOf(bat), dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv,
                                    dkvStride, nullptr),
         "attentionBlockBackward");
  }
  static kc::AttentionBatch batchOf(const Batch& bat) {
    return kc::AttentionBatch{bat.batch, bat.qRows, bat.kvRows, bat.statsApart};
  }
  int device_ = 0;
  std::string name_;
  Scratch scratch_[2];
  std::mutex commMutex_;
  cudaStream_t comm_[kCommLanes] = {};
  std::mutex blocksMutex_;
  std::unordered_map<void*, size_t> sizes_;  // the blocks in use, by address
  std::multimap<size_t, void*> kept_;        // released blocks, by size
};

}  // namespace

namespace {

// The number of devices; throws naming why there is none.
int deviceCount() {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(chorusUnhandledCudaError, fmt::format("device \"cuda\": no usable CUDA device here ({})",
                                                      probe != cudaSuccess ? cudaGetErrorString(probe) : "none found"));
  }
  return count;
}

}  // namespace

std::unique_ptr<Backend> makeCudaBackend() {
  deviceCount();
  return std::make_unique<CudaBackend>();
}

int useCudaDeviceOfRank(int rank) {
  const int gpu = rank % deviceCount();
  check(cudaSetDevice(gpu), "cudaSetDevice");
  return gpu;
}

}  // namespace chorus::training
