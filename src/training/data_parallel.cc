// data_parallel.cc: buckets, the communication thread, and the four ZeRO stages.
//
// Layout. Units (embeddings, blocks, final norm) are grouped into buckets in the order backward
// finishes them (the final norm first, the embeddings last). A bucket is a contiguous flat range of
// `count` elements, padded to `padded` (a multiple of N ranks) so that rank r owns the slice
// [r * shard, (r + 1) * shard) of it. Arrays are either "full" (every bucket's padded range side by
// side) or "shard" (every bucket's own slice side by side):
//   stage 0 (DDP):  parameters full, gradients full, AdamW m and v full; all-reduce per bucket
//   stage 1:        parameters full, gradients full, m and v shard; reduce-scatter per bucket, the
//                   owner updates its slice, all-gather the parameters
//   stage 2:        parameters full, gradients shard (a bucket's whole gradient exists only while
//                   backward fills it and it is reduce-scattered), m and v shard
//   stage 3 (FSDP): everything shard; a unit's parameters are all-gathered before it is used,
//                   freed after, the next unit's gather started meanwhile.
#include "src/training/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>

#include "chorus/error.hpp"
#include "kernels/cpu/half.h"

namespace chorus::training {

// ---- the engine ----

DataParallel::DataParallel(const ParamLayout& layout, Communicator* comm, const DataParallelSettings& settings,
                           uint64_t seed)
    : layout_(layout),
      backend_(makeBackend(settings.device)),
      expertParallelSum_(settings.expertParallelSum),
      stage_(settings.zeroStage),
      inflightBuckets_(settings.inflightBuckets),
      modelParallelSum_(settings.modelParallelSum) {
  if (const char* delay = std::getenv("CHORUS_TRAIN_BACKWARD_DELAY_MS")) backwardDelayMs_ = std::atoi(delay);
  if (stage_ < 0 || stage_ > 3) {
    throw Error(chorusInvalidArgument, fmt::format("data parallel: ZeRO stage {} is not 0, 1, 2 or 3", stage_));
  }
  if (inflightBuckets_ < 1) {
    throw Error(chorusInvalidArgument,
                fmt::format("data parallel: {} buckets in flight (at least 1)", settings.inflightBuckets));
  }
  const size_t bucketBytes = settings.bucketBytes;
  const bool expertParallel = layout.ep() > 1;
  auto makeGroup = [&](Group& g, Communicator* c) {
    g.size = c ? c->size() : 1;
    g.rank = c ? c->rank() : 0;
    if (c != nullptr && g.size > 1) {
      g.worker = std::make_unique<CommWorker>(*c, CommWorker::delayFromEnvironment());
      if (settings.device != Device::kCpu) g.worker->run([this](Communicator&) { backend_->bindThread(); });
    }
  };
  makeGroup(groups_[kDense], comm);
  if (expertParallel) {
    makeGroup(groups_[kExperts], settings.expertComm);
    expertScale_ = 1.0f / static_cast<float>(layout.ep());
  }
  auto groupOfUnit = [&](int unit) { return expertParallel && layout.holdsExperts(unit) ? kExperts : kDense; };
  const int units = layout.units();
  unitBucket_.assign(units, -1);
  if (settings.tiedSum) {
    tiedUnit_ = layout.headUnit() >= 0 ? layout.headUnit() : layout.embeddingUnit();
    if (tiedUnit_ >= 0) {
      if (stage_ >= 2) {
        throw Error(chorusInvalidArgument,
                    fmt::format("data parallel: ZeRO stage {} reduces gradients per micro-batch, which pipeline "
                                "parallelism does not allow (its tied embedding is summed once per step); use 0 or 1",
                                stage_));
      }
      tiedSum_ = settings.tiedSum;
      for (const auto& t : layout.tensors()) {
        if (t.unit == tiedUnit_) {
          tiedFloats_ = t.count;  // the unit's first tensor: wte or lm_head
          break;
        }
      }
    }
  }
  // Backward finishes units in the order layers+1 (final norm), layers, ..., 1, then 0.
  std::vector<int> finishOrder;
  for (int u = units - 1; u >= 0; --u) finishOrder.push_back(u);
  for (size_t i = 0; i < finishOrder.size();) {
    Bucket b;
    b.lastUnit = b.firstUnit = finishOrder[i];
    b.group = groupOfUnit(b.firstUnit);
    size_t bytes = layout.unitCount(finishOrder[i]) * sizeof(float);
    ++i;
    while (stage_ != 3 && i < finishOrder.size() && b.firstUnit != tiedUnit_ && finishOrder[i] != tiedUnit_ &&
           groupOfUnit(finishOrder[i]) == b.group &&
           bytes + layout.unitCount(finishOrder[i]) * sizeof(float) <= bucketBytes) {
      b.firstUnit = finishOrder[i];
      bytes += layout.unitCount(finishOrder[i]) * sizeof(float);
      ++i;
    }
    b.lo = layout.unitOffset(b.firstUnit);
    b.count = layout.unitOffset(b.lastUnit) + layout.unitCount(b.lastUnit) - b.lo;
    const size_t N = static_cast<size_t>(groups_[b.group].size);
    b.padded = (b.count + N - 1) / N * N;
    b.shard = b.padded / N;
    b.fullOffset = fullTotal_;
    b.shardOffset = shardTotal_;
    fullTotal_ += b.padded;
    shardTotal_ += b.shard;
    for (int u = b.firstUnit; u <= b.lastUnit; ++u) unitBucket_[u] = static_cast<int>(buckets_.size());
    buckets_.push_back(std::move(b));
  }

  const bool paramsInFile = settings.offload.params == OffloadTarget::kFile;
  if (paramsInFile && (stage_ != 3 || settings.offload.optimizer != OffloadTarget::kFile)) {
    throw Error(chorusInvalidArgument,
                fmt::format("data parallel: parameters offloaded to a file with ZeRO-{} and the optimizer state in {}: "
                            "the file holds ZeRO-3's parameter shard beside the optimizer state, so ZeRO-3 with the "
                            "optimizer state offloaded to the file too",
                            stage_, offloadTargetName(settings.offload.optimizer)));
  }
  // The optimizer state offloaded from a device: the step runs on the host beside it.
  if (onDevice() && settings.offload.optimizer != OffloadTarget::kNone) hostStepper_ = makeBackend(Device::kCpu);
  params_ = Buffer<float>(*backend_, paramsInFile ? 0 : stage_ == 3 ? shardTotal_ : fullTotal_);
  grads_ = Buffer<float>(*backend_, stage_ >= 2 ? shardTotal_ : fullTotal_);
  optimizer_ = settings.optimizer;
  int arrays = 0;
  if (paramsInFile) stateParams_ = arrays++;
  stateM_ = arrays++;
  if (optimizer_ == kernels::Optimizer::kAdamW) stateV_ = arrays++;
  state_ = makeStateStore(settings.offload.optimizer, settings.offload, arrays, stage_ >= 1 ? shardTotal_ : fullTotal_,
                          settings.offloadFile, backend_.get());
  reduceBf16_ = settings.reduceBf16;
  localSteps_ = settings.localSteps;
  stepInBackward_ = settings.stepInBackward;
  if (stepInBackward_ && (tiedUnit_ >= 0 || localSteps_ || paramsInFile)) {
    throw Error(chorusInvalidArgument,
                fmt::format("data parallel: the optimizer step during backward with {}",
                            tiedUnit_ >= 0 ? "pipeline parallelism (its tied embedding is summed after backward)"
                            : localSteps_  ? "local steps (each rank steps on its own gradient after backward)"
                                           : "ZeRO-3's parameters in a file (backward's gathers read the file the "
                                             "step writes)"));
  }
  if (localSteps_ && (stage_ != 0 || expertParallel)) {
    throw Error(chorusInvalidArgument,
                fmt::format("data parallel: local steps (local SGD, DiLoCo) with ZeRO-{}{}: each rank keeps the whole "
                            "optimizer state and its own experts' copy, so ZeRO 0 without expert parallelism only",
                            stage_, expertParallel ? " and expert parallelism" : ""));
  }
  if (reduceBf16_ && !settings.compressor.empty() && settings.compressor != "none") {
    throw Error(chorusInvalidArgument,
                fmt::format("data parallel: gradients reduced in bf16 and compressed by '{}' at once; choose one",
                            settings.compressor));
  }
  // Each bucket's own parameters, initialised on the host and placed where they live.
  std::vector<float> initial;
  for (auto& b : buckets_) {
    if (stage_ == 3) {
      const size_t rank = static_cast<size_t>(groupOf(b).rank);
      const size_t lo = b.lo + std::min(b.count, rank * b.shard);
      const size_t hi = b.lo + std::min(b.count, (rank + 1) * b.shard);
      initial.assign(b.shard, 0.0f);
      layout.initialize(seed, initial.data(), lo, hi);
      if (paramsInFile) {
        state_->write(stateParams_, b.shardOffset, b.shard, initial.data());
      } else {
        backend_->fromHost(params_.data() + b.shardOffset, initial.data(), b.shard * sizeof(float));
      }
    } else {
      initial.assign(b.count, 0.0f);
      layout.initialize(seed, initial.data(), b.lo, b.lo + b.count);
      backend_->fromHost(params_.data() + b.fullOffset, initial.data(), b.count * sizeof(float));
    }
  }
  // ZeRO-3's order of acquire calls in one training micro-batch (see UnitAccess).
  if (stage_ == 3) {
    if (layout.spans().size() != 1) {
      throw Error(chorusInvalidArgument,
                  fmt::format("data parallel: ZeRO-3 prefetches one span of layers; this rank holds {} (virtual "
                              "pipeline stages)",
                              layout.spans().size()));
    }
    const auto order = layout.accessOrder();
    order_ = order.units;
    forwardLength_ = order.forwardLength;
  }
  if (!settings.compressor.empty() && settings.compressor != "none") {
    if (expertParallel) {
      throw Error(chorusInvalidArgument,
                  fmt::format("data parallel: gradient compression ({}) with expert parallelism (ep {}): the "
                              "compressors hold one group's error feedback; use one or the other",
                              settings.compressor, layout.ep()));
    }
    if (stage_ != 0) {
      throw Error(chorusInvalidArgument,
                  fmt::format("data parallel: gradient compression ({}) with ZeRO stage {}: compressed gradients are "
                              "all-reduced, which ZeRO's reduce-scatter replaces; use ZeRO 0",
                              settings.compressor, stage_));
    }
    compressFrom_ = settings.compressFrom;
    // One compressor per bucket, over the bucket's tensors (PowerSGD views each as rows x the rest).
    std::vector<std::vector<size_t>> counts(buckets_.size()), rows(buckets_.size());
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const Bucket& b = buckets_[i];
      size_t covered = 0;
      for (const auto& t : layout.tensors()) {
        if (t.offset < b.lo || t.offset >= b.lo + b.count) continue;
        counts[i].push_back(t.count);
        rows[i].push_back(t.shape.size() >= 2 ? static_cast<size_t>(t.shape[0]) : 1);
        covered += t.count;
      }
      if (covered != b.count) {  // not whole tensors back to back: one vector
        counts[i] = {b.count};
        rows[i] = {1};
      }
    }
    auto make = [&](Communicator& c) {
      for (size_t i = 0; i < buckets_.size(); ++i)
        compressors_.emplace_back(c, settings.compressor, counts[i], rows[i]);
    };
    if (Group& dense = groups_[kDense]; dense.worker) {
      dense.worker->run(make);
    } else if (comm != nullptr) {
      make(*comm);  // one rank: nothing is sent, but the spec is checked and the compressors exist
    }
  }
  state_->prefetch();  // the first step's state, read during the first forward and backward
}

