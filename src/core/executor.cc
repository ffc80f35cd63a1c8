// executor.cc: runs schedules over the transports as one stream (see executor.h).
#include "src/core/executor.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/reduce.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/collectives/traits.h"
#include "src/core/flight_recorder.h"

namespace chorus {
namespace {

// Tells the core this thread is spinning (a hyperthread sibling runs faster meanwhile).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

using collectives::StepKind;

std::string nameOfCall(collectives::Collective collective, uint64_t sequence, size_t count, chorusDataType_t type,
                       chorusRedOp_t op, int rootOrPeer, const char* algorithm) {
  using collectives::Collective;
  const char* name = collectives::collectiveName(collective);
  if (collective == Collective::kSend || collective == Collective::kRecv) {
    return fmt::format("{} #{} (count {} {}, {} rank {})", name, sequence, count, chorusTypeName(type),
                       collective == Collective::kSend ? "to" : "from", rootOrPeer);
  }
  std::string detail = fmt::format("count {} {}", count, chorusTypeName(type));
  if (collectives::traitsOf(collective).reduces) detail += fmt::format(" {}", chorusOpName(op));
  if (rootOrPeer >= 0) detail += fmt::format(" root {}", rootOrPeer);
  return fmt::format("{} #{} ({}, {})", name, sequence, detail, algorithm);
}

std::string PreparedOp::what() const {
  return nameOfCall(collective, sequence, count, type, op, rootOrPeer, schedule ? schedule->algorithm : "");
}

Executor::Executor(ExecutorOptions options, std::vector<Transport*> transportOfPeer, std::vector<Transport*> transports,
                   const std::atomic<bool>* aborted)
    : options_(options),
      links_(static_cast<size_t>(std::max(options.nranks, 1))),
      transportOfPeer_(std::move(transportOfPeer)),
      transports_(std::move(transports)),
      aborted_(aborted) {}

Executor::~Executor() { abandon(chorusInvalidUsage, "the communicator was destroyed before the operation completed"); }

bool Executor::mustWait(const Item& item) const {
  return collectives::mustWait(item.placed, inFlight_, [](const Item* earlier) { return &earlier->placed; });
}

std::shared_ptr<Completion> Executor::submit(std::vector<PreparedOp> ops) {
  auto batch = std::make_unique<Batch>();
  batch->completion = std::make_shared<Completion>();
  batch->ops = std::move(ops);
  // Each op's scratch starts on a cache line: a group's ops have scratch of any size, and the
  // reductions load whole elements (a 7-element bfloat16 scratch would misalign the next op's).
  auto lineUp = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  size_t scratchBytes = 0;
  for (const PreparedOp& op : batch->ops) {
    batch->count += op.schedule->steps.size();
    scratchBytes += lineUp(op.schedule->scratchBytes);
  }
  if (!options_.observers.empty()) {
    const int64_t now = steadyNs();
    for (PreparedOp& op : batch->ops) {
      op.startNs = now;
      for (OpObserver* o : options_.observers) o->started(op);
    }
  }
  if (batch->count == 0) {
    batch->completion->done = true;
    tellFinished(*batch, chorusSuccess, "");
    return batch->completion;
  }
  if (scratchBytes > 0) {
    if (!scratchPool_.empty()) {
      batch->scratch = std::move(scratchPool_.back());
      scratchPool_.pop_back();
    }
    if (batch->scratch.size() < scratchBytes) batch->scratch.resize(scratchBytes);
  }
  batch->items.reset(new Item[batch->count]);
  size_t index = 0;
  size_t scratchOffset = 0;
  for (PreparedOp& op : batch->ops) {
    char* bases[collectives::kBufferCount] = {static_cast<char*>(const_cast<void*>(op.input)),
                                              static_cast<char*>(op.output), batch->scratch.data() + scratchOffset};
    scratchOffset += lineUp(op.schedule->scratchBytes);
    if (op.schedule->agreementSteps > 0) {
      const CallAgreement mine = agreementOf(op.record);
      std::memcpy(bases[static_cast<int>(collectives::BufferId::kScratch)] + op.schedule->recordOffset, &mine,
                  sizeof(mine));
    }
    size_t inOp = 0;
    for (const collectives::Step& step : op.schedule->steps) {
      Item& item = batch->items[index];
      item.step = &step;
      item.op = &op;
      item.batch = batch.get();
      item.src = bases[static_cast<int>(step.src.buffer)] + step.src.offset;
      item.dst = bases[static_cast<int>(step.dst.buffer)] + step.dst.offset;
      item.tmp = bases[static_cast<int>(step.tmp.buffer)] + step.tmp.offset;
      item.request.done = false;
      item.tag = inOp++ < op.schedule->agreementSteps ? op.agreementTag : op.tag;
      item.needsReduce = false;
      item.forward = nullptr;
      item.forwardVia = nullptr;
      item.index = index;
      item.placed = collectives::placeStep<const char*>(
          step, [&](collectives::BufferId buffer) -> const char* { return bases[static_cast<int>(buffer)]; });
      ++index;
    }
  }
  std::shared_ptr<Completion> completion = batch->completion;
  reap();
  if (batches_.empty()) moved_ = true;  // the no-progress clock starts now
  batches_.push_back(std::move(batch));
  try {
    advance();
  } catch (const Error& e) {
    failAll(e);
  }
  return completion;
}

bool Executor::issueReady() {
  bool moved = false;
  for (size_t b = 0; b < batches_.size(); ++b) {
    Batch& batch = *batches_[b];
    while (batch.issued < batch.count) {
      Item& item = batch.items[batch.issued];
      if (mustWait(item)) return moved;
      ++batch.issued;
      issue(item);
      moved = true;
      Item* forward = item.forward;  // posted with it
      if (forward != nullptr) ++batch.issued;
      for (Item* posted : {&item, forward}) {
        if (posted == nullptr) continue;
        if (finish(*posted)) {
          complete(*posted);
        } else {
          inFlight_.push_back(posted);
        }
      }
      poll();  // keeps FIFOs moving while a long schedule is posted
    }
  }
  return moved;
}

void Executor::issue(Item& item) {
  const collectives::Step& step = *item.step;
  switch (step.kind) {
    case StepKind::kSend:
      transportOfPeer_[step.peer]->postSend(step.peer, item.tag, item.src, step.bytes, &item.request);
      break;
    case StepKind::kRecv:
      item.request.streamed = item.streams();
      transportOfPeer_[step.peer]->postRecv(step.peer, item.tag, item.dst, step.bytes, &item.request);
      break;
    case StepKind::kRecvReduce: {
      Transport* from = transportOfPeer_[step.peer];
      // The send of the result first, so every piece the receive delivers can feed it.
      if (Item* next = forwardOf(item);
          next != nullptr &&
          from->postStreamingSend(next->step->peer, next->tag, next->src, step.bytes, &next->request)) {
        item.forward = next;
        item.forwardVia = from;
        if (!from->postRecvToSink(step.peer, item.tag, &item, step.bytes, &item.request)) {
          fail(chorusInternalError, "the {} transport takes streaming sends but not sinks", from->name());
        }
        break;
      }
      if (from->postRecvToSink(step.peer, item.tag, &item, step.bytes, &item.request)) break;
      item.needsReduce = true;
      from->postRecv(step.peer, item.tag, item.tmp, step.bytes, &item.request);
      break;
    }
    case StepKind::kCopy:
      if (item.src != item.dst && step.bytes > 0) {
        // A large copy into the output is final: streamed, it skips reading the destination first.
        const bool apart = item.dst + step.bytes <= item.src || item.src + step.bytes <= item.dst;
        if (apart && item.streams()) {
          kernels::copyStreaming(item.dst, item.src, step.bytes);
        } else {
          std::memmove(item.dst, item.src, step.bytes);
        }
      }
      item.request.done = true;
      break;
    case StepKind::kReduce: {
      const size_t typeSize = kernels::typeSize(item.op->type);
      kernels::reduce(item.dst, item.src, item.tmp, step.bytes / typeSize, item.op->type, item.op->op);
      item.request.done = true;
      break;
    }
    case StepKind::kDivide: {
      const size_t typeSize = kernels::typeSize(item.op->type);
      kernels::divide(item.dst, step.bytes / typeSize, item.op->type, options_.nranks);
      item.request.done = true;
      break;
    }
    case StepKind::kReducePeers:
      reducePeers(item);
      item.request.done = true;
      break;
    case StepKind::kAgree:
      agree(item);
      item.request.done = true;
      break;
    case StepKind::kFold:
      fold(item);
      item.request.done = true;
      break;
  }
}

// Every rank's contribution to a piece, folded in rank order: the peers' from the slots they were
// received into, this rank's own where it lies.
void Executor::fold(Item& item) {
  const collectives::Step& step = *item.step;
  const PreparedOp& op = *item.op;
  if (step.parts != options_.nranks) {
    fail(chorusInternalError, "rank {}: {}: a fold of {} parts among {} ranks", options_.rank, op.what(), step.parts,
         options_.nranks);
  }
  std::vector<const void*> from(static_cast<size_t>(step.parts));
  for (int p = 0; p < step.parts; ++p) {
    from[p] = p == options_.rank ? item.tmp : item.src + static_cast<size_t>(p) * step.bytes;
  }
  void* to = item.dst;
  kernels::reduceMany(&to, 1, from.data(), step.parts, step.bytes / kernels::typeSize(op.type), op.type, op.op,
                      nullptr);
}

// One round of the ranks' agreement on the call: what this rank knew and what a peer did, merged;
// after the last, a call the ranks disagree on fails on every rank.
void Executor::agree(Item& item) {
  CallAgreement mine, theirs;
  if (item.step->bytes != sizeof(CallAgreement)) {
    fail(chorusInternalError, "rank {}: {}: an agreement step of {} bytes, not {}", options_.rank, item.op->what(),
         item.step->bytes, sizeof(CallAgreement));
  }
  std::memcpy(&mine, item.src, sizeof(mine));
  std::memcpy(&theirs, item.tmp, sizeof(theirs));
  const CallAgreement both = merged(mine, theirs);
  std::memcpy(item.dst, &both, sizeof(both));
  if (item.step->peer != collectives::kEveryRank) return;
  if (const std::string why = disagreement(both, item.op->sequence); !why.empty()) {
    fail(chorusRemoteError, "{}", why);
  }
}

// This rank's share of a direct call: its part of every rank's input, folded in one pass into its
// output or every rank's. Outputs of large calls are streamed past the cache, except where an
// output is its input (reduceMany: those lines were just read into the cache).
void Executor::reducePeers(Item& item) {
  const collectives::Step& step = *item.step;
  const PreparedOp& op = *item.op;
  const size_t n = static_cast<size_t>(options_.nranks);
  if (op.peers == nullptr || op.peers->inputs.size() != n || op.peers->outputs.size() != n) {
    fail(chorusInternalError, "rank {}: {}: a reduce-peers step without every rank's buffers mapped", options_.rank,
         op.what());
  }
  std::vector<const void*> from;
  std::vector<void*> to;
  collectives::reducePeersOperands(
      step, options_.nranks, options_.rank, [&](int p) { return op.peers->inputs[p]; },
      [&](int p) { return op.peers->outputs[p]; }, &from, &to);
  const size_t typeSize = kernels::typeSize(op.type);
  const std::unique_ptr<bool[]> stream(new bool[to.size()]);
  std::fill_n(stream.get(), to.size(), kernels::streamingPays(op.footprint, op.count * typeSize));
  kernels::reduceMany(to.data(), static_cast<int>(to.size()), from.data(), static_cast<int>(n), step.bytes / typeSize,
                      op.type, op.op, stream.get());
  *item.tmp = 1;
}

Executor::Item* Executor::forwardOf(Item& item) {
  Batch& batch = *item.batch;
  const size_t at = static_cast<size_t>(&item - batch.items.get()) + 1;
  if (at >= batch.count) return nullptr;
  Item& next = batch.items[at];
  const collectives::Step& step = *next.step;
  if (next.op != item.op || step.kind != StepKind::kSend || next.src != item.dst || step.bytes != item.step->bytes ||
      transportOfPeer_[step.peer] != transportOfPeer_[item.step->peer]) {
    return nullptr;
  }
  return mustWait(next) ? nullptr : &next;
}

void Executor::Item::consume(size_t offset, const void* piece, size_t bytes) {
  const size_t count = bytes / kernels::typeSize(op->type);
  const int to = forward != nullptr ? forward->step->peer : -1;
  void* also = forward != nullptr ? forwardVia->streamingWindow(to, &forward->request, offset, bytes) : nullptr;
  if (also == nullptr) {
    kernels::reduce(dst + offset, src + offset, piece, count, op->type, op->op);
  } else {
    // The result into its place and into the message that sends it on, in one pass. Its place is
    // not read again (the message carries it on), so a large output is written past the cache.
    void* dsts[2] = {dst + offset, also};
    const void* srcs[2] = {src + offset, piece};
    const bool stream[2] = {streams(), false};
    // Avg folds as Sum here (reduce()'s rule; the divide is a step of its own), where reduceMany
    // would divide by its two sources.
    kernels::reduceMany(dsts, 2, srcs, 2, count, op->type, op->op == chorusAvg ? chorusSum : op->op, stream);
  }
  if (forward == nullptr) return;
  forward->request.ready = offset + bytes;
  forwardVia->produced(to, &forward->request, also != nullptr ? bytes : 0);
}

bool Executor::Item::streams() const {
  if (step->dst.buffer != collectives::BufferId::kOutput || !kernels::streamingPays(op->footprint, step->bytes)) {
    return false;
  }
  // In place, 2 ranks, all-reduce of 64 MiB: 6.8-7.8 ms with plain stores, 7.6-10.5 streamed.
  const char* input = static_cast<const char*>(op->input);
  return dst + step->bytes <= input || input + op->inputBytes <= dst;
}

// Completes the local part of a step whose transfer is done. True if the item is complete.
bool Executor::finish(Item& item) {
  if (!item.request.done) return false;
  if (item.needsReduce) {
    const size_t typeSize = kernels::typeSize(item.op->type);
    kernels::reduce(item.dst, item.src, item.tmp, item.step->bytes / typeSize, item.op->type, item.op->op);
    item.needsReduce = false;
  }
  return true;
}

// Counts a finished item; a batch whose every item is finished is done (reap() removes it).
void Executor::complete(Item& item) {
  const collectives::Step& step = *item.step;
  if (step.kind == StepKind::kSend) {
    Link& link = links_[step.peer];
    ++link.sentMessages;
    link.sentBytes += step.bytes;
  } else if (step.kind == StepKind::kRecv || step.kind == StepKind::kRecvReduce) {
    Link& link = links_[step.peer];
    ++link.receivedMessages;
    link.receivedBytes += step.bytes;
    link.lastCollective = item.op->collective;
    link.lastSequence = item.op->sequence;
    link.receivedAny = true;
  }
  Batch& batch = *item.batch;
  if (++batch.completed == batch.count) {
    batch.completion->done = true;
    tellFinished(batch, chorusSuccess, "");
  }
}

void Executor::reap() {
  std::erase_if(batches_, [this](std::unique_ptr<Batch>& batch) {
    if (!batch->completion->done) return false;
    if (!batch->scratch.empty()) scratchPool_.push_back(std::move(batch->scratch));
    return true;
  });
}

bool Executor::poll() {
  bool moved = false;
  for (Transport* t : transports_) {
    if (t->busy()) moved |= t->progress();
  }
  for (size_t k = 0; k < inFlight_.size();) {
    Item* item = inFlight_[k];
    if (finish(*item)) {
      inFlight_[k] = inFlight_.back();
      inFlight_.pop_back();
      complete(*item);
      moved = true;
    } else {
      ++k;
    }
  }
  moved_ |= moved;
  return moved;
}

bool Executor::advance() {
  bool moved = issueReady();
  moved |= poll();
  reap();
  return moved;
}

template <typename Done>
void Executor::waitUntil(Done done) {
  // Idle, a wait polls a few times at full speed (a small message arrives within a microsecond
  // or so, and a system call costs as much), then yields the core until spinUs has passed, then
  // blocks in the transports. Clocks are read only when idle.
  constexpr int kBusyPolls = 32;
  const auto spin = std::chrono::microseconds(options_.spinUs);
  int idlePolls = 0;
  Clock::time_point idleSince{};
  // A blocked wait is charged to the peer of the earliest unfinished step, from when the rank
  // went idle until something moved.
  int waitedOn = -1;
  Clock::time_point waitedSince{};
  auto charge = [&] {
    if (waitedOn < 0) return;
    links_[waitedOn].waitNs +=
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - waitedSince).count());
    waitedOn = -1;
  };
  try {
    while (!done()) {
      failIfAborted();
      if (advance()) {
        idlePolls = 0;
        charge();
        continue;
      }
      if (++idlePolls <= kBusyPolls) {
        cpuRelax();
        continue;
      }
      const auto now = Clock::now();
      noteProgress(now);
      if (idlePolls == kBusyPolls + 1) idleSince = now;
      if (now - idleSince < spin) {
        sched_yield();
        continue;
      }
      if (stalled(now)) timeout();
      if (waitedOn < 0) {
        const Item* oldest = oldestPending();
        if (oldest != nullptr && oldest->step->peer >= 0 && oldest->step->peer != options_.rank) {
          waitedOn = oldest->step->peer;
          waitedSince = idleSince;
        }
      }
      if (options_.failureLine != nullptr) options_.failureLine->watch(0);
      if (options_.whileBlocked) options_.whileBlocked();
      // Block in the transports that have work: one alone may sleep long; several take turns.
      int busy = 0;
      for (Transport* t : transports_) busy += t->busy() ? 1 : 0;
      for (Transport* t : transports_) {
        if (t->busy()) t->wait(busy == 1 ? 50 : 1);
      }
      idlePolls = 0;
    }
    charge();
  } catch (const Error& e) {
    charge();
    failAll(e);
  }
}

