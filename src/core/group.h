// group.h: the calls made between chorusGroupStart and chorusGroupEnd, kept per communicator and
// run together at the end. A group may span communicators, as NCCL's do: one thread may drive
// several ranks of a job (one communicator each) through one group, since every communicator's
// host calls are started before any is waited for, and all are progressed together; and its
// device calls, whose enqueueing may meet the communicator's peers on the host (the device
// engine's set-up, the direct algorithm), are enqueued for each communicator on a thread of its
// own when they span several.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/core/device.h"
#include "src/core/executor.h"

namespace chorus {

class Communicator;

// A device collective kept for the end of its group, with what it needs then: its stream, its
// entry point's name, the CUDA device current when it was made (made current again to enqueue it),
// and a copy of all-to-allv's array of arrays (call.vector points at the caller's, gone by then).
struct KeptDeviceCall {
  DeviceCall call;
  std::array<const size_t*, 4> vector{};
  chorusStream_t stream = nullptr;
  const char* name = "";
  int cudaDevice = -1;
};

// One communicator's share of a group.
struct GroupPart {
  const void* handle = nullptr;             // the C handle the calls named
  std::shared_ptr<Communicator> comm;       // held until the group has run
  std::vector<PreparedOp> ops;              // host calls, in call order
  std::vector<KeptDeviceCall> deviceCalls;  // device collectives, in call order
  std::vector<DeviceCall> deviceOps;        // device sends and receives, enqueued as one step
  chorusStream_t deviceStream = nullptr;    // theirs (one for all)
  int deviceOpsCudaDevice = -1;             // current when the first of them was made
};

// The open group of one thread.
class Group {
 public:
  int depth = 0;  // chorusGroupStart nesting
  // The first argument error of a call inside the group: chorusGroupEnd reports it and runs none.
  chorusResult_t deferred = chorusSuccess;
  std::string deferredMessage;
  // Communicator inits asked for inside the group (each waits for its peers, whom this thread may
  // be initing too): made together at chorusGroupEnd, before the group's calls.
  std::vector<std::function<void()>> inits;

  // The part of the communicator behind `handle`, made on its first call.
  GroupPart& partFor(const void* handle, std::shared_ptr<Communicator> comm);
  // Keeps a device call (checked already) for the end of the group. Throws chorusInvalidUsage
  // where one communicator's device sends and receives would use two streams (they are one
  // staged step on one stream).
  void keepDevice(const void* handle, std::shared_ptr<Communicator> comm, const DeviceCall& call, chorusStream_t stream,
                  int rank, const char* name);
  // Takes the parts, and the inits into *inits, leaving the group empty and closed.
  std::vector<GroupPart> take(std::vector<std::function<void()>>* inits);

 private:
  std::vector<GroupPart> parts_;
};

// Runs a closed group's parts: every communicator's host calls started, then progressed together
// until all are done (each communicator's timeout applies); then each communicator's device
// collectives enqueued in call order, and its device sends and receives as one step, on a thread
// per communicator where several have device calls. Throws the first failure once no part is
// left running.
void runGroup(std::vector<GroupPart> parts);

// Runs every job, each on a thread of its own where there are several (a job may wait for another),
// inline where there is one; returns when all are done, throwing the first failure.
void runEachOnItsOwnThread(const std::vector<std::function<void()>>& jobs);

}  // namespace chorus
