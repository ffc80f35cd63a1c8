// offload_test.cc: the state stores of offload.h. A file store streamed through a small window
// (chunks of 1024 elements) must give a pass every element's value and keep what the pass wrote,
// on io_uring and on threads; keep its memory under the window; read and write any range outside
// a pass; refuse a window too small, a directory it cannot write, and a pass that goes back; and
// report a file cut short under it by path. Then DataParallel on one rank: steps with the
// optimizer state (and ZeRO-3's parameters) in a file leave the same bits as in memory.
#include "src/training/offload.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "chorus/error.hpp"
#include "src/training/data_parallel.h"

namespace chorus::training {
namespace {

namespace fs = std::filesystem;

// The value element i of array a holds after `passes` passes that each added 1 (a pattern that
// tells arrays and positions apart).
float expected(int a, size_t i, int passes) { return static_cast<float>(a * 100000 + i) * 0.5f + passes; }

// Why this kernel will not set up an io_uring (a container's seccomp filter, an old kernel), or
// empty when it will: asked of the kernel directly, not through the code under test.
std::string kernelRefusesUring() {
  io_uring_params params{};
  const long fd = ::syscall(__NR_io_uring_setup, 2, &params);
  if (fd < 0) return std::strerror(errno);
  ::close(static_cast<int>(fd));
  return "";
}

// The file store on each I/O engine this build has: io_uring (built with liburing) and threads.
class FileStoreTest : public ::testing::TestWithParam<OffloadIo> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("chorus-offload-" + std::to_string(::getpid()));
    settings_.directory = dir_.string();
    settings_.io = GetParam();
    if (GetParam() == OffloadIo::kUring) {
      const std::string why = kernelRefusesUring();
      if (!why.empty()) GTEST_SKIP() << "this kernel refuses io_uring_setup (" << why << ")";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<StateStore> make(int arrays, size_t elements, size_t windowBytes) {
    settings_.windowBytes = windowBytes;
    return makeStateStore(OffloadTarget::kFile, settings_, arrays, elements, "store.bin");
  }
  fs::path dir_;
  OffloadSettings settings_;
};

TEST_P(FileStoreTest, PassesSeeEveryValueAndKeepTheirWrites) {
  const int arrays = 3;
  const size_t elements = 10 * 1024 + 77;  // eleven chunks, the last partial
  const size_t window = 4 * 1024 * arrays * sizeof(float);
  auto store = make(arrays, elements, window);
  EXPECT_LE(store->residentBytes(), window);
  EXPECT_GE(store->fileBytes(), elements * arrays * sizeof(float));
  EXPECT_TRUE(fs::exists(dir_ / "store.bin"));
  for (int a = 0; a < arrays; ++a) {
    std::vector<float> init(elements);
    for (size_t i = 0; i < elements; ++i) init[i] = expected(a, i, 0);
    store->write(a, 0, elements, init.data());
  }
  std::mt19937 rng(5);
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 1) store->prefetch();  // begun early, as the step's end does
    // Runs of random length from increasing starts, some elements skipped (padding is never visited).
    size_t i = 0;
    std::vector<bool> visited(elements, false);
    while (i < elements) {
      const StateStore::Run run = store->at(i);
      ASSERT_GT(run.count, 0u);
      ASSERT_LE(i + run.count, elements);
      const size_t take = std::min<size_t>(run.count, 1 + rng() % 700);
      for (size_t k = 0; k < take; ++k) {
        for (int a = 0; a < arrays; ++a) {
          ASSERT_EQ(run.array[a][k], expected(a, i + k, pass)) << "pass " << pass << " array " << a << " i " << i + k;
          run.array[a][k] += 1.0f;
        }
        visited[i + k] = true;
      }
      i += take + (rng() % 5 == 0 ? rng() % 2500 : 0);  // now and then a gap, a whole chunk at times
    }
    store->finish();
    // What the pass skipped, it adds now by read and write, so every element has had `pass + 1`.
    for (int a = 0; a < arrays; ++a) {
      std::vector<float> all(elements);
      store->read(a, 0, elements, all.data());
      for (size_t k = 0; k < elements; ++k) {
        if (!visited[k]) {
          ASSERT_EQ(all[k], expected(a, k, pass));
          all[k] += 1.0f;
        }
      }
      store->write(a, 0, elements, all.data());
    }
  }
  // Ranges across chunk boundaries, read and written outside a pass.
  std::vector<float> part(3000);
  store->read(1, 1000, part.size(), part.data());
  for (size_t k = 0; k < part.size(); ++k) ASSERT_EQ(part[k], expected(1, 1000 + k, 3));
  store.reset();
  EXPECT_FALSE(fs::exists(dir_ / "store.bin")) << "the store's file outlived it";
}

