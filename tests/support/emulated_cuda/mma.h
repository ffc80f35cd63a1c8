// mma.h, under tests/support/cuda_emulation.h: targets built against the emulation put this folder
// first on their include path, so the CUDA source and the GPU tests compile unchanged.
#pragma once
#include "tests/support/cuda_emulation.h"