void Executor::failIfAborted() const {
  if (aborted_ == nullptr || !aborted_->load(std::memory_order_relaxed)) return;
  const Item* item = oldestPending();
  fail(chorusAborted, "the communicator was aborted while step {} ({} with rank {}) was pending",
       item ? item->index : 0, item ? collectives::stepKindName(item->step->kind) : "none",
       item ? item->step->peer : -1);
}

void Executor::noteProgress(Clock::time_point now) {
  if (!moved_) return;
  lastProgress_ = now;
  moved_ = false;
}

bool Executor::stalled(Clock::time_point now) const {
  return now - lastProgress_ > std::chrono::milliseconds(options_.timeoutMs);
}

bool Executor::settled(const Completion& completion) {
  if (completion.done && completion.result != chorusSuccess) throw Error(completion.result, completion.message);
  return completion.done;
}

void Executor::wait(const Completion& completion) {
  waitUntil([&] { return completion.done; });
  settled(completion);
}

bool Executor::test(const Completion& completion) {
  if (!completion.done) {
    try {
      advance();
    } catch (const Error& e) {
      failAll(e);
    }
  }
  return settled(completion);
}

bool Executor::poll(const Completion& completion) {
  if (!completion.done) {
    try {
      failIfAborted();
      advance();
      const auto now = Clock::now();
      noteProgress(now);
      if (stalled(now)) timeout();
    } catch (const Error& e) {
      failAll(e);
    }
  }
  return settled(completion);
}

