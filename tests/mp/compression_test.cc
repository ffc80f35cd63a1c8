// compression_test.cc: compressed all-reduce on real ranks: PowerSGD exact on low-rank data,
// error feedback conserving what it drops, every rank holding the same bits, the 16-bit codecs'
// error bounds, the bytes the transports send against the formula and how they grow with the
// rank count, the emulated slow tcp link, and the refusals.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

RanksOptions ranks(int n, const char* transport = "shm") {
  RanksOptions o;
  o.nranks = n;
  o.transport = transport;
  return o;
}

// Reproducible data of a rank: normal values from (seed, rank).
std::vector<float> randomData(size_t count, uint64_t seed, int rank) {
  std::mt19937_64 engine(seed * 1000003 + static_cast<uint64_t>(rank));
  std::normal_distribution<float> normal;
  std::vector<float> out(count);
  for (float& v : out) v = normal(engine);
  return out;
}

// Every rank's buffer, gathered on every rank.
std::vector<float> gather(const std::vector<float>& mine, chorusComm_t comm) {
  int n = 0;
  chorusCommCount(comm, &n);
  std::vector<float> all(mine.size() * static_cast<size_t>(n));
  EXPECT_EQ(chorusAllGather(mine.data(), all.data(), mine.size(), chorusFloat32, comm, nullptr), chorusSuccess);
  return all;
}

// The mean over ranks of every rank's data, in double.
std::vector<double> exactMean(const std::vector<float>& all, size_t count, int n) {
  std::vector<double> mean(count, 0.0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) mean[i] += all[static_cast<size_t>(r) * count + i];
  }
  for (double& m : mean) m /= n;
  return mean;
}

// Every rank's result has the same bits as rank 0's.
void expectSameOnEveryRank(const std::vector<float>& result, chorusComm_t comm, const std::string& what) {
  int n = 0;
  chorusCommCount(comm, &n);
  const std::vector<float> all = gather(result, comm);
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(std::memcmp(all.data(), all.data() + static_cast<size_t>(r) * result.size(), result.size() * 4), 0)
        << what << ": rank " << r << " differs from rank 0";
  }
}