TEST_P(FileStoreTest, AWriteReplacesWhatAPrefetchRead) {
  auto store = make(2, 5000, 64 * 1024);
  store->prefetch();
  const std::vector<float> sevens(5000, 7.0f);
  store->write(0, 0, sevens.size(), sevens.data());
  for (size_t i = 0; i < 5000;) {
    const auto run = store->at(i);
    for (size_t k = 0; k < run.count; ++k) ASSERT_EQ(run.array[0][k], 7.0f) << i + k;
    i += run.count;
  }
  store->finish();
}

TEST_P(FileStoreTest, BadUseIsRefusedByName) {
  try {
    make(2, 100000, 1000);
    FAIL() << "a window of 1000 bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window of 1000 bytes"), std::string::npos) << e.what();
  }
  auto store = make(1, 9000, 16 * 1024);
  store->at(5000);
  EXPECT_THROW(store->at(100), Error);  // a pass goes forward only
  store->finish();
  std::vector<float> x(10);
  EXPECT_THROW(store->read(0, 8995, 10, x.data()), Error);  // past the end
  // A file cut short under the store: the next pass's read fails and names the file.
  fs::resize_file(dir_ / "store.bin", 0);
  try {
    for (size_t i = 0; i < 9000;) i += store->at(i).count;
    store->finish();
    FAIL() << "reads of a truncated file succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("store.bin"), std::string::npos) << e.what();
  }
  OffloadSettings nowhere = settings_;
  nowhere.directory = "/proc/no-such-dir";
  try {
    makeStateStore(OffloadTarget::kFile, nowhere, 1, 100, "x.bin");
    FAIL() << "a file in /proc was created";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/no-such-dir/x.bin"), std::string::npos) << e.what();
  }
}

#ifdef CHORUS_HAVE_URING
INSTANTIATE_TEST_SUITE_P(Engines, FileStoreTest, ::testing::Values(OffloadIo::kUring, OffloadIo::kThreads),
                         [](const auto& info) { return info.param == OffloadIo::kUring ? "IoUring" : "Threads"; });
#else
INSTANTIATE_TEST_SUITE_P(Engines, FileStoreTest, ::testing::Values(OffloadIo::kThreads),
                         [](const auto&) { return "Threads"; });
// Without liburing, io = io_uring is refused by name (auto takes threads).
TEST(OffloadTest, IoUringWithoutLiburingIsRefused) {
  OffloadSettings s;
  s.directory = (fs::temp_directory_path() / ("chorus-offload-nouring-" + std::to_string(::getpid()))).string();
  s.io = OffloadIo::kUring;
  try {
    makeStateStore(OffloadTarget::kFile, s, 1, 100, "x.bin");
    FAIL() << "io = io_uring accepted by a build without liburing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not built with liburing"), std::string::npos) << e.what();
  }
  s.io = OffloadIo::kAuto;
  EXPECT_NE(makeStateStore(OffloadTarget::kFile, s, 1, 100, "x.bin")->describe().find("threads"), std::string::npos);
  fs::remove_all(s.directory);
}
#endif

