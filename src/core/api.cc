// api.cc: the C ABI. Validates arguments (nothing is touched on error), maps chorus::Error to
// result codes and the per-thread last-error message, and collects calls made inside groups.
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#include "chorus/chorus.h"
#include "kernels/cpu/reduce.h"
#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/base/memory.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/traits.h"
#include "src/collectives/tuner.h"
#include "src/core/bootstrap.h"
#include "src/core/communicator.h"
#include "src/core/device.h"
#include "src/core/group.h"
#include "src/core/launcher.h"
#include "src/core/pmi.h"

using chorus::Communicator;
using chorus::Error;
using chorus::fail;
using chorus::PreparedOp;
using chorus::collectives::Collective;
namespace collectives = chorus::collectives;

// The handle's hold on its communicator; every call holds it too while it runs (Lease), so an
// abort from another thread frees the handle at once and the communicator when the last call
// holding it has returned.
struct chorusComm {
  std::shared_ptr<Communicator> impl;
};

// A non-blocking operation: its communicator and its outcome (which outlives the communicator).
struct chorusRequest {
  chorusComm_t comm = nullptr;
  std::shared_ptr<chorus::Completion> completion;
};

// A compressed all-reduce's persistent state, made for communicators of nranks ranks.
struct chorusCompressor {
  std::unique_ptr<chorus::collectives::CompressedAllReduce> state;
  int nranks = 0;
};

