// communicator.cc: communicator set-up (bootstrap, transport choice per peer) and the path from
// a call to a running schedule.
#include "src/core/communicator.h"

#if defined(CHORUS_HAVE_DEVICE)
#include "src/core/device.h"
#endif

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <utility>

#include "kernels/cpu/reduce.h"
#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/collectives/traits.h"
#include "src/core/flight_recorder.h"
#include "src/core/placement.h"
#include "src/core/stats.h"

namespace chorus {
namespace {

// Processes with equal host hashes can share memory: same machine (hostname, boot id) and same
// network and mount namespaces (separate network namespaces stand for separate hosts in tests).
uint64_t hostHash() {
  std::string key;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  key += name;
  std::ifstream bootId("/proc/sys/kernel/random/boot_id");
  std::string line;
  if (std::getline(bootId, line)) key += "|" + line;
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/mnt"}) {
    struct stat info {};
    if (stat(ns, &info) == 0) key += fmt::format("|{}", static_cast<uint64_t>(info.st_ino));
  }
  return std::hash<std::string>{}(key);
}

// SIGUSR1 asks every communicator of the process to print its state the next time a call of
// it waits (the waiting thread prints: the state is only ever touched by it).
std::atomic<uint64_t> dumpRequests{0};
void onDumpSignal(int) { dumpRequests.fetch_add(1, std::memory_order_relaxed); }
void installDumpSignal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = onDumpSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

uint16_t signatureOf(collectives::Collective collective, size_t count, chorusDataType_t type, chorusRedOp_t op,
                     uint64_t root) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t v : {static_cast<uint64_t>(collective), static_cast<uint64_t>(count), static_cast<uint64_t>(type),
                     static_cast<uint64_t>(op), static_cast<uint64_t>(root)}) {
    h = (h ^ v) * 1099511628211ull;
  }
  return static_cast<uint16_t>(h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48));
}

}  // namespace

CommSettings CommSettings::resolve(const chorusConfig_t* config) {
  CommSettings s;
  s.timeoutMs = static_cast<int>(knobInt(Knob::kTimeoutMs));
  s.initTimeoutMs = static_cast<int>(knobInt(Knob::kInitTimeoutMs));
  s.transport = knobString(Knob::kTransport);
  const std::string connect = knobString(Knob::kConnect);
  if (connect != "lazy" && connect != "eager") {
    fail(chorusInvalidArgument, "CHORUS_CONNECT='{}' is not lazy or eager", connect);
  }
  s.eagerConnect = connect == "eager";
  s.chunkBytes = static_cast<size_t>(knobInt(Knob::kChunkBytes));
  s.chunkForced = knobSet(Knob::kChunkBytes);
  s.spinUs = static_cast<int>(knobInt(Knob::kSpinUs));
  s.checkCalls = knobInt(Knob::kCheckCalls) != 0;
  s.deterministic = knobInt(Knob::kDeterministic) != 0;
  s.algorithms = knobString(Knob::kAlgo);
  s.rankOrder = knobString(Knob::kRankOrder);
  if (config != nullptr) {
    if (config->timeoutMs >= 0) s.timeoutMs = config->timeoutMs;
    if (config->initTimeoutMs >= 0) s.initTimeoutMs = config->initTimeoutMs;
    if (config->transport != nullptr) s.transport = config->transport;
    if (config->algorithms != nullptr) s.algorithms = config->algorithms;
    if (config->deterministic >= 0) s.deterministic = config->deterministic != 0;
  }
  if (s.transport != "auto" && s.transport != "shm" && s.transport != "tcp" && s.transport != "ucx") {
    fail(chorusInvalidArgument, "transport '{}' (CHORUS_TRANSPORT or config) is not one of auto, shm, tcp, ucx",
         s.transport);
  }
  if (s.transport == "ucx" && !transportBuilt("ucx")) {
    fail(chorusInvalidArgument, "transport 'ucx' (CHORUS_TRANSPORT or config): this build of chorus has no UCX");
  }
  if (s.chunkBytes == 0) fail(chorusInvalidArgument, "CHORUS_CHUNK_BYTES must be positive");
  return s;
}

void Communicator::followOrder(std::vector<int> order) {
  order_ = std::move(order);
  // Ranks that follow different orders fail on the signature instead of mixing data.
  orderHash_ = 0;
  for (int r : order_) orderHash_ = (orderHash_ ^ static_cast<uint64_t>(r + 1)) * 1099511628211ull;
  orderHash_ &= 0xffffffffull;
}