uint64_t DataParallel::wireBytes() {
  uint64_t bytes = 0;
  for (Group& g : groups_) {
    if (g.worker) g.worker->run([&](Communicator& c) { bytes += c.traffic().bytesSent; });
  }
  return bytes;
}

uint64_t DataParallel::compressionPayloadBytes() {
  uint64_t bytes = 0;
  for (const Compressor& c : compressors_) bytes += c.info().payloadBytes;
  return bytes;
}

std::vector<double> DataParallel::compressionRatios() {
  std::vector<double> ratios;
  for (const Compressor& c : compressors_) ratios.push_back(c.info().ratio);
  return ratios;
}

DataParallel::~DataParallel() {
  if (armed_ && armed_->thread.joinable()) {  // a step armed and never taken (backward failed): let it go
    {
      std::lock_guard<std::mutex> lock(stepMutex_);
      armed_->ready.assign(armed_->ready.size(), 2);
    }
    stepReady_.notify_all();
    armed_->thread.join();
  }
  // Outstanding collectives finish before their buffers go.
  for (auto& b : buckets_) {
    if (b.reduction.valid()) b.reduction.wait();
    if (b.gather.valid()) b.gather.wait();
  }
  for (Group& g : groups_) g.worker.reset();
}

void DataParallel::trackTransient(long delta) {
  std::lock_guard<std::mutex> lock(transientMutex_);
  transientNow_ = static_cast<size_t>(static_cast<long>(transientNow_) + delta);
  transientPeak_ = std::max(transientPeak_, transientNow_);
}

