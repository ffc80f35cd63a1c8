// device_ring.h: the device engine's ring (the "ipc" device algorithm), as code that runs both in
// the CUDA kernel (device_kernels.cu, device_ring.cuh) and on host threads
// (tests/unit/ipc_ring_test.cc), so the algorithm's logic is tested on machines without a GPU.
//
// Each rank owns an inbox in its device memory that its ring neighbours map (CUDA IPC): its
// predecessor writes messages into it, its successor writes back how many it has consumed. A
// collective is one kernel launch of one block per channel; each channel moves its slice of the
// buffers around the ring, message by message, through kSlots slots per channel (so up to kSlots
// messages are in flight on each link). Two protocols:
//  - Bulk: the sender writes a slot's data, fences, then sets the slot's ready word; the receiver
//    waits on that word. For large messages.
//  - LL (low latency, as NCCL's LL): every 8 bytes of data travel with a 4-byte copy of the
//    message's flag in one 16-byte line (two data words, two flags), written in one store, so the
//    receiver polls the data itself and no fence or ready word is needed. Half the bandwidth,
//    one hop less latency: for small messages.
// Message m on a link carries flag m + 1; every counter is per link and kept across launches in
// device memory, so a captured CUDA graph replays with fresh flags. All waits give up after a
// deadline or when the host raises the abort word, recording why in Control.status; the kernel
// then skips the rest and returns (nothing hangs).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>

#include "chorus/chorus.h"
#include "kernels/cpu/half.h"
#include "kernels/hd.h"
#include "kernels/reduce_ops.h"