Communicator::Communicator(const UniqueIdData& id, int nranks, int rank, const CommSettings& settings,
                           uint64_t grownFrom)
    : rank_(rank), nranks_(nranks), settings_(settings), sendSequence_(nranks), recvSequence_(nranks) {
  logKnobs(rank);
  algorithms_.fill(collectives::Algorithm::kDefault);
  setAlgorithms(settings.algorithms);
  if (!settings.rankOrder.empty()) {
    std::vector<int> order;
    try {
      order = collectives::parseRankOrder(settings.rankOrder);
    } catch (const std::invalid_argument& e) {
      fail(chorusInvalidArgument, "rank {}: CHORUS_RANK_ORDER '{}': {}", rank, settings.rankOrder, e.what());
    }
    if (static_cast<int>(order.size()) == nranks) {
      followOrder(std::move(order));
    } else {
      logAt(LogLevel::kInfo, "rank {}: CHORUS_RANK_ORDER names {} ranks; this communicator of {} keeps 0..{}", rank,
            order.size(), nranks, nranks - 1);
    }
  }
  bootstrap_ = std::make_unique<Bootstrap>(rank, nranks);
  dataListener_ = listenOn(defaultLocalAddress());

  PeerInfo self;
  self.ringAddress = bootstrap_->ringAddress();
  self.dataAddress = pack(boundAddress(dataListener_.fd()));
  self.rank = rank;
  self.pid = getpid();
  self.hostHash = hostHash();
  std::strncpy(self.transportMode, settings.transport.c_str(), sizeof(self.transportMode) - 1);
  self.eagerConnect = settings.eagerConnect ? 1 : 0;
  self.grownFrom = grownFrom;
  gethostname(self.hostname, sizeof(self.hostname) - 1);
  std::vector<char> blob(sizeof(PeerInfo));
  std::memcpy(blob.data(), &self, sizeof(self));

  const auto blobs = bootstrap_->join(id, blob, settings.initTimeoutMs);
  TransportContext context;
  context.rank = rank;
  context.nranks = nranks;
  context.commId = bootstrap_->commId();
  context.exchange = bootstrap_.get();
  context.dataListener = &dataListener_;
  context.deadline = deadlineAfterMs(settings.initTimeoutMs);
  context.mode = settings.transport;
  context.eager = settings.eagerConnect;
  context.peers.resize(nranks);
  for (int r = 0; r < nranks; ++r) {
    std::memcpy(&context.peers[r], blobs[r].data(), sizeof(PeerInfo));
    if (std::strncmp(context.peers[r].transportMode, self.transportMode, sizeof(self.transportMode)) != 0) {
      fail(chorusInvalidUsage, "rank {} uses transport mode '{}' but rank {} uses '{}' (CHORUS_TRANSPORT must agree)",
           rank, self.transportMode, r, context.peers[r].transportMode);
    }
    // A grown communicator: its first ranks are the parent's, keeping their numbers; the rest new.
    if (id.parent != 0 && (r < id.parentNranks) != (context.peers[r].grownFrom == id.parent)) {
      fail(chorusInvalidUsage,
           "rank {}: rank {} {} communicator {:016x}, but a communicator grown from it with this id takes ranks "
           "0..{} from it (chorusCommGrow with it) and new ranks from {} (chorusCommGrow with NULL)",
           rank, r, context.peers[r].grownFrom == id.parent ? "comes from" : "does not come from", id.parent,
           id.parentNranks - 1, id.parentNranks);
    }
    if (context.peers[r].eagerConnect != self.eagerConnect) {
      fail(chorusInvalidUsage, "rank {} connects {} but rank {} {} (CHORUS_CONNECT must agree)", rank,
           self.eagerConnect ? "eagerly" : "lazily", r, context.peers[r].eagerConnect ? "eagerly" : "lazily");
    }
  }

  // Hosts numbered by their lowest rank; the hierarchical algorithms and their costs use them.
  std::vector<uint64_t> hostHashes;
  for (int peer = 0; peer < nranks; ++peer) {
    const uint64_t hash = context.peers[peer].hostHash;
    const auto found = std::find(hostHashes.begin(), hostHashes.end(), hash);
    hosts_.push_back(static_cast<int>(found - hostHashes.begin()));
    if (found == hostHashes.end()) hostHashes.push_back(hash);
  }
  const bool severalHosts = hostHashes.size() > 1;
  // Binding (before the transports allocate their buffers, so they land on this rank's node), and
  // the rank order the topology search lays (unless CHORUS_RANK_ORDER gave one).
  if (nranks > 1) {
    std::vector<int> searched = placeRanks(*bootstrap_, rank, context.peers, hosts_, context.deadline);
    if (order_.empty() && !searched.empty()) {
      if (rank == 0)
        logAt(LogLevel::kInfo, "rank 0: rank order from the topology search: {}", fmt::join(searched, ","));
      followOrder(std::move(searched));
    }
  }
  if (!severalHosts) hosts_.clear();

  // Ask the transports in priority order; every rank creates every kind (set-up is collective).
  const auto& registry = transportRegistry();
  std::vector<std::vector<int>> chosen(registry.size());
  transportOfPeer_.assign(nranks, nullptr);
  std::vector<int> kindOfPeer(nranks, -1);
  for (int peer = 0; peer < nranks; ++peer) {
    for (size_t k = 0; k < registry.size(); ++k) {
      if (registry[k].canConnect(context, peer)) {
        chosen[k].push_back(peer);
        kindOfPeer[peer] = static_cast<int>(k);
        break;
      }
    }
    if (kindOfPeer[peer] < 0) {
      fail(chorusInvalidUsage, "rank {}: no transport can reach rank {} (host {}) with CHORUS_TRANSPORT={}", rank, peer,
           context.peers[peer].hostname, settings.transport);
    }
  }
  for (size_t k = 0; k < registry.size(); ++k) transports_.push_back(registry[k].create(context, chosen[k]));
  for (int peer = 0; peer < nranks; ++peer) transportOfPeer_[peer] = transports_[kindOfPeer[peer]].get();
  dataListener_.close();

  // The tuner models the slowest link in use: a network where ranks span hosts or any peer is
  // reached over tcp. Every rank sees the same answer. Built-in costs, then the tuning file's.
  auto costsOf = [&](bool network) {
    collectives::CostParams costs = collectives::defaultCostParams(network);
    if (const std::string file = knobString(Knob::kTuningFile); !file.empty()) {
      try {
        costs = collectives::loadCostParams(file, network, costs);
      } catch (const std::invalid_argument& e) {
        fail(chorusInvalidArgument, "rank {}: CHORUS_TUNING_FILE: {}", rank, e.what());
      }
    }
    return costs;
  };
  bool network = severalHosts;
  for (int peer = 0; peer < nranks; ++peer) network = network || std::string(transportOfPeer_[peer]->name()) == "tcp";
  costs_ = costsOf(network);
  if (!network) {
    const size_t fifoBytes = static_cast<size_t>(std::max<int64_t>(knobInt(Knob::kShmSlots), 1)) *
                             static_cast<size_t>(std::max<int64_t>(knobInt(Knob::kShmSlotBytes), 1));
    costs_.maxChunkBytes = std::bit_floor(fifoBytes / 2);
  }
  if (severalHosts) {
    // Within a host: the local transport's costs (shm, or tcp when it is forced).
    const collectives::CostParams local = costsOf(settings.transport == "tcp");
    costs_.hosts = static_cast<int>(hostHashes.size());
    costs_.localAlphaUs = local.alphaUs;
    costs_.localBetaUsPerByte = local.betaUsPerByte;
  }
  int corrected = 0;
  for (const auto& byAlgorithm : costs_.corrections) {
    for (const auto& correction : byAlgorithm) corrected += correction.nranks == nranks ? 1 : 0;
  }
  logAt(LogLevel::kInfo,
        "rank {}: tuner model ({}): alpha {} us, beta {} GB/s, gamma {} GB/s, copy {} GB/s, overhead {} us; "
        "measured corrections for {} algorithms at {} ranks",
        rank, network ? "tcp" : "shm", costs_.alphaUs, 1e-3 / costs_.betaUsPerByte, 1e-3 / costs_.gammaUsPerByte,
        1e-3 / costs_.copyUsPerByte, costs_.overheadUs, corrected, nranks);

  bool allShm = nranks > 1;
  for (int peer = 0; peer < nranks; ++peer) {
    allShm = allShm && (peer == rank || std::string(transportOfPeer_[peer]->name()) == "shm");
  }
  directCapable_ = allShm;
  costs_.directMinBytes = allShm ? static_cast<size_t>(std::max<int64_t>(knobInt(Knob::kShmDirectBytes), 0)) : 0;

  std::vector<Transport*> all;
  for (auto& t : transports_) all.push_back(t.get());
  ExecutorOptions options;
  options.rank = rank;
  options.nranks = nranks;
  options.timeoutMs = settings.timeoutMs;
  options.spinUs = settings.spinUs;
  options.failureLine = bootstrap_.get();
  // CHORUS_TRACE_DIR: the flight recorder, written on failures, at destroy and on SIGUSR1.
  if (const std::string dir = knobString(Knob::kTraceDir); !dir.empty()) {
    recorder_ = std::make_unique<FlightRecorder>(
        dir, static_cast<size_t>(std::max<int64_t>(knobInt(Knob::kTraceOps), 1)), rank, nranks, context.commId);
    options.recorder = recorder_.get();
    options.observers.push_back(recorder_.get());
  }
  if (knobInt(Knob::kStats) != 0) {
    stats_ = std::make_unique<CommStats>(rank, nranks, context.commId);
    options.observers.push_back(stats_.get());
    if (const std::string file = knobString(Knob::kStatsFile); !file.empty()) {
      statsFile_ = statsFileName(file, rank, context.commId);
      if (const int64_t seconds = knobInt(Knob::kStatsIntervalS); seconds > 0) {
        stats_->every(static_cast<double>(seconds), [this] { writeStatsFile(); });
      }
    }
  }
  const bool printOnSignal = knobInt(Knob::kDumpSignal) != 0;
  if (printOnSignal || recorder_ != nullptr) {
    installDumpSignal();
    dumpsSeen_ = dumpRequests.load();
    options.whileBlocked = [this, printOnSignal] {
      if (const uint64_t asked = dumpRequests.load(std::memory_order_relaxed); asked != dumpsSeen_) {
        dumpsSeen_ = asked;
        if (printOnSignal) printState();
        if (executor_ != nullptr) executor_->writeTrace("SIGUSR1", /*failure=*/false);
      }
    };
  }
  executor_ = std::make_unique<Executor>(std::move(options), transportOfPeer_, all, &aborted_);
  bootstrap_->barrier(deadlineAfterMs(settings.initTimeoutMs));
  if (logEnabled(LogLevel::kInfo)) {
    std::string peers;
    for (int peer = 0; peer < nranks; ++peer) peers += fmt::format(" {}:{}", peer, transportName(peer));
    logAt(LogLevel::kInfo, "rank {} of {} ready (comm {:016x}); transports by peer:{}", rank, nranks, context.commId,
          peers);
  }
}

