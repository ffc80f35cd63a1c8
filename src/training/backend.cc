// backend.cc: the CPU backend (kernels/cpu on host memory) and the choice of backend.
#include "src/training/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "chorus/error.hpp"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"

namespace chorus::training {

#if CHORUS_HAVE_CUDA_BACKEND
std::unique_ptr<Backend> makeCudaBackend();  // backend_cuda.cc
#endif

namespace kn = chorus::kernels;

Device parseDevice(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw Error(chorusInvalidArgument, fmt::format("device \"{}\": expected \"cpu\" or \"cuda\"", name));
}

const char* deviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

bool cudaBackendBuilt() {
#if CHORUS_HAVE_CUDA_BACKEND
  return true;
#else
  return false;
#endif
}

namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  std::string describe() const override { return "cpu"; }
  size_t scratchBytes() const override { return scratch_.size() * sizeof(float); }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::calloc(1, bytes);
    if (p == nullptr) throw Error(chorusSystemError, fmt::format("cpu backend: no room for {} bytes", bytes));
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void zero(void* p, size_t bytes) override {
    if (bytes > 0) std::memset(p, 0, bytes);
  }
  void fill(float* p, size_t count, float value) override { std::fill(p, p + count, value); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copyRows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    }
  }
  void toHost(void* host, const void* src, size_t bytes) override { copy(host, src, bytes); }
  void fromHost(void* dst, const void* host, size_t bytes) override { copy(dst, host, bytes); }

  void embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int v0,
                        int vcount, const int* positions) override {
    kn::embeddingForward(out, tokens, wte, wpe, B, T, C, v0, vcount, positions);
  }
  void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0,
                         int vcount, const int* positions) override {
    kn::embeddingBackward(dwte, dwpe, dout, tokens, B, T, C, v0, vcount, positions);
  }
  void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                        int n, int c) override {
    kn::layernormForward(out, mean, rstd, inp, weight, bias, n, c);
  }
  void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int n, int c) override {
    kn::layernormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c);
  }
  void geluForward(float* out, const float* inp, size_t n) override { kn::geluForward(out, inp, n); }
  void geluBackward(float* dinp, const float* inp, const float* dout, size_t n) override {
    kn::geluBackward(dinp, inp, dout, n);
  }
  void residualForward(float* out, const float* a, const float* b, size_t n) override {
    kn::residualForward(out, a, b, n);
  }
  void addRows(float* dst, size_t dstStride, const float* src, size_t srcStride, size_t width, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      float* row = dst + r * dstStride;
      kn::residualForward(row, row, src + r * srcStride, width);
    }
  }
  void addIndexedRows(float* out, const float* table, const int* index, size_t width, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      float* row = out + r * width;
      kn::residualForward(row, row, table + static_cast<size_t>(index[r]) * width, width);
    }
  }
  void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c,
                     int oc) override {
    kn::matmulForward(out, inp, weight, bias, n, c, oc);
  }
  void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int n, int c, int oc) override {
    kn::matmulBackward(dinp, dweight, dbias, dout, inp, weight, n, c, oc);
  }
  void matmulForward16(kn::Float16 format, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                       int n, int c, int oc) override {
    kn::matmulForward16(format, out, inp, weight, bias, n, c, oc);
  }
  void matmulBackward16(kn::Float16 format, float* dinp, float* dweight, float* dbias, const float* dout,
                        const uint16_t* inp, const uint16_t* weight, int n, int c, int oc) override {
    kn::matmulBackward16(format, dinp, dweight, dbias, dout, inp, weight, n, c, oc);
  }
  void toFloat16(kn::Float16 format, const float* in, uint16_t* out, size_t count) override {
    kn::toFloat16(format, in, out, count);
  }
  void fromFloat16(kn::Float16 format, const uint16_t* in, float* out, size_t count) override {
    kn::fromFloat16(format, in, out, count);
  }

  bool attentionBackwardReadsOutput() const override { return false; }  // the probabilities suffice
  // Kept: the probabilities, in fp32 or the 16-bit format.
  size_t attentionKeptBytes(bool sixteen, int B, int T, int /*C*/, int NH) const override {
    return static_cast<size_t>(B) * NH * T * T * (sixteen ? sizeof(uint16_t) : sizeof(float));
  }
  void attentionForward(bool sixteen, kn::Float16 format, float* out, void* kept, const void* qkv, int B, int T, int C,
                        int NH) override {
    if (sixteen) {
      kn::attentionForward16(format, out, static_cast<uint16_t*>(kept), static_cast<const uint16_t*>(qkv),
                             scratch(kn::attention16ScratchFloats(T, C)), B, T, C, NH);
    } else {
      kn::attentionForward(out, static_cast<float*>(kept), static_cast<const float*>(qkv), B, T, C, NH);
    }
  }
  void attentionBackward(bool sixteen, kn::Float16 format, float* dqkv, const float* dout, const float* /*out*/,
                         const void* qkv, const void* kept, int B, int T, int C, int NH) override {
    if (sixteen) {
      kn::attentionBackward16(format, dqkv, scratch(kn::attention16ScratchFloats(T, C)), dout,
                              static_cast<const uint16_t*>(qkv), static_cast<const uint16_t*>(kept), B, T, C, NH);
    } else {
      kn::attentionBackward(dqkv, scratch(static_cast<size_t>(T) * T), dout, static_cast<const float*>(qkv),
                            static_cast<const float*>(kept), B, T, C, NH);
    }
  }

  void attentionBlockForward(const kn::AttentionBlock& blk, const Batch& bat, float* out, int outStride, float* rowMax,
                             float* rowSum, int statStride) override {
    blockForward(blk, bat, out, outStride, rowMax, rowSum, statStride, scratch(static_cast<size_t>(blk.Tq) * blk.Tk));
  }
  void attentionBlockForward(const kn::AttentionBlock16& blk, const Batch& bat, float* out, int outStride,
                             float* rowMax, float* rowSum, int statStride) override {
    blockForward(blk, bat, out, outStride, rowMax, rowSum, statStride,
                 scratch(kn::attentionBlock16ScratchFloats(blk.Tq, blk.Tk, blk.C)));
  }
  void attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                            int statStride, int Tq, int C, int NH, const Batch& bat) override {
    for (int b = 0; b < bat.batch; ++b) {
      const size_t stat = b * bat.statsApart;
      kn::attentionBlockFinish(out + b * bat.qRows * outStride, outStride, lse + stat, rowMax + stat, rowSum + stat,
                               statStride, Tq, C, NH);
    }
  }
  void attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                           int NH, const Batch& bat) override {
    for (int b = 0; b < bat.batch; ++b) {
      const size_t row = b * bat.qRows * stride;
      kn::attentionBlockDelta(delta + b * bat.statsApart, statStride, dout + row, out + row, stride, Tq, C, NH);
    }
  }
  void attentionBlockBackward(const kn::AttentionBlock& blk, const Batch& bat, const float* dout, int doutStride,
                              const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                              float* dv, int dkvStride) override {
    blockBackward(blk, bat, dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv, dkvStride,
                  scratch(2 * static_cast<size_t>(blk.Tq) * blk.Tk));
  }
  void attentionBlockBackward(const kn::AttentionBlock16& blk, const Batch& bat, const float* dout, int doutStride,
                              const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                              float* dv, int dkvStride) override {
    blockBackward(blk, bat, dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv, dkvStride,
                  scratch(kn::attentionBlock16ScratchFloats(blk.Tq, blk.Tk, blk.C)));
  }

  float crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets, int n,
                            int v) override {
    return kn::crossEntropyForward(rowMax, sums, losses, logits, targets, n, v);
  }
  void crossEntropyShardMax(float* rowMax, const float* logits, int n, int v) override {
    kn::crossEntropyShardMax(rowMax, logits, n, v);
  }
  void crossEntropyShardExp(float* sums, float* targetLogits, const float* logits, const float* rowMax,
                            const int* targets, int n, int v, int v0) override {
    kn::crossEntropyShardExp(sums, targetLogits, logits, rowMax, targets, n, v, v0);
  }
  float crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits,
                              int n) override {
    return kn::crossEntropyShardLoss(losses, sums, rowMax, targetLogits, n);
  }
  void crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                            const int* targets, int n, int v, float scale, int v0) override {
    kn::crossEntropyBackward(dlogits, logits, rowMax, sums, targets, n, v, scale, v0);
  }

  void moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C) override {
    kn::moeDispatch(buffer, x, row, n, k, C);
  }
  void moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C) override {
    kn::moeDispatchBackward(dx, dbuffer, row, n, k, C);
  }
  void moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C) override {
    kn::moeCombine(out, y, row, gate, n, k, C);
  }
  void moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                          int n, int k, int C) override {
    kn::moeCombineBackward(dy, dgate, dout, y, row, gate, n, k, C);
  }
  void swigluForward(float* out, const float* inp, int n, int h) override { kn::swigluForward(out, inp, n, h); }
  void swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h) override {
    kn::swigluBackward(dinp, inp, dout, n, h);
  }

  // These keep no scratch: data parallelism's step thread calls them beside the training thread.
  void adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step,
                 const kn::OptimizerSettings& s) override {
    kn::adamwStep(param, grad, m, v, n, step, s);
  }
  void sgdStep(float* param, const float* grad, float* m, size_t n, long step,
               const kn::OptimizerSettings& s) override {
    kn::sgdStep(param, grad, m, n, step, s);
  }
  double sumOfSquares(const float* x, size_t n) override { return kn::sumOfSquares(x, n); }
  void scale(float* x, size_t n, float factor) override { kn::scale(x, n, factor); }

 private:
  // count floats of scratch, grown as asked, kept between calls.
  float* scratch(size_t count) {
    if (scratch_.size() < count) scratch_.resize(count);
    return scratch_.data();
  }
  // One sequence at a time, as the CPU's block functions take them.
  template <typename Element>
  static kn::AttentionBlockOf<Element> sequence(kn::AttentionBlockOf<Element> blk, const Batch& bat, int b) {
    blk.q += b * bat.qRows * blk.qStride;
    blk.k += b * bat.kvRows * blk.kvStride;
    blk.v += b * bat.kvRows * blk.kvStride;
    return blk;
  }
  template <typename Element>
  static void blockForward(const kn::AttentionBlockOf<Element>& blk, const Batch& bat, float* out, int outStride,
                           float* rowMax, float* rowSum, int statStride, float* scratch) {
    for (int b = 0; b < bat.batch; ++b) {
      const size_t stat = b * bat.statsApart;
      kn::attentionBlockForward(sequence(blk, bat, b), out + b * bat.qRows * outStride, outStride, rowMax + stat,
                                rowSum + stat, statStride, scratch);
    }
  }
  template <typename Element>
  static void blockBackward(const kn::AttentionBlockOf<Element>& blk, const Batch& bat, const float* dout,
                            int doutStride, const float* lse, const float* delta, int statStride, float* dq,
                            int dqStride, float* dk, float* dv, int dkvStride, float* scratch) {
    for (int b = 0; b < bat.batch; ++b) {
      const size_t stat = b * bat.statsApart, kv = b * bat.kvRows * dkvStride;
      kn::attentionBlockBackward(sequence(blk, bat, b), dout + b * bat.qRows * doutStride, doutStride, lse + stat,
                                 delta + stat, statStride, dq + b * bat.qRows * dqStride, dqStride, dk + kv, dv + kv,
                                 dkvStride, scratch);
    }
  }
  std::vector<float> scratch_;
};

}  // namespace

