// executor.cc: runs schedules over the transports.
#include "src/core/executor.h"

#include <sched.h>

#include <cstring>
#include <memory>

#include "kernels/cpu/reduce.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace chorus {

using collectives::Access;
using collectives::StepKind;

Executor::Executor(ExecutorOptions options, std::vector<Transport*> transportOfPeer, std::vector<Transport*> transports,
                   const std::atomic<bool>* aborted)
    : options_(options),
      transportOfPeer_(std::move(transportOfPeer)),
      transports_(std::move(transports)),
      aborted_(aborted) {}

bool Executor::conflicts(const Item& earlier, const Item& later) const {
  for (int i = 0; i < earlier.rangeCount; ++i) {
    const Range& a = earlier.ranges[i];
    for (int j = 0; j < later.rangeCount; ++j) {
      const Range& b = later.ranges[j];
      if ((a.write || b.write) && a.begin < b.end && b.begin < a.end) return true;
    }
  }
  return false;
}

void Executor::run(std::vector<PreparedOp>& ops, char* scratch) {
  size_t count = 0;
  for (const PreparedOp& op : ops) count += op.schedule.steps.size();
  std::unique_ptr<Item[]> items(new Item[count]);
  total_ = count;
  inFlight_.clear();
  lastProgress_ = Clock::now();

  size_t index = 0;
  size_t scratchOffset = 0;
  try {
    for (PreparedOp& op : ops) {
      char* bases[collectives::kBufferCount] = {static_cast<char*>(const_cast<void*>(op.input)),
                                                static_cast<char*>(op.output), scratch + scratchOffset};
      scratchOffset += op.schedule.scratchBytes;
      for (const collectives::Step& step : op.schedule.steps) {
        Item& item = items[index];
        item.step = &step;
        item.op = &op;
        item.src = bases[static_cast<int>(step.src.buffer)] + step.src.offset;
        item.dst = bases[static_cast<int>(step.dst.buffer)] + step.dst.offset;
        item.tmp = bases[static_cast<int>(step.tmp.buffer)] + step.tmp.offset;
        item.request.done = false;
        item.needsReduce = false;
        item.index = index;
        Access accesses[4];
        item.rangeCount = collectives::stepAccesses(step, accesses);
        for (int i = 0; i < item.rangeCount; ++i) {
          const char* begin = bases[static_cast<int>(accesses[i].span.buffer)] + accesses[i].span.offset;
          item.ranges[i] = {begin, begin + accesses[i].bytes, accesses[i].write};
        }
        // Wait for the earlier in-flight steps this one conflicts with.
        for (size_t k = 0; k < inFlight_.size();) {
          if (conflicts(*inFlight_[k], item)) {
            waitFor(*inFlight_[k]);
            k = 0;  // the in-flight list changed
          } else {
            ++k;
          }
        }
        issue(item);
        if (!item.request.done || item.needsReduce) inFlight_.push_back(&item);
        ++index;
        poll();
      }
    }
    waitAll();
  } catch (Error& e) {
    for (Transport* t : transports_) t->cancelAll();
    inFlight_.clear();
    const PreparedOp* op = index < count ? items[index].op : (ops.empty() ? nullptr : &ops.back());
    throw Error(e.code(), fmt::format("rank {}: {}: {}", options_.rank, op ? op->what : "operation", e.what()));
  }
}

void Executor::issue(Item& item) {
  const collectives::Step& step = *item.step;
  switch (step.kind) {
    case StepKind::kSend:
      transportOfPeer_[step.peer]->postSend(step.peer, item.op->tag, item.src, step.bytes, &item.request);
      break;
    case StepKind::kRecv:
      transportOfPeer_[step.peer]->postRecv(step.peer, item.op->tag, item.dst, step.bytes, &item.request);
      break;
    case StepKind::kRecvReduce:
      item.needsReduce = true;
      transportOfPeer_[step.peer]->postRecv(step.peer, item.op->tag, item.tmp, step.bytes, &item.request);
      finish(item);
      break;
    case StepKind::kCopy:
      if (item.src != item.dst && step.bytes > 0) std::memmove(item.dst, item.src, step.bytes);
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
  }
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

bool Executor::poll() {
  bool moved = false;
  for (Transport* t : transports_) {
    if (t->busy()) moved |= t->progress();
  }
  for (size_t k = 0; k < inFlight_.size();) {
    if (finish(*inFlight_[k])) {
      inFlight_[k] = inFlight_.back();
      inFlight_.pop_back();
      moved = true;
    } else {
      ++k;
    }
  }
  if (moved) lastProgress_ = Clock::now();
  return moved;
}

void Executor::waitFor(Item& item) {
  const auto spin = std::chrono::microseconds(options_.spinUs);
  auto spinUntil = Clock::now() + spin;
  while (!(item.request.done && !item.needsReduce)) {
    if (aborted_ != nullptr && aborted_->load(std::memory_order_relaxed)) {
      fail(chorusAborted, "the communicator was aborted while step {} of {} ({} with rank {}) was pending", item.index,
           total_, collectives::stepKindName(item.step->kind), item.step->peer);
    }
    if (poll()) {
      spinUntil = Clock::now() + spin;
      continue;
    }
    const auto now = Clock::now();
    if (now < spinUntil) {
      sched_yield();
      continue;
    }
    if (now - lastProgress_ > std::chrono::milliseconds(options_.timeoutMs)) timeout(&item);
    // Block in the transports that have work: one alone may sleep long; several take turns.
    int busy = 0;
    for (Transport* t : transports_) busy += t->busy() ? 1 : 0;
    for (Transport* t : transports_) {
      if (t->busy()) t->wait(busy == 1 ? 50 : 1);
    }
    spinUntil = Clock::now() + spin;
  }
  // The item is complete; drop it from the in-flight list.
  for (size_t k = 0; k < inFlight_.size(); ++k) {
    if (inFlight_[k] == &item) {
      inFlight_[k] = inFlight_.back();
      inFlight_.pop_back();
      break;
    }
  }
}

void Executor::waitAll() {
  while (!inFlight_.empty()) waitFor(*inFlight_.front());
}

void Executor::timeout(const Item* item) {
  const collectives::Step& step = *item->step;
  fail(chorusTimeout,
       "nothing moved for {} ms (CHORUS_TIMEOUT_MS); step {} of {} is a {} of {} bytes with rank {}, which has not "
       "completed: rank {} is stalled, dead, or in a different operation",
       options_.timeoutMs, item->index, total_, collectives::stepKindName(step.kind), step.bytes, step.peer, step.peer);
}

}  // namespace chorus
