// peak_test.cc: the GEMM peak behind MFU (src/training/peak.h): where it comes from, in what
// order, how a calibration is kept and read back, and how an MFU over 100% is printed.
#include "src/training/peak.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "chorus/error.hpp"
#include "kernels/cpu/matmul.h"
#include "src/training/job.h"

namespace chorus::training {
namespace {

namespace fs = std::filesystem;

// A calibration file of its own, named by CHORUS_CALIBRATION for the test's length.
class PeakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("chorus_peak_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    file_ = (dir_ / "sub" / "peaks.json").string();
    setenv("CHORUS_CALIBRATION", file_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("CHORUS_CALIBRATION");
    fs::remove_all(dir_);
  }
  fs::path dir_;
  std::string file_;
};

TEST_F(PeakTest, MfuOverAHundredPercentSaysWhy) {
  EXPECT_EQ(mfuText(0.655, PeakSource::kMeasured), "MFU 65.5%");
  EXPECT_EQ(mfuText(1.0, PeakSource::kDeclared), "MFU 100.0%");
  EXPECT_EQ(mfuText(1.28, PeakSource::kMeasured), "MFU 128.0% (over 100%: the peak was measured under load)");
  EXPECT_EQ(mfuText(1.28, PeakSource::kCalibrated),
            "MFU 128.0% (over 100%: the calibrated peak is below this machine's)");
  EXPECT_EQ(mfuText(3.0, PeakSource::kDeclared), "MFU 300.0% (over 100%: the declared peak is below this machine's)");
}

TEST_F(PeakTest, ACalibrationIsKeptPerMachineAndPrecisionAndReadBack) {
  EXPECT_EQ(calibrationFile(), file_);
  EXPECT_FALSE(calibratedPeak(file_, "fp32").has_value());  // no file yet
  saveCalibratedPeak(file_, "fp32", 123.5);
  saveCalibratedPeak(file_, "bf16", 400.0);
  const auto fp32 = calibratedPeak(file_, "fp32");
  ASSERT_TRUE(fp32.has_value());
  EXPECT_EQ(fp32->gflops, 123.5);
  EXPECT_EQ(fp32->source, PeakSource::kCalibrated);
  EXPECT_NE(fp32->describe().find(file_), std::string::npos) << fp32->describe();
  EXPECT_EQ(calibratedPeak(file_, "bf16")->gflops, 400.0);
  EXPECT_FALSE(calibratedPeak(file_, "fp16").has_value());
  // The key names the BLAS kernels: SGEMM's peak under OpenBLAS's fallback is not its peak.
  EXPECT_NE(machineKey().find(chorus::kernels::blasDescription()), std::string::npos) << machineKey();
  // Another machine's entry is not this one's.
  std::ofstream(file_) << R"({"some other CPU, 96 cores": {"fp32": {"gflops": 9000}}})";
  EXPECT_FALSE(calibratedPeak(file_, "fp32").has_value());
}

TEST_F(PeakTest, ABrokenCalibrationIsRefusedByName) {
  fs::create_directories(fs::path(file_).parent_path());
  std::ofstream(file_) << "[1, 2]";
  try {
    calibratedPeak(file_, "fp32");
    FAIL() << "a JSON array was read as a calibration";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file_ + " is not a JSON object"), std::string::npos) << e.what();
  }
  std::ofstream(file_) << "{\"" << machineKey() << "\": {\"fp32\": {\"gflops\": 0}}}";
  try {
    calibratedPeak(file_, "fp32");
    FAIL() << "a peak of 0 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not positive"), std::string::npos) << e.what();
  }
}

// Declared first, then calibrated; the launcher hands the peak to the ranks whole.
TEST_F(PeakTest, DeclaredComesBeforeCalibratedAndTravelsToTheRanks) {
  saveCalibratedPeak(file_, "fp32", 77.0);
  Job job;
  job.peakTflops = 2.0;
  const GemmPeak declared = findPeak(job);
  EXPECT_EQ(declared.gflops, 2000.0);
  EXPECT_EQ(declared.source, PeakSource::kDeclared);
  EXPECT_EQ(declared.describe(), "declared ([run] peak_tflops)");
  job.peakTflops = 0;
  const GemmPeak calibrated = findPeak(job);
  EXPECT_EQ(calibrated.gflops, 77.0);
  EXPECT_EQ(calibrated.source, PeakSource::kCalibrated);
  exportPeak(calibrated);
  const auto imported = importedPeak();
  ASSERT_TRUE(imported.has_value());
  EXPECT_EQ(imported->gflops, 77.0);
  EXPECT_EQ(imported->source, PeakSource::kCalibrated);
  EXPECT_EQ(imported->where, calibrated.where);
  for (const char* name : {"CHORUS_TRAIN_PEAK_GFLOPS", "CHORUS_TRAIN_PEAK_SOURCE", "CHORUS_TRAIN_PEAK_WHERE"}) {
    unsetenv(name);
  }
  EXPECT_FALSE(importedPeak().has_value());
}

}  // namespace
}  // namespace chorus::training
