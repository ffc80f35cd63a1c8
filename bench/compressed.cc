// compressed.cc: collbench --compress: the compressed all-reduce of each compressor timed beside
// the fp32 all-reduce of the same buffer, with what the transports sent per rank per call
// (chorusCommGetTraffic: payload, indices, scales and headers), the compression ratio in those
// bytes, the effective busbw (the fp32 buffer's bytes over the compressed call's time, with
// nccl-tests' all-reduce factor) and the error of one call against the fp32 mean. With --mem
// device both calls take device buffers on the rank's stream (the compressed one staged by chorus
// through the host, where the compressors work); the inputs and the checked result go through the
// host copies; with --mem chorus the host buffers come from chorusMemAlloc.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/device_memory.h"
#include "bench/engine.h"
#include "bench/options.h"
#include "chorus/chorus.h"

namespace chorus::bench {
namespace {

struct Timed {
  double timeUs = 0;     // rank average per call
  double wireBytes = 0;  // rank average per call
};

// The matrix PowerSGD sees: the largest power-of-two row count up to sqrt(count) that divides it.
size_t rowsOf(size_t count) {
  size_t rows = 1;
  while ((rows * 2) * (rows * 2) <= count && count % (rows * 2) == 0) rows *= 2;
  return rows;
}

class Sweep {
 public:
  Sweep(const Options& o, chorusComm_t comm)
      : o_(o), comm_(comm), sendBuffer_(o.mem == "chorus"), recvBuffer_(o.mem == "chorus") {
    chorusCommUserRank(comm, &rank_);
    chorusCommCount(comm, &nranks_);
    if (o.mem == "device") device_ = std::make_unique<DeviceMemory>(rank_);
  }

