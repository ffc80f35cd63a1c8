// launcher_test: Slurm's srun environment as chorusCommInitFromEnv reads it (src/core/launcher.h),
// built from source since it is internal to libchorus.
#include "src/core/launcher.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <stdexcept>

namespace chorus {
namespace {

TEST(SlurmHostList, FirstHostKeepsPaddingAndSuffix) {
  EXPECT_EQ(firstSlurmHost("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(firstSlurmHost("a,b"), "a");
  EXPECT_EQ(firstSlurmHost("single"), "single");
  EXPECT_EQ(firstSlurmHost("rack[7,2-3]-n[1-4]"), "rack7-n[1-4]");
  EXPECT_EQ(firstSlurmHost("x[010]y"), "x010y");
  for (const char* bad : {"", "node[1-3", "node]1[", "node[]", "node[a-b]"}) {
    EXPECT_THROW(firstSlurmHost(bad), std::invalid_argument) << bad;
  }
}

class SlurmEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_JOB_ID",
                             "SLURM_STEP_ID", "CHORUS_MASTER_PORT", "MASTER_PORT", "CHORUS_SECRET"}) {
      unsetenv(name);
    }
  }
};

TEST_F(SlurmEnvironment, OutsideAStepThereIsNone) {
  EXPECT_FALSE(slurmStepFromEnvironment().has_value());
  setenv("SLURM_PROCID", "0", 1);  // a batch script has this, but no step of tasks
  EXPECT_FALSE(slurmStepFromEnvironment().has_value());
}

TEST_F(SlurmEnvironment, ATaskMeetsAtTheStepsFirstNodeOnAPortOfTheJobAndStep) {
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  setenv("SLURM_STEP_NODELIST", "cn[12-13]", 1);
  setenv("SLURM_JOB_ID", "4711", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  auto step = slurmStepFromEnvironment();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->rank, 2);
  EXPECT_EQ(step->nranks, 4);
  EXPECT_EQ(step->firstHost, "cn12");
  EXPECT_EQ(step->port, slurmPort(4711, 3));
  EXPECT_GE(step->port, 20000);
  EXPECT_LT(step->port, 60000);
  EXPECT_NE(slurmPort(4711, 3), slurmPort(4711, 4));  // the next step of the job meets elsewhere
  EXPECT_NE(step->secret, "");
  setenv("MASTER_PORT", "31337", 1);
  EXPECT_EQ(slurmStepFromEnvironment()->port, 31337);
  setenv("SLURM_PROCID", "4", 1);
  try {
    slurmStepFromEnvironment();
    ADD_FAILURE() << "SLURM_PROCID 4 of 4 tasks was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID=4"), std::string::npos) << e.what();
  }
  setenv("SLURM_PROCID", "x", 1);
  EXPECT_THROW(slurmStepFromEnvironment(), std::invalid_argument);
}

}  // namespace
}  // namespace chorus
