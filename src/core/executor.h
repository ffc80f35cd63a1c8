// executor.h: runs schedules (src/collectives) over the transports, as one stream per rank.
// Submitted operations (a call, or a group of calls) append their steps to the stream; steps are
// posted strictly in stream order, which keeps the order of messages between every pair of ranks
// the same on both sides, and a step waits only for the earlier in-flight steps whose byte ranges
// it conflicts with (on the real addresses, so in-place calls and two in-flight calls on the same
// buffer are ordered correctly). Sends, receives and reductions of different chunks, and of
// different operations, overlap. Progress happens inside submit, test and wait: waits spin
// briefly and then block in the transports; every wait is bounded by the no-progress timeout and
// checks the abort flag. One thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/collectives/schedule.h"
#include "src/core/agreement.h"
#include "src/core/bootstrap.h"
#include "src/transport/transport.h"

namespace chorus {

// Every rank's input and output (by rank, this rank's own too) as this process reaches them:
// what a reduce-peers step reads and writes.
struct PeerBuffers {
  std::vector<const char*> inputs;
  std::vector<char*> outputs;
};

// One operation ready to run: its schedule (shared with later calls of the same shape), its
// buffers, and what to call it in messages.
struct PreparedOp {
  std::shared_ptr<const collectives::Schedule> schedule;
  const void* input = nullptr;
  void* output = nullptr;
  chorusDataType_t type = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  uint64_t tag = 0;
  // Where the schedule has the ranks agree on the call first (rooted collectives): this rank's
  // call, and the tag of the agreement's messages (the same whatever the call, so ranks whose
  // calls differ exchange them all and find out together).
  CallRecord record;
  uint64_t agreementTag = 0;
  // For messages only, formatted when one is written (a small call must not pay for it).
  collectives::Collective collective = collectives::Collective::kAllReduce;
  uint64_t sequence = 0;
  size_t count = 0;
  size_t footprint = 0;   // bytes of every rank's input and output together (kernels::streamingPays)
  size_t inputBytes = 0;  // this rank's input spans [input, input + inputBytes)
  int64_t startNs = 0;    // steady clock at submit, where something observes the ops
  int rootOrPeer = -1;    // rooted collectives: the root; send and recv: the peer; else -1
  // The direct algorithm only: every rank's buffers, mapped before the op starts
  // (Communicator::start); and the schedule and tag the call takes instead where some rank's
  // buffers cannot be mapped.
  std::shared_ptr<const PeerBuffers> peers;
  std::shared_ptr<const collectives::Schedule> fallback;
  uint64_t fallbackTag = 0;

  // "allreduce #12 (count 1024 float32 sum, ring)", "send #3 (count 4 int32, to rank 1)".
  std::string what() const;
};

// How errors name a call: "allreduce #12 (count 1024 float32 sum, ring)", "broadcast #3 (count 8
// int32 root 1, binomial)", "send #3 (count 4 int32, to rank 1)"; rootOrPeer < 0: none.
std::string nameOfCall(collectives::Collective collective, uint64_t sequence, size_t count, chorusDataType_t type,
                       chorusRedOp_t op, int rootOrPeer, const char* algorithm);

// The outcome of one submission, shared with the request handle that waits for it.
struct Completion {
  bool done = false;
  chorusResult_t result = chorusSuccess;
  std::string message;  // the error, when result is not chorusSuccess
};

class FlightRecorder;

// Nanoseconds on the steady clock (one clock for every process of a host).
inline int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Told of every operation's start (PreparedOp::startNs set) and end: the flight recorder, the
// statistics.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void started(const PreparedOp& op) = 0;
  virtual void finished(const PreparedOp& op, chorusResult_t result, const std::string& error) = 0;
};

struct ExecutorOptions {
  int rank = 0;
  int nranks = 1;
  int timeoutMs = 300000;  // fail when nothing moved for this long
  int spinUs = 20;
  // The communicator's failure line (null: none). Watched before each block in the transports
  // (not while spinning): a failure a peer tells of ends the stream; a failure found here is
  // told to the peers (Bootstrap::failed).
  Bootstrap* failureLine = nullptr;
  // Called there too (a dump of the state a signal asked for).
  std::function<void()> whileBlocked;
  // Told of every operation's start and end (none: no clock is read for them).
  std::vector<OpObserver*> observers;
  // CHORUS_TRACE_DIR: written on a failure of the stream (null: none; it observes too).
  FlightRecorder* recorder = nullptr;
};

class Executor {
 public:
  Executor(ExecutorOptions options, std::vector<Transport*> transportOfPeer, std::vector<Transport*> transports,
           const std::atomic<bool>* aborted);
  ~Executor();

