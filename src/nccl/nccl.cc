// nccl.cc: libchorus_nccl, the NCCL API (as NCCL 2.28's own nccl.h declares it) over chorus, so
// programs written for NCCL link to chorus unchanged. Every call maps onto its chorus twin; what
// this file adds is NCCL's conventions where chorus's differ:
//  - Host buffers (a documented extension): NCCL takes device memory only; here a call whose
//    buffers are host memory runs on chorus's host path whatever stream it was given, after that
//    stream's earlier work (the call waits for it), and returns when done. So NCCL programs run
//    on machines without GPUs. Device buffers go to chorus's device path on the stream.
//  - Result codes: chorus's are NCCL's plus two; chorusTimeout maps to ncclRemoteError (a peer
//    that never came) and chorusAborted to ncclInvalidUsage (the communicator is gone), with the
//    reason in ncclGetLastError.
//  - Groups: calls inside ncclGroupStart/End are kept and made at ncclGroupEnd as one chorus
//    group, which may span communicators (one thread driving several ranks, as NCCL allows), on
//    host or device buffers; each call is made on its communicator's device.
//    ncclCommInitRank* inside a group are kept too: chorus's group makes them together at its
//    end. An argument error of a call in a group is reported by ncclGroupEnd.
//  - ncclGetVersion reports the NCCL API version implemented (NCCL_VERSION_CODE of the header),
//    which is what programs test for features.
// What chorus lacks is refused with ncclInvalidUsage and a message naming it: fp8 types,
// ncclRedOpCreatePreMulSum, window registration, ncclGroupSimulateEnd. ncclCommRegister is
// accepted and does nothing (registration is an optimisation in NCCL too).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/chorus.h"

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(chorusUniqueId), "unique ids must be the same size");

// The last error this file itself reported on this thread (chorus's own are asked of chorus).
thread_local std::string shimError;
thread_local bool shimErrorLast = false;

ncclResult_t refuse(ncclResult_t result, const char* format, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t refuse(ncclResult_t result, const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  shimError = text;
  shimErrorLast = true;
  return result;
}

ncclResult_t fromChorus(chorusResult_t result) {
  shimErrorLast = false;
  switch (result) {
    case chorusTimeout:
      return ncclRemoteError;
    case chorusAborted:
      return ncclInvalidUsage;
    default:
      return result >= chorusSuccess && result < chorusTimeout ? static_cast<ncclResult_t>(result) : ncclInternalError;
  }
}

chorusComm_t toChorus(ncclComm_t comm) { return reinterpret_cast<chorusComm_t>(comm); }
ncclComm_t toNccl(chorusComm_t comm) { return reinterpret_cast<ncclComm_t>(comm); }

// NCCL's types are chorus's, numbered alike, plus the two fp8 kinds chorus does not have.
bool typeOf(ncclDataType_t type, chorusDataType_t* out, const char* call) {
  if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2) {
    refuse(ncclInvalidArgument, "%s: datatype %d (fp8) is not supported by chorus", call, static_cast<int>(type));
    return false;
  }
  *out = static_cast<chorusDataType_t>(type);  // out-of-range values: chorus refuses them, naming them
  return true;
}

bool opOf(ncclRedOp_t op, chorusRedOp_t* out, const char* call) {
  if (static_cast<int>(op) >= static_cast<int>(ncclNumOps)) {
    refuse(ncclInvalidArgument, "%s: reduction op %d is not a built-in op (chorus has no ncclRedOpCreatePreMulSum)",
           call, static_cast<int>(op));
    return false;
  }
  *out = static_cast<chorusRedOp_t>(op);
  return true;
}

// CUDA's current device, or -1 where CUDA has none (the communicator then takes host buffers only).
int currentDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return -1;
  }
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  return device;
}

// The device each communicator was made on (ncclCommCuDevice).
std::mutex devicesMutex;
std::unordered_map<chorusComm_t, int> devices;