void Executor::progress() {
  if (batches_.empty()) return;
  try {
    advance();
  } catch (const Error& e) {
    failAll(e);
    throw;
  }
}

void Executor::waitAll() {
  waitUntil([&] { return batches_.empty(); });
}

// The earliest posted step that has not completed (what a stalled stream waits for).
const Executor::Item* Executor::oldestPending() const {
  for (const auto& batch : batches_) {
    for (const Item* item : inFlight_) {
      if (item->batch != batch.get()) continue;
      const Item* oldest = item;
      for (const Item* other : inFlight_) {
        if (other->batch == batch.get() && other->index < oldest->index) oldest = other;
      }
      return oldest;
    }
  }
  return nullptr;
}

void Executor::timeout() {
  const Item* item = oldestPending();
  if (item == nullptr) fail(chorusTimeout, "nothing moved for {} ms (CHORUS_TIMEOUT_MS)", options_.timeoutMs);
  std::string links;
  for (int peer = 0; peer < options_.nranks; ++peer) {
    if (peer != options_.rank) links += fmt::format("{}{}", links.empty() ? "" : "; ", describeLink(peer));
  }
  fail(chorusTimeout, "nothing moved for {} ms (CHORUS_TIMEOUT_MS): {}; links: {}", options_.timeoutMs,
       describeWait(*item), links.empty() ? "none" : links);
}

