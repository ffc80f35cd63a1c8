// group.cc: groups, kept per communicator and run together (group.h).
#include "src/core/group.h"

#include <sched.h>

#include <exception>
#include <utility>

#include "src/base/error.h"
#include "src/core/communicator.h"

namespace chorus {

GroupPart& Group::partFor(const void* handle, std::shared_ptr<Communicator> comm) {
  for (GroupPart& part : parts_) {
    if (part.handle == handle) return part;
  }
  GroupPart& part = parts_.emplace_back();
  part.handle = handle;
  part.comm = std::move(comm);
  return part;
}

void Group::keepDevice(const void* handle, std::shared_ptr<Communicator> comm, const DeviceCall& call,
                       chorusStream_t stream, int rank, const char* name) {
  for (const GroupPart& part : parts_) {
    if (part.handle != handle && !part.deviceOps.empty()) {
      fail(chorusInvalidUsage,
           "rank {}: {}: the device sends and receives of one group must use one communicator (this call uses "
           "another)",
           rank, name);
    }
  }
  GroupPart& part = partFor(handle, std::move(comm));
  if (!part.deviceOps.empty() && part.deviceStream != stream) {
    fail(chorusInvalidUsage, "rank {}: {}: the device sends and receives of one group must use one stream", rank, name);
  }
  part.deviceStream = stream;
  part.deviceOps.push_back(call);
}

std::vector<GroupPart> Group::take() {
  std::vector<GroupPart> parts = std::move(parts_);
  *this = Group{};
  return parts;
}

namespace {

// Several communicators' host calls, started all before any is waited for, then progressed in
// turn until none is left (one thread may be driving every rank). Throws the first failure.
void runTogether(std::vector<GroupPart>& parts) {
  std::exception_ptr first;
  std::vector<std::shared_ptr<Completion>> completions(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    try {
      if (!parts[i].ops.empty()) completions[i] = parts[i].comm->start(std::move(parts[i].ops));
    } catch (const Error&) {
      if (!first) first = std::current_exception();
    }
  }
  for (size_t left = parts.size(); left > 0;) {
    left = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!completions[i]) continue;
      try {
        if (parts[i].comm->poll(*completions[i])) {
          completions[i] = nullptr;
        } else {
          ++left;
        }
      } catch (const Error&) {
        if (!first) first = std::current_exception();
        completions[i] = nullptr;
      }
    }
    if (left > 0) sched_yield();
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

void runGroup(std::vector<GroupPart> parts) {
  if (parts.size() == 1) {
    // One communicator: its own wait, which blocks in the transports when idle.
    if (!parts[0].ops.empty()) parts[0].comm->run(std::move(parts[0].ops));
  } else {
    runTogether(parts);
  }
  // Then the device sends and receives (one communicator's at most): their staged step makes
  // host calls of its own on the communicator, after the group's.
#if defined(CHORUS_HAVE_DEVICE)
  for (GroupPart& part : parts) {
    if (!part.deviceOps.empty()) part.comm->device().enqueueGroup(part.deviceOps, part.deviceStream, "chorusGroupEnd");
  }
#endif
}

}  // namespace chorus
