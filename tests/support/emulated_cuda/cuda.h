// cuda.h (the driver's header), under tests/support/cuda_emulation.h: the driver types and calls
// chorus uses are emulated with the runtime (cuda_emulation_runtime.h).
#pragma once
#include "tests/support/cuda_emulation.h"