// Rank-r PowerSGD of matrices that share one rank-r column space (so their mean has rank r) is
// exact, with a vector beside them sent whole (fp32: exact; bf16: within two roundings).
TEST(Compression, PowerSgdOfRankRMatricesEqualsTheExactMean) {
  for (int r : {1, 4}) {
    for (const std::string whole : {"fp32", "bf16"}) {
      runRanks(ranks(4), [&](int rank, chorusComm_t comm) {
        const size_t rows = 64, cols = 48, vector = 33;
        const std::vector<float> u = randomData(rows * r, 7, 0);  // the same on every rank
        const std::vector<float> v = randomData(cols * r, 11, rank);
        std::vector<float> x(rows * cols + vector, 0.0f);
        for (size_t i = 0; i < rows; ++i) {
          for (size_t j = 0; j < cols; ++j) {
            for (int k = 0; k < r; ++k) x[i * cols + j] += u[i * r + k] * v[j * r + k];
          }
        }
        const std::vector<float> tail = randomData(vector, 13, rank);
        std::copy(tail.begin(), tail.end(), x.begin() + rows * cols);
        const size_t counts[2] = {rows * cols, vector};
        const size_t shape[2] = {rows, 1};
        chorusCompressor_t c = nullptr;
        const std::string spec = "powersgd:" + std::to_string(r) + ",min_rate=1,whole=" + whole;
        ASSERT_EQ(chorusCompressorCreate(comm, spec.c_str(), 2, counts, shape, &c), chorusSuccess)
            << chorusGetLastError(comm);
        std::vector<float> out(x.size());
        ASSERT_EQ(chorusCompressedAllReduce(x.data(), out.data(), x.size(), chorusFloat32, chorusAvg, c, comm, nullptr),
                  chorusSuccess)
            << chorusGetLastError(comm);
        const std::vector<float> all = gather(x, comm);
        const std::vector<double> mean = exactMean(all, x.size(), 4);
        double diff = 0, norm = 0;
        for (size_t i = 0; i < rows * cols; ++i) {
          diff += (out[i] - mean[i]) * (out[i] - mean[i]);
          norm += mean[i] * mean[i];
        }
        EXPECT_LE(std::sqrt(diff / norm), 1e-4) << "rank " << r << " PowerSGD, relative Frobenius error";
        // The vector goes whole: summed in fp32, or as bf16 (two roundings: each rank's x/4, then the mean).
        double largest = 0;  // over every rank's vector
        for (int k = 0; k < 4; ++k) {
          for (size_t i = rows * cols; i < x.size(); ++i)
            largest = std::max(largest, std::fabs(double(all[k * x.size() + i])));
        }
        const double tolerance = whole == "fp32" ? 1e-6 : std::ldexp(largest, -8) * 2;
        for (size_t i = rows * cols; i < x.size(); ++i) {
          EXPECT_NEAR(out[i], mean[i], tolerance) << spec << " vector element " << i;
        }
        // The payload: P (64 x r), then Q (48 x r), each a reduce-scatter + all-gather; the vector
        // with the Ps (fp32), or as 2-byte shards to their owners and back (bf16).
        chorusCompressorInfo_t info{};
        ASSERT_EQ(chorusCompressorGetInfo(c, &info), chorusSuccess);
        auto sumBytes = [](size_t count) { return 2 * 3 * ((count + 3) / 4) * 4; };
        if (whole == "fp32") {
          EXPECT_EQ(info.payloadBytes, sumBytes(rows * r + vector) + sumBytes(cols * r));
        } else {
          EXPECT_EQ(info.payloadBytes, sumBytes(rows * r) + sumBytes(cols * r) + 2 * 3 * ((vector + 3) / 4) * 2);
        }
        expectSameOnEveryRank(out, comm, spec);
        chorusCompressorDestroy(c);
      });
    }
  }
}