std::string Executor::describeWait(const Item& item) const {
  const collectives::Step& step = *item.step;
  const PreparedOp& op = *item.op;
  std::string text = fmt::format("step {} of {}, a {} of {} bytes with rank {}, has not completed", item.index,
                                 item.batch->count, collectives::stepKindName(step.kind), step.bytes, step.peer);
  if (step.kind != StepKind::kRecv && step.kind != StepKind::kRecvReduce) {
    return text + fmt::format(" (rank {} has not taken it: stalled, dead, or in another operation)", step.peer);
  }
  // Messages from a peer come in call order: the call its last message belonged to says whether
  // it has reached this one.
  const Link& link = links_[step.peer];
  const bool pointToPoint =
      op.collective == collectives::Collective::kSend || op.collective == collectives::Collective::kRecv;
  const bool sameKind = link.receivedAny && (link.lastCollective == collectives::Collective::kSend ||
                                             link.lastCollective == collectives::Collective::kRecv) == pointToPoint;
  if (!link.receivedAny) {
    return text + fmt::format(": rank {} has not arrived at {} (no message from it yet)", step.peer, op.what());
  }
  const std::string last = fmt::format("{} #{}", collectives::collectiveName(link.lastCollective), link.lastSequence);
  if (sameKind && link.lastSequence < op.sequence) {
    return text + fmt::format(": rank {} has not arrived at {} (its last message here belonged to {})", step.peer,
                              op.what(), last);
  }
  if (!sameKind) {
    return text + fmt::format(": rank {} has not sent it (its last message here belonged to {})", step.peer, last);
  }
  return text +
         fmt::format(": rank {} is inside it, or stalled (its last message here belonged to {})", step.peer, last);
}