namespace {

thread_local std::string lastError = "no error";

// Live handles: a call with a destroyed (or never created) handle is an error, not a crash.
std::mutex liveMutex;
std::unordered_set<const chorusComm*> liveComms;

// The thread's open group (src/core/group.h).
thread_local chorus::Group group;

// Live request handles, as liveComms; and where the call being made returns its request (set by
// the non-blocking entry points around the blocking one's validation and preparation).
std::unordered_set<const chorusRequest*> liveRequests;
std::unordered_set<const chorusCompressor*> liveCompressors;
thread_local chorusRequest_t* nonBlockingTarget = nullptr;

template <typename F>
chorusResult_t guarded(F&& body) {
  try {
    body();
    return chorusSuccess;
  } catch (const Error& e) {
    lastError = e.what();
    chorus::logAt(chorus::LogLevel::kInfo, "{}", lastError);
    return e.code();
  } catch (const std::bad_alloc&) {
    lastError = "out of host memory";
    return chorusSystemError;
  } catch (const std::exception& e) {
    lastError = std::string("internal error: ") + e.what();
    return chorusInternalError;
  }
}

using Lease = std::shared_ptr<Communicator>;

Lease live(const chorusComm* comm, const char* call) {
  if (comm == nullptr) fail(chorusInvalidUsage, "{}: the communicator is NULL", call);
  std::lock_guard<std::mutex> lock(liveMutex);
  if (liveComms.count(comm) == 0) {
    fail(chorusInvalidUsage, "{}: the communicator handle is not live (destroyed, aborted or never initialized)", call);
  }
  return comm->impl;
}

// The library's collective for the C ABI's name of it.
Collective internalCollective(chorusCollective_t collective, const char* call) {
  static constexpr Collective kOf[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                       Collective::kBroadcast, Collective::kReduce,    Collective::kAllToAll,
                                       Collective::kSend,      Collective::kRecv,      Collective::kBarrier,
                                       Collective::kAllToAllv, Collective::kGather,    Collective::kScatter};
  const int which = static_cast<int>(collective);
  if (which < 0 || which >= static_cast<int>(std::size(kOf))) {
    fail(chorusInvalidArgument, "{}: collective {} is not a chorusCollective_t", call, which);
  }
  return kOf[which];
}

void checkType(chorusDataType_t type, const char* call, int rank) {
  if (static_cast<int>(type) < 0 || type >= chorusNumTypes) {
    fail(chorusInvalidArgument, "rank {}: {}: unknown datatype {}", rank, call, static_cast<int>(type));
  }
}

void checkOp(chorusRedOp_t op, const char* call, int rank) {
  if (static_cast<int>(op) < 0 || op >= chorusNumOps) {
    fail(chorusInvalidArgument, "rank {}: {}: unknown reduction op {}", rank, call, static_cast<int>(op));
  }
}

// Whether count elements of typeSize bytes, times `multiple` (1 or nranks), fit in bytes (with
// room for offsets past them).
bool countFits(size_t count, size_t multiple, size_t typeSize) {
  return count <= std::numeric_limits<size_t>::max() / 2 / typeSize / multiple;
}

void checkCount(size_t count, size_t multiple, chorusDataType_t type, const char* call, int rank) {
  if (!countFits(count, multiple, chorus::kernels::typeSize(type))) {
    fail(chorusInvalidArgument, "rank {}: {}: count {} of {} (x{} ranks) overflows the byte size", rank, call, count,
         chorusTypeName(type), multiple);
  }
}

void checkBuffer(const void* buffer, size_t count, const char* name, const char* call, int rank) {
  if (buffer == nullptr && count > 0) {
    fail(chorusInvalidArgument, "rank {}: {}: {} is NULL with count {}", rank, call, name, count);
  }
}

void checkRank(int value, int nranks, const char* what, const char* call, int rank) {
  if (value < 0 || value >= nranks) {
    fail(chorusInvalidArgument, "rank {}: {}: {} {} is out of range [0, {})", rank, call, what, value, nranks);
  }
}

// A message to oneself completes only when its send and receive are posted together.
void checkSelfOutsideGroup(int peer, int rank, const char* call) {
  if (peer == rank && group.depth == 0 && nonBlockingTarget == nullptr) {
    fail(chorusInvalidUsage,
         "rank {}: {} with peer {} (itself) outside a group would wait forever; put the send and the receive in "
         "one chorusGroupStart/chorusGroupEnd",
         rank, call, peer);
  }
}

// One call of the C ABI as its entry point received it (NCCL's ncclInfo): the entry points fill
// it and enqueue() does the rest.
struct CallInfo {
  const char* call;  // the entry point's name, for messages
  Collective collective;
  chorusComm_t comm;
  chorusStream_t stream;
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  chorusDataType_t type = chorusUint8;
  chorusRedOp_t op = chorusSum;
  int rootOrPeer = 0;
  // All-to-allv: send counts, send displacements, receive counts, receive displacements.
  std::array<const size_t*, 4> vector{};
};

// Runs the op now, starts it for a non-blocking call, or adds it to the open group.
void submit(const Lease& held, chorusComm_t comm, PreparedOp op) {
  Communicator& c = *held;
  if (nonBlockingTarget != nullptr) {
    auto request = std::make_unique<chorusRequest>();
    request->comm = comm;
    std::vector<PreparedOp> ops;
    ops.push_back(std::move(op));
    request->completion = c.start(std::move(ops));
    std::lock_guard<std::mutex> lock(liveMutex);
    liveRequests.insert(request.get());
    *nonBlockingTarget = request.release();
    return;
  }
  if (group.depth > 0) {
    group.partFor(comm, held).ops.push_back(std::move(op));
    return;
  }
  std::vector<PreparedOp> ops;
  ops.push_back(std::move(op));
  c.run(std::move(ops));
}

// Host buffers (a NULL stream): submit. Device buffers: enqueued on the stream by the
// communicator's device path (src/core/device.h), which returns at once.
// rootOrPeer is the call's root or peer (0 for the others), vector its all-to-allv arrays or null.
void submitOn(const Lease& held, const CallInfo& info, int rootOrPeer, const size_t* const* vector) {
  Communicator& c = *held;
  chorusStream_t stream = info.stream;
#if defined(CHORUS_HAVE_DEVICE)
  if (stream == nullptr) stream = chorus::streamForNull(info.input, info.output);
#endif
  if (stream == nullptr) {
    // A blocking call outside a group may take the direct algorithm, which meets the peers first.
    const bool alone = group.depth == 0 && nonBlockingTarget == nullptr;
    submit(
        held, info.comm,
        c.prepare(info.collective, info.input, info.output, info.count, info.type, info.op, rootOrPeer, vector, alone));
    return;
  }
  if (nonBlockingTarget != nullptr) {
    fail(chorusInvalidUsage,
         "rank {}: {}: non-blocking calls take host buffers (a NULL stream); a call with a stream is already "
         "asynchronous",
         c.rank(), info.call);
  }
#if defined(CHORUS_HAVE_DEVICE)
  const chorus::DeviceCall device{info.collective, info.input, info.output, info.count,
                                  info.type,       info.op,    rootOrPeer,  vector};
  chorus::checkDeviceCall(device, c.rank(), c.nranks(), info.call);
  if (group.depth > 0) {
    // Kept for chorusGroupEnd: the collectives in call order, the sends and receives as one step.
    group.keepDevice(info.comm, held, device, stream, c.rank(), info.call);
    return;
  }
  c.device().enqueue(device, stream, info.call);
#else
  fail(chorusInvalidArgument,
       "rank {}: {}: a non-NULL stream was given, but this build of chorus has no CUDA (host buffers take NULL)",
       c.rank(), info.call);
#endif
}

// Checks a call's arguments by what its collective is (collectives/traits.h), then runs it on the
// executor or the device path.
void enqueue(const CallInfo& info) {
  using collectives::Extent;
  const Lease held = live(info.comm, info.call);
  Communicator& c = *held;
  const char* call = info.call;
  const int rank = c.rank();
  const collectives::CollectiveTraits& t = collectives::traitsOf(info.collective);
  checkType(info.type, call, rank);
  if (t.reduces) checkOp(info.op, call, rank);
  if (t.rooted) checkRank(info.rootOrPeer, c.nranks(), "root", call, rank);
  if (t.pointToPoint) checkRank(info.rootOrPeer, c.nranks(), "peer", call, rank);
  const bool isRoot = t.rooted && info.rootOrPeer == rank;
  size_t inCount = info.count, outCount = info.count;
  if (t.input == Extent::kVector) {
    const auto& v = info.vector;
    if (v[0] == nullptr || v[1] == nullptr || v[2] == nullptr || v[3] == nullptr) {
      fail(chorusInvalidArgument, "rank {}: {}: a count or displacement array is NULL", rank, call);
    }
    inCount = outCount = 0;
    for (int peer = 0; peer < c.nranks(); ++peer) {
      checkCount(v[0][peer], 1, info.type, call, rank);
      checkCount(v[2][peer], 1, info.type, call, rank);
      checkCount(v[1][peer], 2, info.type, call, rank);
      checkCount(v[3][peer], 2, info.type, call, rank);
      inCount += v[0][peer];
      outCount += v[2][peer];
    }
  } else {
    checkCount(info.count, collectives::blocksOf(info.collective, c.nranks()), info.type, call, rank);
  }
  if (t.input != Extent::kNone && (!t.inputAtRootOnly || isRoot))
    checkBuffer(info.input, inCount, "sendbuff", call, rank);
  if (t.output != Extent::kNone && (!t.outputAtRootOnly || isRoot)) {
    checkBuffer(info.output, outCount, "recvbuff", call, rank);
  }
  if (!t.inPlace && t.input != Extent::kNone && t.output != Extent::kNone && inCount > 0 && info.input == info.output) {
    fail(chorusInvalidArgument, "rank {}: {}: sendbuff and recvbuff are the same buffer (no in-place {})", rank, call,
         t.name);
  }
  if (t.pointToPoint) checkSelfOutsideGroup(info.rootOrPeer, rank, call);
  const size_t* const* vector = t.input == Extent::kVector ? info.vector.data() : nullptr;
  submitOn(held, info, t.rooted || t.pointToPoint ? info.rootOrPeer : 0, vector);
}

// In a group, an argument error is reported again at chorusGroupEnd and drops the group.
chorusResult_t record(chorusResult_t result) {
  if (result != chorusSuccess && group.depth > 0 && group.deferred == chorusSuccess) {
    group.deferred = result;
    group.deferredMessage = lastError;
  }
  return result;
}

void checkConfig(const chorusConfig_t* config, int rank) {
  if (config != nullptr) {
    if (config->size != sizeof(chorusConfig_t) || config->magic != CHORUS_CONFIG_MAGIC ||
        config->version > CHORUS_VERSION_CODE) {
      fail(chorusInvalidArgument,
           "rank {}: the config was not made with CHORUS_CONFIG_INITIALIZER of this version (size {}, magic {:#x}, "
           "version {})",
           rank, config->size, config->magic, config->version);
    }
    if (config->blocking != 1) {
      fail(chorusInvalidArgument, "rank {}: config.blocking = {}: this version has blocking communicators only", rank,
           config->blocking);
    }
    if (config->deterministic < -1 || config->deterministic > 1) {
      fail(chorusInvalidArgument, "rank {}: config.deterministic = {}: expected 1, 0 or -1 (CHORUS_DETERMINISTIC)",
           rank, config->deterministic);
    }
  }
}

// Hands out a handle for a communicator just made.
void publish(chorusComm_t* out, std::shared_ptr<Communicator> impl) {
  auto comm = std::make_unique<chorusComm>();
  comm->impl = std::move(impl);
  std::lock_guard<std::mutex> lock(liveMutex);
  liveComms.insert(comm.get());
  *out = comm.release();
}

// An init's arguments, checked before anything is made; *out is NULL afterwards.
void checkInitArguments(chorusComm_t* out, int nranks, int rank, const chorusConfig_t* config) {
  if (out == nullptr) fail(chorusInvalidArgument, "chorusCommInitRank: comm (the output pointer) is NULL");
  *out = nullptr;
  if (nranks < 1) fail(chorusInvalidArgument, "chorusCommInitRank: nranks {} is less than 1", nranks);
  if (rank < 0 || rank >= nranks) {
    fail(chorusInvalidArgument, "chorusCommInitRank: rank {} is out of range [0, {})", rank, nranks);
  }
  checkConfig(config, rank);
}

void initCommunicator(chorusComm_t* out, int nranks, const chorus::UniqueIdData& id, int rank,
                      const chorusConfig_t* config) {
  checkInitArguments(out, nranks, rank, config);
  publish(out, std::make_shared<Communicator>(id, nranks, rank, chorus::CommSettings::resolve(config)));
}

int envInt(const char* name, const std::string& text) {
  int64_t value = 0;
  if (!chorus::parseNonNegative(text, std::numeric_limits<int>::max(), &value)) {
    fail(chorusInvalidArgument, "chorusCommInitFromEnv: {}='{}' is not a valid non-negative integer", name, text);
  }
  return static_cast<int>(value);
}

std::string hexOf(const void* data, size_t bytes) {
  static const char* const kDigits = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned char b = static_cast<const unsigned char*>(data)[i];
    text += kDigits[b >> 4];
    text += kDigits[b & 15];
  }
  return text;
}