  int run() {
    const bool average = o_.redop == "avg";
    if (o_.op != "allreduce" || o_.type != "float" || (o_.redop != "sum" && o_.redop != "avg")) {
      if (rank_ == 0) {
        std::fprintf(stderr,
                     "collbench: --compress times all-reduce of float with sum or avg, not --op %s -d %s -o %s\n",
                     o_.op.c_str(), o_.type.c_str(), o_.redop.c_str());
      }
      return 2;
    }
    const chorusRedOp_t op = average ? chorusAvg : chorusSum;
    const bool print = rank_ == 0;
    const char* transport = std::getenv("CHORUS_TRANSPORT");
    const char* rate = std::getenv("CHORUS_TCP_RATE_LIMIT");
    const char* delay = std::getenv("CHORUS_TCP_DELAY");
    if (print) {
      std::printf(
          "# collbench (chorus) compressed all-reduce  nranks: %d  transport: %s  tcp rate: %s  tcp delay: %s  "
          "iters: %d  warmup: %d  memory: %s\n",
          nranks_, transport ? transport : "auto", rate ? rate : "unlimited", delay ? delay : "none", o_.iters,
          o_.warmup,
          device_ ? device_->describe().c_str()
                  : (o_.mem == "chorus" ? "host, chorusMemAlloc (--mem chorus)" : "host"));
      std::printf(
          "#  wire B = bytes the transports sent per rank per call (headers included); ratio = fp32's wire B "
          "over the compressor's (- where the fp32 call moved its data without the transports: a direct path "
          "reads the peers' buffers);\n#  busbw = the fp32 buffer's bytes over the call's time x 2(n-1)/n; "
          "rel_err = |one call - fp32 mean| / |fp32 mean|; #diff = ranks whose result bits differ\n");
      std::printf("# %10s %11s %-22s %10s %8s %8s %12s %8s %9s %5s %10s %8s %12s %8s\n", "size", "count", "compressor",
                  "time(us)", "algbw", "busbw", "wire B", "ratio", "rel_err", "#diff", "fp32(us)", "busbw", "wire B",
                  "speedup");
    }
    nlohmann::json table = nlohmann::json::array();
    int differing = 0;
    for (size_t bytes = o_.minBytes; bytes != 0; bytes = nextSize(o_, bytes)) {
      const size_t count = bytes / sizeof(float);
      if (count == 0) continue;
      fill(count);
      const size_t rows = rowsOf(count);
      const Timed plain = time(count, op, nullptr);
      // The fp32 mean (or sum) of this input: what one compressed call is compared with.
      std::vector<float> reference(count);
      check(chorusAllReduce(input_.data(), reference.data(), count, chorusFloat32, op, comm_, nullptr),
            "fp32 all-reduce");
      for (const std::string& spec : o_.compress) {
        chorusCompressor_t compressor = nullptr;
        check(chorusCompressorCreate(comm_, spec.c_str(), 1, &count, &rows, &compressor), "chorusCompressorCreate");
        // One call on fresh state for the error and the agreement of the ranks, then the timed calls.
        std::vector<float> out(count);
        once(count, op, compressor);
        if (device_) {
          device_->synchronize();
          device_->download(reinterpret_cast<char*>(out.data()), out_, count * sizeof(float));
        } else {
          std::memcpy(out.data(), recvBuffer_.data(), count * sizeof(float));
        }
        double diff = 0, norm = 0;
        for (size_t i = 0; i < count; ++i) {
          diff += (double(out[i]) - reference[i]) * (double(out[i]) - reference[i]);
          norm += double(reference[i]) * reference[i];
        }
        const double relError = norm > 0 ? std::sqrt(diff / norm) : 0;
        const int differs = ranksDiffer(out);
        differing += differs;
        const Timed packed = time(count, op, compressor);
        chorusCompressorInfo_t info{};
        check(chorusCompressorGetInfo(compressor, &info), "chorusCompressorGetInfo");
        chorusCompressorDestroy(compressor);
        const double factor = nranks_ > 1 ? 2.0 * (nranks_ - 1) / nranks_ : 0;
        const double algbw = packed.timeUs > 0 ? bytes / 1e3 / packed.timeUs : 0;
        const double plainAlgbw = plain.timeUs > 0 ? bytes / 1e3 / plain.timeUs : 0;
        // A ratio of bytes on the wire says something only where fp32's call put its data there: any
        // all-reduce over the transports sends each rank at least (n - 1)/n of the buffer, on
        // average; a direct path (chorusMemAlloc buffers on shm, a GPU's ranks) sends almost none.
        const bool measured = packed.wireBytes > 0 && plain.wireBytes >= double(bytes) * (nranks_ - 1) / nranks_;
        const double ratio = measured ? plain.wireBytes / packed.wireBytes : 0;
        const double speedup = packed.timeUs > 0 ? plain.timeUs / packed.timeUs : 0;
        if (print) {
          char ratioText[32] = "-";
          if (measured) std::snprintf(ratioText, sizeof ratioText, "%.2f", ratio);
          std::printf("  %10zu %11zu %-22s %10.1f %8.3f %8.3f %12.0f %8s %9.2e %5d %10.1f %8.3f %12.0f %8.2f\n", bytes,
                      count, info.spec, packed.timeUs, algbw, algbw * factor, packed.wireBytes, ratioText, relError,
                      differs, plain.timeUs, plainAlgbw * factor, plain.wireBytes, speedup);
        }
        table.push_back({{"size_bytes", bytes},
                         {"count", count},
                         {"rows", rows},
                         {"compressor", info.spec},
                         {"nranks", nranks_},
                         {"time_us", packed.timeUs},
                         {"algbw_GBps", algbw},
                         {"busbw_GBps", algbw * factor},
                         {"wire_bytes_per_rank", packed.wireBytes},
                         {"payload_bytes_per_rank", info.payloadBytes},
                         {"ratio", measured ? nlohmann::json(ratio) : nlohmann::json(nullptr)},
                         {"formula_ratio", info.ratio},
                         {"rel_error", relError},
                         {"ranks_differ", differs},
                         {"speedup", speedup},
                         {"fp32",
                          {{"time_us", plain.timeUs},
                           {"algbw_GBps", plainAlgbw},
                           {"busbw_GBps", plainAlgbw * factor},
                           {"wire_bytes_per_rank", plain.wireBytes}}}});
      }
    }
    if (print) {
      std::printf("# Ranks that disagreed : %d %s\n#\n", differing, differing == 0 ? "OK" : "FAILED");
      if (!o_.json.empty()) {
        const nlohmann::json doc = {{"tool", "collbench"},
                                    {"op", "allreduce"},
                                    {"compressed", true},
                                    {"nranks", nranks_},
                                    {"iters", o_.iters},
                                    {"warmup", o_.warmup},
                                    {"transport", transport ? transport : "auto"},
                                    {"tcp_rate", rate ? rate : ""},
                                    {"tcp_delay", delay ? delay : ""},
                                    {"rows", table}};
        if (!writeOutput(o_.json, doc.dump(2) + "\n")) return 2;
      }
    }
    return differing == 0 ? 0 : 1;
  }

