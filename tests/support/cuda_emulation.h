// cuda_emulation.h: the part of CUDA that chorus's CUDA source is written against (kernels/cuda's
// attention, tensor-core and scalar, nn.cu's and moe.cu's layers, reduce.cu's reductions and
// casts, their launchers; the device engine's kernels, src/core/device_kernels.cu and
// device_ring.cuh; the runtime calls of src/core/device.cc, src/transport/cuda_ipc.cc and
// src/training/backend_cuda.cc), emulated on the host, so that the same source runs where there
// is no GPU. Every CUDA thread of a block is a fiber of the thread that runs the launch (a stack of
// its own; switching costs no system call on x86-64), run until it waits at __syncthreads or
// __syncwarp, the scheduler taking the fibers in turn; a warp's shuffles and ballots go through an
// exchange behind a warp barrier; asynchronous copies to shared memory (cp.async) land only when
// their thread waits for them, their destinations NaN until then; static shared memory is one
// copy for the whole launch (the blocks run one after another, and the process's kernels one at a
// time); the warp's tensor-core product (mma.sync m16n8k16, kernels/cuda/mma.cuh) reads every
// lane's registers through that exchange by PTX's layout of them, and each lane computes its own
// part of the result; its matrix load (ldmatrix) exchanges the lanes' row addresses and gives each
// lane its elements. A barrier some thread never reaches (divergent code) aborts, saying so. The
// runtime (memory, streams as host threads, events, CUDA IPC between processes, graphs) is
// cuda_emulation_runtime.h's, which says what it models. What neither models: the hardware's order
// of the sums inside one product, memory ordering beyond the barriers, blocks running at once, and
// a kernel's own launch limits (registers, __launch_bounds__, static shared memory; refusedLaunch
// says which limits it keeps). Include it before the kernels' source, or put emulated_cuda/ (which
// stands in for CUDA's headers and cuBLAS's) first on the include path.
#pragma once

#define CHORUS_CUDA_EMULATION 1

#include <ucontext.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CHORUS_EMULATION_ASAN 1
#endif

#include "kernels/cpu/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(bytes) alignas(bytes)
#define __shared__ static  // one copy for the launch: its blocks run one after another

using std::max;
using std::min;  // as CUDA's device min and max; expf, logf and fmaxf are the C library's

