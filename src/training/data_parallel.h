// data_parallel.h: data parallelism over chorus for the GPT model: gradients reduced in buckets as
// soon as backward has produced them (non-blocking collectives on a communication thread, so they
// overlap the rest of backward), gradient accumulation, and ZeRO stages 1 (optimizer state
// sharded), 2 (gradients too) and 3 (parameters too, gathered unit by unit before use, freed after,
// the next unit prefetched). Used by one training thread; the communicator belongs to the engine's
// communication thread from construction to destruction.
#pragma once

#include <atomic>
#include <chorus/chorus.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "kernels/cpu/nn.h"
#include "src/training/backend.h"
#include "src/training/comm_worker.h"
#include "src/training/gpt.h"
#include "src/training/offload.h"

namespace chorus::training {

// Bytes a rank holds for the training state. params/grads/optimizer are the persistent buffers
// (padding included); transient is the peak of buffers that live only within a step (ZeRO-2/3
// gradient buckets, ZeRO-3 gathered units).
// offloaded: bytes kept in a file (offload.h) rather than memory, not counted in the others.
struct StateBytes {
  size_t params = 0, grads = 0, optimizer = 0, transientPeak = 0, offloaded = 0;
  size_t persistent() const { return params + grads + optimizer; }
};

struct DataParallelSettings {
  int zeroStage = 0;               // 0..3
  size_t bucketBytes = 25u << 20;  // gradient bucket cap (units are whole: a bucket holds at least one
                                   // unit; ZeRO-3 uses one unit per bucket)
  // ZeRO-2/3: at most this many buckets' whole gradients wait for their reduce-scatter; backward
  // waits for the oldest before it starts another bucket. The whole gradients alive at once are
  // then at most inflightBuckets + 2 buckets (those in flight, the one being filled, and the
  // embeddings' bucket, which the output layer starts first and the embedding layer finishes last).
  int inflightBuckets = 2;
  // With model parallelism: sums a value over the ranks that hold the other parts of the model
  // (the tp group), called on the training thread in step() for the gradient norm (each rank adds
  // the tensors its layout counts). Empty: the model is whole on this rank.
  std::function<double(double)> modelParallelSum;
  // With pipeline parallelism, on the first and last stages: sums the gradient of this rank's token
  // embedding rows (the first stage's wte, the last stage's tied lm_head copy) over the two stages,
  // called on the training thread in step() before the data-parallel reduction. The unit holding
  // them is a bucket of its own and is reduced only then. Empty: the embedding is tied on this rank.
  std::function<void(std::span<float>)> tiedSum;
  // Gradient compression (ZeRO-0 only; with localSteps DiLoCo's parameter delta instead): each bucket is averaged by a
  // compressed all-reduce with this compressor (a chorusCompressorCreate spec such as "powersgd:4"; empty or "none":
  // the fp32 all-reduce), one compressor per bucket holding its tensors' error feedback and warm start, from step
  // compressFrom on (the steps before are uncompressed: a warm-up).
  std::string compressor;
  long compressFrom = 1;
  // Expert parallelism (the layout's ep > 1): the units holding MoE experts differ between the ep
  // ranks, so their gradients are averaged over expertComm, the ranks that hold the same experts
  // (the expert-data-parallel group; null: no other rank), rather than over comm, and ZeRO shards
  // them over it. They are first scaled by 1 / ep: each rank's experts took the tokens of every ep
  // rank, whose losses the data-parallel average divides by ep more ranks. The gradient norm adds
  // the experts' part over the ep group with expertParallelSum (on the training thread).
  Communicator* expertComm = nullptr;
  std::function<double(double)> expertParallelSum;
  // Local SGD and DiLoCo (ZeRO-0, without experts): gradients are not reduced; each rank steps
  // on its own, and syncParameters() brings the ranks together.
  bool localSteps = false;
  // Gradients averaged in bf16 (half the bytes on the wire): each bucket cast before its reduction,
  // the result widened after. Not with a compressor.
  bool reduceBf16 = false;
  // The optimizer step() takes: AdamW keeps m and v per parameter, SGD m only.
  kernels::Optimizer optimizer = kernels::Optimizer::kAdamW;
  // Where the optimizer state (and with ZeRO-3 the parameter shard) lives: memory, or the file
  // offload.directory/offloadFile streamed through offload.windowBytes (offload.h). The step reads
  // and writes it in one pass, and reads the next step's first chunks as it ends, so they arrive
  // during the next forward and backward. Parameters in the file need ZeRO-3 and the optimizer
  // state there too.
  OffloadSettings offload;
  std::string offloadFile = "state.bin";
  // The optimizer step during backward, bucket by bucket (PyTorch's optimizer in backward): once a
  // bucket's last reduction of the step is complete, a thread of the step takes that bucket's
  // optimizer step while backward computes the rest, visiting the buckets (and the offloaded
  // state) in their order. On a device the training thread enqueues each bucket's step on the
  // compute queue, after that bucket's reduction, when a unit's backward ends and finds that
  // reduction enqueued (those left, in step()); nothing waits for the device meanwhile, except
  // a step on the host (the optimizer state offloaded). armStep() sets it going each step. The
  // step then cannot depend on the whole gradient: no clipping, no loss scale, and a non-finite
  // gradient is applied, not skipped (the norm is still computed: on the CPU from each bucket
  // before its step, on a device after the steps, which leave the gradients). Not with pipeline
  // parallelism (tiedSum), local steps, or ZeRO-3's parameters in a file (the gathers read the
  // file during backward).
  bool stepInBackward = false;
  // Where parameters, gradients and the optimizer state live and the step computes: host memory,
  // or the calling thread's current CUDA device (the model's gradients and parameters are then
  // device pointers; every collective is enqueued on the backend's communication stream, ordered
  // against the model's kernels by marks, see Backend::Queue). On a device: ZeRO 0-3 with fp32
  // or bf16 reductions (cast and widened on the device), AdamW or SGD, clipping, the loss scale, a
  // pipeline's tied embedding (tiedSum then gets device memory), the experts' own group, local
  // steps (the anchor and DiLoCo's outer state on the device too), and the optimizer state
  // offloaded to host memory or a file (the step then runs on the host: each bucket's own
  // parameters and gradients come over, the parameters go back; ZeRO-3's parameters in the file
  // are read and copied up for each gather), compression (each bucket through the host, where the
  // compressors work), and the step during backward: everything above.
  Device device = Device::kCpu;
};

// How far the reductions overlapped backward: of `reductions` bucket reductions, `overlapped`
// began on the communication thread before their micro-batch's backward had finished.
// With stepInBackward, of `steps` bucket steps, `stepsOverlapped` began so.
struct OverlapCounts {
  long reductions = 0, overlapped = 0;
  long steps = 0, stepsOverlapped = 0;
};

class DataParallel : public UnitAccess {
 public:
  // comm null: one rank, nothing communicated. Parameters are initialised from seed
  // (ParamLayout::initialize), each rank its own part. Test hook: environment variable
  // CHORUS_TRAIN_COMM_DELAY_MS=D makes the communication thread sleep D ms before each collective
  // it starts (a slow link, so that reductions fall behind backward); CHORUS_TRAIN_BACKWARD_DELAY_MS=D
  // makes backward pause D ms after each unit's gradients are final (slow compute, so that the
  // reductions and the step during backward run ahead of it).
  DataParallel(const ParamLayout& layout, Communicator* comm, const DataParallelSettings& settings, uint64_t seed);
  ~DataParallel() override;