void remember(chorusComm_t comm, int device) {
  if (comm == nullptr) return;
  std::lock_guard<std::mutex> lock(devicesMutex);
  devices[comm] = device;
}

void forget(chorusComm_t comm) {
  std::lock_guard<std::mutex> lock(devicesMutex);
  devices.erase(comm);
}

// The stream chorus is given: the caller's for device buffers, NULL for host buffers (after the
// caller's stream has run what it holds, as NCCL's ordering promises). Returns false, with the
// error recorded, when that wait fails.
bool streamFor(const void* a, const void* b, cudaStream_t stream, chorusStream_t* out, const char* call) {
  *out = nullptr;
  if (chorusIsDeviceMemory(a) || chorusIsDeviceMemory(b)) {
    *out = reinterpret_cast<chorusStream_t>(stream);
    return true;
  }
  if (stream == nullptr) return true;
  const cudaError_t waited = cudaStreamSynchronize(stream);
  if (waited == cudaSuccess || waited == cudaErrorInsufficientDriver || waited == cudaErrorNoDevice) {
    cudaGetLastError();  // no driver or device: no stream can hold work
    return true;
  }
  refuse(ncclUnhandledCudaError, "%s: waiting for the stream before a host-buffer call failed: %s", call,
         cudaGetErrorString(waited));
  return false;
}

// NCCL's config: checked as NCCL does (an uninitialised one is an error); none of its fields
// changes chorus's behaviour (every communicator blocks, which NCCL's non-blocking mode allows).
bool checkConfig(const ncclConfig_t* config, const char* call) {
  if (config == nullptr) return true;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking)) {
    refuse(ncclInvalidArgument, "%s: config was not set from NCCL_CONFIG_INITIALIZER (size %zu, magic 0x%x)", call,
           config->size, config->magic);
    return false;
  }
  return true;
}

// Inits asked for inside a group: chorus's group makes them together at its end (a kept call
// each); here, where each handle goes and the device it was asked on.
struct PendingInit {
  ncclComm_t* comm;
  std::shared_ptr<chorusComm_t> made;  // chorus writes the handle here at the group's end
  int device;
};
thread_local int groupDepth = 0;
thread_local std::vector<PendingInit> pendingInits;

// A call made inside a group, kept for ncclGroupEnd.
struct GroupCall {
  chorusComm_t comm;
  bool device;  // on device buffers (a stream)
  std::function<chorusResult_t()> call;
};
thread_local std::vector<GroupCall> groupCalls;

// Makes a collective now, or keeps it for the end of the open group.
ncclResult_t dispatch(ncclComm_t comm, chorusStream_t on, std::function<chorusResult_t()> call) {
  if (groupDepth > 0) {
    groupCalls.push_back({toChorus(comm), on != nullptr, std::move(call)});
    return ncclSuccess;
  }
  return fromChorus(call());
}

// The kept calls at the end of the outermost group, as one chorus group (chorus's groups span
// communicators, their device calls too), each made on its communicator's device, as NCCL uses a
// communicator's own device whatever is current; the caller's device is current again after.
ncclResult_t runGroupCalls() {
  std::vector<GroupCall> calls;
  calls.swap(groupCalls);
  if (calls.empty()) return ncclSuccess;
  const int caller = currentDevice();
  chorusGroupStart();
  for (const GroupCall& call : calls) {
    if (call.device) {
      std::lock_guard<std::mutex> lock(devicesMutex);
      if (const auto it = devices.find(call.comm); it != devices.end() && it->second >= 0) cudaSetDevice(it->second);
    }
    call.call();  // a failure is kept for chorusGroupEnd
  }
  const ncclResult_t result = fromChorus(chorusGroupEnd());
  if (caller >= 0) cudaSetDevice(caller);
  return result;
}