// Destroying waits (within the timeout) for operations still in flight, so peers are not left
// waiting for this rank's part; aborting does not.
Communicator::~Communicator() {
  deviceLive_.store(nullptr);
#if defined(CHORUS_HAVE_DEVICE)
  device_.reset();  // its calls in flight finish first; it uses this communicator to get there
#endif
  if (executor_ == nullptr) return;
  if (!aborted() && broken_.empty()) {
    try {
      executor_->waitAll();
    } catch (const Error&) {
      // Their requests carry the error.
    }
  }
  if (!statsFile_.empty()) writeStatsFile();
  // A rank that leaves says so in its record (a failure's record stays as it was written).
  executor_->writeTrace(aborted() ? "the communicator was aborted, then destroyed" : "the communicator was destroyed",
                        /*failure=*/false);
  executor_->abandon(aborted() ? chorusAborted : chorusInvalidUsage,
                     fmt::format("rank {}: the communicator was {} before the operation completed", rank_,
                                 aborted() ? "aborted" : "destroyed"));
  // The peers hear why this rank leaves (a failure was told when it happened).
  if (aborted()) bootstrap_->tellFailure(fmt::format("rank {}: the communicator was aborted", rank_));
  bootstrap_->sayGoodbye();
}

std::string Communicator::dumpState() const {
  std::string transports;
  for (int peer = 0; peer < nranks_; ++peer) transports += fmt::format(" {}:{}", peer, transportName(peer));
  std::string text = fmt::format("rank {} of {} (comm {:016x}); transports by peer:{}; {} connection(s)\n", rank_,
                                 nranks_, bootstrap_->commId(), transports, connections());
  if (aborted()) text += "aborted\n";
  if (!broken_.empty()) text += fmt::format("failed: {}\n", broken_);
  return text + executor_->describeState();
}