  int zeroStage() const { return stage_; }
  int ranks() const { return groups_[kDense].size; }
  int rank() const { return groups_[kDense].rank; }
  int buckets() const { return static_cast<int>(buckets_.size()); }

  // Before each micro-batch's forward: `last` marks the step's last micro-batch (stages 0 and 1
  // reduce gradients only after it; 2 and 3 after every micro-batch). eval: forward only (ZeRO-3
  // then frees every unit after use). A pipeline, whose micro-batches' forwards and backwards
  // interleave, calls it before each backward instead (stages 0 and 1 only); step() reduces the
  // buckets whose gradients a last micro-batch did not finish.
  void beginMicro(bool last, bool eval = false);
  // After the last micro-batch's backward: waits for the reductions, divides the gradients by
  // gradScale (the loss scale they carry), clips the gradient to clipNorm (global L2 norm; 0: no
  // clipping), takes one optimizer step (step counts from 1; the kind the settings were made with)
  // and makes parameters current everywhere (ZeRO-1/2 all-gather them). Returns the gradient's norm
  // before clipping. When that norm is not finite (an overflow, on some rank: the norm is global),
  // no step is taken: parameters and optimizer state stay as they were. Gradients are then zeroed
  // for the next step.
  // skipped: the earlier steps that overflowed; the optimizer counts step - skipped updates (as
  // PyTorch's does not count a step the loss scaler skipped), the compression warm-up the steps.
  double step(const kernels::OptimizerSettings& optimizer, long step, float clipNorm, float gradScale = 1.0f,
              long skipped = 0);
  // stepInBackward: before the step's last micro-batch (after its beginMicro), the settings and
  // step number that step() will be called with; its bucket steps begin as their reductions
  // complete. step() must then be called with the same, clipNorm 0 and gradScale 1.
  void armStep(const kernels::OptimizerSettings& optimizer, long step, long skipped = 0);

