// group.cc: groups, kept per communicator and run together (group.h).
#include "src/core/group.h"

#include <sched.h>

#include <algorithm>
#include <exception>
#include <thread>
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
  GroupPart& part = partFor(handle, std::move(comm));
#if defined(CHORUS_HAVE_DEVICE)
  const int cudaDevice = currentCudaDevice();
#else
  const int cudaDevice = -1;
#endif
  if (call.collective != collectives::Collective::kSend && call.collective != collectives::Collective::kRecv) {
    KeptDeviceCall& kept = part.deviceCalls.emplace_back();
    kept.call = call;
    if (call.vector != nullptr) {
      std::copy(call.vector, call.vector + kept.vector.size(), kept.vector.begin());
      kept.call.vector = nullptr;  // pointed at kept.vector when enqueued (the part may move)
    }
    kept.stream = stream;
    kept.name = name;
    kept.cudaDevice = cudaDevice;
    return;
  }
  if (!part.deviceOps.empty() && part.deviceStream != stream) {
    fail(chorusInvalidUsage,
         "rank {}: {}: the device sends and receives of one communicator in a group must use one stream", rank, name);
  }
  if (part.deviceOps.empty()) part.deviceOpsCudaDevice = cudaDevice;
  part.deviceStream = stream;
  part.deviceOps.push_back(call);
}

std::vector<GroupPart> Group::take(std::vector<std::function<void()>>* taken) {
  *taken = std::move(inits);
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

#if defined(CHORUS_HAVE_DEVICE)
namespace {

// One communicator's device calls of the group: its collectives in call order, then its sends and
// receives as one staged step (after the group's host calls, which that step's host side follows),
// each on the CUDA device current when it was made; the caller's device is current again after.
void enqueueDeviceCalls(GroupPart& part) {
  struct Restore {
    int device = currentCudaDevice();
    ~Restore() { useCudaDevice(device); }
  } restore;
  DeviceEngine& engine = part.comm->device();
  for (KeptDeviceCall& kept : part.deviceCalls) {
    useCudaDevice(kept.cudaDevice);
    DeviceCall call = kept.call;
    if (kept.vector[0] != nullptr) call.vector = kept.vector.data();
    engine.enqueue(call, kept.stream, kept.name);
  }
  if (!part.deviceOps.empty()) {
    useCudaDevice(part.deviceOpsCudaDevice);
    engine.enqueueGroup(part.deviceOps, part.deviceStream, "chorusGroupEnd");
  }
}

// Every part's device calls. Enqueueing may wait for the communicator's peers on the host (the
// engine's set-up at a first device call, the direct algorithm's meetings), and one thread may be
// driving all of them: where several communicators have device calls, each is enqueued on a
// thread of its own. Throws the first failure once every thread is done.
void enqueueDeviceParts(std::vector<GroupPart>& parts) {
  std::vector<std::function<void()>> jobs;
  for (GroupPart& part : parts) {
    if (!part.deviceCalls.empty() || !part.deviceOps.empty()) jobs.push_back([&part] { enqueueDeviceCalls(part); });
  }
  runEachOnItsOwnThread(jobs);
}

}  // namespace
#endif

void runEachOnItsOwnThread(const std::vector<std::function<void()>>& jobs) {
  if (jobs.size() == 1) jobs[0]();
  if (jobs.size() <= 1) return;
  std::vector<std::exception_ptr> failures(jobs.size());
  std::vector<std::thread> threads;
  threads.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        jobs[i]();
      } catch (...) {
        failures[i] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

void runGroup(std::vector<GroupPart> parts) {
  if (parts.size() == 1) {
    // One communicator: its own wait, which blocks in the transports when idle.
    if (!parts[0].ops.empty()) parts[0].comm->run(std::move(parts[0].ops));
  } else {
    runTogether(parts);
  }
#if defined(CHORUS_HAVE_DEVICE)
  enqueueDeviceParts(parts);
#endif
}

}  // namespace chorus
