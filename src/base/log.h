// log.h: leveled logging to stderr, controlled by CHORUS_DEBUG. Thread-safe.
#pragma once

#include <fmt/format.h>

#include <string>

namespace chorus {

enum class LogLevel { kWarn = 0, kInfo = 1, kTrace = 2 };

// True if messages of this level are printed.
bool logEnabled(LogLevel level);
void logLine(LogLevel level, const std::string& message);

template <typename... Args>
void logAt(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (logEnabled(level)) logLine(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace chorus
