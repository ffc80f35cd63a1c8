// config.cc: the table of environment knobs.
#include "src/core/config.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "src/core/error.h"
#include "src/core/log.h"

namespace chorus {
namespace {

struct KnobSpec {
  const char* name;
  const char* defaultValue;
  const char* meaning;
};

// One line per knob: environment name, default, meaning.
constexpr KnobSpec kKnobs[] = {
    {"CHORUS_DEBUG", "WARN", "log level: WARN, INFO or TRACE"},
    {"CHORUS_TRANSPORT", "auto", "auto (shm within a host, ucx across), or shm, tcp or ucx for every peer"},
    {"CHORUS_TIMEOUT_MS", "300000", "how long one operation waits for a peer before failing"},
    {"CHORUS_INIT_TIMEOUT_MS", "120000", "how long init waits for every rank to arrive"},
    {"CHORUS_CHUNK_BYTES", "524288", "pipelining chunk of every call, bytes (unset: the tuner picks it per call)"},
    {"CHORUS_SHM_SLOT_BYTES", "262144", "bytes per shared-memory FIFO slot"},
    {"CHORUS_SHM_SLOTS", "8", "slots per shared-memory FIFO (one FIFO per ordered pair of ranks)"},
    {"CHORUS_SHM_READ_BYTES", "0",
     "shm messages of at least this many bytes are read by the receiver straight from the sender's memory "
     "(process_vm_readv: one copy instead of two); 0: never"},
    {"CHORUS_SHM_MAP_BYTES", "65536",
     "shm messages of at least this many bytes whose buffer lies in a chorusMemAlloc allocation are copied by the "
     "receiver straight from the sender's pages, mapped (one copy at memory speed); 0: never"},
    {"CHORUS_SHM_DIRECT_BYTES", "65536",
     "blocking all-reduces and reduce-scatters with at least this many input bytes among ranks all on shm, whose "
     "buffers on every rank lie in chorusMemAlloc allocations, reduce straight from every rank's input into the "
     "outputs; 0: never"},
    {"CHORUS_SPIN_US", "20", "how long a wait spins before it blocks (ranks may outnumber cores)"},
    {"CHORUS_BOOTSTRAP_ADDR", "", "IP address to listen on (default: chosen by CHORUS_SOCKET_IFNAME)"},
    {"CHORUS_SOCKET_IFNAME", "",
     "interfaces to listen on: name prefixes, comma-separated; ^ excludes them, = matches whole names (default: the "
     "first interface that is up and not loopback, else loopback)"},
    {"CHORUS_ALGO", "", "algorithm per collective, e.g. allreduce:ring,allgather:bruck (default: chosen per call)"},
    {"CHORUS_TUNING_FILE", "", "tuner cost parameters per transport (lines: shm alpha_us=5 beta_GBps=5 ...)"},
    {"CHORUS_RANK_ORDER", "",
     "order in which rings, chains and trees visit the ranks, e.g. 0,2,1,3 (default 0..n-1; used by "
     "communicators of that many ranks)"},
    {"CHORUS_DUMP_SIGNAL", "0",
     "1: SIGUSR1 makes every communicator of the process print its pending operations, the step each waits on "
     "and what each link has moved (as chorusCommDumpState), the next time a call of it waits"},
    {"CHORUS_BIND", "auto",
     "auto: bind each process to a CPU node of its host (local ranks in blocks over the NUMA nodes) unless a "
     "launcher bound it; none: leave it"},
    {"CHORUS_TOPO_FILE", "",
     "topology file (chorus, hwloc or NCCL XML) read instead of discovering the machine, for binding and the "
     "rank order"},
    {"CHORUS_TCP_RATE_LIMIT", "",
     "rate each rank may send at over the tcp connections of one communicator, all its peers together, e.g. 50mbit or "
     "1gbit (bit, kbit, mbit, gbit; "
     "headers count): a slow link emulated in user space (default: unlimited)"},
    {"CHORUS_TCP_DELAY", "",
     "latency added to every tcp message before its first byte leaves, e.g. 5ms (us, ms, s; default: none)"},
    {"CHORUS_COMPRESS", "",
     "compressor of compressed all-reduces created without one, e.g. powersgd:4 or topk:0.01 (names: none, fp16, "
     "bf16, powersgd, topk, randomk, qsgd, sign; default: none)"},
    {"CHORUS_DEVICE_TRANSPORT", "auto",
     "how collectives on device buffers move data: ipc (kernels that read and write the peers' GPU memory, mapped "
     "with CUDA IPC; every rank on one host), staged (through pinned host buffers and the host transports, any "
     "ranks), auto (ipc where every rank can, else staged)"},
    {"CHORUS_DEVICE_LL_BYTES", "65536",
     "device calls whose per-rank buffer is at most this many bytes use the low-latency protocol (flags in line "
     "with the data); larger ones the bulk protocol"},
    {"CHORUS_DEVICE_CHANNELS", "8", "channels (thread blocks) of a bulk-protocol device call, 1 to 16"},
    {"CHORUS_DEVICE_THREADS", "512", "threads per channel of a device call, 32 to 1024, a multiple of 32"},
    {"CHORUS_DEVICE_STAGE_BYTES", "4194304",
     "chunk of the staged device path: the device-to-host copy of one chunk overlaps the transfer of the one "
     "before"},
};
static_assert(sizeof(kKnobs) / sizeof(kKnobs[0]) == static_cast<size_t>(Knob::kCount));

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
  for (const KnobSpec& k : kKnobs) {
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