// Error feedback conserves what it drops: input + old error = contribution + new error, and the
// result is the mean of the ranks' contributions (for the compressors whose exchange is exact).
// Sign encodes the mean again at each shard's owner, with a memory of its own there: the mean of
// the contributions + the owners' old memory = the result + their new memory.
TEST(Compression, ErrorFeedbackConservesAndTheResultIsTheMeanOfContributions) {
  const char* specs[] = {"powersgd:2,whole=fp32", "powersgd:2", "topk:0.05", "randomk:0.1", "sign", "qsgd:3,ef=1"};
  runRanks(ranks(3), [&](int rank, chorusComm_t comm) {
    for (const char* spec : specs) {
      const size_t counts[3] = {40 * 30, 77, 16 * 20};
      const size_t rows[3] = {40, 1, 16};
      const size_t total = counts[0] + counts[1] + counts[2];
      chorusCompressor_t c = nullptr;
      ASSERT_EQ(chorusCompressorCreate(comm, spec, 3, counts, rows, &c), chorusSuccess) << chorusGetLastError(comm);
      std::vector<float> error(total, 0.0f), contribution(total), newError(total), out(total);
      std::vector<float> ownerError(total, 0.0f), newOwnerError(total);
      const bool ownerFeedback = std::string(spec) == "sign";
      for (int call = 0; call < 3; ++call) {
        const std::vector<float> x = randomData(total, 100 + call, rank);
        ASSERT_EQ(chorusCompressedAllReduce(x.data(), out.data(), total, chorusFloat32, chorusAvg, c, comm, nullptr),
                  chorusSuccess)
            << spec << ": " << chorusGetLastError(comm);
        ASSERT_EQ(chorusCompressorGetResidual(c, newError.data(), contribution.data(), total), chorusSuccess);
        double worst = 0;
        for (size_t i = 0; i < total; ++i) {
          worst = std::max(worst, std::fabs(double(x[i]) + error[i] - contribution[i] - newError[i]));
        }
        EXPECT_LE(worst, 1e-5) << spec << " call " << call << ": input + old error - contribution - new error";
        // Error feedback keeps something: the error is not all zero.
        double kept = 0;
        for (float e : newError) kept += std::fabs(e);
        EXPECT_GT(kept, 0.0) << spec;
        // The exchange is exact (not rounded again at the shards' owners) for these.
        const std::string name = spec;
        if (name == "powersgd:2,whole=fp32" || name.rfind("topk", 0) == 0 || name.rfind("randomk", 0) == 0) {
          const std::vector<double> mean = exactMean(gather(contribution, comm), total, 3);
          for (size_t i = 0; i < total; ++i) {
            ASSERT_NEAR(out[i], mean[i], 1e-5 * (1 + std::fabs(mean[i]))) << spec << " element " << i;
          }
        }
        // The owners' memory, summed over the ranks (each holds its shard's, zeros elsewhere).
        ASSERT_EQ(chorusCompressorGetOwnerResidual(c, newOwnerError.data(), total), chorusSuccess);
        ASSERT_EQ(
            chorusAllReduce(newOwnerError.data(), newOwnerError.data(), total, chorusFloat32, chorusSum, comm, nullptr),
            chorusSuccess);
        const std::vector<double> mean = exactMean(gather(contribution, comm), total, 3);
        double ownerWorst = 0, ownerKept = 0;
        for (size_t i = 0; i < total; ++i) {
          ownerWorst = std::max(ownerWorst, std::fabs(mean[i] + ownerError[i] - out[i] - newOwnerError[i]));
          ownerKept += std::fabs(newOwnerError[i]);
        }
        if (ownerFeedback) {
          EXPECT_LE(ownerWorst, 1e-5) << spec << " call " << call << ": mean + owners' old error - out - new error";
          EXPECT_GT(ownerKept, 0.0) << spec;
        } else {
          EXPECT_EQ(ownerKept, 0.0) << spec << ": a second hop's memory without one";
        }
        ownerError = newOwnerError;
        error = newError;
      }
      expectSameOnEveryRank(out, comm, spec);
      chorusCompressorDestroy(c);
    }
  });
}

// Every compressor leaves the same bits on every rank, with a count that does not divide evenly,
// summing or averaging.
TEST(Compression, EveryRankHoldsTheSameBits) {
  const char* specs[] = {"none", "fp16",      "bf16",         "qsgd:15",    "qsgd:1",
                         "sign", "topk:0.01", "randomk:0.02", "powersgd:4", "powersgd:4,whole=fp32"};
  for (const char* transport : {"shm", "tcp"}) {
    runRanks(ranks(3, transport), [&](int rank, chorusComm_t comm) {
      for (const char* spec : specs) {
        for (chorusRedOp_t op : {chorusSum, chorusAvg}) {
          const size_t counts[2] = {100 * 37, 1001};
          const size_t rows[2] = {100, 0};
          chorusCompressor_t c = nullptr;
          ASSERT_EQ(chorusCompressorCreate(comm, spec, 2, counts, rows, &c), chorusSuccess) << chorusGetLastError(comm);
          std::vector<float> x = randomData(counts[0] + counts[1], 5, rank);
          const std::vector<float> in = x;
          // In place, twice (PowerSGD's warm start and the error feedback carry over).
          for (int call = 0; call < 2; ++call) {
            x = in;
            ASSERT_EQ(chorusCompressedAllReduce(x.data(), x.data(), x.size(), chorusFloat32, op, c, comm, nullptr),
                      chorusSuccess)
                << spec << ": " << chorusGetLastError(comm);
          }
          expectSameOnEveryRank(x, comm, std::string(spec) + " on " + transport);
          // The estimate is near the true mean (or sum): correlation, whatever the compressor.
          const std::vector<double> mean = exactMean(gather(in, comm), in.size(), 3);
          double dot = 0, xx = 0, mm = 0;
          for (size_t i = 0; i < in.size(); ++i) {
            const double m = op == chorusSum ? 3 * mean[i] : mean[i];
            dot += x[i] * m;
            xx += double(x[i]) * x[i];
            mm += m * m;
          }
          const std::string name = spec;
          const double least = name.find('k') != std::string::npos ? 0.05 : name == "qsgd:1" ? 0.25 : 0.4;
          EXPECT_GT(dot / std::sqrt(xx * mm), least) << spec << (op == chorusSum ? " sum" : " mean");
          chorusCompressorDestroy(c);
        }
      }
    });
  }
}