  // UnitAccess, for Gpt::forward and backward.
  const float* acquire(int unit, Pass pass) override;
  void release(int unit, Pass pass) override;
  float* gradients(int unit) override;
  void gradientsDone(int unit) override;

  // DiLoCo (DataParallelSettings::localSteps): the parameters the ranks last agreed on (the outer
  // optimizer's), taken from the current parameters, with the outer momentum and delta buffers
  // (counted as optimizer state); call once before the first step (after a checkpoint is loaded).
  void anchorParameters();
  // DiLoCo: the outer momentum in the model's flat layout (no padding), for checkpoints; and set
  // from one (after anchorParameters()). Not collective.
  void outerMomentum(std::vector<float>& flat) const;
  void loadOuterMomentum(const std::vector<float>& flat);
  // Collective over the data-parallel ranks. Local SGD (outer null): the parameters averaged.
  // DiLoCo: the delta of each rank's parameters from the anchor averaged (by the compressor when
  // the settings name one: each bucket's, with its error feedback), and taken as the
  // gradient of one step of the outer optimizer (its kind and settings; outerStep counts from 1)
  // on the anchor; every rank then starts again from it.
  void syncParameters(const kernels::OptimizerSettings* outer, long outerStep);

  // Mean of value over ranks, and the element-wise sum of values over ranks in place (on the
  // communication thread; collective).
  double average(double value);
  void sumOverRanks(std::vector<double>& values);
  // Collective: the whole state in the model's flat layout (no padding), for checkpoints: the
  // parameters and AdamW's m and v. Every rank gets them.
  void gatherState(std::vector<float>& params, std::vector<float>& m, std::vector<float>& v);
  // Sets the state from whole flat arrays (each rank keeps its part). Not collective.
  void loadState(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v);

  StateBytes bytes() const;
  // The largest bucket's padded whole, in bytes (the unit of the transient-memory bound).
  size_t largestBucketBytes() const;
  OverlapCounts overlap() const {
    return {reductions_.load(), overlapped_.load(), bucketSteps_.load(), bucketStepsOverlapped_.load()};
  }
  // The step the next backward belongs to (a resumed run sets it; step() advances it): whether
  // its buckets are compressed.
  void setNextStep(long step) { nextStep_ = step; }
  bool compressing() const { return !compressors_.empty() && nextStep_ >= compressFrom_; }
  // Bytes this rank has sent on the data-parallel communicators so far, headers included
  // (chorusCommGetTraffic; 0 on one rank). Not collective.
  uint64_t wireBytes();
  // Where the optimizer state lives, for the banner (StateStore::describe).
  std::string stateDescription() const { return state_->describe(); }
  // Each bucket's compression ratio by formula (empty without compression).
  std::vector<double> compressionRatios();
  // The payload bytes one compressed step sends from this rank, by formula (0 without compression).
  uint64_t compressionPayloadBytes();