void fromHex(const std::string& text, void* data, size_t bytes) {
  if (text.size() != 2 * bytes) fail(chorusRemoteError, "PMI: the published unique id has the wrong length");
  for (size_t i = 0; i < bytes; ++i) {
    static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  }
}

// Runs a blocking entry point's validation and preparation, starting its op instead of running
// it, with the request written to *request.
template <typename Call>
chorusResult_t nonBlocking(chorusRequest_t* request, const char* call, Call&& blocking) {
  const chorusResult_t checked = guarded([&] {
    if (request == nullptr) fail(chorusInvalidArgument, "{}: request (the output pointer) is NULL", call);
    *request = nullptr;
    if (group.depth > 0) {
      fail(chorusInvalidUsage, "{}: non-blocking calls cannot be made inside a group (use the blocking form there)",
           call);
    }
  });
  if (checked != chorusSuccess) return checked;
  nonBlockingTarget = request;
  const chorusResult_t result = blocking();
  nonBlockingTarget = nullptr;
  return result;
}

// The live request *request points at; nullptr for a null request (already complete).
chorusRequest* liveRequest(chorusRequest_t* request, const char* call) {
  if (request == nullptr) fail(chorusInvalidArgument, "{}: request (the pointer to the handle) is NULL", call);
  if (*request == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(liveMutex);
  if (liveRequests.count(*request) == 0) {
    fail(chorusInvalidUsage, "{}: the request handle is not live (already completed by test or wait, or never made)",
         call);
  }
  return *request;
}

// Frees a completed request, sets the handle to NULL and reports its operation's result.
void settle(chorusRequest_t* request) {
  std::unique_ptr<chorusRequest> owned(*request);
  {
    std::lock_guard<std::mutex> lock(liveMutex);
    liveRequests.erase(owned.get());
  }
  *request = nullptr;
  const chorus::Completion& completion = *owned->completion;
  if (completion.result != chorusSuccess) throw Error(completion.result, completion.message);
}

}  // namespace