ncclResult_t initRank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, const char* call) {
  if (comm == nullptr) return refuse(ncclInvalidArgument, "%s: comm is NULL", call);
  chorusUniqueId chorusId;
  std::memcpy(&chorusId, &id, sizeof(chorusId));
  if (groupDepth > 0) {
    *comm = nullptr;
    auto made = std::make_shared<chorusComm_t>(nullptr);
    pendingInits.push_back({comm, made, currentDevice()});
    groupCalls.push_back({nullptr, false, [made, nranks, chorusId, rank] {
                            return chorusCommInitRank(made.get(), nranks, chorusId, rank);
                          }});
    return ncclSuccess;
  }
  chorusComm_t made = nullptr;
  const ncclResult_t result = fromChorus(chorusCommInitRank(&made, nranks, chorusId, rank));
  if (result == ncclSuccess) {
    remember(made, currentDevice());
    *comm = toNccl(made);
  }
  return result;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return refuse(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return refuse(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  chorusUniqueId id;
  const ncclResult_t result = fromChorus(chorusGetUniqueId(&id));
  if (result == ncclSuccess) std::memcpy(uniqueId, &id, sizeof(id));
  return result;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRank(comm, nranks, commId, rank, "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  if (!checkConfig(config, "ncclCommInitRankConfig")) return ncclInvalidArgument;
  return initRank(comm, nranks, commId, rank, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr) {
    return refuse(ncclInvalidArgument, "ncclCommInitRankScalable: %d ids at %p (need at least one)", nId,
                  static_cast<void*>(commIds));
  }
  if (!checkConfig(config, "ncclCommInitRankScalable")) return ncclInvalidArgument;
  return initRank(newcomm, nranks, commIds[0], myrank, "ncclCommInitRankScalable");  // one root serves all
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) {
    return refuse(ncclInvalidArgument, "ncclCommInitAll: %d communicators into %p", ndev, static_cast<void*>(comms));
  }
  ncclUniqueId id;
  if (const ncclResult_t result = ncclGetUniqueId(&id); result != ncclSuccess) return result;
  const bool cuda = currentDevice() >= 0;
  ncclGroupStart();
  for (int i = 0; i < ndev; ++i) {
    if (cuda) cudaSetDevice(devlist != nullptr ? devlist[i] : i);
    initRank(&comms[i], ndev, id, i, "ncclCommInitAll");
  }
  return ncclGroupEnd();
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  // Every chorus call is complete (host) or ordered on its stream (device) when it returns; what
  // NCCL's finalize flushes, chorusCommDestroy waits for.
  int count = 0;
  return fromChorus(chorusCommCount(toChorus(comm), &count));
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  forget(toChorus(comm));
  return fromChorus(chorusCommDestroy(toChorus(comm)));
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  forget(toChorus(comm));
  return fromChorus(chorusCommAbort(toChorus(comm)));
}

#if !defined(NCCL_REVOKE_DEFAULT)  // an nccl.h older than 2.28 does not name it
#define NCCL_REVOKE_DEFAULT 0
#endif
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    return refuse(ncclInvalidArgument, "ncclCommRevoke: revokeFlags %d (must be NCCL_REVOKE_DEFAULT)", revokeFlags);
  }
  // chorus has no revoked-but-alive state: in-flight calls end as on abort, and the handle goes.
  return ncclCommAbort(comm);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!checkConfig(config, "ncclCommSplit")) return ncclInvalidArgument;
  chorusComm_t made = nullptr;
  const ncclResult_t result = fromChorus(chorusCommSplit(toChorus(comm), color, key, &made, nullptr));
  if (result == ncclSuccess && newcomm != nullptr) {
    remember(made, currentDevice());
    *newcomm = toNccl(made);
  }
  return result;
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  if (!checkConfig(config, "ncclCommShrink")) return ncclInvalidArgument;
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
    return refuse(ncclInvalidArgument, "ncclCommShrink: unknown shrinkFlags %d", shrinkFlags);
  }
  chorusComm_t made = nullptr;
  const ncclResult_t result =
      fromChorus(chorusCommShrink(toChorus(comm), excludeRanksList, excludeRanksCount, &made, nullptr));
  if (result == ncclSuccess && newcomm != nullptr) {
    remember(made, currentDevice());
    *newcomm = toNccl(made);
  }
  return result;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with CHORUS_DEBUG=info for details)";
    case ncclSystemError:
      return "unhandled system error (run with CHORUS_DEBUG=info for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the chorus developers";
    case ncclInvalidArgument:
      return "invalid argument (run with CHORUS_DEBUG=warn for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with CHORUS_DEBUG=warn for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return shimErrorLast ? shimError.c_str() : chorusGetLastError(toChorus(comm));
}