void DataParallel::beginMicro(bool last, bool eval) {
  lastMicro_ = last;
  eval_ = eval;
  orderAt_ = 0;
  for (auto& b : buckets_) b.unitsLeft = b.lastUnit - b.firstUnit + 1;
  if (!eval) ++microsBegun_;
  unitsLeftInMicro_ = layout_.units();
}

int DataParallel::nextInOrder() const {
  const size_t end = eval_ ? forwardLength_ : order_.size();
  return orderAt_ < end ? order_[orderAt_] : -1;
}

int DataParallel::laneOf(const Bucket& b) { return b.group == kDense ? Backend::kDenseLane : Backend::kExpertDataLane; }

CommWorker::Task DataParallel::deviceTask(const Bucket& b, Backend::Mark ready, Backend::Mark* done,
                                          std::function<void(Communicator&, chorusStream_t)> call) {
  const int lane = laneOf(b);
  return
      [this, lane, ready = std::move(ready), done, call = std::move(call)](Communicator& c) -> std::optional<Request> {
        backend_->wait(Backend::Queue::kComm, ready, lane);
        call(c, static_cast<chorusStream_t>(backend_->stream(Backend::Queue::kComm, lane)));
        *done = backend_->mark(Backend::Queue::kComm, lane);
        return std::nullopt;
      };
}

void DataParallel::startGather(Bucket& b) {
  if (!b.gathered.empty() || b.gather.valid()) return;
  b.gathered = Buffer<float>(*backend_, b.padded);
  trackTransient(static_cast<long>(b.padded * sizeof(float)));
  CommWorker* worker = groupOf(b).worker.get();
  const size_t count = b.shard, from = b.shardOffset;
  if (!worker) {
    if (stateParams_ >= 0 && onDevice()) {  // read on the host, copied up
      std::vector<float> shard(count);
      state_->read(stateParams_, from, count, shard.data());
      backend_->fromHost(b.gathered.data(), shard.data(), count * sizeof(float));
    } else if (stateParams_ >= 0) {
      state_->read(stateParams_, from, count, b.gathered.data());
    } else {
      backend_->copy(b.gathered.data(), params_.data() + from, count * sizeof(float));
    }
    return;
  }
  float* out = b.gathered.data();
  if (onDevice() && stateParams_ >= 0) {
    // The shard in a file: the communication thread reads it, copies it up on its own stream (the
    // device collectives take device memory only) and gathers from there, while backward goes on.
    b.gatherSource.assign(count, 0.0f);
    b.gatherShard = Buffer<float>(*backend_, count);
    trackTransient(static_cast<long>(2 * count * sizeof(float)));
    float *host = b.gatherSource.data(), *shard = b.gatherShard.data();
    const StateStore* store = state_.get();
    b.gather = worker->submit(
        deviceTask(b, backend_->mark(Backend::Queue::kCompute), &b.gatheredMark,
                   [this, store, array = stateParams_, from, count, host, shard, out, lane = laneOf(b)](
                       Communicator& c, chorusStream_t stream) {
                     store->read(array, from, count, host);
                     backend_->fromHostOn(Backend::Queue::kComm, shard, host, count * sizeof(float), lane);
                     c.allGather(std::span<const float>(shard, count), std::span<float>(out, count * c.size()), stream);
                   }));
    return;
  }
  if (onDevice()) {  // after the step that wrote the shard, on the communication queue
    const float* shard = params_.data() + from;
    b.gather = worker->submit(deviceTask(b, backend_->mark(Backend::Queue::kCompute), &b.gatheredMark,
                                         [shard, out, count](Communicator& c, chorusStream_t stream) {
                                           c.allGather(std::span<const float>(shard, count),
                                                       std::span<float>(out, count * c.size()), stream);
                                         }));
    return;
  }
  // With the shard in a file, the communication thread reads it first (outside the step's pass).
  const float* shard = params_.data() + from;
  const StateStore* store = nullptr;
  if (stateParams_ >= 0) {
    b.gatherSource.assign(count, 0.0f);
    trackTransient(static_cast<long>(count * sizeof(float)));
    shard = b.gatherSource.data();
    store = state_.get();
  }
  const int array = stateParams_;
  b.gather = worker->submit([shard, out, count, from, store, array](Communicator& c) -> std::optional<Request> {
    if (store) store->read(array, from, count, const_cast<float*>(shard));
    return c.iallGather(std::span<const float>(shard, count), std::span<float>(out, count * c.size()));
  });
}

void DataParallel::waitGather(Bucket& b) {
  startGather(b);
  finishGather(b);
}

void DataParallel::finishGather(Bucket& b) {
  if (b.gather.valid()) b.gather.get();
  if (b.gatheredMark) backend_->wait(Backend::Queue::kCompute, std::exchange(b.gatheredMark, nullptr));
  if (!b.gatherShard.empty()) {  // released behind the gather (the compute queue waits for its mark)
    trackTransient(-static_cast<long>(b.gatherShard.size() * sizeof(float)));
    b.gatherShard = {};
  }
  if (!b.gatherSource.empty()) {
    trackTransient(-static_cast<long>(b.gatherSource.size() * sizeof(float)));
    std::vector<float>().swap(b.gatherSource);
  }
}

const float* DataParallel::acquire(int unit, Pass /*pass*/) {
  Bucket& b = bucketOf(unit);
  const size_t within = layout_.unitOffset(unit) - b.lo;
  if (stage_ != 3) return params_.data() + b.fullOffset + within;
  waitGather(b);
  ++orderAt_;
  // Prefetch: the next unit in the order that differs from this one.
  for (size_t k = orderAt_; k < order_.size(); ++k) {
    if (eval_ && k >= forwardLength_) break;
    if (order_[k] != unit) {
      startGather(bucketOf(order_[k]));
      break;
    }
  }
  return b.gathered.data() + within;
}