struct EmulatedDim {
  constexpr EmulatedDim(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
  unsigned x, y, z;
};
using dim3 = EmulatedDim;
inline thread_local EmulatedDim threadIdx, blockIdx;
inline thread_local EmulatedDim blockDim, gridDim;

struct float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

#include "tests/support/cuda_emulation_runtime.h"

// Rounded products and sums; kept apart only where the including test compiles with
// -ffp-contract=off (nn_emulated_test does), else a host with FMA may fuse them once inlined.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

inline float atomicAdd(float* p, float value) { return std::atomic_ref<float>(*p).fetch_add(value); }
inline int atomicAdd(int* p, int value) { return std::atomic_ref<int>(*p).fetch_add(value); }
inline int atomicSub(int* p, int value) { return std::atomic_ref<int>(*p).fetch_sub(value); }

namespace chorus::testing::emulation {

constexpr size_t kFiberStackBytes = 256 << 10;
// Each fiber's stack starts this much lower than the last's, modulo kFiberStackSpread: the stacks
// are separate allocations of the same size, so their tops (where every switch reads and writes)
// would otherwise all sit at one address modulo the allocation's size. Measured on
// chorus-train-emulated's parity job (107 million switches in 6 steps), on one AMD EPYC: ~13% less
// time spread over 16 KiB; spread within one page (4 KiB) no gain.
constexpr size_t kFiberStackStagger = 13 * 64, kFiberStackSpread = 16 << 10;

// Where a fiber's (or the scheduler's) registers were left. On x86-64 a switch saves the
// callee-saved registers on the stack it leaves and keeps that stack's pointer (no system call, as
// swapcontext makes to save the signal mask); elsewhere it is a ucontext_t.
#if defined(__x86_64__)
struct Context {
  void* stack = nullptr;
};
// Saves the callee-saved registers on this stack and its pointer in *from, then takes to's.
[[gnu::naked]] static void swapStacks(void** /*from*/, void* /*to*/) {
  asm volatile(
      "pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n"
      "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
      "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n ret\n");
}
inline void swapContext(Context* from, const Context* to) { swapStacks(&from->stack, to->stack); }
// A context that starts entry() on the stack of `bytes` at base (entry never returns).
inline void makeContext(Context* c, void (*entry)(), char* base, size_t bytes) {
  auto top = (reinterpret_cast<uintptr_t>(base) + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uintptr_t*>(top);
  *--slot = 0;                                   // entry's return address: none
  *--slot = reinterpret_cast<uintptr_t>(entry);  // where the first switch's ret goes
  for (int r = 0; r < 6; ++r) *--slot = 0;       // the six registers it pops
  c->stack = slot;
}
#else
struct Context {
  ucontext_t context;
};
inline void swapContext(Context* from, const Context* to) { swapcontext(&from->context, &to->context); }
inline void makeContext(Context* c, void (*entry)(), char* base, size_t bytes) {
  getcontext(&c->context);
  c->context.uc_stack.ss_sp = base;
  c->context.uc_stack.ss_size = bytes;
  c->context.uc_link = nullptr;
  makecontext(&c->context, entry, 0);
}
#endif

// A barrier of `expected` fibers: each that arrives waits (yields to the next ready fiber) until
// the last arrives and makes them ready.
struct FiberBarrier {
  int expected = 0, arrived = 0;
  std::vector<int> waiting;
};
// An asynchronous copy (kernels/cuda/copy_async.cuh) not yet landed: where it goes, what it writes.
struct PendingCopy {
  void* to;
  std::array<unsigned char, 16> bytes;
};
// A CUDA thread: its context and stack, its indices, whether it waits at a barrier or has
// finished, and its asynchronous copies not yet waited for.
struct Fiber {
  Context context;
  char* stack = nullptr;
  EmulatedDim thread, block;
  bool waiting = false, done = false;
  std::vector<PendingCopy> openCopies;              // issued since the last commit
  std::deque<std::vector<PendingCopy>> copyGroups;  // committed, oldest first
};

// What the emulation knows of each 16 bytes of dynamic shared memory that asynchronous copies
// (cp.async) write and ldmatrix reads, to catch the races a GPU would run into: copies in flight
// to them, the block barrier epoch (barriers passed) and warp of the last copy landed, and the
// epoch of the last reads and the warps (a bit each) that read them in it.
struct SharedChunk {
  int inFlight = 0;
  int landedEpoch = -1, lander = -1;
  int readEpoch = -1;
  uint32_t readers = 0;
};

// One launch's threads (those ready to run, in the order they became ready), their block barrier
// and warp barriers, the shuffles' exchange, the dynamic shared memory (reused block after block)
// with what the race checks know of it, and the kernel with its arguments.
struct Launch {
  Launch(int threads, size_t sharedBytes, EmulatedDim grid)
      : fibers(threads),
        exchange(threads),
        turn(threads),
        shared(sharedBytes + 128, 0xcd),
        chunks(shared.size() / 16 + 1),
        grid(grid) {
    block.expected = threads;
    for (int w = 0; w * 32 < threads; ++w) warps.push_back(FiberBarrier{std::min(32, threads - w * 32), 0, {}});
  }
  std::vector<Fiber> fibers;
  std::deque<int> ready;
  FiberBarrier block;
  std::vector<FiberBarrier> warps;
  // Two values per thread, of up to 16 bytes each, used in turn (turn[thread]: the next one).
  std::vector<std::array<std::array<unsigned char, 16>, 2>> exchange;
  std::vector<unsigned char> turn;
  std::vector<unsigned char> shared;
  std::vector<SharedChunk> chunks;  // by 16 bytes of `shared`
  int epoch = 0;                    // block barriers passed
  EmulatedDim grid;
  void (*body)(void*) = nullptr;  // runs the kernel on this thread's indices
  void* bodyArgument = nullptr;
  Context scheduler;                     // the launching thread's own context, back in once no fiber is ready
  int running = -1;                      // the fiber running now
  const void* schedulerStack = nullptr;  // for AddressSanitizer's stack switches
  size_t schedulerStackBytes = 0;
};
inline thread_local Launch* current = nullptr;

inline unsigned char* sharedBytes() {
  // 128-byte aligned, as the kernels declare it.
  const auto at = reinterpret_cast<uintptr_t>(current->shared.data());
  return current->shared.data() + ((128 - at % 128) % 128);
}

// The chunk of dynamic shared memory that holds p, or null where p is not in it.
inline SharedChunk* chunkAt(const void* p) {
  const auto* byte = static_cast<const unsigned char*>(p);
  const unsigned char* base = current->shared.data();
  if (byte < base || byte >= base + current->shared.size()) return nullptr;
  return &current->chunks[static_cast<size_t>(byte - base) / 16];
}

// A switch of contexts, told to AddressSanitizer (which otherwise takes the other stack for an
// overflow). stack: the one switched to; leaving: the context left will not run again.
inline void switchContext(Context* from, const Context* to, const void* stack, size_t bytes, bool leaving) {
#if CHORUS_EMULATION_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(leaving ? nullptr : &fake, stack, bytes);
#else
  (void)stack, (void)bytes, (void)leaving;
#endif
  swapContext(from, to);
#if CHORUS_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// Leaves `from` (the running fiber, or the launching thread) for the next ready fiber, its indices
// made the current ones, or, where none is ready, for the launching thread.
inline void switchToNext(Launch& l, Context* from, bool leaving) {
  if (l.ready.empty()) {
    switchContext(from, &l.scheduler, l.schedulerStack, l.schedulerStackBytes, leaving);
    return;
  }
  const int next = l.ready.front();
  l.ready.pop_front();
  Fiber& f = l.fibers[next];
  l.running = next;
  threadIdx = f.thread;
  blockIdx = f.block;
  if (&f.context == from) return;  // the fiber that yields is the next to run: it goes on
  switchContext(from, &f.context, f.stack, kFiberStackBytes, leaving);
}

// The order in which the threads of a block or warp run from one barrier to the next: first to
// last, or last to first where CHORUS_EMULATION_ORDER=reverse. Code that reads what another thread
// writes without a barrier between (a race on a GPU) reads it in one of the two orders only, so a
// test that passes both ways does not depend on such a read. Either way the warps go about in step
// (a warp that passes a warp barrier, as every shuffle and tensor-core product is, waits for the
// others' turns); with CHORUS_EMULATION_ORDER=ahead a warp released from a warp barrier runs on at
// once, so each warp runs to the block's next barrier before the next warp starts: a warp that
// reads shared memory another warp writes after the same barrier (a missing __syncthreads) reads
// it before it is written.
inline const char* emulationOrder() {
  static const char* order = [] {
    const char* o = std::getenv("CHORUS_EMULATION_ORDER");
    return o != nullptr ? o : "";
  }();
  return order;
}
inline bool reversed() { return std::strcmp(emulationOrder(), "reverse") == 0; }
inline bool warpsAhead() { return std::strcmp(emulationOrder(), "ahead") == 0; }

// The running fiber waits at b until every fiber it expects has arrived. The last to arrive makes
// them all ready, itself included, in thread order (the emulation's order), and yields.
inline void arrive(FiberBarrier& b) {
  Launch& l = *current;
  Fiber& me = l.fibers[l.running];
  me.waiting = true;
  b.waiting.push_back(l.running);
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    if (&b == &l.block) ++l.epoch;
    // The fibers arrive in the order the last barrier made them ready, so mostly already sorted.
    if (reversed()) {
      if (!std::is_sorted(b.waiting.begin(), b.waiting.end(), std::greater<int>())) {
        std::sort(b.waiting.begin(), b.waiting.end(), std::greater<int>());
      }
    } else if (!std::is_sorted(b.waiting.begin(), b.waiting.end())) {
      std::sort(b.waiting.begin(), b.waiting.end());
    }
    for (const int f : b.waiting) l.fibers[f].waiting = false;
    if (warpsAhead() && &b != &l.block) {
      l.ready.insert(l.ready.begin(), b.waiting.begin(), b.waiting.end());
    } else {
      l.ready.insert(l.ready.end(), b.waiting.begin(), b.waiting.end());
    }
    b.waiting.clear();
  }
  switchToNext(l, &me.context, false);
}

// A fiber's life: the kernel on its thread index for every block of the grid in order, a block
// barrier after each (the block done before the next reuses shared memory).
inline void fiberMain() {
  Launch& l = *current;
#if CHORUS_EMULATION_ASAN
  // The first fiber starts from the launching thread: its stack is the one to come back to.
  if (l.schedulerStack == nullptr) {
    __sanitizer_finish_switch_fiber(nullptr, &l.schedulerStack, &l.schedulerStackBytes);
  } else {
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
  }
#endif
  const int me = l.running;
  for (unsigned z = 0; z < l.grid.z; ++z) {
    for (unsigned y = 0; y < l.grid.y; ++y) {
      for (unsigned x = 0; x < l.grid.x; ++x) {
        l.fibers[me].block = blockIdx = {x, y, z};
        l.body(l.bodyArgument);
        if (!l.fibers[me].openCopies.empty() || !l.fibers[me].copyGroups.empty()) {
          std::fprintf(stderr,
                       "cuda emulation: thread %d of block (%u, %u, %u) ended with cp.async copies not waited for\n",
                       me, x, y, z);
          std::abort();
        }
        arrive(l.block);
      }
    }
  }
  l.fibers[me].done = true;
  switchToNext(l, &l.fibers[me].context, true);
}

// Runs the launch's fibers, each until it waits or ends, switching from one to the next ready
// one, until all have ended; aborts, saying so, where all that are left wait (a barrier some
// thread of the block or warp never reaches: divergent code, undefined on a GPU).
inline void runFibers(Launch& l) {
  thread_local std::vector<std::unique_ptr<char[]>> stacks;  // kept from launch to launch
  const int threads = static_cast<int>(l.fibers.size());
  while (static_cast<int>(stacks.size()) < threads) stacks.emplace_back(new char[kFiberStackBytes]);
  for (int t = 0; t < threads; ++t) {
    Fiber& f = l.fibers[t];
    f.thread = {static_cast<unsigned>(t), 0, 0};
    f.stack = stacks[t].get();
#if CHORUS_EMULATION_ASAN
    // The last launch's frames left poisoned where its fibers stopped (they never return).
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kFiberStackBytes);
#endif
    makeContext(&f.context, fiberMain, f.stack, kFiberStackBytes - (t * kFiberStackStagger) % kFiberStackSpread);
    l.ready.push_back(t);
  }
  if (reversed()) std::reverse(l.ready.begin(), l.ready.end());  // the emulation's order
  switchToNext(l, &l.scheduler, false);
  for (const Fiber& f : l.fibers) {
    if (!f.done) {
      std::fprintf(stderr,
                   "cuda emulation: every thread left waits at a barrier that another thread of its block or "
                   "warp will not reach (__syncthreads or __syncwarp in divergent code)\n");
      std::abort();
    }
  }
}

// kernel(args...) over the grid, `threads` threads per block with `sharedBytes` of dynamic shared
// memory, every thread a fiber of the calling thread, made once and going through the blocks in
// order.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, EmulatedDim grid, int threads, size_t sharedBytes, Args... args) {
  auto run = [&] { kernel(args...); };
  Launch state(threads, sharedBytes, grid);
  state.body = [](void* f) { (*static_cast<decltype(run)*>(f))(); };
  state.bodyArgument = &run;
  Launch* const outer = current;
  current = &state;
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  gridDim = grid;
  runFibers(state);
  current = outer;
}

}  // namespace chorus::testing::emulation