void Communicator::connectEveryPeer() {
  const Deadline deadline = deadlineAfterMs(settings_.timeoutMs);
  for (auto& transport : transports_) {
    std::vector<int> peers;
    for (int peer = 0; peer < nranks_; ++peer) {
      if (peer != rank_ && transportOfPeer_[peer] == transport.get()) peers.push_back(peer);
    }
    if (!peers.empty()) connectAll(*transport, peers, rank_, deadline, [this] { bootstrap_->watch(0); });
  }
}

int Communicator::connections() const {
  int total = 0;
  for (const auto& transport : transports_) total += transport->connections();
  return total;
}

std::string Communicator::stats(int format) const {
  if (stats_ == nullptr) fail(chorusInvalidUsage, "rank {}: statistics are off (CHORUS_STATS=0)", rank_);
  if (format != CHORUS_STATS_JSON && format != CHORUS_STATS_PROMETHEUS) {
    fail(chorusInvalidArgument, "rank {}: statistics format {}: expected CHORUS_STATS_JSON or CHORUS_STATS_PROMETHEUS",
         rank_, format);
  }
  const std::vector<Executor::LinkTotals> links = executor_->linkTotals();
  return format == CHORUS_STATS_JSON ? stats_->json(links, connections()) : stats_->prometheus(links, connections());
}

void Communicator::writeStatsFile() const {
  const bool prometheus = statsFile_.ends_with(".prom");
  if (!writeFileWhole(statsFile_, stats(prometheus ? CHORUS_STATS_PROMETHEUS : CHORUS_STATS_JSON))) {
    logAt(LogLevel::kWarn, "rank {}: CHORUS_STATS_FILE: cannot write {}", rank_, statsFile_);
  }
}

