// log.h: leveled logging to stderr, controlled by CHORUS_DEBUG. Thread-safe.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

namespace chorus {

enum class LogLevel { kWarn = 0, kInfo = 1, kTrace = 2 };

// True if messages of this level are printed.
bool logEnabled(LogLevel level);
void logLine(LogLevel level, const std::string& message);

// Writes text to path whole: into path + ".partial", then renamed over path, so a reader (a
// tool, a metrics scraper) never sees half a file. False where it could not.
bool writeFileWhole(const std::string& path, const std::string& text);

template <typename... Args>
void logAt(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (logEnabled(level)) logLine(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace chorus