namespace chorus::testing::emulation {
// Why a GPU refuses a launch of this shape (cudaErrorInvalidConfiguration, nothing run), or empty:
// a grid or a block of no threads, a block of more than 1024, a grid beyond 2^31 - 1 by 65535 by
// 65535 blocks, dynamic shared memory above 48 KiB but for what cudaFuncSetAttribute allowed (the
// runtime's raisedSharedBytes). Not modelled: a kernel's own limits (its registers, its
// __launch_bounds__) and its static shared memory.
inline std::string refusedLaunch(EmulatedDim grid, int threads, size_t sharedBytes) {
  char why[160] = "";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    std::snprintf(why, sizeof why, "a grid of %u x %u x %u blocks", grid.x, grid.y, grid.z);
  } else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    std::snprintf(why, sizeof why, "a grid of %u x %u x %u blocks (at most 2147483647 x 65535 x 65535)", grid.x, grid.y,
                  grid.z);
  } else if (threads <= 0 || threads > 1024) {
    std::snprintf(why, sizeof why, "%d threads per block (1 to 1024)", threads);
  } else if (sharedBytes > std::max(kDefaultSharedBytes, raisedSharedBytes)) {
    std::snprintf(why, sizeof why, "%zu bytes of dynamic shared memory, above the kernel's limit of %zu", sharedBytes,
                  std::max(kDefaultSharedBytes, raisedSharedBytes));
  }
  return why;
}