void Communicator::printState() const {
  std::string out;
  const std::string text = dumpState();
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    out += fmt::format("chorus rank {}: {}\n", rank_, text.substr(at, end - at));
    at = end == std::string::npos ? text.size() : end + 1;
  }
  std::fputs(out.c_str(), stderr);
  std::fflush(stderr);
}

std::string Communicator::transportName(int peer) const {
  return peer >= 0 && peer < nranks_ && transportOfPeer_[peer] ? transportOfPeer_[peer]->name() : "none";
}

void Communicator::setAlgorithms(const std::string& text) {
  collectives::AlgorithmOverrides parsed;
  try {
    parsed = collectives::parseAlgorithmOverrides(text);
  } catch (const std::invalid_argument& e) {
    fail(chorusInvalidArgument, "rank {}: algorithm overrides '{}': {}", rank_, text, e.what());
  }
  for (int c = 0; c < collectives::kCollectiveCount; ++c) {
    if (parsed[c]) algorithms_[c] = *parsed[c];
  }
}

PreparedOp Communicator::prepare(collectives::Collective collective, const void* input, void* output, size_t count,
                                 chorusDataType_t type, chorusRedOp_t op, int rootOrPeer, const size_t* const* vector,
                                 bool alone) {
  using collectives::Collective;
  collectives::ScheduleArgs args;
  args.collective = collective;
  args.nranks = nranks_;
  args.rank = rank_;
  args.count = count;
  args.typeSize = kernels::typeSize(type);
  args.root = rootOrPeer;
  args.divide = op == chorusAvg;
  args.chunkBytes = settings_.chunkBytes;
  args.algorithm = algorithms_[static_cast<int>(collective)];
  if (!collectives::runsOnHost(args.algorithm, collective)) args.algorithm = collectives::Algorithm::kDefault;
  args.order = order_.empty() ? nullptr : order_.data();
  args.hosts = hosts_.empty() ? nullptr : hosts_.data();
  args.deterministic = settings_.deterministic;
  // The direct algorithm needs the ranks to swap where their buffers lie first, which only a
  // blocking call alone can do, on ranks all on shm; forced where it cannot run, the tuner picks.
  const bool mayGoDirect = alone && directCapable_;
  if (args.algorithm == collectives::Algorithm::kDirect && !mayGoDirect)
    args.algorithm = collectives::Algorithm::kDefault;
  const bool forced = args.algorithm != collectives::Algorithm::kDefault;
  const size_t bytes = collectives::wholeElements(collective, count, nranks_) * args.typeSize;
  if (collective != Collective::kSend && collective != Collective::kRecv && (!forced || !settings_.chunkForced)) {
    // The tuner picks the algorithm unless it is forced, and the chunk unless CHORUS_CHUNK_BYTES is set.
    const collectives::TunerChoice choice = tunerChoice(collective, args.algorithm, bytes, mayGoDirect);
    args.algorithm = choice.algorithm;
    args.chunkBytes = choice.chunkBytes;
  }
  if (vector != nullptr) {
    args.sendCounts = vector[0];
    args.sendDispls = vector[1];
    args.recvCounts = vector[2];
    args.recvDispls = vector[3];
  }

  const collectives::CollectiveTraits& traits = collectives::traitsOf(collective);
  // Rooted collectives start with the ranks' agreement on the call: a rank that only sends (a
  // broadcast's root, a gather's leaves) or hears only from ranks that agree with it would
  // otherwise return success whatever the others called.
  const bool agree = traits.rooted && settings_.checkCalls && nranks_ > 1;
  if (agree) args.recordBytes = sizeof(CallAgreement);
  PreparedOp prepared;
  prepared.schedule = scheduleFor(args);
  prepared.input = input;
  prepared.output = output;
  prepared.type = type;
  prepared.op = op;
  prepared.collective = collective;
  prepared.count = count;
  {
    // Every rank's input and output together, which decides streaming stores (a rooted
    // collective's root counted for every rank: the bound streaming is weighed against).
    const size_t n = static_cast<size_t>(nranks_);
    size_t in = collectives::inputElements(collective, count, nranks_, true) * args.typeSize;
    size_t out = collectives::outputElements(collective, count, nranks_, true) * args.typeSize;
    prepared.inputBytes = in;
    if (vector != nullptr) {
      in = std::accumulate(vector[0], vector[0] + n, size_t{0}) * args.typeSize;
      out = std::accumulate(vector[2], vector[2] + n, size_t{0}) * args.typeSize;
      prepared.inputBytes = collectives::vectorExtent(vector[0], vector[1], nranks_) * args.typeSize;
    }
    // A message's footprint is its two ends.
    prepared.footprint = traits.pointToPoint ? 2 * count * args.typeSize : n * (in + out);
  }
  const bool reduces = traits.reduces;
  const bool rooted = traits.rooted;
  if (collective == Collective::kSend || collective == Collective::kRecv) {
    uint64_t& sequence = collective == Collective::kSend ? sendSequence_[rootOrPeer] : recvSequence_[rootOrPeer];
    prepared.tag = makeTag(TagKind::kPointToPoint, sequence, signatureOf(Collective::kSend, count, type, chorusSum, 0));
    prepared.sequence = sequence++;
    prepared.rootOrPeer = rootOrPeer;
    return prepared;
  }
  const uint64_t sequence = collectiveSequence_++;
  // The algorithm is part of the signature: ranks that chose differently fail instead of mixing.
  auto tagOf = [&](collectives::Algorithm algorithm) {
    return makeTag(
        TagKind::kCollective, sequence,
        signatureOf(collective, count, type, reduces ? op : chorusSum,
                    static_cast<uint64_t>(rooted ? rootOrPeer : 0) + 65536 * static_cast<uint64_t>(algorithm) +
                        (settings_.deterministic && reduces ? uint64_t{1} << 23 : 0) + (orderHash_ << 24)));
  };
  prepared.tag = tagOf(args.algorithm);
  if (agree) {
    prepared.record = callRecord(rank_, collective, count, type, op, rootOrPeer, args.algorithm, orderHash_);
    prepared.agreementTag = makeTag(TagKind::kAgreement, sequence, 0);
  }
  if (args.algorithm == collectives::Algorithm::kDirect) {
    // Where some rank's buffers cannot be mapped (start() finds out), what the tuner picks without it.
    collectives::ScheduleArgs instead = args;
    const collectives::TunerChoice choice =
        tunerChoice(collective, collectives::Algorithm::kDefault, bytes, /*mayGoDirect=*/false);
    instead.algorithm = choice.algorithm;
    instead.chunkBytes = settings_.chunkForced ? settings_.chunkBytes : choice.chunkBytes;
    prepared.fallback = scheduleFor(instead);
    prepared.fallbackTag = tagOf(instead.algorithm);
  }
  prepared.sequence = sequence;
  prepared.rootOrPeer = rooted ? rootOrPeer : -1;
  const std::pair<int, int> choice{static_cast<int>(collective), static_cast<int>(args.algorithm)};
  if (logEnabled(LogLevel::kInfo) &&
      std::find(loggedChoices_.begin(), loggedChoices_.end(), choice) == loggedChoices_.end()) {
    loggedChoices_.push_back(choice);
    logAt(LogLevel::kInfo,
          "rank {}: {} of {} bytes uses {} ({}) with {}-byte chunks ({}); logged once per collective and algorithm",
          rank_, collectives::collectiveName(collective), count * args.typeSize, prepared.schedule->algorithm,
          forced ? "set by CHORUS_ALGO or the caller" : "the tuner's choice", args.chunkBytes,
          settings_.chunkForced ? "CHORUS_CHUNK_BYTES" : "the tuner's chunk");
  }
  return prepared;
}