// bf16 and fp16: the mean is rounded once more than the inputs; with inputs already on the
// 16-bit grid each element is within one rounding (2^-8 for bf16, 2^-11 for fp16, relative) of
// the exact mean, and for any inputs within that plus one rounding of the inputs' magnitudes.
TEST(Compression, SixteenBitCodecsStayWithinARounding) {
  runRanks(ranks(4), [&](int rank, chorusComm_t comm) {
    for (const bool bf16 : {true, false}) {
      const double unit = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const size_t count = 50000;
      std::vector<float> x = randomData(count, 17, rank);
      std::vector<float> grid(count);
      for (size_t i = 0; i < count; ++i) {
        // Values in [1, 2) on the 16-bit grid (their sum in fp32 is exact).
        const float v = 1.0f + std::fabs(x[i]) / (1.0f + std::fabs(x[i]));
        grid[i] = bf16 ? kernels::bfloat16ToFloat(kernels::floatToBfloat16(v))
                       : kernels::halfToFloat(kernels::floatToHalf(v));
      }
      const size_t counts[1] = {count};
      chorusCompressor_t c = nullptr;
      ASSERT_EQ(chorusCompressorCreate(comm, bf16 ? "bf16" : "fp16", 1, counts, nullptr, &c), chorusSuccess);
      std::vector<float> out(count);
      ASSERT_EQ(chorusCompressedAllReduce(grid.data(), out.data(), count, chorusFloat32, chorusAvg, c, comm, nullptr),
                chorusSuccess);
      std::vector<double> mean = exactMean(gather(grid, comm), count, 4);
      double worst = 0;
      for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(out[i] - mean[i]) / std::fabs(mean[i]));
      EXPECT_LE(worst, unit) << (bf16 ? "bf16" : "fp16") << " on grid inputs";
      EXPECT_GT(worst, 0.0) << "the codec rounded nothing: is it compressing?";
      // Any inputs, summed.
      ASSERT_EQ(chorusCompressedAllReduce(x.data(), out.data(), count, chorusFloat32, chorusSum, c, comm, nullptr),
                chorusSuccess);
      const std::vector<float> all = gather(x, comm);
      mean = exactMean(all, count, 4);
      for (size_t i = 0; i < count; ++i) {
        double magnitude = 0;
        for (int r = 0; r < 4; ++r) magnitude += std::fabs(all[static_cast<size_t>(r) * count + i]);
        ASSERT_LE(std::fabs(out[i] - 4 * mean[i]), unit * (std::fabs(4 * mean[i]) + magnitude) * 1.0001)
            << "element " << i;
      }
      chorusCompressorDestroy(c);
    }
  });
}

