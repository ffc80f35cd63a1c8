// error.h: helpers that throw chorus::Error (declared in chorus/error.hpp, so the core and C++ users
// share one class); the C ABI maps it to a result code and a last-error message (api.cc).
// Messages name the rank, peer, operation and sizes.
#pragma once

#include <fmt/format.h>

#include <string>

#include "chorus/error.hpp"

namespace chorus {

// Throws Error(code, formatted message).
template <typename... Args>
[[noreturn]] void fail(chorusResult_t code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Throws chorusSystemError with the text of errno appended: "<what>: <strerror(errno)>".
[[noreturn]] void failErrno(const std::string& what);

}  // namespace chorus
