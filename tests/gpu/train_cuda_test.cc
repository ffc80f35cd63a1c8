// train_cuda_test.cc: training steps on a CUDA device against the same steps on the CPU: the
// model and data parallelism (every ZeRO stage, one rank and two ranks sharing the one GPU, as
// forked processes joined by chorus) with parameters, gradients and the optimizer state in device
// memory and the gradients reduced by chorus's device collectives on the backend's communication
// stream. The reference is one CPU rank taking the whole global batch: two ranks that each take
// half of it and average their gradients take the same steps. SGD with momentum keeps the
// parameters' difference as small as the gradients' (bounded below; ZeRO-2/3 accumulating
// micro-batches, and ZeRO-3 with its parameters in a file, too); AdamW with clipping and a loss
// scale is checked by its losses and gradient norms; the optimizer step during backward by the
// step after it, to the bit. Skipped (with the reason) without a device. The test process itself
// never touches CUDA (the ranks are forked from it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "src/training/data_parallel.h"
#include "src/training/gpt.h"
#include "src/training/mesh.h"
#include "tests/gpu/device.h"
#include "tests/support/multiprocess.h"

namespace chorus::training {
namespace {

const GptConfig kConfig{2, 4, 64, 48, 97};
constexpr int kGlobalBatch = 4, kSeq = 32, kSteps = 3;

struct Settings {
  int zero = 0;
  kernels::Optimizer optimizer = kernels::Optimizer::kSgd;
  float clip = 0.0f;
  float lossScale = 1.0f;
  size_t bucketBytes = 64 << 10;  // several buckets
  int micros = 1;                 // micro-batches a step accumulates
  bool inBackward = false;        // the step during backward (armStep)
  OffloadTarget offload = OffloadTarget::kNone;
  bool paramsInFile = false;  // ZeRO-3's parameter shard and the optimizer state in a file, streamed
};

// What a run leaves: each step's mean loss and gradient norm, and the parameters at the end (the
// model's flat layout, whole).
struct Steps {
  std::vector<double> losses, norms;
  std::vector<float> params;
  OverlapCounts overlap;
};

// The global batch of a step: kGlobalBatch sequences of kSeq tokens and their targets.
void batchOf(int step, std::vector<int>& tokens, std::vector<int>& targets) {
  std::mt19937 gen(1000 + step);
  std::uniform_int_distribution<int> pick(0, kConfig.vocab - 1);
  tokens.resize(kGlobalBatch * kSeq);
  targets.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = pick(gen);
    targets[i] = (tokens[i] * 7 + 3) % kConfig.vocab;  // something to learn
  }
}

// kSteps steps on this rank's share of each global batch (comm null: one rank, all of it).
Steps train(Device device, Communicator* comm, const Settings& s) {
  const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const int B = kGlobalBatch / ranks / s.micros;
  Gpt model(kConfig, B, kSeq, {}, {}, Recompute::kNone, {}, {}, Compute::kFp32, device);
  DataParallelSettings parallel;
  parallel.zeroStage = s.zero;
  parallel.bucketBytes = s.bucketBytes;
  parallel.optimizer = s.optimizer;
  parallel.device = device;
  parallel.stepInBackward = s.inBackward;
  parallel.offload.optimizer = s.offload;
  if (s.paramsInFile) {  // a file of this process's own, through a window of a few chunks
    parallel.offload.optimizer = parallel.offload.params = OffloadTarget::kFile;
    parallel.offload.directory = ::testing::TempDir();
    parallel.offload.windowBytes = 64 << 10;
    parallel.offloadFile = "train_cuda_test." + std::to_string(getpid()) + ".state";
  }
  DataParallel dp(model.layout(), comm, parallel, 3);
  kernels::OptimizerSettings optimizer;
  optimizer.kind = s.optimizer;
  optimizer.lr = s.optimizer == kernels::Optimizer::kSgd ? 0.05f : 1e-3f;
  optimizer.momentum = 0.9f;
  Steps run;
  std::vector<int> tokens, targets;
  for (int step = 1; step <= kSteps; ++step) {
    batchOf(step, tokens, targets);
    double loss = 0.0;
    for (int micro = 0; micro < s.micros; ++micro) {
      const size_t mine = static_cast<size_t>(rank * s.micros + micro) * B * kSeq;
      dp.beginMicro(micro == s.micros - 1);
      if (s.inBackward && micro == s.micros - 1) dp.armStep(optimizer, step);
      loss += model.forward(tokens.data() + mine, targets.data() + mine, dp) / s.micros;
      model.backward(dp, s.lossScale / static_cast<float>(s.micros));
    }
    run.norms.push_back(dp.step(optimizer, step, s.clip, s.lossScale));
    run.losses.push_back(dp.average(loss));
  }
  std::vector<float> m, v;
  dp.gatherState(run.params, m, v);
  run.overlap = dp.overlap();
  return run;
}

// The device runs `ranks` ranks on GPU 0, each its own process, and checks each rank's run against
// the reference with check(run) (gtest assertions in the rank fail its process).
void onDevice(int ranks, const Settings& s, const std::function<void(const Steps&)>& check) {
  const auto codes = ::chorus::testing::runProcesses(ranks, [&](int rank, const chorusUniqueId& id) {
    try {
      useDeviceOfRank(Device::kCuda, 0);
      std::optional<Communicator> comm;
      if (ranks > 1) comm.emplace(UniqueId(id), ranks, rank);
      check(train(Device::kCuda, comm ? &*comm : nullptr, s));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << ranks << " failed";
}

double relative(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-12); }

// SGD with momentum: every ZeRO stage, one and two ranks. The GPU's gradients are within 1e-4 of
// the largest of the CPU's (gpt_cuda_test); three steps of lr 0.05 with momentum 0.9 move a
// parameter by under 0.3 x that error, so 1e-4 bounds the parameters' difference with room, while
// a reduction that summed instead of averaging, missed a rank, or a ZeRO gather left undone moves
// them by a whole step (lr x gradient, ~1e-3 and up).
TEST(CudaTrainTest, SgdStepsOnTheGpuFollowTheCpuForEveryZeroStageOnOneAndTwoRanks) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  // ZeRO-2/3 accumulating over 2 micro-batches too: each micro-batch's whole gradient reduced
  // and freed before the next one's backward writes a new one (the reference accumulates on one rank).
  std::vector<Settings> cases;
  for (int zero = 0; zero <= 3; ++zero) cases.push_back({.zero = zero});
  for (int zero = 2; zero <= 3; ++zero) cases.push_back({.zero = zero, .micros = 2});
  cases.push_back({.zero = 3, .paramsInFile = true});  // the gathers read the shard from the file
  for (const Settings& s : cases) {
    const Steps cpu = train(Device::kCpu, nullptr, s);
    // The steps move the parameters well past the bound below (else the comparison says nothing).
    std::vector<float> initial(cpu.params.size());
    ParamLayout(kConfig).initialize(3, initial.data(), 0, initial.size());
    double moved = 0;
    for (size_t i = 0; i < initial.size(); ++i) moved = std::max(moved, std::fabs(double(cpu.params[i]) - initial[i]));
    ASSERT_GT(moved, 1e-3) << "the reference's steps hardly moved the parameters";
    for (int ranks : {1, 2}) {
      SCOPED_TRACE("ZeRO-" + std::to_string(s.zero) + ", " + std::to_string(s.micros) + " micro-batch(es), " +
                   std::to_string(ranks) + " rank(s) on the GPU" +
                   (s.paramsInFile ? ", parameters and state in a file" : ""));
      onDevice(ranks, s, [&](const Steps& gpu) {
        ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
        for (size_t i = 0; i < cpu.losses.size(); ++i) {
          EXPECT_LT(relative(gpu.losses[i], cpu.losses[i]), 1e-5) << "loss of step " << i + 1;
          EXPECT_LT(relative(gpu.norms[i], cpu.norms[i]), 1e-4) << "gradient norm of step " << i + 1;
        }
        ASSERT_EQ(gpu.params.size(), cpu.params.size());
        double worst = 0;
        for (size_t i = 0; i < cpu.params.size(); ++i) {
          worst = std::max(worst, std::fabs(static_cast<double>(gpu.params[i]) - cpu.params[i]));
        }
        EXPECT_LT(worst, 1e-4) << "largest parameter difference after " << kSteps << " steps";
      });
    }
  }
}

// AdamW with clipping (a norm of 0.1, below the gradients', so every step clips) and a loss scale
// the gradients are divided by: ZeRO-2 on two ranks. AdamW normalises each update, so parameters
// whose gradient is near zero may step either way on either device; the losses and norms, which
// those parameters barely move, must follow.
TEST(CudaTrainTest, AdamwWithClippingAndALossScaleOnTwoRanksFollowsTheCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  Settings s;
  s.zero = 2;
  s.optimizer = kernels::Optimizer::kAdamW;
  s.clip = 0.1f;
  s.lossScale = 1024.0f;
  const Steps cpu = train(Device::kCpu, nullptr, s);
  for (double norm : cpu.norms) ASSERT_GT(norm, s.clip) << "the reference's steps would not clip";
  onDevice(2, s, [&](const Steps& gpu) {
    for (size_t i = 0; i < cpu.losses.size(); ++i) {
      EXPECT_LT(relative(gpu.losses[i], cpu.losses[i]), 1e-3) << "loss of step " << i + 1;
      EXPECT_LT(relative(gpu.norms[i], cpu.norms[i]), 1e-3) << "gradient norm of step " << i + 1;
    }
  });
}

// The optimizer step during backward on the device (each bucket's step enqueued behind its
// reduction between backward's kernels) against the step after backward on the device: the same
// kernels on the same gradients, so the same losses, norms and parameters to the bit. ZeRO 0-3
// with AdamW on two ranks, ZeRO-2 accumulating two micro-batches (the step behind the last one's
// reduce-scatter and accumulation), and ZeRO-1 with the optimizer state in host memory (each
// bucket's step on the host). Every bucket of every step is stepped so, and none without it; with
// backward slowed after each unit (CHORUS_TRAIN_BACKWARD_DELAY_MS, 5 ms: this small model's
// backward could otherwise end before a reduction is enqueued, on a busy machine) some steps are
// enqueued while backward still runs.
TEST(CudaTrainTest, TheStepDuringBackwardOnTheDeviceIsTheStepAfterItToTheBit) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  std::vector<Settings> cases;
  for (int zero = 0; zero <= 3; ++zero) cases.push_back({.zero = zero, .optimizer = kernels::Optimizer::kAdamW});
  cases.push_back({.zero = 2, .optimizer = kernels::Optimizer::kAdamW, .micros = 2});
  cases.push_back({.zero = 1, .optimizer = kernels::Optimizer::kAdamW, .offload = OffloadTarget::kHost});
  for (const Settings& after : cases) {
    SCOPED_TRACE("ZeRO-" + std::to_string(after.zero) + ", " + std::to_string(after.micros) + " micro-batch(es)" +
                 (after.offload == OffloadTarget::kHost ? ", the state in host memory" : ""));
    Settings during = after;
    during.inBackward = true;
    const auto codes = ::chorus::testing::runProcesses(2, [&](int rank, const chorusUniqueId& id) {
      try {
        useDeviceOfRank(Device::kCuda, 0);
        Communicator comm(UniqueId(id), 2, rank);
        const Steps want = train(Device::kCuda, &comm, after);
        setenv("CHORUS_TRAIN_BACKWARD_DELAY_MS", "5", 1);
        const Steps got = train(Device::kCuda, &comm, during);
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(got.norms, want.norms);
        EXPECT_TRUE(got.params == want.params) << "the parameters differ after " << kSteps << " steps";
        EXPECT_EQ(want.overlap.steps, 0);
        // One reduction per bucket and micro-batch without it; the step's bucket steps are one per bucket.
        EXPECT_GT(got.overlap.steps, 0);
        EXPECT_EQ(got.overlap.steps * after.micros, want.overlap.reductions);
        EXPECT_GT(got.overlap.stepsOverlapped, 0) << "of " << got.overlap.steps << " bucket steps";
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
    for (int r = 0; r < 2; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " failed";
  }
}

// A device call of one of the mesh's groups that failed on its stream, which nothing has reported
// (rank 1 never joins rank 0's tp all-reduce; the staged path's proxy gives up after the timeout,
// and the stream goes on) is found by the check a trainer makes at each step's end, which names
// the group and the peer; before it the same check passes on every rank. dp 2 x tp 2: rank 0's tp
// group is ranks 0 and 1, its dp group ranks 0 and 2 (which did not fail).
TEST(CudaTrainTest, AMeshGroupWhoseDeviceCallFailedIsNamedAtTheStepEnd) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  ::chorus::testing::SharedWithRanks<std::atomic<int>> rank0Done;
  const auto codes = ::chorus::testing::runProcesses(4, [&](int rank, const chorusUniqueId& id) {
    setenv("CHORUS_DEVICE_TRANSPORT", "staged", 1);
    setenv("CHORUS_TIMEOUT_MS", "1000", 1);
    try {
      useDeviceOfRank(Device::kCuda, 0);
      Communicator world(UniqueId(id), 4, rank);
      DeviceMesh mesh(world, MeshShape{2, 2, 1, 1});
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      ::chorus::testing::DeviceBuffer<float> buffer(std::vector<float>(1000, 1.0f));
      const std::span<float> data(buffer.data, 1000);
      const auto s = reinterpret_cast<chorusStream_t>(stream);
      for (const char* kind : {"tp", "dp"}) mesh.group(kind)->allReduce(data, ReduceOp::kSum, s);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      mesh.checkAsyncErrors();  // nothing failed: no error
      if (rank == 0) {
        mesh.group("tp")->allReduce(data, ReduceOp::kSum, s);  // enqueued: rank 1 never comes
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        try {
          mesh.checkAsyncErrors();
          ADD_FAILURE() << "the failed tp all-reduce went unnoticed";
        } catch (const Error& e) {
          const std::string message = e.what();
          EXPECT_NE(message.find("the tp group: "), std::string::npos) << message;
          EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
        }
        *rank0Done = 1;
      } else {
        for (int i = 0; i < 60000 && rank0Done->load() == 0; ++i) usleep(1000);
      }
      ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace chorus::training
