// copy.h: copies of host memory. Pure functions; safe from any thread.
#pragma once

#include <cstddef>

namespace chorus::kernels {

// dst[0, bytes) = src[0, bytes) with non-temporal stores: the written lines go to memory without
// first being read into the cache (a plain copy reads every destination line before writing it)
// and without evicting what is cached. For large destinations that are not read again soon, as
// the final bytes of a collective. The buffers must not overlap. memcpy where the CPU has no
// streaming stores.
void copyStreaming(void* dst, const void* src, size_t bytes);

// Final copies of at least this many bytes are worth streaming: a destination larger than a
// core's L2 cache (1 MiB on the machines measured) would not stay in it anyway.
inline constexpr size_t kStreamingCopyBytes = size_t{1} << 20;

}  // namespace chorus::kernels