void DataParallel::release(int unit, Pass /*pass*/) {
  if (stage_ != 3) return;
  if (nextInOrder() == unit) return;  // used again right away (the head, forward then backward)
  Bucket& b = bucketOf(unit);
  trackTransient(-static_cast<long>(b.gathered.size() * sizeof(float)));
  b.gathered = {};
}

float* DataParallel::gradients(int unit) {
  Bucket& b = bucketOf(unit);
  const size_t within = layout_.unitOffset(unit) - b.lo;
  if (stage_ < 2) return grads_.data() + b.fullOffset + within;
  if (b.reduction.valid()) {
    // The previous micro-batch's reduction of this bucket: until it is finished the whole gradient
    // is the reduction's (its slice added to the shard gradient, then freed). The tied embedding's
    // bucket, reduced last, is the first the next backward asks for (the output layer's gradient).
    finishReduction(b);
    std::erase(pendingWholeGrads_, static_cast<int>(&b - buckets_.data()));
  }
  if (b.transientGrad.empty()) {
    // Bound the whole gradients alive: wait for the oldest reductions beyond the cap.
    while (static_cast<int>(pendingWholeGrads_.size()) >= inflightBuckets_) {
      Bucket& oldest = buckets_[pendingWholeGrads_.front()];
      pendingWholeGrads_.pop_front();
      finishReduction(oldest);
    }
    b.transientGrad = Buffer<float>(*backend_, b.padded);
    trackTransient(static_cast<long>(b.padded * sizeof(float)));
  }
  return b.transientGrad.data() + within;
}

void DataParallel::gradientsDone(int unit) {
  Bucket& b = bucketOf(unit);
  if (--unitsLeftInMicro_ == 0) backwardsEnded_.fetch_add(1, std::memory_order_release);
  if (--b.unitsLeft == 0 && (stage_ >= 2 || lastMicro_) && unit != tiedUnit_) reduceBucket(b);
  if (armed_ && lastMicro_ && onDevice()) stepEnqueued();
  if (backwardDelayMs_ > 0 && unitsLeftInMicro_ > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(backwardDelayMs_));
}

std::function<void()> DataParallel::countOverlap() {
  const long micro = microsBegun_;
  return [this, micro] {
    reductions_.fetch_add(1, std::memory_order_relaxed);
    if (backwardsEnded_.load(std::memory_order_acquire) < micro) overlapped_.fetch_add(1, std::memory_order_relaxed);
  };
}

void DataParallel::reduceBucket(Bucket& b) {
  b.reduced = true;
  CommWorker* worker = groupOf(b).worker.get();
  // stepInBackward: the step's last reduction of the bucket tells the step thread when it is done.
  const size_t index = static_cast<size_t>(&b - buckets_.data());
  // On a device the training thread enqueues the steps itself (stepEnqueued): the bucket is marked here.
  const bool armedNow = armed_.has_value() && lastMicro_;
  const bool tell = armedNow && !onDevice();
  if (armedNow && onDevice()) armed_->ready[index] = 1;
  auto ready = [this, index, tell] {
    if (tell) bucketReady(index);
  };
  if (b.group == kExperts) {  // see DataParallelSettings::expertComm
    float* g = stage_ < 2 ? grads_.data() + b.fullOffset : b.transientGrad.data();
    backend_->scale(g, b.count, expertScale_);
  }
  if (stage_ < 2) {
    if (!worker || localSteps_) {  // local steps: each rank's own gradient
      ready();
      return;
    }
    float* g = grads_.data() + b.fullOffset;
    if (compressing()) {
      Compressor* compressor = &compressors_[index];
      const size_t count = b.count;
      if (onDevice()) {  // staged through the host by chorus (the compressors work there)
        b.reduction = worker->submit(
            deviceTask(b, backend_->mark(Backend::Queue::kCompute), &b.reducedMark,
                       [g, count, compressor, tally = countOverlap()](Communicator& c, chorusStream_t stream) {
                         tally();
                         compressor->allReduce(std::span<float>(g, count), c, ReduceOp::kAvg, stream);
                       }));
        return;
      }
      b.reduction = worker->submit(
          [g, count, compressor, tally = countOverlap()](Communicator& c) -> std::optional<Request> {
            tally();
            compressor->allReduce(std::span<float>(g, count), c, ReduceOp::kAvg);  // blocking, on this thread
            return std::nullopt;
          },
          ready);
      return;
    }
    // ZeRO-0 averages the bucket in place; ZeRO-1 puts this rank's slice of the average in place.
    b.reduction =
        submitReduction(b, g, stage_ == 1 ? g + static_cast<size_t>(groupOf(b).rank) * b.shard : nullptr, ready);
    return;
  }
  // ZeRO-2/3: reduce-scatter the bucket's whole gradient, add this rank's slice into the shard
  // gradient (micro-batches accumulate there), free the whole.
  float* whole = b.transientGrad.data();
  float* own = whole + static_cast<size_t>(groupOf(b).rank) * b.shard;
  float* acc = grads_.data() + b.shardOffset;
  const size_t shard = b.shard;
  Bucket* bucket = &b;
  auto accumulate = [this, own, acc, shard, bucket, ready] {
    backend_->residualForward(acc, acc, own, shard);
    trackTransient(-static_cast<long>(bucket->transientGrad.size() * sizeof(float)));
    bucket->transientGrad = {};
    ready();
  };
  if (!worker) {
    accumulate();
    return;
  }
  pendingWholeGrads_.push_back(static_cast<int>(&b - buckets_.data()));
  b.reduction = submitReduction(b, whole, own, accumulate);
}

