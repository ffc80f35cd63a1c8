// launcher.h: the rank, size and meeting point a launcher's environment gives a process, for
// chorusCommInitFromEnv: Slurm's srun here (torchrun-style variables and mpiexec's PMI are read
// in api.cc and pmi.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace chorus {

// One task of an srun job step: SLURM_PROCID of SLURM_STEP_NUM_TASKS, meeting at the step's
// first node (SLURM_STEP_NODELIST) on a port every task derives alike: CHORUS_MASTER_PORT /
// MASTER_PORT when set, else one picked from the job and step ids, so two steps of a job do not
// meet each other. The secret is CHORUS_SECRET's when set, else the job and step ids'.
struct SlurmStep {
  int rank = 0;
  int nranks = 0;
  std::string firstHost;
  int port = 0;
  std::string secret;
};

// The step this process is a task of, or nothing outside srun (a batch script or salloc shell
// has no step task variables). Throws std::invalid_argument naming a malformed variable.
std::optional<SlurmStep> slurmStepFromEnvironment();

// The first host of a Slurm host list: "node[03-05,9],gpu1" -> "node03", "a,b" -> "a". Throws
// std::invalid_argument for an empty or unbalanced list.
std::string firstSlurmHost(const std::string& nodelist);

// The port derived from a job and step id: in [20000, 60000).
int slurmPort(uint64_t jobId, uint64_t stepId);

}  // namespace chorus