namespace chorus::ipc {

constexpr int kMaxChannels = 16;
constexpr int kSlots = 4;
constexpr size_t kBulkSlotBytes = 128 * 1024;
constexpr size_t kLlLines = 256;   // per slot
constexpr size_t kLlLineData = 8;  // data bytes per 16-byte line
constexpr size_t kLlSlotBytes = kLlLines * kLlLineData;

struct LlLine {
  uint32_t data0, flag0, data1, flag1;
};

// One channel's part of a rank's inbox.
struct alignas(128) ChannelInbox {
  uint64_t ready[kSlots];          // bulk: m + 1 once message m's data is in slot m % kSlots (by prev)
  alignas(128) uint64_t consumed;  // how many of this rank's messages the successor has consumed (by next)
  alignas(128) LlLine ll[kSlots][kLlLines];
  alignas(128) uint8_t bulk[kSlots][kBulkSlotBytes];
};

// A channel's message counts, in the rank's own device memory, kept across launches.
struct ChannelCounters {
  uint64_t sent;      // messages sent to next
  uint64_t received;  // messages received from prev
};

// Shared with the host (mapped pinned memory): the abort word the host raises, and what failed.
enum : uint32_t { kStatusOk = 0, kStatusTimeout = 1, kStatusAborted = 2 };
enum : uint32_t { kWaitData = 1, kWaitCredit = 2 };
struct Control {
  uint32_t abort;    // set by the host: every wait gives up
  uint32_t status;   // first failure: kStatusTimeout / kStatusAborted
  uint32_t channel;  // where it happened
  uint32_t what;     // kWaitData (waiting on prev) or kWaitCredit (waiting on next)
  uint64_t message;  // the link's message index waited for
};

enum class Kind : int { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce };

struct RingArgs {
  Kind kind;
  const void* input;
  void* output;
  size_t count;  // elements: all-reduce, broadcast, reduce: the buffer; all-gather: the input;
                 // reduce-scatter: the output
  int rank;      // position on the ring
  int nranks;
  int root;  // ring position of the root (broadcast, reduce)
  int channels;
  bool average;        // chorusAvg: Sum, then one division by nranks
  ChannelInbox* own;   // channels entries each
  ChannelInbox* next;  // the successor's inbox, mapped
  ChannelInbox* prev;  // the predecessor's inbox, mapped
  ChannelCounters* counters;
  Control* control;
  uint64_t timeoutNs;
  // The rank at each ring position (memory the kernel reads: device memory there), or NULL when
  // the ring visits the ranks by number. Only block placement (all-gather, reduce-scatter) needs
  // ranks; everything else works in positions.
  const int* rankAt;
};

// ---- element types and ops, the same on host and device ----

// Storage type T, compute type C.
template <typename T>
struct Plain {
  using Storage = T;
  using Compute = T;
  CHORUS_HD static T load(T v) { return v; }
  CHORUS_HD static T store(T v) { return v; }
};
struct Fp16 {
  using Storage = uint16_t;
  using Compute = float;
  CHORUS_HD static float load(uint16_t v) { return kernels::halfToFloat(v); }
  CHORUS_HD static uint16_t store(float v) { return kernels::floatToHalf(v); }
};
struct Bf16 {
  using Storage = uint16_t;
  using Compute = float;
  CHORUS_HD static float load(uint16_t v) { return kernels::bfloat16ToFloat(v); }
  CHORUS_HD static uint16_t store(float v) { return kernels::floatToBfloat16(v); }
};

// The ops are kernels/reduce_ops.h's, as the reduction kernels use them.
using kernels::OpMax;
using kernels::OpMin;
using kernels::OpProd;
using kernels::OpSum;

// ---- the ring's memory operations on the host ----

// What S (below) does with memory and time, done by host code: the flag words as acquire / release
// atomics, each 8-byte half of an LL line in one atomic access, Control by atomics. ipc_ring_test's
// threads use them, and so does the kernel under the CUDA emulation (tests/support/
// cuda_emulation.h), its inboxes shared between processes there. Not in CUDA units (the device
// has its own, device_ring.cuh's, and nvcc's C++ may predate std::atomic_ref).
#if !defined(__CUDACC__)
struct HostPrimitives {
  static void acquire() { std::atomic_thread_fence(std::memory_order_acquire); }
  static void release() { std::atomic_thread_fence(std::memory_order_release); }
  static uint64_t loadWord(uint64_t* p) { return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire); }
  static void storeWord(uint64_t* p, uint64_t v) { std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release); }
  static LlLine loadLine(const LlLine* p) {
    auto* words = reinterpret_cast<uint64_t*>(const_cast<LlLine*>(p));
    const uint64_t low = std::atomic_ref<uint64_t>(words[0]).load(std::memory_order_relaxed);
    const uint64_t high = std::atomic_ref<uint64_t>(words[1]).load(std::memory_order_relaxed);
    return LlLine{static_cast<uint32_t>(low), static_cast<uint32_t>(low >> 32), static_cast<uint32_t>(high),
                  static_cast<uint32_t>(high >> 32)};
  }
  static void storeLine(LlLine* p, LlLine v) {
    auto* words = reinterpret_cast<uint64_t*>(p);
    std::atomic_ref<uint64_t>(words[0]).store(v.data0 | uint64_t{v.flag0} << 32, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(words[1]).store(v.data1 | uint64_t{v.flag1} << 32, std::memory_order_relaxed);
  }
  template <typename T>
  static T loadData(const T* p) {
    return *p;
  }
  static uint32_t loadStatus(Control* c) { return std::atomic_ref<uint32_t>(c->status).load(); }
  static uint32_t loadAbort(Control* c) { return std::atomic_ref<uint32_t>(c->abort).load(); }
  static void fail(Control* c, uint32_t why, uint32_t channel, uint32_t what, uint64_t message) {
    uint32_t expected = kStatusOk;
    if (std::atomic_ref<uint32_t>(c->status).compare_exchange_strong(expected, why)) {
      c->channel = channel;
      c->what = what;
      c->message = message;
    }
  }
  static uint64_t nowNs() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  static void pause() { std::this_thread::yield(); }
};
#endif

// ---- one channel of one collective ----