std::future<void> DataParallel::submitReduction(Bucket& b, float* g, float* out, std::function<void()> then) {
  CommWorker* worker = groupOf(b).worker.get();
  const size_t padded = b.padded, shard = b.shard;
  const bool scatter = out != nullptr;
  const size_t at = scatter ? static_cast<size_t>(out - g) : 0;  // this rank's slice, within g
  // In fp32 on g, or (reduceBf16) in bf16 on the bucket's 16-bit copy: cast from g first, the
  // result widened into place after; the copy lives only meanwhile. On the CPU the cast and the
  // widening run on the worker (backward has moved on; the CPU backend's casts keep no scratch), on
  // a device on the compute queue, in order with the kernels; `then` follows the widening.
  Bucket* bucket = &b;
  auto cast = [this, bucket, g, padded] {
    bucket->half = Buffer<uint16_t>(*backend_, padded);
    trackTransient(static_cast<long>(padded * sizeof(uint16_t)));
    backend_->toFloat16(kernels::Float16::kBf16, g, bucket->half.data(), padded);
    return reinterpret_cast<BFloat16*>(bucket->half.data());
  };
  if (reduceBf16_) {
    then = [this, bucket, g, at, padded, shard, scatter, then = std::move(then)] {
      backend_->fromFloat16(kernels::Float16::kBf16, bucket->half.data() + at, g + at, scatter ? shard : padded);
      trackTransient(-static_cast<long>(padded * sizeof(uint16_t)));
      bucket->half = {};
      if (then) then();
    };
  }
  if (onDevice()) {  // enqueued after backward's kernels so far; `then` follows on the compute queue
    auto reduceIn = [padded, shard, at, scatter, count = countOverlap()](auto* data) {
      return [=](Communicator& c, chorusStream_t stream) {
        using T = std::remove_pointer_t<decltype(data)>;
        count();
        if (!scatter) {
          c.allReduce(std::span<T>(data, padded), ReduceOp::kAvg, stream);
        } else {
          c.reduceScatter(std::span<const T>(data, padded), std::span<T>(data + at, shard), ReduceOp::kAvg, stream);
        }
      };
    };
    b.afterReduction = std::move(then);
    if (reduceBf16_) {
      BFloat16* h = cast();
      return worker->submit(deviceTask(b, backend_->mark(Backend::Queue::kCompute), &b.reducedMark, reduceIn(h)));
    }
    return worker->submit(deviceTask(b, backend_->mark(Backend::Queue::kCompute), &b.reducedMark, reduceIn(g)));
  }
  auto reduceIn = [padded, shard, at, scatter](auto* data, Communicator& c) {
    using T = std::remove_pointer_t<decltype(data)>;
    if (!scatter) return c.iallReduce(std::span<T>(data, padded), ReduceOp::kAvg);
    return c.ireduceScatter(std::span<const T>(data, padded), std::span<T>(data + at, shard), ReduceOp::kAvg);
  };
  return worker->submit(
      [this, g, cast, reduceIn, count = countOverlap()](Communicator& c) -> std::optional<Request> {
        count();
        return reduceBf16_ ? reduceIn(cast(), c) : reduceIn(g, c);
      },
      std::move(then));
}

void DataParallel::finishReduction(Bucket& b) {
  if (!b.reduction.valid()) return;
  b.reduction.get();
  if (b.reducedMark) backend_->wait(Backend::Queue::kCompute, std::exchange(b.reducedMark, nullptr));
  if (b.afterReduction) std::exchange(b.afterReduction, nullptr)();
}

void DataParallel::waitReductions() {
  for (auto& b : buckets_) finishReduction(b);
  pendingWholeGrads_.clear();
}

void DataParallel::anchorParameters() {
  if (!localSteps_) throw Error(chorusInvalidUsage, "data parallel: an anchor without local steps");
  anchor_ = Buffer<float>(*backend_, params_.size());
  backend_->copy(anchor_.data(), params_.data(), params_.size() * sizeof(float));
  outerMomentum_ = Buffer<float>(*backend_, params_.size());
  delta_ = Buffer<float>(*backend_, params_.size());
}

void DataParallel::outerMomentum(std::vector<float>& flat) const {
  flat.assign(layout_.total(), 0.0f);
  if (outerMomentum_.size() != params_.size()) throw Error(chorusInvalidUsage, "data parallel: no outer momentum");
  for (const auto& b : buckets_) {
    backend_->toHost(flat.data() + b.lo, outerMomentum_.data() + b.fullOffset, b.count * sizeof(float));
  }
}

void DataParallel::loadOuterMomentum(const std::vector<float>& flat) {
  if (outerMomentum_.size() != params_.size() || flat.size() != layout_.total()) {
    throw Error(chorusInvalidUsage, fmt::format("data parallel: an outer momentum of {} elements for a model of {} "
                                                "(anchorParameters() first)",
                                                flat.size(), layout_.total()));
  }
  for (const auto& b : buckets_) {
    backend_->fromHost(outerMomentum_.data() + b.fullOffset, flat.data() + b.lo, b.count * sizeof(float));
  }
}

void DataParallel::syncParameters(const kernels::OptimizerSettings* outer, long outerStep) {
  if (!localSteps_) throw Error(chorusInvalidUsage, "data parallel: syncParameters without local steps");
  if (outer != nullptr && anchor_.size() != params_.size()) {
    throw Error(chorusInvalidUsage, "data parallel: an outer step before anchorParameters()");
  }
  if (outer != nullptr) {
    // The outer gradient: how far this rank moved from the anchor, anchor + (-params) (padding stays 0).
    backend_->copy(delta_.data(), params_.data(), params_.size() * sizeof(float));
    backend_->scale(delta_.data(), delta_.size(), -1.0f);
    backend_->residualForward(delta_.data(), anchor_.data(), delta_.data(), delta_.size());
  }
  const Backend::Mark ready = onDevice() ? backend_->mark(Backend::Queue::kCompute) : nullptr;
  float* x = outer != nullptr ? delta_.data() : params_.data();
  for (auto& b : buckets_) {
    CommWorker* worker = groupOf(b).worker.get();
    if (!worker) continue;
    float* at = x + b.fullOffset;
    const size_t padded = b.padded, count = b.count;
    if (outer != nullptr && compressing()) {  // DiLoCo's delta through the bucket's compressor
      Compressor* compressor = &compressors_[static_cast<size_t>(&b - buckets_.data())];
      if (onDevice()) {
        b.reduction = worker->submit(
            deviceTask(b, ready, &b.reducedMark, [at, count, compressor](Communicator& c, chorusStream_t stream) {
              compressor->allReduce(std::span<float>(at, count), c, ReduceOp::kAvg, stream);
            }));
        continue;
      }
      b.reduction = worker->submit([at, count, compressor](Communicator& c) -> std::optional<Request> {
        compressor->allReduce(std::span<float>(at, count), c, ReduceOp::kAvg);  // blocking, on this thread
        return std::nullopt;
      });
      continue;
    }
    if (onDevice()) {
      b.reduction =
          worker->submit(deviceTask(b, ready, &b.reducedMark, [at, padded](Communicator& c, chorusStream_t stream) {
            c.allReduce(std::span<float>(at, padded), ReduceOp::kAvg, stream);
          }));
      continue;
    }
    b.reduction = worker->submit([at, padded](Communicator& c) -> std::optional<Request> {
      return c.iallReduce(std::span<float>(at, padded), ReduceOp::kAvg);
    });
  }
  waitReductions();
  if (outer == nullptr) return;
  kernels::OptimizerSettings s = *outer;
  s.weightDecay = 0.0f;
  if (s.kind == kernels::Optimizer::kSgd) {
    backend_->sgdStep(anchor_.data(), delta_.data(), outerMomentum_.data(), anchor_.size(), outerStep, s);
  } else {
    throw Error(chorusInvalidArgument, "data parallel: DiLoCo's outer optimizer is SGD (with Nesterov momentum)");
  }
  backend_->copy(params_.data(), anchor_.data(), anchor_.size() * sizeof(float));
}