 private:
  void check(chorusResult_t result, const char* what) {
    if (result == chorusSuccess) return;
    std::fprintf(stderr, "collbench rank %d: %s failed: %s: %s\n", rank_, what, chorusGetErrorString(result),
                 chorusGetLastError(comm_));
    std::exit(2);
  }

  // Gradient-like input: normal values, different on every rank (on a device, uploaded there).
  void fill(size_t count) {
    std::mt19937 engine(1234u + static_cast<unsigned>(rank_));
    std::normal_distribution<float> normal;
    input_.resize(count);
    for (float& v : input_) v = normal(engine);
    if (device_) {
      in_ = device_->reserve(0, count * sizeof(float));
      out_ = device_->reserve(1, count * sizeof(float));
      device_->upload(in_, reinterpret_cast<const char*>(input_.data()), count * sizeof(float));
    } else {
      sendBuffer_.assign(count * sizeof(float), 0);
      std::memcpy(sendBuffer_.data(), input_.data(), count * sizeof(float));
      recvBuffer_.assign(count * sizeof(float), 0);
    }
  }

  // One all-reduce of the input into the output, compressed by compressor (null: fp32); on a
  // device enqueued on the rank's stream.
  void once(size_t count, chorusRedOp_t op, chorusCompressor_t compressor) {
    const void* in = device_ ? static_cast<const void*>(in_) : sendBuffer_.data();
    void* out = device_ ? static_cast<void*>(out_) : recvBuffer_.data();
    chorusStream_t stream = device_ ? device_->stream() : nullptr;
    if (compressor == nullptr) {
      check(chorusAllReduce(in, out, count, chorusFloat32, op, comm_, stream), "all-reduce");
    } else {
      check(chorusCompressedAllReduce(in, out, count, chorusFloat32, op, compressor, comm_, stream),
            "chorusCompressedAllReduce");
    }
  }

  // Warm-up calls, then the timed ones (on a device, until the stream has run them); the time and
  // the bytes sent, averaged over the ranks.
  Timed time(size_t count, chorusRedOp_t op, chorusCompressor_t compressor) {
    for (int i = 0; i < o_.warmup; ++i) once(count, op, compressor);
    if (device_) device_->synchronize();
    check(chorusBarrier(comm_, nullptr), "barrier");
    chorusTraffic_t before{}, after{};
    check(chorusCommGetTraffic(comm_, &before), "chorusCommGetTraffic");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) once(count, op, compressor);
    if (device_) device_->synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check(chorusCommGetTraffic(comm_, &after), "chorusCommGetTraffic");
    double mine[2] = {seconds / o_.iters * 1e6, double(after.bytesSent - before.bytesSent) / o_.iters};
    double sum[2] = {};
    check(chorusAllReduce(mine, sum, 2, chorusFloat64, chorusSum, comm_, nullptr), "all-reduce of times");
    return {sum[0] / nranks_, sum[1] / nranks_};
  }

  // 1 when some rank's result has other bits than rank 0's.
  int ranksDiffer(const std::vector<float>& result) {
    uint64_t hash = 1469598103934665603ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(result.data());
    for (size_t i = 0; i < result.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
    uint64_t lowest = 0, highest = 0;
    check(chorusAllReduce(&hash, &lowest, 1, chorusUint64, chorusMin, comm_, nullptr), "all-reduce of hashes");
    check(chorusAllReduce(&hash, &highest, 1, chorusUint64, chorusMax, comm_, nullptr), "all-reduce of hashes");
    return lowest == highest ? 0 : 1;
  }

  const Options& o_;
  chorusComm_t comm_;
  int rank_ = 0;
  int nranks_ = 1;
  std::vector<float> input_;
  HostBuffer sendBuffer_, recvBuffer_;    // on the host: the heap's, or chorusMemAlloc's (--mem chorus)
  std::unique_ptr<DeviceMemory> device_;  // --mem device: the buffers below, the stream
  char* in_ = nullptr;
  char* out_ = nullptr;
};

}  // namespace

int runCompressed(const Options& o, chorusComm_t comm) { return Sweep(o, comm).run(); }

}  // namespace chorus::bench