// S: where the code runs, as DeviceSync in device_ring.cuh and HostSync in the test: thread() and
// threads() of the block, barrier(), uniform(v) (barrier, then every thread gets thread 0's v),
// acquire() / release() fences, loadWord / storeWord (volatile 64-bit words), loadLine /
// storeLine (a 16-byte LL line, each 8-byte half in one access), loadData (a slot element, not
// from a stale cache), loadStatus / loadAbort / fail (Control), nowNs(), pause(), and
// kPollEvery (spins between reads of Control). E: element type (Plain<T>, Fp16, Bf16).
// Op: the reduction. Ll: the protocol.
template <class S, class E, class Op, bool Ll>
class RingChannel {
  using T = typename E::Storage;
  using C = typename E::Compute;

 public:
  CHORUS_HD RingChannel(const RingArgs& args, int channel)
      : a_(args),
        channel_(channel),
        own_(args.own + channel),
        next_(args.next + channel),
        prev_(args.prev + channel),
        sent_(args.counters[channel].sent),
        received_(args.counters[channel].received),
        deadline_(S::nowNs() + args.timeoutNs) {}

  // Runs the channel's part of the collective; the counters are written back at the end (thread 0).
  CHORUS_HD void run() {
    size_t begin, end;
    slice(&begin, &end);
    if (a_.nranks == 1) {
      copyAlone(begin, end);
      return;
    }
    switch (a_.kind) {
      case Kind::kAllReduce:
        allReduce(begin, end);
        break;
      case Kind::kAllGather:
        allGather(begin, end);
        break;
      case Kind::kReduceScatter:
        reduceScatter(begin, end);
        break;
      case Kind::kBroadcast:
        broadcast(begin, end);
        break;
      case Kind::kReduce:
        reduce(begin, end);
        break;
    }
    S::barrier();
    if (S::thread() == 0) {
      a_.counters[channel_].sent = sent_;
      a_.counters[channel_].received = received_;
    }
  }

  // Elements one message carries.
  CHORUS_HD static size_t messageElements() { return (Ll ? kLlSlotBytes : kBulkSlotBytes) / sizeof(T); }

 private:
  // The channel's slice of [0, count): equal parts in multiples of 32 elements.
  CHORUS_HD void slice(size_t* begin, size_t* end) const {
    const size_t per = ((a_.count + a_.channels - 1) / a_.channels + 31) / 32 * 32;
    *begin = per * channel_ < a_.count ? per * channel_ : a_.count;
    *end = *begin + per < a_.count ? *begin + per : a_.count;
  }

  CHORUS_HD int peerPosition(int offset) const { return ((a_.rank + offset) % a_.nranks + a_.nranks) % a_.nranks; }

  // Segment k of a round that starts at base and gives each rank `chunk` elements, clipped to end.
  CHORUS_HD static void segment(size_t base, size_t chunk, int k, size_t end, size_t* lo, size_t* n) {
    const size_t start = base + chunk * static_cast<size_t>(k);
    *lo = start < end ? start : end;
    *n = start + chunk < end ? chunk : end - *lo;
  }

  CHORUS_HD void allReduce(size_t begin, size_t end) {
    const T* in = static_cast<const T*>(a_.input);
    T* out = static_cast<T*>(a_.output);
    const int n = a_.nranks;
    const size_t stride = messageElements() * static_cast<size_t>(n);
    for (size_t base = begin; base < end; base += stride) {
      const size_t left = end - base;
      size_t chunk = (left + n - 1) / n;
      chunk = chunk < messageElements() ? chunk : messageElements();
      size_t lo, m;
      // Reduce-scatter: send own segment, then receive, add own and pass on n - 2 times.
      segment(base, chunk, peerPosition(0), end, &lo, &m);
      step(in + lo, nullptr, m, false, true, false);
      for (int s = 1; s < n - 1; ++s) {
        segment(base, chunk, peerPosition(-s), end, &lo, &m);
        step(in + lo, nullptr, m, true, true, false);
      }
      // The segment now complete here is r + 1: keep it and start the all-gather with it.
      segment(base, chunk, peerPosition(1), end, &lo, &m);
      step(in + lo, out + lo, m, true, true, a_.average);
      for (int t = 1; t < n - 1; ++t) {
        segment(base, chunk, peerPosition(1 - t), end, &lo, &m);
        step(nullptr, out + lo, m, true, true, false);
      }
      segment(base, chunk, peerPosition(2), end, &lo, &m);
      step(nullptr, out + lo, m, true, false, false);
    }
  }