// The tuner weighs every algorithm at every chunk size (microseconds, as much as a small call
// itself): its answer is remembered per (collective, forced algorithm, bytes, whether the direct
// algorithm may run). A forced algorithm gets its best chunk; CHORUS_CHUNK_BYTES fixes the chunk.
collectives::TunerChoice Communicator::tunerChoice(collectives::Collective collective, collectives::Algorithm forced,
                                                   size_t bytes, bool mayGoDirect) {
  const uint64_t key = (static_cast<uint64_t>(collective) << 59) ^ (static_cast<uint64_t>(forced) << 54) ^
                       (static_cast<uint64_t>(mayGoDirect) << 53) ^ static_cast<uint64_t>(bytes);
  auto found = tunerChoices_.find(key);
  if (found != tunerChoices_.end()) return found->second;
  if (tunerChoices_.size() >= 4096) tunerChoices_.clear();
  const collectives::CostParams* costs = &costs_;
  collectives::CostParams apart;
  if (!mayGoDirect && costs_.directMinBytes > 0) {  // the direct algorithm cannot run
    apart = costs_;
    apart.directMinBytes = 0;
    costs = &apart;
  }
  collectives::TunerChoice choice;
  if (forced == collectives::Algorithm::kDefault) {
    choice = collectives::choose(collective, nranks_, bytes, *costs, settings_.chunkForced ? settings_.chunkBytes : 0);
  } else {
    choice = {forced, collectives::chooseChunkBytes(collective, forced, nranks_, bytes, *costs)};
  }
  if (rank_ == 0 && forced == collectives::Algorithm::kDefault) {
    logAt(LogLevel::kInfo, "rank 0: tuner: {} of {} bytes on {} ranks ({} host(s)): {}, chunk {} (predicted {:.1f} us)",
          collectives::collectiveName(collective), bytes, nranks_, costs_.hosts,
          collectives::algorithmName(choice.algorithm), choice.chunkBytes, choice.predictedUs);
  }
  return tunerChoices_.emplace(key, choice).first->second;
}

