// config.cc: the table of environment knobs.
#include "src/base/config.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "src/base/error.h"
#include "src/base/knob_table.h"
#include "src/base/log.h"

namespace chorus {
namespace {

static_assert(kRuntimeKnobs == static_cast<int>(Knob::kCount),
              "knob_table.h lists the Knob enum's knobs first, in order");

const KnobSpec& spec(Knob knob) { return kKnobs[static_cast<size_t>(knob)]; }

}  // namespace

const char* knobName(Knob knob) { return spec(knob).name; }

bool knobSet(Knob knob) {
  const char* value = std::getenv(spec(knob).name);
  return value != nullptr && value[0] != '\0';
}

std::string knobString(Knob knob) { return knobSet(knob) ? std::getenv(spec(knob).name) : spec(knob).defaultValue; }

bool parseNonNegative(const std::string& text, int64_t max, int64_t* value) {
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || parsed < 0 || parsed > max) return false;
  *value = parsed;
  return true;
}

int64_t knobInt(Knob knob) {
  const std::string text = knobString(knob);
  int64_t value = 0;
  if (!parseNonNegative(text, std::numeric_limits<int64_t>::max(), &value)) {
    fail(chorusInvalidArgument, "{}='{}' is not a non-negative integer", spec(knob).name, text);
  }
  return value;
}

namespace {

// Splits "12.5mbit" into 12.5 and "mbit"; false for no number, a negative one or trailing junk
// before the unit.
bool splitQuantity(const std::string& text, double* number, std::string* unit) {
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || !(parsed >= 0) || parsed > 1e18) return false;
  *number = parsed;
  *unit = end;
  return true;
}

}  // namespace

namespace {

struct Unit {
  const char* name;
  double factor;
};

// The knob as a number with one of `units` (0 when unset); else chorusInvalidArgument saying
// what it should be.
template <size_t N>
double knobQuantity(Knob knob, const Unit (&units)[N], const char* expected) {
  if (!knobSet(knob)) return 0;
  const std::string text = knobString(knob);
  double number = 0;
  std::string unit;
  if (splitQuantity(text, &number, &unit)) {
    for (const Unit& u : units) {
      if (unit == u.name) return number * u.factor;
    }
  }
  fail(chorusInvalidArgument, "{}='{}' is not {}", spec(knob).name, text, expected);
}

}  // namespace

double knobBitsPerSecond(Knob knob) {
  static constexpr Unit kRates[] = {{"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}};
  return knobQuantity(knob, kRates, "a rate: a number with a unit bit, kbit, mbit or gbit (e.g. 50mbit)");
}

int64_t knobMicroseconds(Knob knob) {
  static constexpr Unit kDurations[] = {{"us", 1}, {"ms", 1e3}, {"s", 1e6}};
  return static_cast<int64_t>(
      knobQuantity(knob, kDurations, "a duration: a number with a unit us, ms or s (e.g. 5ms)"));
}

void logKnobs(int rank) {
  for (int i = 0; i < kRuntimeKnobs; ++i) {
    const KnobSpec& k = kKnobs[i];
    const char* env = std::getenv(k.name);
    const bool fromEnv = env != nullptr && env[0] != '\0';
    logAt(LogLevel::kInfo, "rank {}: {}={} ({}) - {}", rank, k.name, fromEnv ? env : k.defaultValue,
          fromEnv ? "environment" : "default", k.meaning);
  }
}

std::string firstEnv(std::initializer_list<const char*> names, const char** which) {
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value != nullptr && value[0] != '\0') {
      if (which != nullptr) *which = name;
      return value;
    }
  }
  return {};
}

}  // namespace chorus