std::string Executor::describeLink(int peer) const {
  const Link& link = links_[peer];
  std::string text = fmt::format("rank {}: sent {} messages ({} bytes), received {} messages ({} bytes)", peer,
                                 link.sentMessages, link.sentBytes, link.receivedMessages, link.receivedBytes);
  if (link.receivedAny) {
    text += fmt::format(", the last of {} #{}", collectives::collectiveName(link.lastCollective), link.lastSequence);
  }
  return text;
}

std::string Executor::describeState() const {
  std::string text;
  if (batches_.empty()) text += "no operation pending\n";
  for (const auto& batch : batches_) {
    std::string ops;
    for (const PreparedOp& op : batch->ops) ops += fmt::format("{}{}", ops.empty() ? "" : ", ", op.what());
    text += fmt::format("pending: {} ({} of {} steps posted, {} completed)\n", ops, batch->issued, batch->count,
                        batch->completed);
    // The earliest unfinished posted step of this submission is what it waits for.
    const Item* oldest = nullptr;
    for (const Item* item : inFlight_) {
      if (item->batch == batch.get() && (oldest == nullptr || item->index < oldest->index)) oldest = item;
    }
    if (oldest != nullptr) text += fmt::format("  waiting: {}\n", describeWait(*oldest));
  }
  for (int peer = 0; peer < options_.nranks; ++peer) {
    if (peer == options_.rank) continue;
    text += fmt::format("link to {}\n", describeLink(peer));
    if (const std::string held = transportOfPeer_[peer]->describePeer(peer); !held.empty()) {
      text += fmt::format("  {}: {}\n", transportOfPeer_[peer]->name(), held);
    }
  }
  return text;
}