void ncclResetDebugInit() {}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (asyncError == nullptr) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  chorusResult_t found = chorusSuccess;
  const ncclResult_t result = fromChorus(chorusCommGetAsyncError(toChorus(comm), &found));
  if (result == ncclSuccess) *asyncError = fromChorus(found);
  return result;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return fromChorus(chorusCommCount(toChorus(comm), count));
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return fromChorus(chorusCommUserRank(toChorus(comm), rank));
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  int count = 0;
  if (const ncclResult_t result = fromChorus(chorusCommCount(toChorus(comm), &count)); result != ncclSuccess) {
    return result;
  }
  if (device == nullptr) return refuse(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  std::lock_guard<std::mutex> lock(devicesMutex);
  const auto it = devices.find(toChorus(comm));
  *device = it != devices.end() ? it->second : -1;  // -1: made where CUDA had no device
  return ncclSuccess;
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return refuse(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (currentDevice() >= 0) {
    if (cudaMalloc(ptr, size) != cudaSuccess) {
      return refuse(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc of %zu bytes failed: %s", size,
                    cudaGetErrorString(cudaGetLastError()));
    }
    return ncclSuccess;
  }
  return fromChorus(chorusMemAlloc(ptr, size));  // no device: chorus's shareable host memory
}

ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  if (chorusIsDeviceMemory(ptr)) {
    return cudaFree(ptr) == cudaSuccess ? ncclSuccess : refuse(ncclUnhandledCudaError, "ncclMemFree: cudaFree failed");
  }
  return fromChorus(chorusMemFree(ptr));
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  (void)buff;
  (void)size;
  int count = 0;
  if (const ncclResult_t result = fromChorus(chorusCommCount(toChorus(comm), &count)); result != ncclSuccess) {
    return result;
  }
  if (handle == nullptr) return refuse(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  *handle = comm;  // registration changes nothing here; any non-NULL handle serves deregistration
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  (void)handle;
  int count = 0;
  return fromChorus(chorusCommCount(toChorus(comm), &count));
}

ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int) {
  return refuse(ncclInvalidUsage, "ncclCommWindowRegister: symmetric memory windows are not supported by chorus");
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t) {
  return refuse(ncclInvalidUsage, "ncclCommWindowDeregister: symmetric memory windows are not supported by chorus");
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t) {
  return refuse(ncclInvalidUsage,
                "ncclRedOpCreatePreMulSum: custom reduction ops are not supported by chorus (scale, then ncclSum)");
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t) {
  return refuse(ncclInvalidArgument, "ncclRedOpDestroy: op %d was not made by ncclRedOpCreatePreMulSum",
                static_cast<int>(op));
}

// ---- collectives: types, ops and the stream mapped, then chorus's call ----

#define CHORUS_NCCL_TYPE(call) \
  chorusDataType_t type;       \
  if (!typeOf(datatype, &type, call)) return ncclInvalidArgument
#define CHORUS_NCCL_OP(call) \
  chorusRedOp_t redOp;       \
  if (!opOf(op, &redOp, call)) return ncclInvalidArgument