 private:
  // The ranks a bucket's gradients are averaged over: all data-parallel ranks, or (the experts
  // with ep > 1) the expert-data-parallel ones. A group of one rank has no worker.
  enum GroupKind { kDense = 0, kExperts = 1 };
  struct Group {
    std::unique_ptr<CommWorker> worker;
    int size = 1, rank = 0;
  };
  struct Bucket {
    int group = kDense;
    int firstUnit = 0, lastUnit = 0;  // units [firstUnit, lastUnit], contiguous in the flat layout
    size_t lo = 0, count = 0;         // flat range [lo, lo + count)
    size_t padded = 0, shard = 0;     // count rounded up to a multiple of N; padded / N
    size_t fullOffset = 0;            // in the padded full arrays
    size_t shardOffset = 0;           // in the shard arrays
    int unitsLeft = 0;                // units whose gradients backward has not finished this micro-batch
    bool reduced = false;             // ZeRO-0/1: its reduction has been started this step
    Buffer<float> transientGrad;      // ZeRO-2/3: the bucket's whole gradient during backward
    Buffer<float> gathered;           // ZeRO-3: the bucket's whole parameters while in use
    std::vector<float> gatherSource;  // ZeRO-3 with parameters in a file: this rank's shard, read for the gather
    Buffer<float> gatherShard;        // the same on a device: the shard copied up for the gather
    Buffer<uint16_t> half;            // reduceBf16: the gradient in bf16 while it is reduced
    std::future<void> reduction, gather;
    // On a device: where the communication queue's reduction and gather end, and what follows the
    // reduction on the compute queue (ZeRO-2/3's accumulation; on the CPU the worker runs it).
    Backend::Mark reducedMark, gatheredMark;
    std::function<void()> afterReduction;
  };
  Bucket& bucketOf(int unit) { return buckets_[unitBucket_[unit]]; }
  Group& groupOf(const Bucket& b) { return groups_[b.group]; }
  const Group& groupOf(const Bucket& b) const { return groups_[b.group]; }
  // Mean of value over a group's ranks (on its communication thread).
  double averageOver(Group& g, double value);
  void reduceBucket(Bucket& b);
  // A reduction task of padded gradients at g: averaged in place (all-reduce), or this rank's
  // shard of them into out (reduce-scatter); in fp32, or in bf16 through b.half (reduceBf16).
  // `then` runs on the worker once the result is in place.
  std::future<void> submitReduction(Bucket& b, float* g, float* out, std::function<void()> then);
  void startGather(Bucket& b);
  // Starts b's gather if need be and finishes it; finishes one started (waits for it, and on a
  // device makes the compute queue wait for it).
  void waitGather(Bucket& b);
  void finishGather(Bucket& b);
  void waitReductions();
  // For a reduction task: counts it, and as overlapped if it begins before the current
  // micro-batch's backward has ended.
  std::function<void()> countOverlap();
  void trackTransient(long delta);
  int nextInOrder() const;
  // Where this rank's elements of a bucket are: [lo, hi) of the flat range, and the position of lo
  // in params, grads and the optimizer state.
  struct Own {
    size_t lo, hi, p, g, mv;
  };
  Own ownOf(const Bucket& b) const;
  // Waits for b's reduction (and, on a device, makes the compute queue wait for it, then runs what
  // was to follow it there).
  void finishReduction(Bucket& b);
  // The communication task of a collective on b's device buffers: waits for the compute queue's
  // `ready`, enqueues call(c, stream) on the communication lane of b's group and keeps its mark in
  // *done.
  CommWorker::Task deviceTask(const Bucket& b, Backend::Mark ready, Backend::Mark* done,
                              std::function<void(Communicator&, chorusStream_t)> call);
  bool onDevice() const { return backend_->device() != Device::kCpu; }
  // fn(tensor, own, d, n) for each tensor's part of this rank's elements of b: n elements from
  // position d of its own range.
  void eachTensorPart(const Bucket& b, const std::function<void(const ParamTensor&, const Own&, size_t, size_t)>& fn);
  // The squares of b's own gradient elements that the norm counts.
  double gradientSquares(const Bucket& b);
  // The optimizer step of b's own elements, through the state store's pass.
  void stepBucket(const Bucket& b, const kernels::OptimizerSettings& optimizer, long updates);
  // stepInBackward: bucket i's gradients are final for the armed step (from the worker or the
  // training thread); the step thread's loop.
  void bucketReady(size_t i);
  void stepInOrder();
  // The communication lane of bucket b's collectives on a device.
  static int laneOf(const Bucket& b);
  // The armed step of bucket b (counted, with whether backward was still running).
  void stepArmed(const Bucket& b);
  // On a device, from the training thread: the armed step's next buckets, in order, whose
  // reductions are enqueued; each step's kernels go on the compute queue after its reduction.
  void stepEnqueued();

