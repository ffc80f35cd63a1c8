// log.cc: leveled logging.
#include "src/base/log.h"

#include <strings.h>
#include <unistd.h>

#include <cstdio>

#include "src/base/config.h"

namespace chorus {
namespace {

LogLevel parseLevel() {
  const std::string text = knobString(Knob::kDebug);
  if (strcasecmp(text.c_str(), "INFO") == 0) return LogLevel::kInfo;
  if (strcasecmp(text.c_str(), "TRACE") == 0) return LogLevel::kTrace;
  return LogLevel::kWarn;
}

}  // namespace

bool logEnabled(LogLevel level) {
  static const LogLevel threshold = parseLevel();
  return level <= threshold;
}

void logLine(LogLevel level, const std::string& message) {
  static const char* const kNames[] = {"WARN", "INFO", "TRACE"};
  const std::string line = fmt::format("chorus {} [pid {}]: {}\n", kNames[static_cast<int>(level)], getpid(), message);
  // One write per line so lines of different processes do not interleave.
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

bool writeFileWhole(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  std::FILE* out = std::fopen(partial.c_str(), "w");
  if (out == nullptr) return false;
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  return std::fclose(out) == 0 && written && std::rename(partial.c_str(), path.c_str()) == 0;
}

}  // namespace chorus