  // Rank k's block of the output is output[k * count, (k + 1) * count).
  CHORUS_HD void allGather(size_t begin, size_t end) {
    const T* in = static_cast<const T*>(a_.input);
    T* out = static_cast<T*>(a_.output);
    const int n = a_.nranks;
    for (size_t lo = begin; lo < end; lo += messageElements()) {
      const size_t m = end - lo < messageElements() ? end - lo : messageElements();
      step(in + lo, out + block(peerPosition(0)) + lo, m, false, true, false);
      for (int t = 1; t < n; ++t) {
        step(nullptr, out + block(peerPosition(-t)) + lo, m, true, t < n - 1, false);
      }
    }
  }

  // Input block k (count elements each) is rank k's to keep, reduced over ranks.
  CHORUS_HD void reduceScatter(size_t begin, size_t end) {
    const T* in = static_cast<const T*>(a_.input);
    T* out = static_cast<T*>(a_.output);
    const int n = a_.nranks;
    for (size_t lo = begin; lo < end; lo += messageElements()) {
      const size_t m = end - lo < messageElements() ? end - lo : messageElements();
      step(in + block(peerPosition(-1)) + lo, nullptr, m, false, true, false);
      for (int s = 1; s < n - 1; ++s) step(in + block(peerPosition(-1 - s)) + lo, nullptr, m, true, true, false);
      step(in + block(peerPosition(0)) + lo, out + lo, m, true, false, a_.average);
    }
  }

  // A chain from the root around the ring; the root's predecessor ends it.
  CHORUS_HD void broadcast(size_t begin, size_t end) {
    const T* in = static_cast<const T*>(a_.input);
    T* out = static_cast<T*>(a_.output);
    const bool root = a_.rank == a_.root;
    const bool last = peerPosition(1) == a_.root;
    for (size_t lo = begin; lo < end; lo += messageElements()) {
      const size_t m = end - lo < messageElements() ? end - lo : messageElements();
      if (root) {
        step(in + lo, in == out ? nullptr : out + lo, m, false, true, false);
      } else {
        step(nullptr, out + lo, m, true, !last, false);
      }
    }
  }

  // A chain around the ring that ends at the root, adding each rank's input on the way.
  CHORUS_HD void reduce(size_t begin, size_t end) {
    const T* in = static_cast<const T*>(a_.input);
    T* out = static_cast<T*>(a_.output);
    const bool root = a_.rank == a_.root;
    const bool first = peerPosition(-1) == a_.root;
    for (size_t lo = begin; lo < end; lo += messageElements()) {
      const size_t m = end - lo < messageElements() ? end - lo : messageElements();
      if (root) {
        step(in + lo, out + lo, m, true, false, a_.average);
      } else {
        step(in + lo, nullptr, m, !first, true, false);
      }
    }
  }

  // One rank: every collective is a copy (Avg divides by 1).
  CHORUS_HD void copyAlone(size_t begin, size_t end) {
    const T* in = static_cast<const T*>(a_.input);
    T* out = static_cast<T*>(a_.output);
    for (size_t i = begin + S::thread(); i < end; i += S::threads()) out[i] = in[i];
  }

  // Where the block of the rank at a ring position lies in a spread buffer.
  CHORUS_HD size_t block(int position) const {
    return a_.count * static_cast<size_t>(a_.rankAt != nullptr ? a_.rankAt[position] : position);
  }