void Backend::crossEntropyHeadBackward16(kernels::Float16 format, float* dinp, float* dweight, float* logits,
                                         const float* rowMax, const float* sums, const int* targets,
                                         const uint16_t* inp, const uint16_t* weight, int n, int c, int v, float scale,
                                         int v0) {
  crossEntropyBackward(logits, logits, rowMax, sums, targets, n, v, scale, v0);
  matmulBackward16(format, dinp, dweight, nullptr, logits, inp, weight, n, c, v);
}

void Backend::profile(bool on) {
  if (on) {
    throw Error(chorusInvalidUsage,
                fmt::format("profiling calls on {}: only a device backend has a queue to time", describe()));
  }
}

Backend::Mark Backend::timedMark(Queue /*queue*/, int /*lane*/) {
  return std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
}

double Backend::secondsBetween(const Mark& from, const Mark& to) {
  using Point = std::chrono::steady_clock::time_point;
  return std::chrono::duration<double>(*static_cast<const Point*>(to.get()) - *static_cast<const Point*>(from.get()))
      .count();
}

std::unique_ptr<Backend> makeBackend(Device device) {
  if (device == Device::kCpu) return std::make_unique<CpuBackend>();
#if CHORUS_HAVE_CUDA_BACKEND
  return makeCudaBackend();
#else
  throw Error(chorusInvalidUsage,
              "device \"cuda\": this build has no CUDA (nvcc was not found when it was configured)");
#endif
}

#if CHORUS_HAVE_CUDA_BACKEND
int useCudaDeviceOfRank(int rank);  // backend_cuda.cc
#endif

int useDeviceOfRank(Device device, int rank) {
  if (device == Device::kCpu) return 0;
#if CHORUS_HAVE_CUDA_BACKEND
  return useCudaDeviceOfRank(rank);
#else
  (void)rank;
  makeBackend(device);  // throws, naming what is missing
  return 0;
#endif
}

}  // namespace chorus::training