double DataParallel::average(double value) { return averageOver(groups_[kDense], value); }

double DataParallel::averageOver(Group& g, double value) {
  if (!g.worker) return value;
  g.worker->run([&value](Communicator& c) { c.allReduce(std::span<double>(&value, 1), ReduceOp::kAvg); });
  return value;
}

void DataParallel::sumOverRanks(std::vector<double>& values) {
  CommWorker* worker = groups_[kDense].worker.get();
  if (!worker) return;
  worker->run([&values](Communicator& c) { c.allReduce(std::span<double>(values), ReduceOp::kSum); });
}

DataParallel::Own DataParallel::ownOf(const Bucket& b) const {
  Own o;
  if (stage_ == 0) {
    o.lo = b.lo;
    o.hi = b.lo + b.count;
    o.p = o.g = o.mv = b.fullOffset;
    return o;
  }
  const size_t rank = static_cast<size_t>(groupOf(b).rank);
  const size_t start = std::min(b.count, rank * b.shard);
  o.lo = b.lo + start;
  o.hi = b.lo + std::min(b.count, (rank + 1) * b.shard);
  const size_t inFull = b.fullOffset + start;
  o.p = stage_ == 3 ? b.shardOffset : inFull;
  o.g = stage_ >= 2 ? b.shardOffset : inFull;
  o.mv = b.shardOffset;
  return o;
}

void DataParallel::eachTensorPart(const Bucket& b,
                                  const std::function<void(const ParamTensor&, const Own&, size_t, size_t)>& fn) {
  const Own o = ownOf(b);
  for (const auto& t : layout_.tensors()) {
    const size_t lo = std::max(o.lo, t.offset), hi = std::min(o.hi, t.offset + t.count);
    if (lo < hi) fn(t, o, lo - o.lo, hi - lo);
  }
}

double DataParallel::gradientSquares(const Bucket& b) {
  double squares = 0.0;
  eachTensorPart(b, [&](const ParamTensor& t, const Own& o, size_t d, size_t n) {
    if (t.counted) squares += backend_->sumOfSquares(grads_.data() + o.g + d, n);
  });
  return squares;
}

void DataParallel::stepBucket(const Bucket& b, const kernels::OptimizerSettings& optimizer, long updates) {
  // The step computes where the optimizer state is: on the device with it, or on the host when it
  // is offloaded there (the bucket's own parameters and gradients come over, the parameters go back).
  Backend& stepper = hostStepper_ ? *hostStepper_ : *backend_;
  const Own own = ownOf(b);
  float* params = params_.data() + own.p;
  const float* grads = grads_.data() + own.g;
  // (ZeRO-3's parameters in a file are in the state's runs, on the host already.)
  const bool paramsOver = hostStepper_ && stateParams_ < 0;
  if (hostStepper_) {
    const size_t count = own.hi - own.lo;
    stagedGrads_.resize(count);
    backend_->toHost(stagedGrads_.data(), grads, count * sizeof(float));
    grads = stagedGrads_.data();
  }
  if (paramsOver) {
    stagedParams_.resize(stagedGrads_.size());
    backend_->toHost(stagedParams_.data(), params, stagedParams_.size() * sizeof(float));
    params = stagedParams_.data();
  }
  eachTensorPart(b, [&](const ParamTensor& t, const Own& o, size_t d, size_t n) {
    auto s = optimizer;
    if (!t.decay) s.weightDecay = 0.0f;
    for (size_t done = 0; done < n;) {
      const StateStore::Run run = state_->at(o.mv + d + done);
      const size_t k = std::min(n - done, run.count);
      float* param = stateParams_ >= 0 ? run.array[stateParams_] : params + d + done;
      const float* grad = grads + d + done;
      if (optimizer_ == kernels::Optimizer::kSgd) {
        stepper.sgdStep(param, grad, run.array[stateM_], k, updates, s);
      } else {
        stepper.adamwStep(param, grad, run.array[stateM_], run.array[stateV_], k, updates, s);
      }
      done += k;
    }
  });
  if (paramsOver)
    backend_->fromHost(params_.data() + own.p, stagedParams_.data(), stagedParams_.size() * sizeof(float));
}

void DataParallel::armStep(const kernels::OptimizerSettings& optimizer, long stepNumber, long skipped) {
  if (!stepInBackward_) {
    throw Error(chorusInvalidUsage, "data parallel: armStep() without stepInBackward in the settings");
  }
  if (armed_) throw Error(chorusInvalidUsage, fmt::format("data parallel: step {} armed twice", stepNumber));
  if (optimizer.kind != optimizer_) {
    throw Error(chorusInvalidUsage, "data parallel: armStep() with another optimizer than the one it was made for");
  }
  armed_.emplace();
  armed_->optimizer = optimizer;
  armed_->step = stepNumber;
  armed_->updates = stepNumber - skipped;
  armed_->ready.assign(buckets_.size(), 0);
  armed_->micro = microsBegun_;
  if (!onDevice()) armed_->thread = std::thread([this] { stepInOrder(); });
}

