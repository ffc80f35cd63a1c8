// communicator.h: a communicator's state: its ranks, bootstrap ring, transports per peer,
// message sequence numbers, scratch memory and executor. Used by one thread at a time; abort()
// only sets a flag that waits check, so it is safe from any thread while the object lives.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/chorus.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/compression.h"
#include "src/collectives/schedule.h"
#include "src/collectives/tuner.h"
#include "src/core/bootstrap.h"
#include "src/core/executor.h"
#include "src/transport/transport.h"

namespace chorus {

class DeviceEngine;
class FlightRecorder;
class CommStats;

struct CommSettings {
  int timeoutMs = 300000;
  int initTimeoutMs = 120000;
  std::string transport = "auto";
  std::string algorithms;  // CHORUS_ALGO syntax
  std::string rankOrder;   // CHORUS_RANK_ORDER: comma-separated ranks, position by position
  size_t chunkBytes = 512 * 1024;
  bool chunkForced = false;  // CHORUS_CHUNK_BYTES set: every call uses chunkBytes, else the tuner picks
  int spinUs = 20;
  bool eagerConnect = false;  // CHORUS_CONNECT=eager: every peer connected at init
  bool checkCalls = true;     // CHORUS_CHECK_CALLS: the ranks agree on a rooted collective before it runs
  // CHORUS_DETERMINISTIC or the config: reductions fold every element in rank order.
  bool deterministic = false;

  // Built-in defaults, then the environment, then the config (fields not at their initializer).
  static CommSettings resolve(const chorusConfig_t* config);
};

class Communicator {
 public:
  // Collective: meets every rank through the id's root and connects the transports. With a grow
  // id (chorusCommGrow), `grownFrom` is the id of the communicator this rank comes from (0: a new
  // rank); the ranks check that those numbered below the id's parent count come from it, the
  // others not.
  Communicator(const UniqueIdData& id, int nranks, int rank, const CommSettings& settings, uint64_t grownFrom = 0);
  ~Communicator();

  int rank() const { return rank_; }
  uint64_t commId() const;
  int nranks() const { return nranks_; }
  const CommSettings& settings() const { return settings_; }

  // Builds the schedule and tag of a call (arguments checked). `vector` holds all-to-allv's
  // counts and displacements (send counts, send displs, recv counts, recv displs).
  // `alone`: a blocking call outside any group (every rank must call it alike), which may take the
  // direct algorithm (src/collectives/direct.cc) where every peer is on shm: start() then swaps
  // where the ranks' buffers lie first.
  PreparedOp prepare(collectives::Collective collective, const void* input, void* output, size_t count,
                     chorusDataType_t type, chorusRedOp_t op, int rootOrPeer, const size_t* const* vector = nullptr,
                     bool alone = false);

  // Collective over the ranks not in `exclude` (they do not call it): a new communicator of those
  // ranks, in their order here, with `settings`. Works on a communicator that has failed (a dead
  // rank excluded), which is how a job goes on without it. Throws chorusInvalidArgument for a
  // rank out of range or this rank in `exclude`.
  std::unique_ptr<Communicator> shrink(const std::vector<int>& exclude, const CommSettings& settings);

  // Collective over every rank (as ncclCommSplit): the ranks that pass the same color make one new
  // communicator, numbered by (key, rank here). color kNoColor (-1): this rank joins none and gets
  // null. The ranks first all-gather their (color, key) on this communicator, so a bad color on
  // any rank fails on every rank with the same message (chorusInvalidArgument naming the rank);
  // then the lowest-numbered rank of each color makes the new id, and a second all-gather hands
  // it to the rest.
  static constexpr int kNoColor = -1;
  std::unique_ptr<Communicator> split(int color, int key, const CommSettings& settings);

  // A grow id for this communicator (chorusCommGetUniqueId): this process runs its root.
  UniqueIdData growId() const;
  // This rank's part of the communicator of nranks grown from this one with `id` (chorusCommGrow):
  // it keeps its number. Throws chorusInvalidArgument for an id not from growId() here or nranks
  // not above this one's.
  std::unique_ptr<Communicator> grow(int nranks, const UniqueIdData& id, const CommSettings& settings);

  // Applies overrides in CHORUS_ALGO syntax (throws chorusInvalidArgument; nothing changes then).
  void setAlgorithms(const std::string& text);
  // The algorithm forced for a collective (kDefault: none): a host or a device one; each engine
  // follows it where it is one of its own.
  collectives::Algorithm forcedAlgorithm(collectives::Collective collective) const {
    return algorithms_[static_cast<int>(collective)];
  }

  // Starts prepared ops (a single call, or a group) after those already in flight; they progress
  // inside later calls on this communicator. An op of the direct algorithm first meets its peers
  // (mapPeers).
  std::shared_ptr<Completion> start(std::vector<PreparedOp> ops);
  // Progresses until the ops of `completion` are done (wait) or as far as possible (test).
  void wait(const Completion& completion);
  bool test(const Completion& completion);
  bool poll(const Completion& completion);  // test, with the timeout and abort (group.h)
  // start + wait.
  void run(std::vector<PreparedOp> ops) { wait(*start(std::move(ops))); }
  // Operations started and not yet done.
  size_t pending() const { return executor_->pending(); }