extern "C" {

chorusResult_t chorusGetVersion(int* version) {
  return guarded([&] {
    if (version == nullptr) fail(chorusInvalidArgument, "chorusGetVersion: version is NULL");
    *version = CHORUS_VERSION_CODE;
  });
}

chorusResult_t chorusGetCollectiveInfo(chorusCollective_t collective, int nranks, size_t count,
                                       chorusCollectiveInfo_t* info) {
  return guarded([&] {
    const char* call = "chorusGetCollectiveInfo";
    if (info == nullptr) fail(chorusInvalidArgument, "{}: info is NULL", call);
    const Collective which = internalCollective(collective, call);
    if (nranks < 1) fail(chorusInvalidArgument, "{}: {} ranks (at least 1)", call, nranks);
    const collectives::CollectiveTraits& t = collectives::traitsOf(which);
    if (!countFits(count, collectives::blocksOf(which, nranks), 1)) {
      fail(chorusInvalidArgument, "{}: count {} on {} ranks overflows", call, count, nranks);
    }
    info->name = t.name;
    info->reduces = t.reduces;
    info->rooted = t.rooted;
    info->pointToPoint = t.pointToPoint;
    info->inPlace = t.inPlace;
    info->inputAtRootOnly = t.inputAtRootOnly;
    info->outputAtRootOnly = t.outputAtRootOnly;
    info->inputElements = collectives::inputElements(which, count, nranks, true);
    info->outputElements = collectives::outputElements(which, count, nranks, true);
    info->wholeElements =
        t.input == collectives::Extent::kVector ? 0 : collectives::wholeElements(which, count, nranks);
  });
}

chorusResult_t chorusPredictTime(chorusCollective_t collective, int nranks, size_t bytes, const chorusLinkModel_t* link,
                                 double* microseconds) {
  return guarded([&] {
    if (link == nullptr || microseconds == nullptr) {
      fail(chorusInvalidArgument, "chorusPredictTime: link or microseconds is NULL");
    }
    if (nranks < 1 || link->hosts < 1 || link->hosts > nranks || !(link->bandwidthGBps > 0) ||
        !(link->reduceGBps > 0) || link->alphaUs < 0 ||
        (link->hosts > 1 && (!(link->localBandwidthGBps > 0) || link->localAlphaUs < 0))) {
      fail(chorusInvalidArgument,
           "chorusPredictTime: {} ranks on {} host(s), latency {} us, bandwidth {} GB/s (local {} us, {} GB/s), "
           "reduction {} GB/s: ranks and hosts must be at least 1 (hosts no more than ranks), bandwidths positive, "
           "latencies not negative",
           nranks, link->hosts, link->alphaUs, link->bandwidthGBps, link->localAlphaUs, link->localBandwidthGBps,
           link->reduceGBps);
    }
    namespace coll = chorus::collectives;
    coll::CostParams p = coll::defaultCostParams(false);
    p.alphaUs = link->alphaUs;
    p.betaUsPerByte = 1.0 / (link->bandwidthGBps * 1e3);
    p.gammaUsPerByte = 1.0 / (link->reduceGBps * 1e3);
    p.copyUsPerByte = p.gammaUsPerByte / 2;
    p.hosts = link->hosts;
    p.localAlphaUs = link->hosts > 1 ? link->localAlphaUs : link->alphaUs;
    p.localBetaUsPerByte = link->hosts > 1 ? 1.0 / (link->localBandwidthGBps * 1e3) : p.betaUsPerByte;
    const Collective which = internalCollective(collective, "chorusPredictTime");
    if (static_cast<int>(collective) > static_cast<int>(chorusCollSend)) {
      fail(chorusInvalidArgument, "chorusPredictTime: the cost model does not predict {} (collective {})",
           coll::collectiveName(which), static_cast<int>(collective));
    }
    if (nranks == 1 || bytes == 0) {
      *microseconds = 0.0;
    } else if (collective == chorusCollSend) {
      *microseconds = p.alphaUs + static_cast<double>(bytes) * p.betaUsPerByte;
    } else {
      *microseconds = coll::choose(which, nranks, bytes, p).predictedUs;
    }
  });
}

const char* chorusGetErrorString(chorusResult_t result) {
  switch (result) {
    case chorusSuccess:
      return "no error";
    case chorusUnhandledCudaError:
      return "unhandled CUDA error";
    case chorusSystemError:
      return "system error";
    case chorusInternalError:
      return "internal error";
    case chorusInvalidArgument:
      return "invalid argument";
    case chorusInvalidUsage:
      return "invalid usage";
    case chorusRemoteError:
      return "remote error (a peer failed, disconnected or disagreed)";
    case chorusInProgress:
      return "operation in progress";
    case chorusTimeout:
      return "timeout";
    case chorusAborted:
      return "aborted";
    default:
      return "unknown result code";
  }
}

const char* chorusGetLastError(chorusComm_t) { return lastError.c_str(); }

chorusResult_t chorusCommGetTraffic(chorusComm_t comm, chorusTraffic_t* traffic) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommGetTraffic");
    if (traffic == nullptr) fail(chorusInvalidArgument, "rank {}: chorusCommGetTraffic: traffic is NULL", held->rank());
    const chorus::Traffic sent = held->traffic();
    traffic->bytesSent = sent.bytes;
    traffic->messagesSent = sent.messages;
  });
}

namespace {

chorusCompressor* liveCompressor(chorusCompressor_t compressor, const char* call) {
  std::lock_guard<std::mutex> lock(liveMutex);
  if (compressor == nullptr || liveCompressors.count(compressor) == 0) {
    fail(chorusInvalidUsage, "{}: the compressor handle is not live (NULL, destroyed or never created)", call);
  }
  return compressor;
}

}  // namespace

chorusResult_t chorusCompressorCreate(chorusComm_t comm, const char* spec, int ntensors, const size_t* counts,
                                      const size_t* rows, chorusCompressor_t* compressor) {
  return guarded([&] {
    const char* call = "chorusCompressorCreate";
    const Lease held = live(comm, call);
    const int rank = held->rank();
    if (compressor == nullptr) fail(chorusInvalidArgument, "rank {}: {}: compressor is NULL", rank, call);
    *compressor = nullptr;
    if (ntensors < 1 || counts == nullptr) {
      fail(chorusInvalidArgument, "rank {}: {}: {} tensors with counts {} (at least one tensor, counts not NULL)", rank,
           call, ntensors, counts == nullptr ? "NULL" : "given");
    }
    std::string text = spec != nullptr ? spec : chorus::knobString(chorus::Knob::kCompress);
    if (text.empty()) text = "none";
    std::vector<chorus::collectives::TensorShape> shapes;
    for (int t = 0; t < ntensors; ++t) shapes.push_back({counts[t], rows != nullptr ? rows[t] : 0});
    auto made = std::make_unique<chorusCompressor>();
    made->nranks = held->nranks();
    try {
      made->state = std::make_unique<chorus::collectives::CompressedAllReduce>(
          chorus::collectives::CompressorSpec::parse(text), std::move(shapes), rank, held->nranks());
    } catch (const std::invalid_argument& e) {
      fail(chorusInvalidArgument, "rank {}: {}: {}", rank, call, e.what());
    }
    std::lock_guard<std::mutex> lock(liveMutex);
    liveCompressors.insert(made.get());
    *compressor = made.release();
  });
}

chorusResult_t chorusCompressorDestroy(chorusCompressor_t compressor) {
  return guarded([&] {
    liveCompressor(compressor, "chorusCompressorDestroy");
    {
      std::lock_guard<std::mutex> lock(liveMutex);
      liveCompressors.erase(compressor);
    }
    delete compressor;
  });
}