  // Appends the ops' steps to the stream (a group is several ops) and posts what can be posted.
  // The buffers must stay valid until the completion is done.
  std::shared_ptr<Completion> submit(std::vector<PreparedOp> ops);
  // Progresses the stream until `completion` is done. Throws chorus::Error naming the rank, the op
  // and the step on failure; a failure ends every submission in the stream with that error.
  void wait(const Completion& completion);
  // Progresses without blocking; true when `completion` is done (errors as wait).
  bool test(const Completion& completion);
  // test() for a wait spread over several communicators (a group driven by one thread): also
  // fails the ops with the timeout's message when nothing moved for the timeout, or when aborted.
  bool poll(const Completion& completion);
  // Progresses without blocking, with no completion to watch; a failure ends every submission in
  // the stream and is thrown (as wait).
  void progress();
  // Waits for every submission.
  void waitAll();
  // Ends every unfinished submission with this result, without waiting (abort, destroy).
  void abandon(chorusResult_t result, const std::string& message);
  size_t pending() const { return batches_.size(); }
  // Every unfinished submission (its operations, how far each has come, the step it waits on)
  // and what each peer link has moved, one line each, for chorusCommDumpState.
  std::string describeState() const;
  // What each link has moved and how long this rank waited on each peer (a blocked wait is
  // charged to the peer of the earliest unfinished step).
  struct LinkTotals {
    int peer = -1;
    uint64_t sentMessages = 0;
    uint64_t sentBytes = 0;
    uint64_t receivedMessages = 0;
    uint64_t receivedBytes = 0;
    uint64_t waitNs = 0;
  };
  std::vector<LinkTotals> linkTotals() const;
  // Writes the flight recorder's file (options.recorder) with what the stream waits on now.
  void writeTrace(const std::string& reason, bool failure) const;

 private:
  using Placed = collectives::PlacedStep<const char*>;
  struct Batch;
  // One step in the stream. A receive-reduce whose transport delivers pieces reduces each piece
  // as it arrives (consume), so the received bytes are never stored; where the next step sends
  // its result on (a ring's receive-reduce-send), that send is posted with it as a streaming send
  // the pieces feed as they are reduced, written into the outgoing message in the same pass where
  // the transport offers a window (forward).
  struct Item final : PieceSink {
    void consume(size_t offset, const void* piece, size_t bytes) override;
    // Whether the step's bytes go into the output with streaming stores: a large call's final
    // bytes, unless they land on the input, whose lines the call has read into the cache.
    bool streams() const;
    const collectives::Step* step;
    PreparedOp* op;
    Batch* batch;
    char* src;
    char* dst;
    char* tmp;
    Placed placed;  // the ranges the issue rule compares
    Request request;
    uint64_t tag;  // of its messages: the op's, or the agreement's
    bool needsReduce;
    // A receive-reduce posted with the next item, the send of its result, as a streaming send of
    // forwardVia (the transport of both): that item, else null.
    Item* forward;
    Transport* forwardVia;
    size_t index;  // position in its batch, for messages
  };
  struct Batch {
    std::vector<PreparedOp> ops;
    std::unique_ptr<Item[]> items;
    size_t count = 0;
    size_t issued = 0;
    size_t completed = 0;
    std::vector<char> scratch;
    std::shared_ptr<Completion> completion;
  };

  bool advance();     // posts what can be posted, progresses transports; true if anything moved
  bool issueReady();  // posts steps in stream order until one conflicts with an in-flight step
  bool poll();        // progresses transports, completes finished items
  void issue(Item& item);
  void reducePeers(Item& item);
  void agree(Item& item);
  void fold(Item& item);
  void tellFinished(const Batch& batch, chorusResult_t result, const std::string& message) const;
  // The item after `item` in its batch when it sends exactly what `item` (a receive-reduce) writes,
  // through the same transport, and may be posted now; else null.
  Item* forwardOf(Item& item);
  bool finish(Item& item);
  void complete(Item& item);
  void reap();  // removes done batches from the stream
  template <typename Done>
  void waitUntil(Done done);
  [[noreturn]] void timeout();
  // The waits' shared watch: chorusAborted naming the oldest pending step once aborted; moved_
  // read into the no-progress clock; whether nothing moved for the timeout.
  void failIfAborted() const;
  void noteProgress(Clock::time_point now);
  bool stalled(Clock::time_point now) const;
  // Whether completion is done; throws its failure.
  static bool settled(const Completion& completion);
  [[noreturn]] void failAll(const Error& failure);
  const Item* oldestPending() const;
  // The issue rule (schedule.h): whether item must wait for a step in flight.
  bool mustWait(const Item& item) const;

  // What one peer link has moved: completed sends and receives, and the operation the last
  // received message belonged to (which says whether a silent peer has reached a given call).
  struct Link {
    uint64_t sentMessages = 0;
    uint64_t sentBytes = 0;
    uint64_t receivedMessages = 0;
    uint64_t receivedBytes = 0;
    collectives::Collective lastCollective = collectives::Collective::kAllReduce;
    uint64_t lastSequence = 0;
    bool receivedAny = false;
    uint64_t waitNs = 0;  // blocked waiting on this peer
  };
  std::string describeLink(int peer) const;
  // What the step waits for, and whether its peer has reached its operation.
  std::string describeWait(const Item& item) const;

  ExecutorOptions options_;
  std::vector<Link> links_;  // by peer rank
  std::vector<Transport*> transportOfPeer_;
  std::vector<Transport*> transports_;
  const std::atomic<bool>* aborted_;
  std::deque<std::unique_ptr<Batch>> batches_;  // in submission order; removed when complete
  std::vector<std::vector<char>> scratchPool_;  // scratch of completed batches, for reuse
  std::vector<Item*> inFlight_;
  Clock::time_point lastProgress_;  // when a wait last saw moved_ set
  bool moved_ = false;              // something moved since a wait last read the clock
};

}  // namespace chorus