#define CHORUS_NCCL_STREAM(a, b, call) \
  chorusStream_t on;                   \
  if (!streamFor(a, b, stream, &on, call)) return ncclUnhandledCudaError

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclAllReduce");
  CHORUS_NCCL_OP("ncclAllReduce");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclAllReduce");
  return dispatch(comm, on,
                  [=] { return chorusAllReduce(sendbuff, recvbuff, count, type, redOp, toChorus(comm), on); });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclBroadcast");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclBroadcast");
  return dispatch(comm, on, [=] { return chorusBroadcast(sendbuff, recvbuff, count, type, root, toChorus(comm), on); });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclReduce");
  CHORUS_NCCL_OP("ncclReduce");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclReduce");
  return dispatch(comm, on,
                  [=] { return chorusReduce(sendbuff, recvbuff, count, type, redOp, root, toChorus(comm), on); });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclAllGather");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclAllGather");
  return dispatch(comm, on, [=] { return chorusAllGather(sendbuff, recvbuff, sendcount, type, toChorus(comm), on); });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclReduceScatter");
  CHORUS_NCCL_OP("ncclReduceScatter");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclReduceScatter");
  return dispatch(comm, on,
                  [=] { return chorusReduceScatter(sendbuff, recvbuff, recvcount, type, redOp, toChorus(comm), on); });
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclAlltoAll");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclAlltoAll");
  return dispatch(comm, on, [=] { return chorusAllToAll(sendbuff, recvbuff, count, type, toChorus(comm), on); });
}

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclGather");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclGather");
  return dispatch(comm, on, [=] { return chorusGather(sendbuff, recvbuff, count, type, root, toChorus(comm), on); });
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclScatter");
  CHORUS_NCCL_STREAM(sendbuff, recvbuff, "ncclScatter");
  return dispatch(comm, on, [=] { return chorusScatter(sendbuff, recvbuff, count, type, root, toChorus(comm), on); });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclSend");
  CHORUS_NCCL_STREAM(sendbuff, nullptr, "ncclSend");
  return dispatch(comm, on, [=] { return chorusSend(sendbuff, count, type, peer, toChorus(comm), on); });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  CHORUS_NCCL_TYPE("ncclRecv");
  CHORUS_NCCL_STREAM(nullptr, recvbuff, "ncclRecv");
  return dispatch(comm, on, [=] { return chorusRecv(recvbuff, count, type, peer, toChorus(comm), on); });
}

#undef CHORUS_NCCL_TYPE
#undef CHORUS_NCCL_OP
#undef CHORUS_NCCL_STREAM

ncclResult_t ncclGroupStart() {
  ++groupDepth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (groupDepth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd: no group was started (ncclGroupStart)");
  if (--groupDepth > 0) return ncclSuccess;
  const ncclResult_t result = runGroupCalls();
  std::vector<PendingInit> inits;
  inits.swap(pendingInits);
  for (const PendingInit& init : inits) {
    if (*init.made == nullptr) continue;
    remember(*init.made, init.device);
    *init.comm = toNccl(*init.made);
  }
  return result;
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return refuse(ncclInvalidUsage, "ncclGroupSimulateEnd: not supported by chorus (chorusPredictTime predicts a call)");
}

// ---- NCCL's profiling names (pncclX), the same functions ----

#define CHORUS_NCCL_ALIAS(name) __attribute__((alias(#name)))
ncclResult_t pncclGetVersion(int*) CHORUS_NCCL_ALIAS(ncclGetVersion);
ncclResult_t pncclGetUniqueId(ncclUniqueId*) CHORUS_NCCL_ALIAS(ncclGetUniqueId);
ncclResult_t pncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) CHORUS_NCCL_ALIAS(ncclCommInitRank);
ncclResult_t pncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)
    CHORUS_NCCL_ALIAS(ncclCommInitRankConfig);
ncclResult_t pncclCommInitRankScalable(ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*)
    CHORUS_NCCL_ALIAS(ncclCommInitRankScalable);