TEST(OffloadTest, TargetsParseAndMemoryIsTheIdentity) {
  EXPECT_EQ(parseOffloadTarget("host"), OffloadTarget::kHost);
  EXPECT_THROW(parseOffloadTarget("nvme"), Error);
  EXPECT_THROW(parseOffloadIo("aio"), Error);
  auto store = makeStateStore(OffloadTarget::kHost, OffloadSettings{}, 2, 10, "unused");
  EXPECT_EQ(store->describe(), "memory");
  EXPECT_EQ(store->residentBytes(), 2 * 10 * sizeof(float));
  EXPECT_EQ(store->fileBytes(), 0u);
}

// One rank's steps through DataParallel's UnitAccess, with gradients from a seeded generator:
// the parameters and optimizer state after `steps` steps.
struct Stepped {
  std::vector<float> params, m, v;
};
Stepped runSteps(int zero, kernels::Optimizer kind, const OffloadSettings& offload, int steps) {
  const GptConfig config{2, 2, 32, 16, 50};
  const ParamLayout layout(config);
  DataParallelSettings settings;
  settings.zeroStage = zero;
  settings.bucketBytes = 8 * 1024;  // several buckets, several chunks each
  settings.optimizer = kind;
  settings.offload = offload;
  DataParallel dp(layout, nullptr, settings, 11);
  kernels::OptimizerSettings opt;
  opt.kind = kind;
  opt.lr = 1e-2f;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto order = layout.accessOrder();
  for (int step = 1; step <= steps; ++step) {
    dp.beginMicro(true);
    // Forward and backward's parameter accesses (ZeRO-3 gathers them), then the gradients in
    // backward's order; the parameters read feed the gradient so that a stale read shows.
    std::vector<double> seen(layout.units(), 0.0);
    for (size_t k = 0; k < order.units.size(); ++k) {
      const int u = order.units[k];
      const float* p = dp.acquire(u, k < order.forwardLength ? Pass::kForward : Pass::kBackward);
      seen[u] = p[0];
      dp.release(u, k < order.forwardLength ? Pass::kForward : Pass::kBackward);
    }
    for (int u = layout.units() - 1; u >= 0; --u) {
      float* g = dp.gradients(u);
      for (size_t i = 0; i < layout.unitCount(u); ++i) g[i] = normal(rng) + static_cast<float>(seen[u]);
      dp.gradientsDone(u);
    }
    dp.step(opt, step, 1.0f);
  }
  Stepped s;
  dp.gatherState(s.params, s.m, s.v);
  return s;
}

TEST(OffloadTest, StepsInAFileLeaveTheBitsOfStepsInMemory) {
  const fs::path dir = fs::temp_directory_path() / ("chorus-offload-dp-" + std::to_string(::getpid()));
  OffloadSettings file;
  file.optimizer = OffloadTarget::kFile;
  file.directory = dir.string();
  file.windowBytes = 4 * 1024 * 3 * sizeof(float);  // chunks of 1024: units straddle them
  for (const auto kind : {kernels::Optimizer::kAdamW, kernels::Optimizer::kSgd}) {
    for (int zero : {0, 1, 3}) {
      for (bool params : {false, true}) {
        if (params && zero != 3) continue;
        OffloadSettings offload = file;
        if (params) offload.params = OffloadTarget::kFile;
        const Stepped a = runSteps(zero, kind, OffloadSettings{}, 4);
        const Stepped b = runSteps(zero, kind, offload, 4);
        const std::string what = fmt::format("{} ZeRO-{}{}", kind == kernels::Optimizer::kSgd ? "SGD" : "AdamW", zero,
                                             params ? " with parameters in the file" : "");
        EXPECT_EQ(a.params, b.params) << what;
        EXPECT_EQ(a.m, b.m) << what;
        EXPECT_EQ(a.v, b.v) << what;
        EXPECT_NE(a.m, std::vector<float>(a.m.size(), 0.0f)) << what << ": the state never moved";
      }
    }
  }
  OffloadSettings bad = file;
  bad.params = OffloadTarget::kFile;
  try {
    runSteps(1, kernels::Optimizer::kAdamW, bad, 1);
    FAIL() << "parameters in a file with ZeRO-1 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZeRO-1"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace chorus::training
