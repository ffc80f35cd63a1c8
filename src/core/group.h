// group.h: the calls made between chorusGroupStart and chorusGroupEnd, kept per communicator and
// run together at the end. A group may span communicators, as NCCL's do: one thread may drive
// several ranks of a job (one communicator each) through one group, since every communicator's
// host calls are started before any is waited for, and all are progressed together.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/core/device.h"
#include "src/core/executor.h"

namespace chorus {

class Communicator;

// One communicator's share of a group.
struct GroupPart {
  const void* handle = nullptr;        // the C handle the calls named
  std::shared_ptr<Communicator> comm;  // held until the group has run
  std::vector<PreparedOp> ops;         // host calls, in call order
  std::vector<DeviceCall> deviceOps;   // device sends and receives, enqueued as one step
  chorusStream_t deviceStream = nullptr;
};

// The open group of one thread.
class Group {
 public:
  int depth = 0;  // chorusGroupStart nesting
  // The first argument error of a call inside the group: chorusGroupEnd reports it and runs none.
  chorusResult_t deferred = chorusSuccess;
  std::string deferredMessage;

  // The part of the communicator behind `handle`, made on its first call.
  GroupPart& partFor(const void* handle, std::shared_ptr<Communicator> comm);
  // Keeps a device send or receive. Throws chorusInvalidUsage where the group's device calls
  // would span communicators or streams (their staged step is one communicator's).
  void keepDevice(const void* handle, std::shared_ptr<Communicator> comm, const DeviceCall& call, chorusStream_t stream,
                  int rank, const char* name);
  // Takes the parts, leaving the group empty and closed.
  std::vector<GroupPart> take();

 private:
  std::vector<GroupPart> parts_;
};

// Runs a closed group's parts: each communicator's device sends and receives enqueued on their
// stream; every communicator's host calls started, then progressed together until all are done
// (each communicator's timeout applies). Throws the first failure once no part is left running.
void runGroup(std::vector<GroupPart> parts);

}  // namespace chorus
