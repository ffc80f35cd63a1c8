// launcher.cc: Slurm's srun environment (launcher.h).
#include "src/core/launcher.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace chorus {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

uint64_t number(const char* name, const char* text, uint64_t limit) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || value > limit) {
    throw std::invalid_argument(fmt::format("{}='{}' is not a number in [0, {}]", name, text, limit));
  }
  return value;
}

}  // namespace

std::string firstSlurmHost(const std::string& nodelist) {
  // The first entry: up to the first comma outside brackets.
  int depth = 0;
  size_t end = 0;
  for (; end < nodelist.size(); ++end) {
    const char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) break;
  }
  if (depth != 0 || end == 0) throw std::invalid_argument(fmt::format("host list '{}' is malformed", nodelist));
  const std::string entry = nodelist.substr(0, end);
  const size_t open = entry.find('[');
  if (open == std::string::npos) return entry;
  const size_t close = entry.find(']', open);
  // Within the brackets, the first range's first number keeps its zero padding.
  const std::string ranges = entry.substr(open + 1, close - open - 1);
  const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
  if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
    throw std::invalid_argument(fmt::format("host list '{}' is malformed", nodelist));
  }
  return entry.substr(0, open) + first + entry.substr(close + 1);
}

int slurmPort(uint64_t jobId, uint64_t stepId) { return 20000 + static_cast<int>((jobId * 1031 + stepId * 7) % 40000); }

std::optional<SlurmStep> slurmStepFromEnvironment() {
  const char* procid = env("SLURM_PROCID");
  const char* ntasks = env("SLURM_STEP_NUM_TASKS");
  const char* nodelist = env("SLURM_STEP_NODELIST");
  if (procid == nullptr || ntasks == nullptr || nodelist == nullptr) return std::nullopt;
  SlurmStep step;
  step.nranks = static_cast<int>(number("SLURM_STEP_NUM_TASKS", ntasks, 1 << 24));
  step.rank = static_cast<int>(number("SLURM_PROCID", procid, 1 << 24));
  if (step.rank >= step.nranks) {
    throw std::invalid_argument(fmt::format("SLURM_PROCID={} is not below SLURM_STEP_NUM_TASKS={}", procid, ntasks));
  }
  step.firstHost = firstSlurmHost(nodelist);
  const char* job = env("SLURM_JOB_ID");
  const char* stepId = env("SLURM_STEP_ID");
  const uint64_t jobNumber = job != nullptr ? number("SLURM_JOB_ID", job, UINT32_MAX) : 0;
  const uint64_t stepNumber = stepId != nullptr ? number("SLURM_STEP_ID", stepId, UINT32_MAX) : 0;
  const char* portName = env("CHORUS_MASTER_PORT") != nullptr ? "CHORUS_MASTER_PORT" : "MASTER_PORT";
  if (const char* port = env(portName)) {
    step.port = static_cast<int>(number(portName, port, 65535));
    if (step.port == 0) throw std::invalid_argument(fmt::format("{}=0 is not a port", portName));
  } else {
    step.port = slurmPort(jobNumber, stepNumber);
  }
  const char* secret = env("CHORUS_SECRET");
  step.secret = secret != nullptr ? secret : fmt::format("slurm job {} step {}", jobNumber, stepNumber);
  return step;
}

}  // namespace chorus