ncclResult_t pncclCommInitAll(ncclComm_t*, int, const int*) CHORUS_NCCL_ALIAS(ncclCommInitAll);
ncclResult_t pncclCommFinalize(ncclComm_t) CHORUS_NCCL_ALIAS(ncclCommFinalize);
ncclResult_t pncclCommDestroy(ncclComm_t) CHORUS_NCCL_ALIAS(ncclCommDestroy);
ncclResult_t pncclCommAbort(ncclComm_t) CHORUS_NCCL_ALIAS(ncclCommAbort);
ncclResult_t pncclCommRevoke(ncclComm_t, int) CHORUS_NCCL_ALIAS(ncclCommRevoke);
ncclResult_t pncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) CHORUS_NCCL_ALIAS(ncclCommSplit);
ncclResult_t pncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) CHORUS_NCCL_ALIAS(ncclCommShrink);
const char* pncclGetErrorString(ncclResult_t) CHORUS_NCCL_ALIAS(ncclGetErrorString);
const char* pncclGetLastError(ncclComm_t) CHORUS_NCCL_ALIAS(ncclGetLastError);
void pncclResetDebugInit() CHORUS_NCCL_ALIAS(ncclResetDebugInit);
ncclResult_t pncclCommGetAsyncError(ncclComm_t, ncclResult_t*) CHORUS_NCCL_ALIAS(ncclCommGetAsyncError);
ncclResult_t pncclCommCount(const ncclComm_t, int*) CHORUS_NCCL_ALIAS(ncclCommCount);
ncclResult_t pncclCommCuDevice(const ncclComm_t, int*) CHORUS_NCCL_ALIAS(ncclCommCuDevice);
ncclResult_t pncclCommUserRank(const ncclComm_t, int*) CHORUS_NCCL_ALIAS(ncclCommUserRank);
ncclResult_t pncclMemAlloc(void**, size_t) CHORUS_NCCL_ALIAS(ncclMemAlloc);
ncclResult_t pncclMemFree(void*) CHORUS_NCCL_ALIAS(ncclMemFree);
ncclResult_t pncclCommRegister(const ncclComm_t, void*, size_t, void**) CHORUS_NCCL_ALIAS(ncclCommRegister);
ncclResult_t pncclCommDeregister(const ncclComm_t, void*) CHORUS_NCCL_ALIAS(ncclCommDeregister);
ncclResult_t pncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int)
    CHORUS_NCCL_ALIAS(ncclCommWindowRegister);
ncclResult_t pncclCommWindowDeregister(ncclComm_t, ncclWindow_t) CHORUS_NCCL_ALIAS(ncclCommWindowDeregister);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t)
    CHORUS_NCCL_ALIAS(ncclRedOpCreatePreMulSum);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t, ncclComm_t) CHORUS_NCCL_ALIAS(ncclRedOpDestroy);
ncclResult_t pncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclAllReduce);
ncclResult_t pncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclBroadcast);
ncclResult_t pncclBcast(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) CHORUS_NCCL_ALIAS(ncclBcast);
ncclResult_t pncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclReduce);
ncclResult_t pncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclAllGather);
ncclResult_t pncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclReduceScatter);
ncclResult_t pncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclAlltoAll);
ncclResult_t pncclGather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclGather);
ncclResult_t pncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    CHORUS_NCCL_ALIAS(ncclScatter);
ncclResult_t pncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) CHORUS_NCCL_ALIAS(ncclSend);
ncclResult_t pncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) CHORUS_NCCL_ALIAS(ncclRecv);
ncclResult_t pncclGroupStart() CHORUS_NCCL_ALIAS(ncclGroupStart);
ncclResult_t pncclGroupEnd() CHORUS_NCCL_ALIAS(ncclGroupEnd);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) CHORUS_NCCL_ALIAS(ncclGroupSimulateEnd);
#undef CHORUS_NCCL_ALIAS

}  // extern "C"
