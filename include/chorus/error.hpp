// error.hpp: chorus::Error, the exception of the C++ API and of the library's core.
#ifndef CHORUS_ERROR_HPP_
#define CHORUS_ERROR_HPP_

#include <chorus/chorus.h>

#include <stdexcept>
#include <string>

namespace chorus {

// A failed chorus call: code() is the C result code, what() the message.
class Error : public std::runtime_error {
 public:
  Error(chorusResult_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  chorusResult_t code() const { return code_; }

 private:
  chorusResult_t code_;
};

}  // namespace chorus

#endif  // CHORUS_ERROR_HPP_