// Schedules depend on the call's shape only (steps name buffers by role and offset), so a loop
// of same-shaped calls builds its schedule once. All-to-allv's counts are not part of the key:
// those are built every time.
std::shared_ptr<const collectives::Schedule> Communicator::scheduleFor(const collectives::ScheduleArgs& args) {
  if (args.sendCounts != nullptr)
    return std::make_shared<const collectives::Schedule>(collectives::buildSchedule(args));
  const ScheduleKey key{args.collective, args.algorithm,  args.divide,      args.root,         args.count,
                        args.typeSize,   args.chunkBytes, args.recordBytes, args.deterministic};
  for (auto& [cached, schedule] : schedules_) {
    if (cached == key) return schedule;
  }
  auto schedule = std::make_shared<const collectives::Schedule>(collectives::buildSchedule(args));
  if (schedules_.size() >= kCachedSchedules) schedules_.erase(schedules_.begin());
  schedules_.emplace_back(key, schedule);
  return schedule;
}

template <typename Call>
auto Communicator::breakingOnError(Call&& call) {
  try {
    return call();
  } catch (const Error& e) {
    breakWith(e);
    throw;
  }
}

void Communicator::checkUsable(const char* operation) const {
  if (aborted()) fail(chorusAborted, "rank {}: the communicator was aborted", rank_);
  if (!broken_.empty()) {
    fail(chorusInvalidUsage, "rank {}: the communicator failed earlier and cannot be used: {}", rank_, broken_);
  }
#if defined(CHORUS_HAVE_DEVICE)
  // A device call that failed after it was enqueued (its stream went on; nobody has asked for the
  // asynchronous error yet): the peers' messages may be out of step, so no call, host or device,
  // starts on the communicator.
  if (const DeviceEngine* device = deviceLive_.load()) {
    std::string failure;
    if (device->asyncError(&failure) != chorusSuccess) {
      const std::string call = operation != nullptr ? fmt::format("{}: ", operation) : "";
      fail(chorusInvalidUsage, "rank {}: {}an earlier device call failed: {}", rank_, call, failure);
    }
  }
#endif
}

std::shared_ptr<Completion> Communicator::start(std::vector<PreparedOp> ops) {
  checkUsable();
  for (PreparedOp& op : ops) {
    if (op.fallback != nullptr) mapPeers(op);
  }
  return breakingOnError([&] { return executor_->submit(std::move(ops)); });
}

void Communicator::wait(const Completion& completion) {
  breakingOnError([&] { executor_->wait(completion); });
}

bool Communicator::test(const Completion& completion) {
  return breakingOnError([&] { return executor_->test(completion); });
}

bool Communicator::poll(const Completion& completion) {
  return breakingOnError([&] { return executor_->poll(completion); });
}

std::unique_ptr<Communicator> Communicator::shrink(const std::vector<int>& exclude, const CommSettings& settings) {
  std::vector<bool> excluded(nranks_, false);
  for (int r : exclude) {
    if (r < 0 || r >= nranks_) {
      fail(chorusInvalidArgument, "rank {}: chorusCommShrink: excluded rank {} is out of range [0, {})", rank_, r,
           nranks_);
    }
    excluded[r] = true;
  }
  if (excluded[rank_]) {
    fail(chorusInvalidArgument,
         "rank {}: chorusCommShrink: this rank is among the excluded (excluded ranks do not call)", rank_);
  }
  std::vector<int> remaining;
  for (int r = 0; r < nranks_; ++r) {
    if (!excluded[r]) remaining.push_back(r);
  }
  const int newRank = static_cast<int>(std::find(remaining.begin(), remaining.end(), rank_) - remaining.begin());
  const UniqueIdData id = bootstrap_->agreeOnNewId(remaining, deadlineAfterMs(settings.initTimeoutMs));
  logAt(LogLevel::kInfo, "rank {}: shrinking to {} of {} ranks, as rank {}", rank_, remaining.size(), nranks_, newRank);
  return std::make_unique<Communicator>(id, static_cast<int>(remaining.size()), newRank, settings);
}

uint64_t Communicator::commId() const { return bootstrap_->commId(); }

UniqueIdData Communicator::growId() const {
  UniqueIdData id = createUniqueId();
  id.parent = commId();
  id.parentNranks = nranks_;
  return id;
}