chorusResult_t chorusCompressedAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                         chorusRedOp_t op, chorusCompressor_t compressor, chorusComm_t comm,
                                         chorusStream_t stream) {
  return guarded([&] {
    const char* call = "chorusCompressedAllReduce";
    const Lease held = live(comm, call);
    Communicator& c = *held;
    chorusCompressor* state = liveCompressor(compressor, call);
    checkType(datatype, call, c.rank());
    checkOp(op, call, c.rank());
    if (datatype != chorusFloat32) {
      fail(chorusInvalidArgument, "rank {}: {}: datatype {} (compressed all-reduces take float32)", c.rank(), call,
           chorusTypeName(datatype));
    }
    if (op != chorusSum && op != chorusAvg) {
      fail(chorusInvalidArgument, "rank {}: {}: op {} (compressed all-reduces sum or average)", c.rank(), call,
           chorusOpName(op));
    }
    checkCount(count, 1, datatype, call, c.rank());
    checkBuffer(sendbuff, count, "sendbuff", call, c.rank());
    checkBuffer(recvbuff, count, "recvbuff", call, c.rank());
    if (count != state->state->count()) {
      fail(chorusInvalidArgument, "rank {}: {}: count {} but the compressor ({}) was made for {} elements", c.rank(),
           call, count, state->state->spec().text(), state->state->count());
    }
    if (c.nranks() != state->nranks) {
      fail(chorusInvalidArgument, "rank {}: {}: the communicator has {} ranks but the compressor was made for {}",
           c.rank(), call, c.nranks(), state->nranks);
    }
    if (group.depth > 0 || nonBlockingTarget != nullptr) {
      fail(chorusInvalidUsage, "rank {}: {}: not allowed inside a group", c.rank(), call);
    }
#if defined(CHORUS_HAVE_DEVICE)
    if (stream == nullptr) stream = chorus::streamForNull(sendbuff, recvbuff);
    if (stream != nullptr) {  // device buffers: staged through the engine's proxy (device.h)
      chorus::DeviceCall device{Collective::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0};
      device.compressor = state->state.get();
      chorus::checkDeviceCall(device, c.rank(), c.nranks(), call);  // before the engine exists
      c.device().enqueue(device, stream, call);
      return;
    }
#else
    if (stream != nullptr) {
      fail(chorusInvalidArgument,
           "rank {}: {}: a non-NULL stream was given, but this build of chorus has no CUDA (host buffers take NULL)",
           c.rank(), call);
    }
#endif
    c.compressedAllReduce(*state->state, static_cast<const float*>(sendbuff), static_cast<float*>(recvbuff), count,
                          op == chorusAvg);
  });
}

chorusResult_t chorusCompressorGetInfo(chorusCompressor_t compressor, chorusCompressorInfo_t* info) {
  return guarded([&] {
    const chorusCompressor* c = liveCompressor(compressor, "chorusCompressorGetInfo");
    if (info == nullptr) fail(chorusInvalidArgument, "chorusCompressorGetInfo: info is NULL");
    *info = chorusCompressorInfo_t{};
    const std::string text = c->state->spec().text();
    std::snprintf(info->spec, sizeof(info->spec), "%s", text.c_str());
    info->payloadBytes = c->state->payloadBytes();
    info->ratio = c->state->ratio();
    info->calls = c->state->calls();
    info->count = c->state->count();
  });
}

chorusResult_t chorusCompressorGetResidual(chorusCompressor_t compressor, float* error, float* contribution,
                                           size_t count) {
  return guarded([&] {
    const chorusCompressor* c = liveCompressor(compressor, "chorusCompressorGetResidual");
    if (count != c->state->count()) {
      fail(chorusInvalidArgument, "chorusCompressorGetResidual: count {} but the compressor holds {}", count,
           c->state->count());
    }
    if (error != nullptr) {
      const auto e = c->state->error();
      if (e.empty()) {
        std::fill(error, error + count, 0.0f);
      } else {
        std::copy(e.begin(), e.end(), error);
      }
    }
    if (contribution != nullptr)
      std::copy(c->state->contribution().begin(), c->state->contribution().end(), contribution);
  });
}

chorusResult_t chorusCompressorGetOwnerResidual(chorusCompressor_t compressor, float* error, size_t count) {
  return guarded([&] {
    const chorusCompressor* c = liveCompressor(compressor, "chorusCompressorGetOwnerResidual");
    if (error == nullptr) fail(chorusInvalidArgument, "chorusCompressorGetOwnerResidual: error is NULL");
    if (count != c->state->count()) {
      fail(chorusInvalidArgument, "chorusCompressorGetOwnerResidual: count {} but the compressor holds {}", count,
           c->state->count());
    }
    c->state->ownerError(error);
  });
}

chorusResult_t chorusMemAlloc(void** ptr, size_t size) {
  return guarded([&] {
    if (ptr == nullptr) fail(chorusInvalidArgument, "chorusMemAlloc: ptr (the output pointer) is NULL");
    *ptr = nullptr;
    *ptr = chorus::allocShared(size);
  });
}

chorusResult_t chorusMemFree(void* ptr) {
  return guarded([&] {
    if (ptr == nullptr) fail(chorusInvalidArgument, "chorusMemFree: ptr is NULL");
    chorus::freeShared(ptr);
  });
}

chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId) {
  return guarded([&] {
    if (uniqueId == nullptr) fail(chorusInvalidArgument, "chorusGetUniqueId: uniqueId is NULL");
    const chorus::UniqueIdData id = chorus::createUniqueId();
    std::memset(uniqueId, 0, sizeof(*uniqueId));
    static_assert(sizeof(id) <= sizeof(chorusUniqueId));
    std::memcpy(uniqueId->internal, &id, sizeof(id));
  });
}

chorusResult_t chorusCommInitRankConfig(chorusComm_t* comm, int nranks, chorusUniqueId uniqueId, int rank,
                                        const chorusConfig_t* config) {
  return guarded([&] {
    chorus::UniqueIdData id;
    std::memcpy(&id, uniqueId.internal, sizeof(id));
    if (group.depth == 0) {
      initCommunicator(comm, nranks, id, rank, config);
      return;
    }
    // In a group: checked now, made at chorusGroupEnd with the group's other inits (one thread may
    // be initing every rank of a job).
    checkInitArguments(comm, nranks, rank, config);
    // The config and its strings copied: the caller's may be gone by the end of the group.
    std::optional<chorusConfig_t> kept;
    if (config != nullptr) kept = *config;
    const std::optional<std::string> transport = config != nullptr && config->transport != nullptr
                                                     ? std::optional<std::string>(config->transport)
                                                     : std::nullopt;
    const std::optional<std::string> algorithms = config != nullptr && config->algorithms != nullptr
                                                      ? std::optional<std::string>(config->algorithms)
                                                      : std::nullopt;
    group.inits.push_back([comm, nranks, id, rank, kept, transport, algorithms] {
      std::optional<chorusConfig_t> made = kept;
      if (made) {
        made->transport = transport ? transport->c_str() : nullptr;
        made->algorithms = algorithms ? algorithms->c_str() : nullptr;
      }
      initCommunicator(comm, nranks, id, rank, made ? &*made : nullptr);
    });
  });
}

chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId uniqueId, int rank) {
  return chorusCommInitRankConfig(comm, nranks, uniqueId, rank, nullptr);
}