  CHORUS_HD C finish(C value, bool divide) const {
    if (!divide) return value;
    // As kernels::divide after kernels::reduce: the sum is stored, then divided once.
    const C sum = E::load(E::store(value));
    if constexpr (C(1) / C(2) == C(0)) {  // integer: in 64 bits, as the reference
      if constexpr (C(-1) < C(0)) {
        return static_cast<C>(static_cast<int64_t>(sum) / static_cast<int64_t>(a_.nranks));
      } else {
        return static_cast<C>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(a_.nranks));
      }
    } else {
      return sum / static_cast<C>(a_.nranks);
    }
  }

  // One message's worth: value[i] = received[i] (op) local[i] (either may be absent); out[i] =
  // value[i] (divided when `divide`), and value goes on to next when `send`.
  // Thread 0 waits and decides; S::uniform hands its decision to every thread, so all threads
  // take the same path past each barrier.
  CHORUS_HD void step(const T* local, T* out, size_t n, bool recv, bool send, bool divide) {
    const uint64_t rm = received_;
    const uint64_t sm = sent_;
    const int rs = static_cast<int>(rm % kSlots);
    const int ss = static_cast<int>(sm % kSlots);
    bool stop = false;
    if (S::thread() == 0) {
      stop = failed();
      if (!stop && send) stop = !waitAtLeast(&own_->consumed, sm + 1 > kSlots ? sm + 1 - kSlots : 0, kWaitCredit, sm);
      if (!stop && recv && !Ll) stop = !waitAtLeast(&own_->ready[rs], rm + 1, kWaitData, rm);
    }
    if (S::uniform(stop)) return;
    if constexpr (Ll) {
      stepLl(local, out, n, recv, send, divide, rs, ss, rm, sm);
    } else {
      S::acquire();
      const T* in = reinterpret_cast<const T*>(own_->bulk[rs]);
      T* to = reinterpret_cast<T*>(next_->bulk[ss]);
      for (size_t i = S::thread(); i < n; i += S::threads()) {
        C value;
        if (recv) {
          value = E::load(S::loadData(in + i));
          if (local != nullptr) value = Op::apply(value, E::load(local[i]));
        } else {
          value = E::load(local[i]);
        }
        if (out != nullptr) out[i] = E::store(finish(value, divide));
        if (send) to[i] = E::store(divide ? finish(value, true) : value);
      }
    }
    S::barrier();
    if (S::thread() == 0 && !failed()) {
      S::release();
      if (recv) S::storeWord(&prev_->consumed, rm + 1);
      if (send && !Ll) S::storeWord(&next_->ready[ss], sm + 1);
    }
    if (recv) received_ = rm + 1;
    if (send) sent_ = sm + 1;
  }

  // Each thread moves whole lines: 8 data bytes each, with the message's flag beside each half.
  CHORUS_HD void stepLl(const T* local, T* out, size_t n, bool recv, bool send, bool divide, int rs, int ss,
                        uint64_t rm, uint64_t sm) {
    constexpr size_t kPerLine = kLlLineData / sizeof(T);
    const uint32_t recvFlag = static_cast<uint32_t>(rm + 1);
    const uint32_t sendFlag = static_cast<uint32_t>(sm + 1);
    const size_t lines = (n + kPerLine - 1) / kPerLine;
    for (size_t j = S::thread(); j < lines; j += S::threads()) {
      uint32_t words[2] = {0, 0};
      if (recv) {
        LlLine line;
        const uint64_t limit = deadline_;
        while (true) {
          line = S::loadLine(&own_->ll[rs][j]);
          if (line.flag0 == recvFlag && line.flag1 == recvFlag) break;
          if (!keepWaiting(limit, kWaitData, rm)) return;
        }
        words[0] = line.data0;
        words[1] = line.data1;
      }
      T got[kPerLine];
      T result[kPerLine];
      unpack(words, got);
      const size_t first = j * kPerLine;
      for (size_t e = 0; e < kPerLine; ++e) {
        const size_t i = first + e;
        if (i >= n) {
          result[e] = T{};
          continue;
        }
        C value;
        if (recv) {
          value = E::load(got[e]);
          if (local != nullptr) value = Op::apply(value, E::load(local[i]));
        } else {
          value = E::load(local[i]);
        }
        if (out != nullptr) out[i] = E::store(finish(value, divide));
        result[e] = E::store(divide ? finish(value, true) : value);
      }
      if (send) {
        uint32_t packed[2];
        pack(result, packed);
        S::storeLine(&next_->ll[ss][j], LlLine{packed[0], sendFlag, packed[1], sendFlag});
      }
    }
  }

  CHORUS_HD static void unpack(const uint32_t words[2], T* elements) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(words);
    auto* to = reinterpret_cast<unsigned char*>(elements);
    for (size_t b = 0; b < kLlLineData; ++b) to[b] = bytes[b];
  }
  CHORUS_HD static void pack(const T* elements, uint32_t words[2]) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(elements);
    auto* to = reinterpret_cast<unsigned char*>(words);
    for (size_t b = 0; b < kLlLineData; ++b) to[b] = bytes[b];
  }

  CHORUS_HD bool failed() const { return S::loadStatus(a_.control) != kStatusOk; }

  CHORUS_HD bool waitAtLeast(uint64_t* word, uint64_t value, uint32_t what, uint64_t message) {
    while (S::loadWord(word) < value) {
      if (!keepWaiting(deadline_, what, message)) return false;
    }
    return true;
  }

  // False (and the failure recorded) once the host aborts, another wait failed, or the deadline passed.
  // Control is read every S::kPollEvery spins only: on a GPU it lives in host memory, a bus read away.
  CHORUS_HD bool keepWaiting(uint64_t deadline, uint32_t what, uint64_t message) {
    if (++spins_ % S::kPollEvery != 0) {
      S::pause();
      return true;
    }
    if (S::loadStatus(a_.control) != kStatusOk) return false;
    uint32_t why = kStatusOk;
    if (S::loadAbort(a_.control) != 0) {
      why = kStatusAborted;
    } else if (S::nowNs() > deadline) {
      why = kStatusTimeout;
    }
    if (why == kStatusOk) {
      S::pause();
      return true;
    }
    S::fail(a_.control, why, static_cast<uint32_t>(channel_), what, message);
    return false;
  }

  const RingArgs& a_;
  int channel_;
  ChannelInbox* own_;
  ChannelInbox* next_;
  ChannelInbox* prev_;
  uint64_t sent_;
  uint64_t received_;
  uint64_t deadline_;
  unsigned spins_ = 0;
};

