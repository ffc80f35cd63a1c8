// error.h: chorus::Error, the exception used inside the C++ core; the C ABI maps it to a result
// code and a last-error message (api.cc). Messages name the rank, peer, operation and sizes.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "chorus/chorus.h"

namespace chorus {

class Error : public std::runtime_error {
 public:
  Error(chorusResult_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  chorusResult_t code() const { return code_; }

 private:
  chorusResult_t code_;
};

// Throws Error(code, formatted message).
template <typename... Args>
[[noreturn]] void fail(chorusResult_t code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Throws chorusSystemError with the text of errno appended: "<what>: <strerror(errno)>".
[[noreturn]] void failErrno(const std::string& what);

}  // namespace chorus