  // Marks the communicator aborted (and its device path's waits, if it has one).
  void abort();
  bool aborted() const { return aborted_.load(); }
  // After a failed operation the message streams may be out of step: later calls fail at once.
  const std::string& brokenReason() const { return broken_; }
  // Throws chorusAborted once aborted, chorusInvalidUsage once failed or once a device call failed
  // after it was enqueued (naming the failure, and the operation where given): what every new
  // operation, host or device, checks first.
  void checkUsable(const char* operation = nullptr) const;
  // Progresses the operations in flight without blocking, then says whether the communicator has
  // failed: chorusSuccess, or the failure's result. The failure's message is brokenReason().
  chorusResult_t asyncError();
  // This rank's state, for chorusCommDumpState and CHORUS_DUMP_SIGNAL: the communicator, whether
  // it has failed, every pending operation and the step it waits on, what each link has moved.
  std::string dumpState() const;
  // The live statistics as text: format 0 JSON, 1 Prometheus (chorusCommGetStats).
  std::string stats(int format) const;
  // Writes dumpState() to stderr, each line prefixed with "chorus rank R: ".
  void printState() const;

  // Peers this rank holds connections to, over all its transports (not counting itself).
  int connections() const;
  // What this rank has sent on all its transports (chorusCommGetTraffic), its device path's
  // staged calls included.
  Traffic traffic() const;
  // Runs a compressed all-reduce of `state`'s buffer (blocking; compressed.cc): its exchanges are
  // this communicator's collectives. Throws chorusInvalidArgument for a count that is not the
  // state's.
  void compressedAllReduce(collectives::CompressedAllReduce& state, const float* input, float* output, size_t count,
                           bool average);

  // The device path (device.h), made at the first call with a stream: collective, so every rank
  // must reach it in the same call. Only in builds with CUDA.
  DeviceEngine& device();
  // Whether every rank is on this host.
  bool singleHost() const { return hosts_.empty(); }
  // Name of the transport used for each peer, for logs and tests.
  std::string transportName(int peer) const;

 private:
  // Follows `order` (position -> rank) in rings, chains and trees from now on.
  void followOrder(std::vector<int> order);
  collectives::TunerChoice tunerChoice(collectives::Collective collective, collectives::Algorithm forced, size_t bytes,
                                       bool mayGoDirect);
  // A direct op's meeting (direct.cc): the ranks swap where their buffers lie and map each
  // other's; where some rank's cannot be mapped, every rank's op takes its fallback schedule.
  void mapPeers(PreparedOp& op);

  int rank_;
  int nranks_;
  CommSettings settings_;
  std::unique_ptr<Bootstrap> bootstrap_;
  Socket dataListener_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<Transport*> transportOfPeer_;
  std::unique_ptr<FlightRecorder> recorder_;  // CHORUS_TRACE_DIR; made before executor_, which points at it
  std::unique_ptr<CommStats> stats_;          // CHORUS_STATS; likewise
  std::string statsFile_;                     // CHORUS_STATS_FILE, this rank's name
  void writeStatsFile() const;
  std::unique_ptr<Executor> executor_;
  uint64_t collectiveSequence_ = 0;
  std::vector<uint64_t> sendSequence_;
  std::vector<uint64_t> recvSequence_;
  std::array<collectives::Algorithm, collectives::kCollectiveCount> algorithms_{};  // kDefault: the tuner's
  std::vector<int> order_;  // rank order (position -> rank), empty for 0..n-1
  uint64_t orderHash_ = 0;  // folded into every collective's signature
  std::vector<int> hosts_;  // host of each rank (numbered by lowest rank), empty on one host
  // The tuner's answers by (collective, forced algorithm, bytes).
  std::unordered_map<uint64_t, collectives::TunerChoice> tunerChoices_;
  collectives::CostParams costs_;                   // the tuner's model of this communicator's slowest transport
  std::vector<std::pair<int, int>> loggedChoices_;  // (collective, algorithm) already logged
  // The schedules of recent call shapes, oldest first.
  struct ScheduleKey {
    collectives::Collective collective;
    collectives::Algorithm algorithm;
    bool divide;
    int root;
    size_t count;
    size_t typeSize;
    size_t chunkBytes;
    size_t recordBytes;
    bool deterministic;
    bool operator==(const ScheduleKey&) const = default;
  };
  static constexpr size_t kCachedSchedules = 16;
  std::shared_ptr<const collectives::Schedule> scheduleFor(const collectives::ScheduleArgs& args);
  std::vector<std::pair<ScheduleKey, std::shared_ptr<const collectives::Schedule>>> schedules_;
  bool directCapable_ = false;  // every peer on shm: the direct algorithm can run
  bool meshConnected_ = false;  // connectEveryPeer() done
  // Connects to every peer now (transports connect lazily otherwise); collective.
  void connectEveryPeer();
  bool directLogged_ = false;
  bool fallbackLogged_ = false;
  // Direct calls left that skip the swap (a heap buffer was found), by (collective, input bytes):
  // every rank counts the same calls, and calls of other shapes (a benchmark's bookkeeping on the
  // heap between its timed calls) do not hold back those on shareable buffers.
  std::unordered_map<uint64_t, int> directSkips_;
  std::atomic<bool> aborted_{false};
  std::shared_ptr<DeviceEngine> device_;  // shared_ptr: destroyed here without its definition (no-CUDA builds)
  std::atomic<DeviceEngine*> deviceLive_{nullptr};  // device_, for abort() from another thread
  uint64_t dumpsSeen_ = 0;                          // signal dump requests already answered
  std::string broken_;
  chorusResult_t brokenResult_ = chorusSuccess;  // the result of the failure broken_ describes
  void breakWith(const Error& e);                // records the first failure
  // call(), recording a chorus::Error it throws (breakWith) before passing it on.
  template <typename Call>
  auto breakingOnError(Call&& call);
};

}  // namespace chorus