// Ends the whole stream with the error: messages between the pairs are out of step afterwards.
void Executor::failAll(const Error& error) {
  const Item* item = oldestPending();
  const PreparedOp* op = item != nullptr ? item->op : nullptr;
  if (op == nullptr && !batches_.empty() && !batches_.front()->ops.empty()) {
    Batch& front = *batches_.front();
    op = front.issued < front.count ? front.items[front.issued].op : &front.ops.back();
  }
  const std::string where = fmt::format("rank {}: {}", options_.rank, op != nullptr ? op->what() : "operation");
  const std::string message = options_.failureLine != nullptr ? options_.failureLine->failed(error, where)
                                                              : fmt::format("{}: {}", where, error.what());
  for (Transport* t : transports_) t->cancelAll();
  writeTrace(message, /*failure=*/true);  // what it waited on, before the stream is dropped
  abandon(error.code(), message);
  throw Error(error.code(), message);
}

void Executor::abandon(chorusResult_t result, const std::string& message) {
  inFlight_.clear();
  for (auto& batch : batches_) {
    batch->completion->done = true;
    batch->completion->result = result;
    batch->completion->message = message;
    tellFinished(*batch, result, message);
  }
  batches_.clear();
}

void Executor::tellFinished(const Batch& batch, chorusResult_t result, const std::string& message) const {
  for (OpObserver* o : options_.observers) {
    for (const PreparedOp& op : batch.ops) o->finished(op, result, message);
  }
}

