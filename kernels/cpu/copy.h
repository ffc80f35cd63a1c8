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

// Whether a collective's final copies and results are worth streaming past the cache: where its
// footprint on the host (every rank's input and output together) exceeds half the last-level
// cache of the machines measured (32 MiB). Smaller calls stay in that cache, where plain stores
// win: 2 ranks, all-gather of 4 MiB out of place (2 MiB copies; footprint 12 MiB) took 124-125 us
// on chorusMemAlloc buffers and 238-300 on the heap with plain stores, 355-415 and 424-479
// streamed; with 4 ranks (20 MiB) streaming won: 1324-1422 us vs 1868-1876 plain. Each copy of
// less than kStreamingMinBytes stays plain.
inline constexpr size_t kStreamingFootprintBytes = size_t{16} << 20;
inline constexpr size_t kStreamingMinBytes = size_t{64} << 10;
inline bool streamingPays(size_t footprintBytes, size_t copyBytes) {
  return footprintBytes > kStreamingFootprintBytes && copyBytes >= kStreamingMinBytes;
}

}  // namespace chorus::kernels
