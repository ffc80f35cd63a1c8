// tuning_fuzz.cc: the tuning file parser (CHORUS_TUNING_FILE) on arbitrary text. A bad line must
// give std::invalid_argument naming it; what parses must be usable by the tuner.
#include <fuzzer/FuzzedDataProvider.h>

#include <sstream>
#include <stdexcept>

#include "src/collectives/tuner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace cc = chorus::collectives;
  FuzzedDataProvider in(data, size);
  const bool network = in.ConsumeBool();
  std::istringstream text(in.ConsumeRemainingBytesAsString());
  try {
    const cc::CostParams params = cc::parseCostParams(text, "fuzz", network, cc::defaultCostParams(network));
    // The parsed model must answer every question the tuner asks of it.
    for (size_t bytes : {size_t{0}, size_t{1000}, size_t{1} << 20}) {
      (void)cc::choose(cc::Collective::kAllReduce, 4, bytes, params, 0);
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
