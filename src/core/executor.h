// executor.h: runs schedules (src/collectives) over the transports. Steps are posted in order;
// a step waits only for the earlier in-flight steps whose byte ranges it conflicts with (on the
// real addresses, so in-place calls are handled), which lets sends, receives and reductions of
// different chunks overlap. Waits spin briefly and then block in the transports; every wait is
// bounded by the no-progress timeout and checks the abort flag. One thread at a time.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/collectives/schedule.h"
#include "src/transport/transport.h"

namespace chorus {

// One operation ready to run: its schedule, its buffers and what to call it in messages.
struct PreparedOp {
  collectives::Schedule schedule;
  const void* input = nullptr;
  void* output = nullptr;
  chorusDataType_t type = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  uint64_t tag = 0;
  std::string what;  // "allreduce #12 (count 1024 float32 sum, ring)"
};

struct ExecutorOptions {
  int rank = 0;
  int nranks = 1;
  int timeoutMs = 300000;  // fail when nothing moved for this long
  int spinUs = 20;
};

class Executor {
 public:
  Executor(ExecutorOptions options, std::vector<Transport*> transportOfPeer, std::vector<Transport*> transports,
           const std::atomic<bool>* aborted);

  // Runs the ops' steps as one stream (a group is several ops). scratch must hold the sum of the
  // ops' scratchBytes. Throws chorus::Error naming the rank, the op and the step on failure.
  void run(std::vector<PreparedOp>& ops, char* scratch);

 private:
  struct Range {
    const char* begin;
    const char* end;
    bool write;
  };
  struct Item {
    const collectives::Step* step;
    PreparedOp* op;
    char* src;
    char* dst;
    char* tmp;
    Range ranges[4];
    int rangeCount;
    Request request;
    bool needsReduce;
    size_t index;  // position in the stream, for messages
  };

  void issue(Item& item);
  bool poll();  // progresses transports, completes finished items; true if anything moved
  bool finish(Item& item);
  void waitFor(Item& item);
  void waitAll();
  [[noreturn]] void timeout(const Item* item);
  bool conflicts(const Item& earlier, const Item& later) const;

  ExecutorOptions options_;
  std::vector<Transport*> transportOfPeer_;
  std::vector<Transport*> transports_;
  const std::atomic<bool>* aborted_;
  std::vector<Item*> inFlight_;
  Clock::time_point lastProgress_;
  size_t total_ = 0;
};

}  // namespace chorus