// launch() in stream order, once the GPU would take its shape (refusedLaunch) and every pointer
// argument is null, device memory or pinned host memory; else, as a GPU would fail the kernel's
// first access to it, nothing runs and the launch's error is cudaErrorIllegalAddress. The
// process's kernels run one at a time.
template <typename Kernel, typename... Args>
void checkedLaunch(const char* name, cudaStream_t stream, Kernel kernel, EmulatedDim grid, int threads,
                   size_t sharedBytes, Args... args) {
  if (const std::string refused = refusedLaunch(grid, threads, sharedBytes); !refused.empty()) {
    std::fprintf(stderr, "cuda emulation: launch of %s: %s\n", name, refused.c_str());
    device().lastError = cudaErrorInvalidConfiguration;
    return;
  }
  int index = 0;
  bool ok = true;
  auto check = [&](const auto& a) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>) {
      const auto* p = const_cast<const void*>(static_cast<const volatile void*>(a));
      if (ok && p != nullptr && !deviceReachable(p)) {
        std::fprintf(stderr, "cuda emulation: launch of %s: argument %d (%p) is not device memory\n", name, index, p);
        device().lastError = cudaErrorIllegalAddress;
        ok = false;
      }
    }
    ++index;
  };
  (check(args), ...);
  if (!ok) return;
  enqueue(stream, [=] {
    std::lock_guard<std::recursive_mutex> lock(device().kernels);
    launch(kernel, grid, threads, sharedBytes, args...);
  });
}
}  // namespace chorus::testing::emulation

