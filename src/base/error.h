// error.h: helpers that throw chorus::Error (declared in chorus/error.hpp, so the core and C++ users
// share one class); the C ABI maps it to a result code and a last-error message (api.cc).
// Messages name the rank, peer, operation and sizes.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

#include "chorus/error.hpp"

namespace chorus {

// Throws Error(code, formatted message).
template <typename... Args>
[[noreturn]] void fail(chorusResult_t code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// A connection to a peer that closed (chorusRemoteError): the peer died, or left after a failure
// of its own, whose cause it tells on the failure line (bootstrap.h).
class LinkLost : public Error {
 public:
  using Error::Error;
};

// Throws chorusSystemError with the text of errno appended: "<what>: <strerror(errno)>".
[[noreturn]] void failErrno(const std::string& what);

}  // namespace chorus
