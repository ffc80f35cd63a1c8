// error.cc: helpers for chorus::Error.
#include "src/base/error.h"

#include <cerrno>
#include <cstring>

namespace chorus {

void failErrno(const std::string& what) {
  const int saved = errno;
  throw Error(chorusSystemError, fmt::format("{}: {}", what, std::strerror(saved)));
}

}  // namespace chorus
