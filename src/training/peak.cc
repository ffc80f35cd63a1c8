// peak.cc: the GEMM peak of peak.h: measured, calibrated per machine, or declared.
#include "src/training/peak.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "chorus/error.hpp"
#include "kernels/cpu/matmul.h"
#include "src/training/backend.h"
#include "src/training/job.h"

namespace chorus::training {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string GemmPeak::describe() const {
  switch (source) {
    case PeakSource::kDeclared:
      return "declared ([run] peak_tflops)";
    case PeakSource::kCalibrated:
      return fmt::format("calibrated ({})", where);
    case PeakSource::kMeasured:
      break;
  }
  if (!where.empty()) return fmt::format("measured now ({})", where);
  return "measured now (reads low if other work shares the cores; chorus-train --calibrate keeps one)";
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

namespace {

// GFLOP/s of products of n: the best of five trials of about seconds / 5 each (a trial that shared
// the machine with something else reads low), after a warm-up. Each round calls product() batch
// times, then finished() (which returns once they are done).
double bestOfFiveTrials(int n, double seconds, int batch, const std::function<void()>& product,
                        const std::function<void()>& finished) {
  product();
  finished();
  double best = 0.0;
  for (int trial = 0; trial < 5; ++trial) {
    long calls = 0;
    const auto start = Clock::now();
    double elapsed = 0.0;
    do {
      for (int k = 0; k < batch; ++k) product();
      finished();
      calls += batch;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < seconds / 5);
    best = std::max(best, 2.0 * n * static_cast<double>(n) * n * calls / elapsed / 1e9);
  }
  return best;
}

}  // namespace

double measureGemmGflops(int threads, int n, double seconds, const std::string& precision) {
  const int before = kernels::blasThreads();
  kernels::setBlasThreads(threads);
  const Compute compute = parseCompute(precision);
  const auto format = compute == Compute::kFp16 ? kernels::Float16::kFp16 : kernels::Float16::kBf16;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size(), 0.0f);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  kernels::toFloat16(format, a.data(), a16.data(), a.size());
  kernels::toFloat16(format, b.data(), b16.data(), b.size());
  auto product = [&] {
    if (compute == Compute::kFp32) {
      kernels::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    } else {
      kernels::gemm16(format, false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    }
  };
  const double best = bestOfFiveTrials(n, seconds, 1, product, [] {});
  kernels::setBlasThreads(before);
  return best;
}

std::string machineKey() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  // SGEMM's speed depends on the kernels BLAS runs as much as on the CPU.
  return fmt::format("{}, {} cores, {}", model, usableCpus(), kernels::blasDescription());
}

std::string calibrationFile() {
  if (const char* file = std::getenv("CHORUS_CALIBRATION"); file != nullptr && *file != '\0') return file;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && *cache != '\0') {
    return std::string(cache) + "/chorus/gemm-peaks.json";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/chorus/gemm-peaks.json";
}

namespace {

nlohmann::json readCalibrations(const std::string& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  nlohmann::json all = nlohmann::json::parse(in, nullptr, false);
  if (all.is_discarded() || !all.is_object()) {
    throw Error(chorusInvalidArgument, fmt::format("calibration file {} is not a JSON object", file));
  }
  return all;
}

}  // namespace

std::optional<GemmPeak> calibratedPeak(const std::string& file, const std::string& precision) {
  const nlohmann::json all = readCalibrations(file);
  const auto machine = all.find(machineKey());
  if (machine == all.end() || !machine->contains(precision)) return std::nullopt;
  const nlohmann::json& entry = (*machine)[precision];
  const double gflops = entry.value("gflops", 0.0);
  if (!(gflops > 0)) {
    throw Error(chorusInvalidArgument, fmt::format("calibration file {}: {} peak of \"{}\" is {}, not positive", file,
                                                   precision, machineKey(), entry.dump()));
  }
  return GemmPeak{gflops, PeakSource::kCalibrated, fmt::format("{}, {}", file, entry.value("date", "undated"))};
}

void saveCalibratedPeak(const std::string& file, const std::string& precision, double gflops) {
  nlohmann::json all = readCalibrations(file);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M", std::localtime(&now));
  all[machineKey()][precision] = {{"gflops", gflops}, {"date", date}};
  const fs::path path(file);
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(file);
  out << all.dump(1) << "\n";
  if (!out) throw Error(chorusSystemError, "cannot write the calibration file " + file);
}

double measureDeviceGemmGflops(Device device, int n, double seconds, const std::string& precision) {
  std::unique_ptr<Backend> backend = makeBackend(device);
  const Compute compute = parseCompute(precision);
  const auto format = compute == Compute::kFp16 ? kernels::Float16::kFp16 : kernels::Float16::kBf16;
  const size_t elements = static_cast<size_t>(n) * n;
  Buffer<float> a(*backend, elements), b(*backend, elements), c(*backend, elements);
  Buffer<uint16_t> a16(*backend, elements), b16(*backend, elements);
  backend->fill(a.data(), elements, 0.5f);
  backend->fill(b.data(), elements, 0.25f);
  backend->toFloat16(format, a.data(), a16.data(), elements);
  backend->toFloat16(format, b.data(), b16.data(), elements);
  auto product = [&] {
    if (compute == Compute::kFp32) {
      backend->matmulForward(c.data(), a.data(), b.data(), nullptr, n, n, n);
    } else {
      backend->matmulForward16(format, c.data(), a16.data(), b16.data(), nullptr, n, n, n);
    }
  };
  float sink = 0.0f;
  // The products are enqueued; the host waits for a batch of ten at a time.
  return bestOfFiveTrials(n, seconds, 10, product, [&] { backend->toHost(&sink, c.data(), sizeof(sink)); });
}

GemmPeak findPeak(const Job& job) {
  if (job.peakTflops > 0) return GemmPeak{job.peakTflops * 1e3, PeakSource::kDeclared, ""};
  if (const Device device = parseDevice(job.device); device != Device::kCpu) {
    return GemmPeak{measureDeviceGemmGflops(device, 8192, 1.0, job.compute), PeakSource::kMeasured,
                    fmt::format("{} GEMMs of 8192 on the device", job.compute)};
  }
  if (auto calibrated = calibratedPeak(calibrationFile(), job.compute)) return *calibrated;
  return GemmPeak{measureGemmGflops(usableCpus(), 1024, 0.5, job.compute), PeakSource::kMeasured, ""};
}

void exportPeak(const GemmPeak& peak) {
  const char* source = peak.source == PeakSource::kDeclared     ? "declared"
                       : peak.source == PeakSource::kCalibrated ? "calibrated"
                                                                : "measured";
  setenv("CHORUS_TRAIN_PEAK_GFLOPS", fmt::format("{:.3f}", peak.gflops).c_str(), 1);
  setenv("CHORUS_TRAIN_PEAK_SOURCE", source, 1);
  setenv("CHORUS_TRAIN_PEAK_WHERE", peak.where.c_str(), 1);
}

std::optional<GemmPeak> importedPeak() {
  const char* gflops = std::getenv("CHORUS_TRAIN_PEAK_GFLOPS");
  if (gflops == nullptr || std::atof(gflops) <= 0) return std::nullopt;
  GemmPeak peak{std::atof(gflops), PeakSource::kMeasured, ""};
  const std::string source = std::getenv("CHORUS_TRAIN_PEAK_SOURCE") ? std::getenv("CHORUS_TRAIN_PEAK_SOURCE") : "";
  if (source == "declared") peak.source = PeakSource::kDeclared;
  if (source == "calibrated") peak.source = PeakSource::kCalibrated;
  if (const char* where = std::getenv("CHORUS_TRAIN_PEAK_WHERE")) peak.where = where;
  return peak;
}

std::string mfuText(double mfu, PeakSource source) {
  std::string text = fmt::format("MFU {:.1f}%", 100 * mfu);
  if (mfu <= 1.0) return text;
  switch (source) {
    case PeakSource::kMeasured:
      return text + " (over 100%: the peak was measured under load)";
    case PeakSource::kCalibrated:
      return text + " (over 100%: the calibrated peak is below this machine's)";
    case PeakSource::kDeclared:
      break;
  }
  return text + " (over 100%: the declared peak is below this machine's)";
}

}  // namespace chorus::training
