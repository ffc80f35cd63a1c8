// peak.h: the GEMM peak that MFU is measured against, and where it came from. A peak measured at
// start reads low when other work shares the cores (MFU then comes out too high), so a declared
// value ([run] peak_tflops, --peak-tflops) comes first, then a calibration kept per machine and
// precision (chorus-train --calibrate, on an idle machine), and only then a measurement now.
#pragma once

#include <optional>
#include <string>

namespace chorus::training {

struct Job;

enum class PeakSource { kDeclared, kCalibrated, kMeasured };

struct GemmPeak {
  double gflops = 0.0;
  PeakSource source = PeakSource::kMeasured;
  std::string where;  // calibrated: the file and date
  // "declared ([run] peak_tflops)", "calibrated (FILE, DATE)", "measured now (...)".
  std::string describe() const;
};

// The cores this process may run on.
int usableCpus();

// Measures GEMM throughput in a compute precision ("fp32": SGEMM; "bf16", "fp16": the 16-bit
// products mixed precision uses, kernels::gemm16) with `threads` BLAS threads (square products of
// n, the best of five trials of about seconds / 5 each), in GFLOP/s.
double measureGemmGflops(int threads, int n = 1024, double seconds = 0.5, const std::string& precision = "fp32");
// The same on a device (Device of backend.h, not the CPU): products of n through its backend
// (cuBLAS), timed in batches of ten from the host. Throws as makeBackend where there is no device.
enum class Device;
double measureDeviceGemmGflops(Device device, int n = 8192, double seconds = 1.0,
                               const std::string& precision = "fp32");

// This machine, as calibrations are keyed: the CPU model, the usable cores and the BLAS kernels.
std::string machineKey();
// The calibration file: $CHORUS_CALIBRATION, else $XDG_CACHE_HOME/chorus/gemm-peaks.json, else
// ~/.cache/chorus/gemm-peaks.json. JSON: {machine: {precision: {"gflops": x, "date": "..."}}}.
std::string calibrationFile();
// This machine's calibrated peak for the precision ("fp32", "bf16", "fp16"), if the file has one.
std::optional<GemmPeak> calibratedPeak(const std::string& file, const std::string& precision);
// Keeps a peak for this machine and precision in the file (created with its folder).
void saveCalibratedPeak(const std::string& file, const std::string& precision, double gflops);

// The job's peak in its compute precision ([precision] compute): declared, else calibrated, else
// measured now (on a device, [run] device: declared, else measured on it now).
GemmPeak findPeak(const Job& job);
// The launcher hands its peak to the ranks through the environment (CHORUS_TRAIN_PEAK_*).
void exportPeak(const GemmPeak& peak);
std::optional<GemmPeak> importedPeak();

// MFU as the progress line shows it: "MFU 41.2%". Above 100% it says why (the peak read low under
// load, or the declared or calibrated peak is below what the machine does), never a bare figure.
std::string mfuText(double mfu, PeakSource source);

}  // namespace chorus::training
