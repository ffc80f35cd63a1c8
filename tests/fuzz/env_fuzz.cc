// env_fuzz.cc: the parsers of environment knobs: every integer knob (through the environment,
// as a user sets it) and the launcher variables (RANK, WORLD_SIZE, MASTER_PORT), CHORUS_SOCKET_IFNAME,
// CHORUS_RANK_ORDER and CHORUS_ALGO. Bad text must give
// chorusInvalidArgument or std::invalid_argument with a message, never a crash.
#include <fuzzer/FuzzedDataProvider.h>
#include <stdlib.h>

#include <stdexcept>

#include "chorus/error.hpp"
#include "src/base/config.h"
#include "src/base/interfaces.h"
#include "src/collectives/algorithm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int which = in.ConsumeIntegralInRange<int>(0, 3);
  const std::string text = in.ConsumeRemainingBytesAsString();
  try {
    switch (which) {
      case 0: {
        // RANK, WORLD_SIZE, MASTER_PORT: the launcher variables' parser, with an int's range.
        int64_t value = 0;
        if (chorus::parseNonNegative(text, 2147483647, &value) && (value < 0 || value > 2147483647)) __builtin_trap();
        for (const chorus::Knob knob : {chorus::Knob::kTimeoutMs, chorus::Knob::kChunkBytes, chorus::Knob::kShmSlots}) {
          if (text.find('\0') != std::string::npos) break;  // no environment value holds one
          setenv(chorus::knobName(knob), text.c_str(), 1);
          if (chorus::knobInt(knob) < 0) __builtin_trap();
        }
        break;
      }
      case 1: {
        const chorus::InterfaceFilter filter = chorus::parseInterfaceFilter(text);
        if (filter.names.empty()) __builtin_trap();
        (void)filter.matches("eth0");
        break;
      }
      case 2:
        (void)chorus::collectives::parseRankOrder(text);
        break;
      default:
        (void)chorus::collectives::parseAlgorithmOverrides(text);
        break;
    }
  } catch (const chorus::Error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