// The bytes each rank's transports send for one call: within 5% of the payload formula (on shm
// and tcp, whose headers are all that is added), and for the linear compressors flat in the rank
// count while top-k's grow with it.
TEST(Compression, MeasuredBytesMatchTheFormulaAndScaleAsExpected) {
  const char* specs[] = {"none", "bf16", "qsgd:7", "sign", "randomk:0.01", "topk:0.01", "powersgd:4"};
  struct Sent {
    uint64_t measured[8];
    uint64_t formula[8];
  };
  auto measure = [&](int n, const char* transport, SharedWithRanks<Sent>& sent) {
    runRanks(ranks(n, transport), [&](int rank, chorusComm_t comm) {
      for (size_t s = 0; s < std::size(specs); ++s) {
        const size_t counts[2] = {512 * 768, 768};
        const size_t rows[2] = {512, 0};
        chorusCompressor_t c = nullptr;
        ASSERT_EQ(chorusCompressorCreate(comm, specs[s], 2, counts, rows, &c), chorusSuccess);
        std::vector<float> x = randomData(counts[0] + counts[1], 3, rank);
        ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);
        chorusTraffic_t before{}, after{};
        ASSERT_EQ(chorusCommGetTraffic(comm, &before), chorusSuccess);
        ASSERT_EQ(chorusCompressedAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusAvg, c, comm, nullptr),
                  chorusSuccess);
        ASSERT_EQ(chorusCommGetTraffic(comm, &after), chorusSuccess);
        chorusCompressorInfo_t info{};
        ASSERT_EQ(chorusCompressorGetInfo(c, &info), chorusSuccess);
        if (rank == 0) {
          sent->measured[s] = after.bytesSent - before.bytesSent;
          sent->formula[s] = info.payloadBytes;
        }
        chorusCompressorDestroy(c);
      }
    });
  };
  for (const char* transport : {"shm", "tcp"}) {
    SharedWithRanks<Sent> two, eight;
    measure(2, transport, two);
    measure(8, transport, eight);
    for (size_t s = 0; s < std::size(specs); ++s) {
      for (const Sent* sent : {&*two, &*eight}) {
        const double measured = static_cast<double>(sent->measured[s]);
        EXPECT_GE(measured, static_cast<double>(sent->formula[s])) << specs[s] << " on " << transport;
        EXPECT_LE(measured, 1.05 * static_cast<double>(sent->formula[s])) << specs[s] << " on " << transport;
      }
      const double growth = static_cast<double>(eight->measured[s]) / static_cast<double>(two->measured[s]);
      if (std::string(specs[s]).rfind("topk", 0) == 0) {
        EXPECT_GE(growth, 6.0) << specs[s] << ": top-k's all-gather grows with the ranks (7x from 2 to 8)";
      } else {
        EXPECT_LE(growth, 2.0) << specs[s] << ": linear compressors send at most 2x their size, any rank count";
      }
    }
    // The compressed payloads are what their formats say against fp32's.
    EXPECT_GE(double(two->measured[0]) / double(two->measured[1]), 1.9) << "bf16 halves the bytes";
    EXPECT_GE(double(two->measured[0]) / double(two->measured[3]), 25.0) << "sign: 1 bit and a scale per 1024";
    EXPECT_GE(double(two->measured[0]) / double(two->measured[6]), 40.0) << "powersgd:4 of a 512 x 768 matrix";
  }
}