void DataParallel::bucketReady(size_t i) {
  {
    std::lock_guard<std::mutex> lock(stepMutex_);
    armed_->ready[i] = 1;
  }
  stepReady_.notify_all();
}

// The step thread: buckets in their order (the order backward finishes them, and the order the
// optimizer state is laid out in), each as soon as its gradient is final. ready 2: given up.
void DataParallel::stepInOrder() {
  try {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      {
        std::unique_lock<std::mutex> lock(stepMutex_);
        stepReady_.wait(lock, [&] { return armed_->ready[i] != 0; });
        if (armed_->ready[i] == 2) return;
      }
      const Bucket& b = buckets_[i];
      armed_->squares[b.group] += gradientSquares(b);
      stepArmed(b);
    }
    state_->finish();
  } catch (...) {
    armed_->error = std::current_exception();
  }
}

void DataParallel::stepArmed(const Bucket& b) {
  bucketSteps_.fetch_add(1, std::memory_order_relaxed);
  if (backwardsEnded_.load(std::memory_order_acquire) < armed_->micro) {
    bucketStepsOverlapped_.fetch_add(1, std::memory_order_relaxed);
  }
  stepBucket(b, armed_->optimizer, armed_->updates);
}

// A bucket whose reduction the communication thread has not enqueued yet ends the pass: the
// training thread does not wait here (the rest follow at the next bucket's end, or in step()).
void DataParallel::stepEnqueued() {
  ArmedStep& a = *armed_;
  while (a.next < buckets_.size() && a.ready[a.next] != 0) {
    Bucket& b = buckets_[a.next];
    if (b.reduction.valid() && b.reduction.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    finishReduction(b);  // the reduction's mark waited for and what follows it enqueued, before the step's kernels
    stepArmed(b);
    ++a.next;
  }
}

double DataParallel::step(const kernels::OptimizerSettings& optimizer, long stepNumber, float clipNorm, float gradScale,
                          long skipped) {
  const long updates = stepNumber - skipped;  // the optimizer's own count (bias correction, SGD's first step)
  if (optimizer.kind != optimizer_) {
    throw Error(chorusInvalidUsage, "data parallel: step() with another optimizer than the one it was made for");
  }
  // ZeRO-0/1: the buckets no last micro-batch finished (a pipeline's other chunks, the tied
  // embedding, summed over the pipeline's ends first).
  if (stage_ < 2) {
    for (int u = layout_.units() - 1; u >= 0; --u) {
      Bucket& b = bucketOf(u);
      if (b.reduced) continue;
      if (u == tiedUnit_)
        tiedSum_(std::span<float>(grads_.data() + b.fullOffset + layout_.unitOffset(u) - b.lo, tiedFloats_));
      reduceBucket(b);
    }
  }
  waitReductions();
  for (auto& b : buckets_) b.reduced = false;
  double groupSquares[2] = {0.0, 0.0};
  const bool stepped = armed_.has_value();
  if (stepped) {  // stepInBackward: the buckets stepped as they came; their squares were taken before
    if (optimizer.lr != armed_->optimizer.lr || stepNumber != armed_->step || updates != armed_->updates ||
        clipNorm != 0.0f || gradScale != 1.0f) {
      throw Error(chorusInvalidUsage,
                  fmt::format("data parallel: step({}) with lr {}, clip {}, scale {} where step {} was armed with lr "
                              "{}: a step taken during backward is neither clipped nor scaled",
                              stepNumber, optimizer.lr, clipNorm, gradScale, armed_->step, armed_->optimizer.lr));
    }
    if (onDevice()) {
      // The buckets backward left: every reduction is enqueued and followed by now. The squares
      // after every step (the steps leave the gradients as they were), so that no bucket's waited
      // for during backward.
      for (; armed_->next < buckets_.size(); ++armed_->next) stepArmed(buckets_[armed_->next]);
      armed_.reset();
      state_->finish();
      for (const auto& b : buckets_) groupSquares[b.group] += gradientSquares(b);
    } else {
      armed_->thread.join();
      const std::exception_ptr error = armed_->error;
      groupSquares[kDense] = armed_->squares[kDense];
      groupSquares[kExperts] = armed_->squares[kExperts];
      armed_.reset();
      if (error) std::rethrow_exception(error);
    }
  } else {
    if (gradScale != 1.0f) {
      for (const auto& b : buckets_) {
        const Own o = ownOf(b);
        backend_->scale(grads_.data() + o.g, o.hi - o.lo, 1.0f / gradScale);
      }
    }
    for (const auto& b : buckets_) groupSquares[b.group] += gradientSquares(b);
  }
  // The global gradient norm: each rank's own elements, summed over the group's ranks when sharded,
  // the experts' over the ep group (each rank holds others), then all over the model-parallel
  // ranks (of the tensors replicated there, one rank's count).
  for (int g = kDense; g <= kExperts; ++g) {
    if (stage_ >= 1) groupSquares[g] = averageOver(groups_[g], groupSquares[g]) * groups_[g].size;
  }
  if (layout_.ep() > 1 && expertParallelSum_) groupSquares[kExperts] = expertParallelSum_(groupSquares[kExperts]);
  double squares = groupSquares[kDense] + groupSquares[kExperts];
  if (modelParallelSum_) squares = modelParallelSum_(squares);
  const double norm = std::sqrt(squares);
  if (!stepped) {
    if (!std::isfinite(norm)) {  // every rank sees the same norm, so every rank skips
      backend_->zero(grads_.data(), grads_.size() * sizeof(float));
      nextStep_ = stepNumber + 1;
      return norm;
    }
    if (clipNorm > 0.0f && norm > clipNorm) {
      const float factor = static_cast<float>(clipNorm / (norm + 1e-6));
      for (const auto& b : buckets_) {
        const Own o = ownOf(b);
        backend_->scale(grads_.data() + o.g, o.hi - o.lo, factor);
      }
    }
    // One pass over the optimizer state, in increasing order (buckets and tensors are laid out in
    // the order visited), a run of resident elements at a time.
    for (const auto& b : buckets_) stepBucket(b, optimizer, updates);
    state_->finish();
  }

  // ZeRO-1/2: every rank's updated slice to everyone.
  if (stage_ == 1 || stage_ == 2) {
    const Backend::Mark stepped = onDevice() ? backend_->mark(Backend::Queue::kCompute) : nullptr;
    for (auto& b : buckets_) {
      CommWorker* worker = groupOf(b).worker.get();
      if (!worker) continue;
      float* whole = params_.data() + b.fullOffset;
      const size_t shard = b.shard, padded = b.padded;
      if (onDevice()) {
        b.gather = worker->submit(
            deviceTask(b, stepped, &b.gatheredMark, [whole, shard, padded](Communicator& c, chorusStream_t stream) {
              c.allGather(std::span<const float>(whole + c.rank() * shard, shard), std::span<float>(whole, padded),
                          stream);
            }));
        continue;
      }
      b.gather = worker->submit([whole, shard, padded](Communicator& c) -> std::optional<Request> {
        return c.iallGather(std::span<const float>(whole + c.rank() * shard, shard), std::span<float>(whole, padded));
      });
    }
    for (auto& b : buckets_) finishGather(b);
  }
  backend_->zero(grads_.data(), grads_.size() * sizeof(float));
  nextStep_ = stepNumber + 1;
  state_->prefetch();  // the next step's first chunks, read during its forward and backward
  return norm;
}

void DataParallel::gatherState(std::vector<float>& params, std::vector<float>& m, std::vector<float>& v) {
  params.assign(layout_.total(), 0.0f);
  m.assign(layout_.total(), 0.0f);
  v.assign(layout_.total(), 0.0f);
  std::vector<float> whole, stored;
  // Bucket b's part of one of state_'s arrays (its shard, or its padded whole at stage 0).
  auto fromStore = [&](const Bucket& b, int array) -> const float* {
    const bool sharded = stage_ >= 1;
    stored.resize(sharded ? b.shard : b.padded);
    state_->read(array, sharded ? b.shardOffset : b.fullOffset, stored.size(), stored.data());
    return stored.data();
  };
  // Copies bucket b's padded whole (or gathers it from shards first, at `from`) into the flat array.
  auto collect = [&](const Bucket& b, const float* from, bool sharded, std::vector<float>& dst) {
    if (sharded) {
      whole.assign(b.padded, 0.0f);
      if (CommWorker* worker = groupOf(b).worker.get()) {
        const size_t shard = b.shard;
        float* out = whole.data();
        worker->run([from, out, shard](Communicator& c) {
          c.allGather(std::span<const float>(from, shard), std::span<float>(out, shard * c.size()));
        });
      } else {
        std::memcpy(whole.data(), from, b.padded * sizeof(float));
      }
      from = whole.data();
    }
    std::memcpy(dst.data() + b.lo, from, b.count * sizeof(float));
  };
  std::vector<float> ownParams;
  for (const auto& b : buckets_) {
    if (stateParams_ >= 0) {
      collect(b, fromStore(b, stateParams_), true, params);
    } else {  // copied to the host from where they live
      ownParams.resize(stage_ == 3 ? b.shard : b.padded);
      backend_->toHost(ownParams.data(), params_.data() + (stage_ == 3 ? b.shardOffset : b.fullOffset),
                       ownParams.size() * sizeof(float));
      collect(b, ownParams.data(), stage_ == 3, params);
    }
    collect(b, fromStore(b, stateM_), stage_ >= 1, m);
    if (stateV_ >= 0) collect(b, fromStore(b, stateV_), stage_ >= 1, v);  // SGD has none: zeros
  }
}

void DataParallel::loadState(const std::vector<float>& params, const std::vector<float>& m,
                             const std::vector<float>& v) {
  if (params.size() != layout_.total() || m.size() != layout_.total() || v.size() != layout_.total()) {
    throw Error(chorusInvalidArgument, fmt::format("data parallel: state of {} / {} / {} elements for a model of {}",
                                                   params.size(), m.size(), v.size(), layout_.total()));
  }
  // Bucket b's part of the flat array src (its shard, or its whole) at dst.
  auto place = [&](const Bucket& b, const std::vector<float>& src, bool sharded, float* dst) {
    if (!sharded) {
      std::memcpy(dst, src.data() + b.lo, b.count * sizeof(float));
      return;
    }
    const size_t rank = static_cast<size_t>(groupOf(b).rank);
    const size_t start = std::min(b.count, rank * b.shard);
    const size_t end = std::min(b.count, (rank + 1) * b.shard);
    std::fill_n(dst, b.shard, 0.0f);
    std::memcpy(dst, src.data() + b.lo + start, (end - start) * sizeof(float));
  };
  std::vector<float> own;
  auto toStore = [&](const Bucket& b, const std::vector<float>& src, int array) {
    const bool sharded = stage_ >= 1;
    own.assign(sharded ? b.shard : b.padded, 0.0f);
    place(b, src, sharded, own.data());
    state_->write(array, sharded ? b.shardOffset : b.fullOffset, own.size(), own.data());
  };
  for (const auto& b : buckets_) {
    if (stateParams_ >= 0) {
      toStore(b, params, stateParams_);
    } else {  // placed on the host, then copied to where they live
      own.assign(stage_ == 3 ? b.shard : b.count, 0.0f);
      place(b, params, stage_ == 3, own.data());
      backend_->fromHost(params_.data() + (stage_ == 3 ? b.shardOffset : b.fullOffset), own.data(),
                         own.size() * sizeof(float));
    }
    toStore(b, m, stateM_);
    if (stateV_ >= 0) toStore(b, v, stateV_);
  }
  state_->prefetch();
}

size_t DataParallel::largestBucketBytes() const {
  size_t most = 0;
  for (const auto& b : buckets_) most = std::max(most, b.padded * sizeof(float));
  return most;
}

StateBytes DataParallel::bytes() const {
  StateBytes s;
  s.params = params_.size() * sizeof(float);
  s.grads = grads_.size() * sizeof(float);
  // The store's memory, its arrays' shares: ZeRO-3's parameters in a file take one.
  const size_t perArray = state_->residentBytes() / static_cast<size_t>(state_->arrays());
  if (stateParams_ >= 0) s.params += perArray;
  // DiLoCo's outer optimizer: the anchor, its momentum and the averaged delta.
  s.optimizer = state_->residentBytes() - (stateParams_ >= 0 ? perArray : 0) +
                (anchor_.size() + outerMomentum_.size() + delta_.size()) * sizeof(float);
  s.offloaded = state_->fileBytes();
  s.transientPeak = transientPeak_;
  return s;
}

}  // namespace chorus::training