std::vector<Executor::LinkTotals> Executor::linkTotals() const {
  std::vector<LinkTotals> totals;
  for (int peer = 0; peer < options_.nranks; ++peer) {
    if (peer == options_.rank) continue;
    const Link& link = links_[peer];
    totals.push_back({peer, link.sentMessages, link.sentBytes, link.receivedMessages, link.receivedBytes, link.waitNs});
  }
  return totals;
}

void Executor::writeTrace(const std::string& reason, bool failure) const {
  if (options_.recorder == nullptr) return;
  FlightRecorder::Wait wait;
  if (const Item* item = oldestPending(); item != nullptr) {
    wait.any = true;
    wait.sequence = item->op->sequence;
    wait.collective = collectives::collectiveName(item->op->collective);
    wait.call = item->op->what();
    wait.step = collectives::stepKindName(item->step->kind);
    wait.peer = item->step->peer;
    wait.bytes = item->step->bytes;
    wait.text = describeWait(*item);
  }
  std::vector<FlightRecorder::LinkState> links;
  for (int peer = 0; peer < options_.nranks; ++peer) {
    if (peer == options_.rank) continue;
    const Link& link = links_[peer];
    links.push_back({peer, link.sentMessages, link.receivedMessages, link.receivedAny,
                     collectives::collectiveName(link.lastCollective), link.lastSequence});
  }
  options_.recorder->write(reason, failure, wait, links);
}

}  // namespace chorus