// kernels/cuda/grid.cuh's launch line, run here: the kernel (a template deduces its arguments from
// the call, as in a CUDA launch) over the grid, on host threads, in the stream's order, its pointer
// arguments checked at the launch.
#define CHORUS_LAUNCH(kernel, grid, threads, sharedBytes, stream, ...)                                          \
  ::chorus::testing::emulation::checkedLaunch(                                                                  \
      #kernel, static_cast<cudaStream_t>(stream), [=](auto... a) { kernel(a...); }, grid, threads, sharedBytes, \
      __VA_ARGS__)

#define CHORUS_DYNAMIC_SHARED(name) unsigned char* name = ::chorus::testing::emulation::sharedBytes()

inline void __syncthreads() { chorus::testing::emulation::arrive(chorus::testing::emulation::current->block); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  chorus::testing::emulation::arrive(chorus::testing::emulation::current->warps[threadIdx.x / 32]);
}
namespace chorus::testing::emulation {
// Lane `lane` of this thread's warp's x: each lane puts its x in its slot of this turn, and after
// a warp barrier reads the other's. Two slots used in turn need one barrier per exchange: a lane
// writes a slot again only two exchanges later, past the barrier of the one between, which every
// lane reaches only once it has read this one.
template <typename T>
T fromLane(T x, unsigned lane) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>);
  const int slot = current->turn[threadIdx.x];
  current->turn[threadIdx.x] ^= 1;
  std::memcpy(current->exchange[threadIdx.x][slot].data(), &x, sizeof(T));
  __syncwarp();
  T other;
  std::memcpy(&other, current->exchange[threadIdx.x - threadIdx.x % 32 + lane % 32][slot].data(), sizeof(T));
  return other;
}
// Every lane's x, by lane: one exchange, as fromLane's.
template <typename T>
std::array<T, 32> fromEveryLane(T x) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>);
  const int slot = current->turn[threadIdx.x];
  current->turn[threadIdx.x] ^= 1;
  std::memcpy(current->exchange[threadIdx.x][slot].data(), &x, sizeof(T));
  __syncwarp();
  std::array<T, 32> all;
  const unsigned first = threadIdx.x - threadIdx.x % 32;
  for (unsigned lane = 0; lane < 32; ++lane) {
    std::memcpy(&all[lane], current->exchange[first + lane][slot].data(), sizeof(T));
  }
  return all;
}
// A warp's read of 16 bytes of shared memory by ldmatrix: aborts, saying so, where a cp.async to
// them is still in flight, or landed by another warp's wait since the last __syncthreads (the
// barrier that makes it visible to this warp); then notes the read, for the copies that follow.
inline void readSharedRow(const void* row) {
  SharedChunk* c = chunkAt(row);
  if (c == nullptr) return;
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (c->inFlight > 0 || (c->landedEpoch == current->epoch && c->lander != warp)) {
    std::fprintf(stderr,
                 "cuda emulation: warp %d's ldmatrix reads shared memory at %p %s (a race: wait for the copies, "
                 "then __syncthreads)\n",
                 warp, row,
                 c->inFlight > 0 ? "while a cp.async to it is in flight"
                                 : "that another warp's cp.async landed in without a __syncthreads since");
    std::abort();
  }
  if (c->readEpoch != current->epoch) {
    c->readEpoch = current->epoch;
    c->readers = 0;
  }
  c->readers |= 1u << warp;
}
// The warp's ldmatrix (m8n8, 16-bit, kCount matrices; kernels/cuda/mma.cuh): lane 8 m + r gives the
// address of row r of matrix m, which must be 16-byte aligned as a GPU's needs; register m of lane
// 4 r + w gets elements 2w, 2w+1 of matrix m's row r, or with trans of its column r (the elements
// of rows 2w and 2w+1). Every lane's address is exchanged first, then each reads its elements.
template <int kCount>
void warpLoadMatrices(uint32_t (&out)[kCount], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    std::fprintf(stderr, "cuda emulation: an ldmatrix row at %p, not 16-byte aligned (cudaErrorMisalignedAddress)\n",
                 row);
    std::abort();
  }
  const std::array<const void*, 32> rows = fromEveryLane(row);
  const int lane = static_cast<int>(threadIdx.x % 32), r = lane / 4, w = lane % 4;
  if (lane == 0) {
    for (int i = 0; i < 8 * kCount; ++i) readSharedRow(rows[i]);
  }
  for (int m = 0; m < kCount; ++m) {
    const auto at = [&](int i, int j) {  // matrix m's row i, element j
      uint16_t bits;
      std::memcpy(&bits, static_cast<const unsigned char*>(rows[8 * m + i]) + 2 * j, sizeof bits);
      return static_cast<uint32_t>(bits);
    };
    out[m] = trans ? at(2 * w, r) | at(2 * w + 1, r) << 16 : at(r, 2 * w) | at(r, 2 * w + 1) << 16;
  }
}
// kernels/cuda/copy_async.cuh's copies (cp.async): 16 bytes from `from` to `to` (both 16-byte
// aligned, as a GPU needs), issued now and landed only when this thread waits for their group;
// until then the destination holds NaNs (all ones: NaN in fp32, bf16 and fp16), so that a read
// before the wait and the block's barrier, or a tile overwritten while another warp reads it,
// shows in the results.
inline void copyAsync16(void* to, const void* from) {
  if (reinterpret_cast<uintptr_t>(to) % 16 != 0 || reinterpret_cast<uintptr_t>(from) % 16 != 0) {
    std::fprintf(stderr, "cuda emulation: a cp.async from %p to %p, not 16-byte aligned (cudaErrorMisalignedAddress)\n",
                 from, to);
    std::abort();
  }
  if (SharedChunk* c = chunkAt(to)) {
    const uint32_t others = c->readers & ~(1u << threadIdx.x / 32);
    if (c->readEpoch == current->epoch && others != 0) {
      std::fprintf(stderr,
                   "cuda emulation: a cp.async by thread %u to shared memory at %p that warp %d read since the last "
                   "__syncthreads (a race: the copy may land before that read)\n",
                   threadIdx.x, to, std::countr_zero(others));
      std::abort();
    }
    ++c->inFlight;
  }
  PendingCopy copy{to, {}};
  std::memcpy(copy.bytes.data(), from, 16);
  std::memset(to, 0xff, 16);
  current->fibers[current->running].openCopies.push_back(copy);
}
inline void commitCopies() {
  Fiber& me = current->fibers[current->running];
  me.copyGroups.push_back(std::move(me.openCopies));
  me.openCopies.clear();
}
inline void waitCopies(int pending) {
  Fiber& me = current->fibers[current->running];
  while (static_cast<int>(me.copyGroups.size()) > pending) {
    for (const PendingCopy& copy : me.copyGroups.front()) {
      std::memcpy(copy.to, copy.bytes.data(), 16);
      if (SharedChunk* c = chunkAt(copy.to)) {
        --c->inFlight;
        c->landedEpoch = current->epoch;
        c->lander = static_cast<int>(threadIdx.x / 32);
      }
    }
    me.copyGroups.pop_front();
  }
}
// The warp's mma.sync m16n8k16 (d += a b; 16-bit a and b, bf16 or fp16, fp32 d): each lane's
// registers read by PTX's layout (kernels/cuda/mma.cuh), the sums in fp32 in k's order.
inline void warpProduct(float d[4], const uint32_t a[4], const uint32_t b[2], bool bf16) {
  struct A {
    uint32_t word[4];
  };
  struct B {
    uint32_t word[2];
  };
  const std::array<A, 32> as = fromEveryLane(A{{a[0], a[1], a[2], a[3]}});
  const std::array<B, 32> bs = fromEveryLane(B{{b[0], b[1]}});
  const auto element = [bf16](uint32_t word, int high) {
    const auto bits = static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu);
    return bf16 ? chorus::kernels::bfloat16ToFloat(bits) : chorus::kernels::halfToFloat(bits);
  };
  // a's row r, column k: lane 4 (r % 8) + (k % 8) / 2, word (r / 8) + 2 (k / 8), half k % 2.
  const auto aAt = [&](int r, int k) {
    return element(as[(r % 8) * 4 + (k % 8) / 2].word[r / 8 + 2 * (k / 8)], k % 2);
  };
  // b's row k, column n: lane 4 n + (k % 8) / 2, word k / 8, half k % 2.
  const auto bAt = [&](int k, int n) { return element(bs[n * 4 + (k % 8) / 2].word[k / 8], k % 2); };
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += aAt(r, k) * bAt(k, n);
    d[i] = sum;
  }
}
}  // namespace chorus::testing::emulation