  const ParamLayout& layout_;
  // Where the state lives (declared before every buffer in it, so destroyed after them).
  std::unique_ptr<Backend> backend_;
  Group groups_[2];
  float expertScale_ = 1.0f;  // 1 / ep
  std::function<double(double)> expertParallelSum_;
  int stage_;
  int inflightBuckets_;
  std::function<double(double)> modelParallelSum_;
  std::function<void(std::span<float>)> tiedSum_;
  int tiedUnit_ = -1;  // the unit whose leading tiedFloats_ gradients tiedSum_ sums
  size_t tiedFloats_ = 0;
  std::deque<int> pendingWholeGrads_;  // ZeRO-2/3: buckets whose reduce-scatter may be in flight, oldest first
  std::vector<Bucket> buckets_;
  std::vector<int> unitBucket_;
  size_t fullTotal_ = 0, shardTotal_ = 0;
  // Persistent state: full padded arrays or shard arrays, by stage. The optimizer state (m, and v
  // for AdamW) is in state_, in the shard layout from stage 1 on; so are ZeRO-3's parameters when
  // offloaded to a file (params_ is then empty). The arrays' indices in state_ (-1: not there):
  Buffer<float> params_, grads_;
  std::unique_ptr<StateStore> state_;
  // On a device with the optimizer state offloaded to the host: the backend the step runs on there,
  // and a bucket's own parameters and gradients while it steps.
  std::unique_ptr<Backend> hostStepper_;
  std::vector<float> stagedParams_, stagedGrads_;
  int stateParams_ = -1, stateM_ = 0, stateV_ = -1;
  bool reduceBf16_ = false;
  bool localSteps_ = false;
  Buffer<float> anchor_, delta_, outerMomentum_;  // DiLoCo: see syncParameters
  kernels::Optimizer optimizer_ = kernels::Optimizer::kAdamW;
  bool lastMicro_ = true, eval_ = false;
  // ZeRO-3 access order within a micro-batch (its first forwardLength_ in forward) and where we are in it.
  std::vector<int> order_;
  size_t forwardLength_ = 0;
  size_t orderAt_ = 0;
  size_t transientNow_ = 0, transientPeak_ = 0;
  std::mutex transientMutex_;
  // Micro-batches whose backward has begun and ended (training micro-batches only), and the
  // counts of OverlapCounts, written by both threads.
  long microsBegun_ = 0;
  std::atomic<long> backwardsEnded_{0}, reductions_{0}, overlapped_{0};
  int unitsLeftInMicro_ = 0;
  int backwardDelayMs_ = 0;              // the test hook's CHORUS_TRAIN_BACKWARD_DELAY_MS
  std::vector<Compressor> compressors_;  // per bucket, used on the communication thread
  long compressFrom_ = 1;
  long nextStep_ = 1;
  // stepInBackward: the armed step and its thread (on the CPU). ready and the thread's error under
  // stepMutex_; on a device, no thread: ready and next are the training thread's.
  struct ArmedStep {
    kernels::OptimizerSettings optimizer;
    long step = 0, updates = 0;
    long micro = 0;  // the micro-batch whose backward the bucket steps may overlap
    std::vector<char> ready;
    size_t next = 0;  // on a device: the buckets stepped so far
    double squares[2] = {0.0, 0.0};
    std::exception_ptr error;
    std::thread thread;
  };
  bool stepInBackward_ = false;
  std::optional<ArmedStep> armed_;
  std::mutex stepMutex_;
  std::condition_variable stepReady_;
  std::atomic<long> bucketSteps_{0}, bucketStepsOverlapped_{0};
};

}  // namespace chorus::training