std::unique_ptr<Communicator> Communicator::grow(int nranks, const UniqueIdData& id, const CommSettings& settings) {
  if (id.parent != commId()) {
    fail(chorusInvalidArgument,
         "rank {}: chorusCommGrow: the id {} (communicator {:016x}), not by chorusCommGetUniqueId on this "
         "communicator ({:016x})",
         rank_, id.parent == 0 ? "is not a grow id" : "was made for another communicator", id.parent, commId());
  }
  if (nranks <= nranks_) {
    fail(chorusInvalidArgument, "rank {}: chorusCommGrow: {} ranks do not grow this communicator of {}", rank_, nranks,
         nranks_);
  }
  logAt(LogLevel::kInfo, "rank {}: growing from {} to {} ranks", rank_, nranks_, nranks);
  return std::make_unique<Communicator>(id, nranks, rank_, settings, commId());
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const CommSettings& settings) {
  const size_t n = static_cast<size_t>(nranks_);
  std::vector<int32_t> choices(2 * n);  // (color, key) of each rank
  choices[2 * rank_] = color;
  choices[2 * rank_ + 1] = key;
  run({prepare(collectives::Collective::kAllGather, &choices[2 * rank_], choices.data(), 2, chorusInt32, chorusSum,
               0)});
  for (int r = 0; r < nranks_; ++r) {
    if (choices[2 * r] < 0 && choices[2 * r] != kNoColor) {
      fail(chorusInvalidArgument,
           "rank {}: chorusCommSplit: rank {} passed color {} (a color is >= 0, or CHORUS_SPLIT_NOCOLOR = {})", rank_,
           r, choices[2 * r], kNoColor);
    }
  }
  // Each color's members in new-rank order: by key, then by rank here.
  auto membersOf = [&](int c) {
    std::vector<int> members;
    for (int r = 0; r < nranks_; ++r) {
      if (choices[2 * r] == c) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return choices[2 * a + 1] < choices[2 * b + 1]; });
    return members;
  };
  const std::vector<int> members = color == kNoColor ? std::vector<int>{} : membersOf(color);
  // The leader of a color is its lowest-numbered rank here; it makes the id and runs its root.
  std::vector<UniqueIdData> ids(n);
  const int leader = members.empty() ? -1 : *std::min_element(members.begin(), members.end());
  if (leader == rank_) ids[rank_] = createUniqueId();
  run({prepare(collectives::Collective::kAllGather, &ids[rank_], ids.data(), sizeof(UniqueIdData), chorusUint8,
               chorusSum, 0)});
  if (color == kNoColor) return nullptr;
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  logAt(LogLevel::kInfo, "rank {}: split color {} key {}: rank {} of {}", rank_, color, key, newRank, members.size());
  return std::make_unique<Communicator>(ids[leader], static_cast<int>(members.size()), newRank, settings);
}

void Communicator::breakWith(const Error& e) {
  if (!broken_.empty()) return;
  broken_ = e.what();
  brokenResult_ = e.code();
  bootstrap_->tellFailure(broken_);  // the peers fail now instead of at their timeout
}

void Communicator::abort() {
  aborted_.store(true);
#if defined(CHORUS_HAVE_DEVICE)
  if (DeviceEngine* device = deviceLive_.load()) device->abort();
#endif
}

DeviceEngine& Communicator::device() {
#if defined(CHORUS_HAVE_DEVICE)
  if (device_ == nullptr) {
    if (!broken_.empty()) fail(brokenResult_, "rank {}: the communicator has failed: {}", rank_, broken_);
    device_ = std::make_shared<DeviceEngine>(*this);
    deviceLive_.store(device_.get());
    if (aborted()) device_->abort();
  }
  return *device_;
#else
  fail(chorusInvalidUsage, "rank {}: this build of chorus has no CUDA: no device path", rank_);
#endif
}

Traffic Communicator::traffic() const {
  Traffic total;
  for (const auto& t : transports_) {
    const Traffic sent = t->sent();
    total.bytes += sent.bytes;
    total.messages += sent.messages;
  }
#if defined(CHORUS_HAVE_DEVICE)
  if (device_ != nullptr) {
    const Traffic staged = device_->traffic();
    total.bytes += staged.bytes;
    total.messages += staged.messages;
  }
#endif
  return total;
}

chorusResult_t Communicator::asyncError() {
  if (broken_.empty()) {
    try {
      executor_->progress();
      bootstrap_->watch();
#if defined(CHORUS_HAVE_DEVICE)
      std::string message;
      const chorusResult_t device = device_ != nullptr ? device_->asyncError(&message) : chorusSuccess;
      if (device != chorusSuccess) throw Error(device, message);
#endif
    } catch (const Error& e) {
      breakWith(e);
    }
  }
  return broken_.empty() ? chorusSuccess : brokenResult_;
}

}  // namespace chorus