// Runs channel `channel` of args for the element type and op the arguments name: the one entry
// both the kernel and the host test call.
template <class S, bool Ll>
CHORUS_HD void runChannel(const RingArgs& args, int channel, chorusDataType_t type, chorusRedOp_t op);

template <class S, class E, bool Ll>
CHORUS_HD void runTyped(const RingArgs& args, int channel, chorusRedOp_t op) {
  switch (op) {
    case chorusProd:
      RingChannel<S, E, OpProd, Ll>(args, channel).run();
      return;
    case chorusMax:
      RingChannel<S, E, OpMax, Ll>(args, channel).run();
      return;
    case chorusMin:
      RingChannel<S, E, OpMin, Ll>(args, channel).run();
      return;
    default:  // Sum and Avg (divided once at the end)
      RingChannel<S, E, OpSum, Ll>(args, channel).run();
      return;
  }
}

template <class S, bool Ll>
CHORUS_HD void runChannel(const RingArgs& args, int channel, chorusDataType_t type, chorusRedOp_t op) {
  switch (type) {
    case chorusInt8:
      return runTyped<S, Plain<int8_t>, Ll>(args, channel, op);
    case chorusUint8:
      return runTyped<S, Plain<uint8_t>, Ll>(args, channel, op);
    case chorusInt32:
      return runTyped<S, Plain<int32_t>, Ll>(args, channel, op);
    case chorusUint32:
      return runTyped<S, Plain<uint32_t>, Ll>(args, channel, op);
    case chorusInt64:
      return runTyped<S, Plain<int64_t>, Ll>(args, channel, op);
    case chorusUint64:
      return runTyped<S, Plain<uint64_t>, Ll>(args, channel, op);
    case chorusFloat32:
      return runTyped<S, Plain<float>, Ll>(args, channel, op);
    case chorusFloat64:
      return runTyped<S, Plain<double>, Ll>(args, channel, op);
    case chorusFloat16:
      return runTyped<S, Fp16, Ll>(args, channel, op);
    case chorusBfloat16:
      return runTyped<S, Bf16, Ll>(args, channel, op);
    default:
      return;
  }
}

}  // namespace chorus::ipc