namespace {

// torchrun style (and srun): every rank knows the root's address and port; rank 0 listens there.
void meetAt(chorusComm_t* comm, const std::string& addr, int port, const std::string& secret, int rank, int nranks,
            const chorusConfig_t* config) {
  chorus::UniqueIdData id;
  id.magic = chorus::wire::kUniqueIdMagic;
  id.version = chorus::wire::kVersion;
  id.secret = secret.empty() ? 0 : std::hash<std::string>{}(secret);
  const chorus::SocketAddress root = chorus::SocketAddress::parse(addr, static_cast<uint16_t>(port));
  id.root = chorus::pack(root);
  if (rank == 0) {
    // Listen where the others knock: the address on the agreed port; every address of its family
    // only where it is none of this host's (a name behind NAT, say).
    chorus::Socket listener;
    try {
      listener = chorus::listenOn(root);
    } catch (const Error& e) {
      chorus::logAt(chorus::LogLevel::kInfo, "chorusCommInitFromEnv: {}; listening on every address instead", e.what());
      listener = chorus::listenOn(chorus::SocketAddress::parse(root.storage.ss_family == AF_INET6 ? "::" : "0.0.0.0",
                                                               static_cast<uint16_t>(port)));
    }
    chorus::startBootstrapRoot(std::move(listener), id.secret);
  }
  initCommunicator(comm, nranks, id, rank, config);
}

}  // namespace

chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm, const chorusConfig_t* config) {
  return guarded([&] {
    using chorus::firstEnv;
    const char* rankName = nullptr;
    const char* sizeName = nullptr;
    const std::string rankText = firstEnv({"CHORUS_RANK", "RANK"}, &rankName);
    const std::string sizeText = firstEnv({"CHORUS_WORLD_SIZE", "WORLD_SIZE"}, &sizeName);
    const std::string addr = firstEnv({"CHORUS_MASTER_ADDR", "MASTER_ADDR"});
    const char* portName = nullptr;
    const std::string portText = firstEnv({"CHORUS_MASTER_PORT", "MASTER_PORT"}, &portName);
    chorus::CommSettings::resolve(config);  // a malformed knob is reported before anything starts

    if (!rankText.empty() && !sizeText.empty() && !addr.empty() && !portText.empty()) {
      const int rank = envInt(rankName, rankText);
      const int nranks = envInt(sizeName, sizeText);
      const int port = envInt(portName, portText);
      if (port < 1 || port > 65535)
        fail(chorusInvalidArgument, "chorusCommInitFromEnv: {}={} is not a port", portName, port);
      meetAt(comm, addr, port, firstEnv({"CHORUS_SECRET"}), rank, nranks, config);
      return;
    }
    if (auto pmi = chorus::PmiClient::fromEnvironment()) {
      // Under mpiexec (or srun --mpi=pmi2): rank 0 makes an id and publishes it in the process
      // manager's key-value space.
      chorus::UniqueIdData id;
      if (pmi->rank() == 0) {
        id = chorus::createUniqueId();
        pmi->put("chorus-unique-id", hexOf(&id, sizeof(id)));
      }
      pmi->barrier();
      if (pmi->rank() != 0) fromHex(pmi->get("chorus-unique-id"), &id, sizeof(id));
      pmi->finalize();
      initCommunicator(comm, pmi->size(), id, pmi->rank(), config);
      return;
    }
    std::optional<chorus::SlurmStep> step;
    try {
      step = chorus::slurmStepFromEnvironment();
    } catch (const std::invalid_argument& e) {
      fail(chorusInvalidArgument, "chorusCommInitFromEnv: {}", e.what());
    }
    if (step) {
      // A task of srun: the step's first node hosts the root (launcher.h).
      meetAt(comm, addr.empty() ? step->firstHost : addr, step->port, step->secret, step->rank, step->nranks, config);
      return;
    }
    fail(chorusInvalidArgument,
         "chorusCommInitFromEnv: no launcher environment found: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
         "(or their CHORUS_ spellings), or start under mpiexec or srun");
  });
}

chorusResult_t chorusCommDestroy(chorusComm_t comm) {
  return guarded([&] {
    live(comm, "chorusCommDestroy");
    {
      std::lock_guard<std::mutex> lock(liveMutex);
      if (liveComms.erase(comm) == 0) return;  // another thread destroyed or aborted it meanwhile
    }
    delete comm;
  });
}

chorusResult_t chorusCommAbort(chorusComm_t comm) {
  return guarded([&] {
    live(comm, "chorusCommAbort")->abort();  // calls in flight on other threads return chorusAborted
    {
      std::lock_guard<std::mutex> lock(liveMutex);
      if (liveComms.erase(comm) == 0) return;  // another thread destroyed or aborted it meanwhile
    }
    delete comm;
  });
}

chorusResult_t chorusCommShrink(chorusComm_t comm, const int* excludeRanks, int excludeCount, chorusComm_t* newcomm,
                                const chorusConfig_t* config) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommShrink");
    Communicator& c = *held;
    if (newcomm == nullptr) fail(chorusInvalidArgument, "rank {}: chorusCommShrink: newcomm is NULL", c.rank());
    *newcomm = nullptr;
    if (excludeCount < 0 || (excludeCount > 0 && excludeRanks == nullptr)) {
      fail(chorusInvalidArgument, "rank {}: chorusCommShrink: {} excluded ranks at {}", c.rank(), excludeCount,
           static_cast<const void*>(excludeRanks));
    }
    checkConfig(config, c.rank());
    const chorus::CommSettings settings = config != nullptr ? chorus::CommSettings::resolve(config) : c.settings();
    publish(newcomm, c.shrink(std::vector<int>(excludeRanks, excludeRanks + excludeCount), settings));
  });
}

chorusResult_t chorusCommGetUniqueId(chorusComm_t comm, chorusUniqueId* uniqueId) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommGetUniqueId");
    if (uniqueId == nullptr)
      fail(chorusInvalidArgument, "rank {}: chorusCommGetUniqueId: uniqueId is NULL", held->rank());
    const chorus::UniqueIdData id = held->growId();
    std::memset(uniqueId, 0, sizeof(*uniqueId));
    std::memcpy(uniqueId->internal, &id, sizeof(id));
  });
}