// The emulated slow link: at 4 Mbit/s, 1 MB cannot cross in less than 2 s; with 30 ms of delay,
// ten ping-pongs cannot take less than 600 ms. (Lower bounds only: the limiter sets them.)
TEST(Compression, TcpRateLimitAndDelayHold) {
  struct Seconds {
    double rate;
    double delay;
  };
  SharedWithRanks<Seconds> took;
  setenv("CHORUS_TCP_RATE_LIMIT", "4mbit", 1);
  runRanks(ranks(2, "tcp"), [&](int rank, chorusComm_t comm) {
    std::vector<uint8_t> data(1000000, static_cast<uint8_t>(rank));
    const auto start = std::chrono::steady_clock::now();
    if (rank == 0) {
      ASSERT_EQ(chorusSend(data.data(), data.size(), chorusUint8, 1, comm, nullptr), chorusSuccess);
    } else {
      ASSERT_EQ(chorusRecv(data.data(), data.size(), chorusUint8, 0, comm, nullptr), chorusSuccess);
      EXPECT_EQ(data[12345], 0);
    }
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);
    if (rank == 1) took->rate = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  unsetenv("CHORUS_TCP_RATE_LIMIT");
  // 1 MB at 4 Mbit/s is 2 s, less the initial burst (16 KiB).
  EXPECT_GE(took->rate, 1.9);
  setenv("CHORUS_TCP_DELAY", "30ms", 1);
  runRanks(ranks(2, "tcp"), [&](int rank, chorusComm_t comm) {
    int32_t ball = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
      if (rank == 0) {
        ++ball;
        ASSERT_EQ(chorusSend(&ball, 1, chorusInt32, 1, comm, nullptr), chorusSuccess);
        ASSERT_EQ(chorusRecv(&ball, 1, chorusInt32, 1, comm, nullptr), chorusSuccess);
      } else {
        ASSERT_EQ(chorusRecv(&ball, 1, chorusInt32, 0, comm, nullptr), chorusSuccess);
        ++ball;
        ASSERT_EQ(chorusSend(&ball, 1, chorusInt32, 0, comm, nullptr), chorusSuccess);
      }
    }
    if (rank == 0) {
      EXPECT_EQ(ball, 20);
      took->delay = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  });
  unsetenv("CHORUS_TCP_DELAY");
  EXPECT_GE(took->delay, 0.6);
  // A malformed value fails init, naming the variable.
  for (const char* bad : {"CHORUS_TCP_RATE_LIMIT=fast", "CHORUS_TCP_DELAY=5"}) {
    const std::string assignment = bad;
    const std::string name = assignment.substr(0, assignment.find('='));
    setenv(name.c_str(), assignment.substr(name.size() + 1).c_str(), 1);
    const auto codes = runProcesses(2, [&](int rank, const chorusUniqueId& id) {
      chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
      config.transport = "tcp";
      chorusComm_t comm = nullptr;
      EXPECT_EQ(chorusCommInitRankConfig(&comm, 2, id, rank, &config), chorusInvalidArgument);
      EXPECT_NE(std::string(chorusGetLastError(nullptr)).find(name), std::string::npos) << chorusGetLastError(nullptr);
    });
    unsetenv(name.c_str());
    for (int code : codes) EXPECT_EQ(code, 0) << bad;
  }
}

// Bad input is refused with a message that names it, and nothing is sent.
TEST(Compression, RefusalsNameWhatIsWrong) {
  runRanks(ranks(2), [&](int rank, chorusComm_t comm) {
    const size_t counts[2] = {100, 10};
    const size_t badRows[2] = {7, 0};
    chorusCompressor_t c = nullptr;
    auto refused = [&](const char* spec, const size_t* rows, const char* says) {
      EXPECT_EQ(chorusCompressorCreate(comm, spec, 2, counts, rows, &c), chorusInvalidArgument) << spec;
      EXPECT_NE(std::string(chorusGetLastError(comm)).find(says), std::string::npos) << chorusGetLastError(comm);
      EXPECT_EQ(c, nullptr);
    };
    refused("zip", nullptr, "unknown compressor 'zip'");
    refused("topk:2", nullptr, "ratio=2 is not in (0, 1]");
    refused("qsgd:300", nullptr, "levels=300");
    refused("bf16,ef=1", nullptr, "error feedback");
    refused("powersgd:4,colour=red", nullptr, "unknown key 'colour'");
    refused("sign:3", nullptr, "sign takes no parameter");
    refused("powersgd:4,whole=int8", nullptr, "whole=int8 is not fp32, bf16 or fp16");
    refused("topk:0.01,whole=bf16", nullptr, "whole= applies to powersgd only");
    refused("powersgd:4", badRows, "rows 7 do not divide its count 100");
    ASSERT_EQ(chorusCompressorCreate(comm, "topk:0.1", 2, counts, nullptr, &c), chorusSuccess);
    std::vector<float> x(110, 1.0f);
    std::vector<double> d(110);
    EXPECT_EQ(chorusCompressedAllReduce(x.data(), x.data(), 100, chorusFloat32, chorusAvg, c, comm, nullptr),
              chorusInvalidArgument);
    EXPECT_NE(
        std::string(chorusGetLastError(comm)).find("count 100 but the compressor (topk:0.1,ef=1) was made for 110"),
        std::string::npos)
        << chorusGetLastError(comm);
    EXPECT_EQ(chorusCompressedAllReduce(d.data(), d.data(), 110, chorusFloat64, chorusAvg, c, comm, nullptr),
              chorusInvalidArgument);
    EXPECT_EQ(chorusCompressedAllReduce(x.data(), x.data(), 110, chorusFloat32, chorusMax, c, comm, nullptr),
              chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("op max"), std::string::npos);
    ASSERT_EQ(chorusCompressorDestroy(c), chorusSuccess);
    EXPECT_EQ(chorusCompressorDestroy(c), chorusInvalidUsage);
    // The communicator still works: nothing was sent by the refused calls.
    std::vector<float> y(5, static_cast<float>(rank + 1));
    ASSERT_EQ(chorusAllReduce(y.data(), y.data(), 5, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    EXPECT_EQ(y[4], 3.0f);
    // No spec: CHORUS_COMPRESS's.
    setenv("CHORUS_COMPRESS", "bf16", 1);
    chorusCompressor_t fromEnv = nullptr;
    ASSERT_EQ(chorusCompressorCreate(comm, nullptr, 2, counts, nullptr, &fromEnv), chorusSuccess);
    chorusCompressorInfo_t info{};
    ASSERT_EQ(chorusCompressorGetInfo(fromEnv, &info), chorusSuccess);
    EXPECT_STREQ(info.spec, "bf16");
    EXPECT_NEAR(info.ratio, 2.0, 0.05);
    chorusCompressorDestroy(fromEnv);
  });
}

// The C++ API: a Compressor over a Communicator, averaging in place; traffic() counts what it sent.
TEST(Compression, CppCompressor) {
  const auto codes = runProcesses(2, [&](int rank, const chorusUniqueId& id) {
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.transport = "tcp";
    Communicator comm(UniqueId(id), 2, rank, &config);
    const std::vector<size_t> counts{64 * 64, 64};
    const std::vector<size_t> rows{64, 1};
    Compressor compressor(comm, "powersgd:2", counts, rows);
    std::vector<float> x(64 * 64 + 64, static_cast<float>(rank + 1));  // rank 1: the mean is 1.5
    const chorusTraffic_t before = comm.traffic();
    compressor.allReduce(std::span<float>(x), comm);
    const chorusTraffic_t after = comm.traffic();
    for (float v : x) ASSERT_NEAR(v, 1.5f, 1e-5f);
    const chorusCompressorInfo_t info = compressor.info();
    EXPECT_EQ(info.calls, 1u);
    EXPECT_STREQ(info.spec, "powersgd:2,warm=1,whole=bf16,ef=1");
    EXPECT_GE(after.bytesSent - before.bytesSent, info.payloadBytes);
    std::vector<float> error(x.size()), mine(x.size());
    compressor.residual(error, mine);
    EXPECT_NEAR(mine[5], static_cast<float>(rank + 1), 1e-5f);
    // PowerSGD has no second hop's memory: all zero (NaN first, so the call must write it).
    std::vector<float> owner(x.size(), std::nanf(""));
    compressor.ownerResidual(owner);
    for (float v : owner) ASSERT_EQ(v, 0.0f);
    EXPECT_THROW(compressor.ownerResidual(std::span<float>(owner.data(), 10)), Error);
    EXPECT_THROW(compressor.allReduce(std::span<float>(x.data(), 10), comm), Error);
  });
  for (int code : codes) EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace chorus
