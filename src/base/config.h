// config.h: every environment knob of chorus, declared once (name, default, meaning) in
// config.cc. Values are read when first asked for; thread-safe after that.
#pragma once

#include <cstdint>
#include <string>

namespace chorus {

enum class Knob {
  kDebug,                     // CHORUS_DEBUG: log level
  kTransport,                 // CHORUS_TRANSPORT: auto | shm | tcp | ucx
  kConnect,                   // CHORUS_CONNECT: lazy | eager: when transports connect to peers
  kTimeoutMs,                 // CHORUS_TIMEOUT_MS: per-operation wait limit
  kInitTimeoutMs,             // CHORUS_INIT_TIMEOUT_MS: bootstrap wait limit
  kChunkBytes,                // CHORUS_CHUNK_BYTES: pipelining chunk of ring and chain algorithms
  kShmSlotBytes,              // CHORUS_SHM_SLOT_BYTES: bytes per shared-memory FIFO slot
  kShmSlots,                  // CHORUS_SHM_SLOTS: slots per shared-memory FIFO
  kShmReadBytes,              // CHORUS_SHM_READ_BYTES: messages this large are read from the sender's memory
  kShmMapBytes,               // CHORUS_SHM_MAP_BYTES: messages this large in chorusMemAlloc buffers are mapped
  kShmDirectBytes,            // CHORUS_SHM_DIRECT_BYTES: all-reduces this large on chorusMemAlloc buffers go direct
  kSpinUs,                    // CHORUS_SPIN_US: how long a wait spins before it blocks
  kBootstrapAddr,             // CHORUS_BOOTSTRAP_ADDR: address this process listens on
  kSocketIfname,              // CHORUS_SOCKET_IFNAME: interfaces to listen on
  kAlgo,                      // CHORUS_ALGO: per-collective algorithm overrides
  kTuningFile,                // CHORUS_TUNING_FILE: cost-model parameters for the tuner
  kRankOrder,                 // CHORUS_RANK_ORDER: the order rings, chains and trees visit the ranks
  kDumpSignal,                // CHORUS_DUMP_SIGNAL: SIGUSR1 prints every pending operation
  kCheckCalls,                // CHORUS_CHECK_CALLS: the ranks agree on a rooted collective before it runs
  kDeterministic,             // CHORUS_DETERMINISTIC: reductions whose bits depend on the rank count alone
  kTraceDir,                  // CHORUS_TRACE_DIR: where each rank's flight recorder writes its file
  kTraceOps,                  // CHORUS_TRACE_OPS: operations each flight recorder keeps
  kStats,                     // CHORUS_STATS: live statistics per communicator
  kStatsFile,                 // CHORUS_STATS_FILE: where each rank writes them
  kStatsIntervalS,            // CHORUS_STATS_INTERVAL_S: and how often
  kBind,                      // CHORUS_BIND: auto | none: bind each rank's process to a CPU node
  kTopoFile,                  // CHORUS_TOPO_FILE: a topology file instead of discovering the machine
  kTcpRateLimit,              // CHORUS_TCP_RATE_LIMIT: bits per second each rank may send over tcp
  kTcpDelay,                  // CHORUS_TCP_DELAY: latency added to every tcp message
  kCompress,                  // CHORUS_COMPRESS: the compressor of compressed all-reduces given none
  kDeviceTransport,           // CHORUS_DEVICE_TRANSPORT: auto | direct | ipc | staged: how device buffers move
  kDeviceLlBytes,             // CHORUS_DEVICE_LL_BYTES: device calls this small use the LL protocol
  kDeviceChannels,            // CHORUS_DEVICE_CHANNELS: blocks (channels) of a bulk device call
  kDeviceThreads,             // CHORUS_DEVICE_THREADS: threads per channel
  kDeviceStageBytes,          // CHORUS_DEVICE_STAGE_BYTES: pinned staging chunk of the staged path
  kDeviceDirectBytes,         // CHORUS_DEVICE_DIRECT_BYTES: each of the direct path's two publishing buffers
  kDeviceDirectInPlaceBytes,  // CHORUS_DEVICE_DIRECT_INPLACE_BYTES: direct all-reduces this large read in place
  kDeviceStagedPost,          // CHORUS_DEVICE_STAGED_POST: host | value: how staged calls reach the proxy and back
  kDeviceDirectReducers,      // CHORUS_DEVICE_DIRECT_REDUCERS: all | one: who reduces an in-place direct all-reduce
  kCount
};

// Whether the environment sets the knob (to a non-empty value).
bool knobSet(Knob knob);
// The knob's value: the environment's if set (non-empty), else its default.
std::string knobString(Knob knob);
// Parses a whole decimal integer in [0, max] (knobs, launcher variables); false for anything else.
bool parseNonNegative(const std::string& text, int64_t max, int64_t* value);
// The knob as an integer; a malformed value throws chorusInvalidArgument naming the variable.
int64_t knobInt(Knob knob);
// The knob as a rate in bits per second: a decimal number with a unit bit, kbit, mbit or gbit
// (powers of 1000, as tc writes them), e.g. "50mbit"; 0 when unset. Throws chorusInvalidArgument
// naming the variable for anything else.
double knobBitsPerSecond(Knob knob);
// The knob as a duration in microseconds: a decimal number with a unit us, ms or s, e.g. "5ms";
// 0 when unset. Throws chorusInvalidArgument naming the variable for anything else.
int64_t knobMicroseconds(Knob knob);
// The environment variable's name.
const char* knobName(Knob knob);
// Logs every knob with its value in effect and whether it came from the environment (INFO).
void logKnobs(int rank);

// Reads the first set variable among `names` (for torchrun-style spellings); empty if none is.
std::string firstEnv(std::initializer_list<const char*> names, const char** which = nullptr);

}  // namespace chorus