chorusResult_t chorusCommGrow(chorusComm_t comm, int nranks, const chorusUniqueId* uniqueId, int rank,
                              chorusComm_t* newcomm, const chorusConfig_t* config) {
  return guarded([&] {
    if (newcomm == nullptr) fail(chorusInvalidArgument, "chorusCommGrow: newcomm is NULL");
    *newcomm = nullptr;
    if (uniqueId == nullptr) fail(chorusInvalidArgument, "chorusCommGrow: uniqueId is NULL");
    if (group.depth > 0) fail(chorusInvalidUsage, "chorusCommGrow inside a group");
    chorus::UniqueIdData id;
    std::memcpy(&id, uniqueId->internal, sizeof(id));
    if (const std::string why = chorus::wire::checkUniqueId(id); !why.empty()) {
      fail(chorusInvalidArgument, "chorusCommGrow: the unique id is bad: {}", why);
    }
    if (comm != nullptr) {
      const Lease held = live(comm, "chorusCommGrow");
      Communicator& c = *held;
      if (rank != -1) {
        fail(chorusInvalidArgument, "rank {}: chorusCommGrow: a rank of the communicator passes rank -1 (got {})",
             c.rank(), rank);
      }
      checkConfig(config, c.rank());
      const chorus::CommSettings settings = config != nullptr ? chorus::CommSettings::resolve(config) : c.settings();
      publish(newcomm, c.grow(nranks, id, settings));
      return;
    }
    if (id.parent == 0) {
      fail(chorusInvalidArgument,
           "chorusCommGrow: the id is not a grow id (chorusCommGetUniqueId makes those; chorusCommInitRank takes "
           "this one)");
    }
    if (rank < id.parentNranks || rank >= nranks) {
      fail(chorusInvalidArgument,
           "chorusCommGrow: a new rank of a communicator grown from {} to {} ranks takes a number in [{}, {}), not {}",
           id.parentNranks, nranks, id.parentNranks, nranks, rank);
    }
    initCommunicator(newcomm, nranks, id, rank, config);
  });
}

chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm,
                               const chorusConfig_t* config) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommSplit");
    Communicator& c = *held;
    if (newcomm == nullptr) fail(chorusInvalidArgument, "rank {}: chorusCommSplit: newcomm is NULL", c.rank());
    *newcomm = nullptr;
    if (group.depth > 0) fail(chorusInvalidUsage, "rank {}: chorusCommSplit inside a group", c.rank());
    checkConfig(config, c.rank());
    const chorus::CommSettings settings = config != nullptr ? chorus::CommSettings::resolve(config) : c.settings();
    auto made = c.split(color, key, settings);
    if (made != nullptr) publish(newcomm, std::move(made));
  });
}

chorusResult_t chorusCommDumpState(chorusComm_t comm) {
  return guarded([&] { live(comm, "chorusCommDumpState")->printState(); });
}

chorusResult_t chorusCommGetStats(chorusComm_t comm, int format, char* text, size_t* size) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommGetStats");
    Communicator& c = *held;
    if (size == nullptr) fail(chorusInvalidArgument, "rank {}: chorusCommGetStats: size is NULL", c.rank());
    const std::string stats = c.stats(format);
    const size_t capacity = *size;
    *size = stats.size() + 1;
    if (text == nullptr) return;
    if (capacity < stats.size() + 1) {
      fail(chorusInvalidArgument, "rank {}: chorusCommGetStats: the text needs {} bytes, *size was {}", c.rank(),
           stats.size() + 1, capacity);
    }
    std::memcpy(text, stats.c_str(), stats.size() + 1);
  });
}

chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommGetAsyncError");
    Communicator& c = *held;
    if (asyncError == nullptr) fail(chorusInvalidArgument, "chorusCommGetAsyncError: asyncError is NULL");
    *asyncError = c.asyncError();
    if (*asyncError != chorusSuccess) lastError = c.brokenReason();
  });
}

chorusResult_t chorusCommCount(const chorusComm_t comm, int* count) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommCount");
    Communicator& c = *held;
    if (count == nullptr) fail(chorusInvalidArgument, "chorusCommCount: count is NULL");
    *count = c.nranks();
  });
}

chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommUserRank");
    Communicator& c = *held;
    if (rank == nullptr) fail(chorusInvalidArgument, "chorusCommUserRank: rank is NULL");
    *rank = c.rank();
  });
}

int chorusIsDeviceMemory(const void* ptr) {
#if defined(CHORUS_HAVE_DEVICE)
  return chorus::isDeviceMemory(ptr) ? 1 : 0;
#else
  (void)ptr;
  return 0;
#endif
}

chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusAllReduce", Collective::kAllReduce, comm, stream, sendbuff, recvbuff, count, datatype, op});
  }));
}

chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusAllGather", Collective::kAllGather, comm, stream, sendbuff, recvbuff, sendcount, datatype});
  }));
}

chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                   chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue(
        {"chorusReduceScatter", Collective::kReduceScatter, comm, stream, sendbuff, recvbuff, recvcount, datatype, op});
  }));
}

chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype, int root,
                               chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusBroadcast", Collective::kBroadcast, comm, stream, sendbuff, recvbuff, count, datatype, chorusSum,
             root});
  }));
}

chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                            chorusRedOp_t op, int root, chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusReduce", Collective::kReduce, comm, stream, sendbuff, recvbuff, count, datatype, op, root});
  }));
}

chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusAllToAll", Collective::kAllToAll, comm, stream, sendbuff, recvbuff, count, datatype});
  }));
}

chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                               const size_t* recvcounts, const size_t* rdispls, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    CallInfo info{"chorusAllToAllv", Collective::kAllToAllv, comm, stream, sendbuff, recvbuff, 0, datatype};
    info.vector = {sendcounts, sdispls, recvcounts, rdispls};
    enqueue(info);
  }));
}

chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype, int root,
                            chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue(
        {"chorusGather", Collective::kGather, comm, stream, sendbuff, recvbuff, sendcount, datatype, chorusSum, root});
  }));
}

chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusScatter", Collective::kScatter, comm, stream, sendbuff, recvbuff, recvcount, datatype, chorusSum,
             root});
  }));
}

chorusResult_t chorusCommSetAlgorithms(chorusComm_t comm, const char* algorithms) {
  return guarded([&] {
    const Lease held = live(comm, "chorusCommSetAlgorithms");
    Communicator& c = *held;
    if (algorithms == nullptr) fail(chorusInvalidArgument, "chorusCommSetAlgorithms: algorithms is NULL");
    c.setAlgorithms(algorithms);
  });
}

chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusSend", Collective::kSend, comm, stream, sendbuff, nullptr, count, datatype, chorusSum, peer});
  }));
}

chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream) {
  return record(guarded([&] {
    enqueue({"chorusRecv", Collective::kRecv, comm, stream, nullptr, recvbuff, count, datatype, chorusSum, peer});
  }));
}

chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream) {
  return record(guarded([&] { enqueue({"chorusBarrier", Collective::kBarrier, comm, stream}); }));
}