// kernels/cuda/mma.cuh's product and matrix load, run here.
#define CHORUS_WARP_MMA_M16N8K16(d, a, b, bf16) ::chorus::testing::emulation::warpProduct(d, a, b, bf16)
#define CHORUS_LOAD_MATRICES(out, row, trans) ::chorus::testing::emulation::warpLoadMatrices(out, row, trans)
// kernels/cuda/copy_async.cuh's cp.async, commit and wait.
#define CHORUS_COPY_ASYNC_16(to, from) ::chorus::testing::emulation::copyAsync16(to, from)
#define CHORUS_COMMIT_COPIES() ::chorus::testing::emulation::commitCopies()
#define CHORUS_WAIT_COPIES(pending) ::chorus::testing::emulation::waitCopies(pending)

template <typename T>
T __shfl_xor_sync(unsigned, T x, int laneMask) {
  return chorus::testing::emulation::fromLane(x, (threadIdx.x % 32) ^ static_cast<unsigned>(laneMask));
}
template <typename T>
T __shfl_sync(unsigned, T x, int srcLane) {
  return chorus::testing::emulation::fromLane(x, static_cast<unsigned>(srcLane));
}
// Bit l set where lane l of this thread's warp passed a true predicate.
inline unsigned __ballot_sync(unsigned, int predicate) {
  auto& l = *chorus::testing::emulation::current;
  const int slot = l.turn[threadIdx.x];
  l.turn[threadIdx.x] ^= 1;
  l.exchange[threadIdx.x][slot][0] = predicate != 0;
  __syncwarp();
  const unsigned first = threadIdx.x - threadIdx.x % 32;
  unsigned ballot = 0;
  for (unsigned lane = 0; lane < 32; ++lane) ballot |= static_cast<unsigned>(l.exchange[first + lane][slot][0]) << lane;
  return ballot;
}
inline int __popc(unsigned x) { return std::popcount(x); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}

// The 16-bit types, converted as the hardware's round-to-nearest-even conversions (half.h's).
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {chorus::kernels::floatToBfloat16(x)}; }
inline __half __float2half_rn(float x) { return {chorus::kernels::floatToHalf(x)}; }
inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t bits) { return {bits}; }
inline __half __ushort_as_half(uint16_t bits) { return {bits}; }
inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 x) { return x.bits; }
inline uint16_t __half_as_ushort(__half x) { return x.bits; }
inline float __bfloat162float(__nv_bfloat16 x) { return chorus::kernels::bfloat16ToFloat(x.bits); }
inline float __half2float(__half x) { return chorus::kernels::halfToFloat(x.bits); }