chorusResult_t chorusIAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                chorusRedOp_t op, chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIAllReduce",
                     [&] { return chorusAllReduce(sendbuff, recvbuff, count, datatype, op, comm, nullptr); });
}

chorusResult_t chorusIAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIAllGather",
                     [&] { return chorusAllGather(sendbuff, recvbuff, sendcount, datatype, comm, nullptr); });
}

chorusResult_t chorusIReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                                    chorusRedOp_t op, chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIReduceScatter",
                     [&] { return chorusReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, nullptr); });
}

chorusResult_t chorusIBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype, int root,
                                chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIBroadcast",
                     [&] { return chorusBroadcast(sendbuff, recvbuff, count, datatype, root, comm, nullptr); });
}

chorusResult_t chorusIReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                             chorusRedOp_t op, int root, chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIReduce",
                     [&] { return chorusReduce(sendbuff, recvbuff, count, datatype, op, root, comm, nullptr); });
}

chorusResult_t chorusIAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIAllToAll",
                     [&] { return chorusAllToAll(sendbuff, recvbuff, count, datatype, comm, nullptr); });
}

chorusResult_t chorusIAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                                const size_t* recvcounts, const size_t* rdispls, chorusDataType_t datatype,
                                chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIAllToAllv", [&] {
    return chorusAllToAllv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, comm, nullptr);
  });
}

chorusResult_t chorusIGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIGather",
                     [&] { return chorusGather(sendbuff, recvbuff, sendcount, datatype, root, comm, nullptr); });
}

chorusResult_t chorusIScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                              int root, chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIScatter",
                     [&] { return chorusScatter(sendbuff, recvbuff, recvcount, datatype, root, comm, nullptr); });
}

chorusResult_t chorusISend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                           chorusRequest_t* request) {
  return nonBlocking(request, "chorusISend",
                     [&] { return chorusSend(sendbuff, count, datatype, peer, comm, nullptr); });
}

chorusResult_t chorusIRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                           chorusRequest_t* request) {
  return nonBlocking(request, "chorusIRecv",
                     [&] { return chorusRecv(recvbuff, count, datatype, peer, comm, nullptr); });
}

chorusResult_t chorusIBarrier(chorusComm_t comm, chorusRequest_t* request) {
  return nonBlocking(request, "chorusIBarrier", [&] { return chorusBarrier(comm, nullptr); });
}

chorusResult_t chorusTest(chorusRequest_t* request, int* done) {
  return guarded([&] {
    if (done == nullptr) fail(chorusInvalidArgument, "chorusTest: done is NULL");
    *done = 0;
    chorusRequest* r = liveRequest(request, "chorusTest");
    if (r != nullptr && !r->completion->done) {
      try {
        live(r->comm, "chorusTest")->test(*r->completion);
      } catch (const Error&) {
        if (!r->completion->done) throw;
      }
      if (!r->completion->done) return;
    }
    *done = 1;
    if (r != nullptr) settle(request);
  });
}

chorusResult_t chorusWait(chorusRequest_t* request) {
  return guarded([&] {
    chorusRequest* r = liveRequest(request, "chorusWait");
    if (r == nullptr) return;
    if (!r->completion->done) {
      try {
        live(r->comm, "chorusWait")->wait(*r->completion);
      } catch (const Error&) {
        if (!r->completion->done) throw;
      }
    }
    settle(request);
  });
}

chorusResult_t chorusWaitAll(int count, chorusRequest_t* requests) {
  chorusResult_t first = chorusSuccess;
  std::string message;
  const chorusResult_t checked = guarded([&] {
    if (count < 0 || (count > 0 && requests == nullptr)) {
      fail(chorusInvalidArgument, "chorusWaitAll: {} requests at {}", count, static_cast<const void*>(requests));
    }
  });
  if (checked != chorusSuccess) return checked;
  for (int i = 0; i < count; ++i) {
    const chorusResult_t result = chorusWait(&requests[i]);
    if (result != chorusSuccess && first == chorusSuccess) {
      first = result;
      message = lastError;
    }
  }
  if (first != chorusSuccess) lastError = message;
  return first;
}

chorusResult_t chorusGroupStart(void) {
  ++group.depth;
  return chorusSuccess;
}

chorusResult_t chorusGroupEnd(void) {
  return guarded([&] {
    if (group.depth == 0) fail(chorusInvalidUsage, "chorusGroupEnd without chorusGroupStart");
    if (--group.depth > 0) return;
    const chorusResult_t deferred = group.deferred;
    const std::string message = group.deferredMessage;
    std::vector<std::function<void()>> inits;
    std::vector<chorus::GroupPart> parts = group.take(&inits);
    if (deferred != chorusSuccess) {
      fail(deferred, "a call in the group failed, so none of the group's calls ran: {}", message);
    }
    // The inits first, together (each waits for its peers), then the calls.
    chorus::runEachOnItsOwnThread(inits);
    // A communicator destroyed or aborted inside the group is refused before anything runs.
    for (const chorus::GroupPart& part : parts) live(static_cast<const chorusComm*>(part.handle), "chorusGroupEnd");
    chorus::runGroup(std::move(parts));
  });
}

const char* chorusAlgorithmNames(const char* collective) {
  static const auto names = [] {
    std::vector<std::string> all(chorus::collectives::kCollectiveCount);
    for (int c = 0; c < chorus::collectives::kCollectiveCount; ++c) {
      for (auto a : chorus::collectives::algorithmsFor(static_cast<Collective>(c))) {
        all[c] += std::string(all[c].empty() ? "" : ",") + chorus::collectives::algorithmName(a);
      }
    }
    return all;
  }();
  Collective c;
  if (collective == nullptr || !chorus::collectives::parseCollective(collective, &c)) return nullptr;
  return names[static_cast<int>(c)].c_str();
}

size_t chorusTypeSize(chorusDataType_t datatype) { return chorus::kernels::typeSize(datatype); }

const char* chorusTypeName(chorusDataType_t datatype) {
  static const char* const kNames[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                       "uint64", "float16", "float32", "float64", "bfloat16"};
  if (static_cast<int>(datatype) < 0 || datatype >= chorusNumTypes) return "unknown";
  return kNames[datatype];
}

const char* chorusOpName(chorusRedOp_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  if (static_cast<int>(op) < 0 || op >= chorusNumOps) return "unknown";
  return kNames[op];
}

}  // extern "C"
