/* chorus.h: the C ABI of libchorus, a collective communication runtime (NCCL-shaped).
 *
 * Thread rules: a communicator may be used by one thread at a time; calls on different
 * communicators may run concurrently from different threads. chorusGetUniqueId,
 * chorusGetErrorString and chorusGetVersion may be called from any thread at any time.
 *
 * Stream rule: every collective takes a stream argument like NCCL's.
 *  - Host buffers take NULL, and the call returns when the operation is complete on this rank (its
 *    buffers may be reused). Non-blocking forms (chorusIAllReduce, ...) return a request instead,
 *    for chorusTest/chorusWait.
 *  - Device buffers (CUDA memory of the current device) take a stream (a cudaStream_t). Given
 *    NULL with a device buffer, the call takes CUDA's legacy default stream, as NCCL does (found
 *    by asking the CUDA driver about the buffers once the program has loaded it). The call is
 *    enqueued on that stream, ordered with the caller's other work on it, and returns at once;
 *    it may be captured in a CUDA graph. The first such call on a communicator is collective
 *    (every rank sets up its device path in it). Failures surface through chorusCommGetAsyncError,
 *    and every later call on the communicator, host or device, fails naming them. Ranks on one host
 * map each other's GPU memory (CUDA IPC) and the ring collectives run as one kernel; other cases go through pinned host
 * memory (CHORUS_DEVICE_TRANSPORT). A group's device calls are enqueued at chorusGroupEnd (a communicator's sends and
 * receives together, on one stream they must share), and non-blocking forms take host buffers only.
 *  - A build without CUDA, or a machine without a device, rejects a non-NULL stream with
 *    chorusInvalidArgument and touches nothing.
 *
 * Errors: every function returns a chorusResult_t. On failure, chorusGetLastError(comm) gives a
 * message naming the operation, the rank, the peer and the sizes involved. No function throws
 * or exits the process.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CHORUS_BUILDING_LIBRARY)
#define CHORUS_API __attribute__((visibility("default")))
#else
#define CHORUS_API
#endif

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
/* Version as one integer: major*10000 + minor*100 + patch. */
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)

/* Result codes. */
typedef enum {
  chorusSuccess = 0,
  chorusUnhandledCudaError = 1, /* a CUDA call failed */
  chorusSystemError = 2,        /* a system call failed (socket, shm, fork, ...) */
  chorusInternalError = 3,      /* a bug in chorus */
  chorusInvalidArgument = 4,    /* a bad pointer, count, type, op, root or peer */
  chorusInvalidUsage = 5,       /* a call in the wrong state (destroyed communicator, ...) */
  chorusRemoteError = 6,        /* a peer failed, disconnected or disagreed */
  chorusInProgress = 7,         /* reserved for non-blocking communicators */
  chorusTimeout = 8,            /* a wait ran past its timeout */
  chorusAborted = 9,            /* the communicator was aborted */
  chorusNumResults = 10
} chorusResult_t;

/* Element types. */
typedef enum {
  chorusInt8 = 0,
  chorusUint8 = 1,
  chorusInt32 = 2,
  chorusUint32 = 3,
  chorusInt64 = 4,
  chorusUint64 = 5,
  chorusFloat16 = 6,
  chorusFloat32 = 7,
  chorusFloat64 = 8,
  chorusBfloat16 = 9,
  chorusNumTypes = 10,
  /* Reserved: keeps the type 32 bits wide, so any value a C caller passes is one chorus can
   * check and reject instead of undefined behaviour. */
  chorusDataTypeForce32 = 0x7fffffff
} chorusDataType_t;

/* Reduction operations. Float16 and Bfloat16 accumulate in fp32. Avg is the sum divided by the
 * number of ranks (integer division, truncating toward zero, for integer types). Integer sums
 * and products wrap modulo 2^bits. */
typedef enum {
  chorusSum = 0,
  chorusProd = 1,
  chorusMax = 2,
  chorusMin = 3,
  chorusAvg = 4,
  chorusNumOps = 5,
  chorusRedOpForce32 = 0x7fffffff /* reserved, as chorusDataTypeForce32 */
} chorusRedOp_t;

/* A CUDA stream; the same type as cudaStream_t, so one passes with no cast. */
typedef struct CUstream_st* chorusStream_t;

/* Opaque communicator handle. */
typedef struct chorusComm* chorusComm_t;

#define CHORUS_UNIQUE_ID_BYTES 128
/* Identifies one communicator being created: the bootstrap root's address and port and a random
 * secret. Created by chorusGetUniqueId on one process and handed to every rank by any means
 * (file, MPI broadcast, ...). Treat it as a password: a process that holds it may join. */
typedef struct {
  char internal[CHORUS_UNIQUE_ID_BYTES];
} chorusUniqueId;

/* Versioned configuration for chorusCommInitRankConfig. Always start from
 * CHORUS_CONFIG_INITIALIZER, then set the fields you want. A field left at its initializer value
 * takes the environment's value or the built-in default. */
typedef struct {
  size_t size;            /* sizeof(chorusConfig_t), set by the initializer */
  unsigned int magic;     /* set by the initializer */
  unsigned int version;   /* CHORUS_VERSION_CODE, set by the initializer */
  int blocking;           /* 1: every call returns when done (the only mode in this version) */
  int timeoutMs;          /* per-operation wait limit in ms; -1: CHORUS_TIMEOUT_MS or default */
  int initTimeoutMs;      /* bootstrap wait limit in ms; -1: CHORUS_INIT_TIMEOUT_MS or default */
  const char* transport;  /* "auto", "shm", "tcp" or "ucx"; NULL: CHORUS_TRANSPORT or "auto" */
  const char* algorithms; /* overrides as CHORUS_ALGO ("allreduce:ring,allgather:bruck"); NULL: CHORUS_ALGO */
  int deterministic;      /* 1: all-reduce, reduce-scatter and reduce fold every element in rank order, so
                             their bits depend on the rank count alone; 0: not; -1: CHORUS_DETERMINISTIC */
} chorusConfig_t;

#define CHORUS_CONFIG_MAGIC 0xc405c0f1u
#define CHORUS_CONFIG_INITIALIZER \
  { sizeof(chorusConfig_t), CHORUS_CONFIG_MAGIC, CHORUS_VERSION_CODE, 1, -1, -1, NULL, NULL, -1 }

/* A communicator's live statistics (chorusCommGetStats; CHORUS_STATS, on by default): per
 * collective and size bucket (bytes of the call's count, at most 1 KiB, 64 KiB, 1 MiB, 16 MiB,
 * 256 MiB, more) the calls, failed calls, bytes, seconds from submit to completion and the
 * algorithms that ran them; per peer the bytes and messages each way and the seconds this rank was
 * blocked on a step with that peer; and a straggler hint, the peer it waited on longest. */
#define CHORUS_STATS_JSON 0
#define CHORUS_STATS_PROMETHEUS 1

/* Writes the library version (CHORUS_VERSION_CODE form) to *version. Any thread. */
CHORUS_API chorusResult_t chorusGetVersion(int* version);

/* The cost model the runtime's tuner picks algorithms with, for planning (chorus-plan uses it):
 * chorusPredictTime writes the predicted time in microseconds of one call of `collective` over
 * nranks ranks on links described by *link, with the algorithm the model finds fastest. bytes
 * as the collective's user sees them: the buffer for all-reduce, broadcast and reduce; the whole
 * nranks-block buffer for all-gather, reduce-scatter and all-to-all; the message for send. Any
 * thread; no communicator needed. */
typedef enum {
  chorusCollAllReduce = 0,
  chorusCollAllGather = 1,
  chorusCollReduceScatter = 2,
  chorusCollBroadcast = 3,
  chorusCollReduce = 4,
  chorusCollAllToAll = 5,
  chorusCollSend = 6,
  chorusCollRecv = 7,
  chorusCollBarrier = 8,
  chorusCollAllToAllv = 9,
  chorusCollGather = 10,
  chorusCollScatter = 11,
  /* Makes the type 32 bits wide, so that an out-of-range value from a caller is one the library
   * can check and reject instead of undefined behaviour. */
  chorusCollectiveForce32 = 0x7fffffff
} chorusCollective_t;
typedef struct {
  int hosts;                 /* hosts the ranks are spread over (1: one) */
  double alphaUs;            /* a message's latency: between hosts, or within the one host */
  double bandwidthGBps;      /* per direction: between hosts, or within the one host */
  double localAlphaUs;       /* within a host, when hosts > 1 */
  double localBandwidthGBps; /* within a host, when hosts > 1 */
  double reduceGBps;         /* reduction throughput of a rank */
} chorusLinkModel_t;
CHORUS_API chorusResult_t chorusPredictTime(chorusCollective_t collective, int nranks, size_t bytes,
                                            const chorusLinkModel_t* link, double* microseconds);

/* What a collective is, for programs that size and check its buffers (collbench does):
 * chorusGetCollectiveInfo fills *info for one call of `collective` with `count` (the count its
 * entry point takes) on nranks ranks. Input and output are of a rank that has them: only the
 * root's input is read where inputAtRootOnly (broadcast, scatter), only the root's output written
 * where outputAtRootOnly (reduce, gather). All-to-allv's come with the call: 0 here. Any thread;
 * no communicator needed. chorusPredictTime predicts the collectives up to chorusCollSend. */
typedef struct {
  const char* name;      /* as CHORUS_ALGO spells it: "allreduce" */
  int reduces;           /* takes a reduction operator */
  int rooted;            /* has a root (broadcast, reduce, gather, scatter) */
  int pointToPoint;      /* has a peer (send, recv) */
  int inPlace;           /* sendbuff and recvbuff may be one buffer */
  int inputAtRootOnly;   /* broadcast, scatter */
  int outputAtRootOnly;  /* reduce, gather */
  size_t inputElements;  /* of a rank's sendbuff */
  size_t outputElements; /* of a rank's recvbuff */
  size_t wholeElements;  /* the size nccl-tests reports: the buffer, or all nranks blocks of it */
} chorusCollectiveInfo_t;
CHORUS_API chorusResult_t chorusGetCollectiveInfo(chorusCollective_t collective, int nranks, size_t count,
                                                  chorusCollectiveInfo_t* info);

/* Returns a static string naming a result code. Any thread. */
CHORUS_API const char* chorusGetErrorString(chorusResult_t result);

/* Returns the message of the last error on this thread for comm (or for calls that had no
 * communicator yet, such as init, when comm is NULL). The string stays valid until the next
 * chorus call on this thread. Never NULL. */
CHORUS_API const char* chorusGetLastError(chorusComm_t comm);

/* Creates a unique id and starts the bootstrap root in the calling process: a background thread
 * that listens on CHORUS_BOOTSTRAP_ADDR (default: this host's first non-loopback IPv4 address,
 * else 127.0.0.1) and a free port, until all ranks of the communicator have met or the init
 * timeout passes. Call once per communicator, on one process. Errors: chorusSystemError when
 * no socket can be opened. */
CHORUS_API chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId);

/* Creates a communicator of nranks ranks; this process is `rank`. Every rank calls it with the
 * same id and nranks; it returns when all have met and every connection is up. Blocking and
 * collective. Inside a group (chorusGroupStart), it checks its arguments, sets *comm to NULL and
 * returns; the group's inits are made together at chorusGroupEnd (each on a thread of its own,
 * so one thread may init several ranks of a job, as with NCCL), before the group's calls, and
 * *comm is set then; none is made if a call of the group failed its checks. Errors: chorusInvalidArgument (rank out of
 * [0, nranks), nranks < 1, bad id), chorusTimeout (ranks missing after the init timeout: the message lists them),
 * chorusRemoteError (a rank disagrees on nranks or secret), chorusSystemError. */
CHORUS_API chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId uniqueId, int rank);

/* As chorusCommInitRank, with a configuration (NULL: defaults). Errors as chorusCommInitRank,
 * plus chorusInvalidArgument for a config whose size, magic or version is wrong. */
CHORUS_API chorusResult_t chorusCommInitRankConfig(chorusComm_t* comm, int nranks, chorusUniqueId uniqueId, int rank,
                                                   const chorusConfig_t* config);

/* Creates a communicator from the environment, in the first way that applies:
 *  1. torchrun style: CHORUS_RANK / RANK, CHORUS_WORLD_SIZE / WORLD_SIZE, CHORUS_MASTER_ADDR /
 *     MASTER_ADDR, CHORUS_MASTER_PORT / MASTER_PORT (CHORUS_ spellings win). Rank 0 hosts the
 *     bootstrap root on MASTER_PORT. CHORUS_SECRET, if set, must match on every rank.
 *  2. Under MPICH's mpiexec (PMI_RANK, PMI_SIZE, PMI_FD): rank 0 creates a unique id and hands
 *     it to the others through the process manager's key-value space (also srun --mpi=pmi2).
 *  3. A task of Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST): the
 *     step's first node hosts the bootstrap root (MASTER_ADDR overrides it) on CHORUS_MASTER_PORT
 *     / MASTER_PORT, else on a port derived from SLURM_JOB_ID and SLURM_STEP_ID.
 * Blocking and collective. Errors: chorusInvalidArgument when none is present or a value is
 * malformed (the message names the variable), and those of chorusCommInitRank. */
CHORUS_API chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm, const chorusConfig_t* config);

/* Destroys a communicator: waits for its non-blocking operations still in flight (within the
 * timeout; blocking calls are complete when they return), closes connections, frees memory. The handle is invalid
 * afterwards; a later call with it returns chorusInvalidUsage. Not collective. */
CHORUS_API chorusResult_t chorusCommDestroy(chorusComm_t comm);

/* The communicator's statistics since it was made, as text in `format` (CHORUS_STATS_JSON or
 * CHORUS_STATS_PROMETHEUS, the Prometheus text exposition format). *size is the capacity of text
 * in bytes; on return it is the bytes the whole text needs, its terminating NUL included. text may be
 * NULL to ask the size. Errors: chorusInvalidArgument (an unknown format, size NULL, or text too
 * small: nothing written), chorusInvalidUsage (CHORUS_STATS=0). Not while another thread uses comm. */
CHORUS_API chorusResult_t chorusCommGetStats(chorusComm_t comm, int format, char* text, size_t* size);

/* Progresses the communicator's operations in flight without blocking, then sets *asyncError to
 * chorusSuccess, or to the result of the failure that ended the communicator (an earlier call's,
 * or one found now in a non-blocking operation: a peer that disagreed or disconnected, ...), whose
 * message chorusGetLastError then gives. The way to watch for a failure while non-blocking
 * operations run. Not collective. Errors:
 * chorusInvalidArgument when asyncError is NULL. */
CHORUS_API chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError);

/* Prints this rank's state of the communicator to stderr, each line prefixed "chorus rank R: ":
 * whether it has failed (and why), every pending operation with how far it has come and the step
 * it waits on (a send or receive with which rank, and whether that rank has reached the
 * operation), and what each peer link has moved. For hangs: with CHORUS_DUMP_SIGNAL=1, SIGUSR1
 * makes a waiting call print the same. Not collective; from the thread that uses comm. */
CHORUS_API chorusResult_t chorusCommDumpState(chorusComm_t comm);

/* Marks the communicator aborted and frees the handle without waiting for peers: the way out
 * after an error, a timeout or a hang. Safe from any thread: a call blocked on this communicator
 * in another thread (and every non-blocking operation in flight) returns chorusAborted within a
 * second, and the communicator's resources go when the last such call has returned. The peers are
 * told, and their calls on the communicator fail at once with chorusRemoteError naming this rank.
 * Not collective. The handle is invalid afterwards (later calls: chorusInvalidUsage). */
CHORUS_API chorusResult_t chorusCommAbort(chorusComm_t comm);

/* Makes a communicator of comm's ranks less the excludeCount ranks in excludeRanks, numbered in
 * comm's order (the new rank is the number of remaining ranks before it). Collective over the
 * remaining ranks only: the excluded do not call it. It works on a communicator that has failed,
 * so a job goes on without a dead rank (elastic continuation): every survivor calls it with the
 * dead rank(s) excluded, then uses *newcomm; comm itself stays failed (abort or destroy it). config
 * as for chorusCommInitRankConfig (NULL: comm's settings). Blocking, bounded by the init timeout.
 * Errors: chorusInvalidArgument (a rank out of range, this rank excluded, NULL pointers),
 * chorusInvalidUsage (the remaining ranks excluded different ranks), chorusTimeout (a remaining
 * rank did not come). */
CHORUS_API chorusResult_t chorusCommShrink(chorusComm_t comm, const int* excludeRanks, int excludeCount,
                                           chorusComm_t* newcomm, const chorusConfig_t* config);

/* A fresh unique id for growing comm (chorusCommGrow), as ncclCommGetUniqueId: made on one rank
 * of comm, whose process then runs the id's meeting point until the grown communicator is made,
 * and handed to comm's other ranks (a chorusBroadcast of its bytes, say) and to the new ranks out
 * of band. Not collective. Errors: chorusInvalidArgument (NULL uniqueId). */
CHORUS_API chorusResult_t chorusCommGetUniqueId(chorusComm_t comm, chorusUniqueId* uniqueId);

/* Grows comm by new ranks, as ncclCommGrow: a communicator of nranks ranks, made with an id from
 * chorusCommGetUniqueId(comm). Collective over comm's ranks and the new ones: each rank of comm
 * passes comm and rank -1 and keeps its number; each new rank passes comm NULL and its rank, from
 * comm's rank count to nranks - 1. comm itself stays as it was (destroy it once the grown one is
 * made). With chorusCommShrink this is the elastic cycle: lose a rank, shrink, grow back. config as
 * for chorusCommInitRankConfig (NULL: comm's settings on its ranks, the environment's on new ones).
 * Blocking, bounded by the init timeout. Errors: chorusInvalidArgument (nranks not above comm's
 * rank count, rank not -1 with a comm, a new rank's number outside [comm's count, nranks), an id
 * that is not a grow id or was made by another communicator, NULL pointers), chorusInvalidUsage (a
 * rank that did not come from comm holding one of comm's numbers: every rank fails naming it),
 * chorusTimeout (a rank did not come). */
CHORUS_API chorusResult_t chorusCommGrow(chorusComm_t comm, int nranks, const chorusUniqueId* uniqueId, int rank,
                                         chorusComm_t* newcomm, const chorusConfig_t* config);

/* Passed as color to chorusCommSplit by a rank that joins no new communicator. */
#define CHORUS_SPLIT_NOCOLOR (-1)

/* Splits comm as ncclCommSplit / MPI_Comm_split: the ranks that pass the same color (>= 0) make one
 * new communicator each, numbered by key (ties: by rank in comm). A rank that passes
 * CHORUS_SPLIT_NOCOLOR gets *newcomm = NULL. Collective over every rank of comm, outside a group,
 * after comm's earlier calls; comm stays usable. config as for chorusCommInitRankConfig (NULL:
 * comm's settings). The way to build groups such as a device mesh's (data, tensor, pipeline and
 * context parallel): one call per dimension. Errors: chorusInvalidArgument (NULL newcomm; a color
 * below 0 other than CHORUS_SPLIT_NOCOLOR on any rank: every rank fails, naming that rank),
 * chorusInvalidUsage (inside a group), and those of a collective and of chorusCommInitRank. */
CHORUS_API chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm,
                                          const chorusConfig_t* config);

/* Sets which algorithm later calls of each named collective use on this communicator, in
 * CHORUS_ALGO's syntax: "allreduce:rabenseifner,allgather:bruck"; a collective not named keeps
 * its setting, and "allreduce:default" returns it to the library's choice. Every rank must set
 * the same, between the same calls. Algorithms: allreduce ring tree recursive_doubling
 * rabenseifner hierarchical direct; allgather ring recursive_doubling bruck hierarchical;
 * reducescatter ring recursive_halving hierarchical direct; broadcast chain binomial
 * scatter_allgather hierarchical; reduce chain binomial reducescatter_gather hierarchical
 * (hierarchical: for ranks on several hosts; direct: for blocking calls outside a group among
 * ranks all on shm, on chorusMemAlloc buffers, else the library's choice);
 * alltoall pairwise bruck; alltoallv pairwise; gather binomial; scatter binomial; barrier
 * dissemination. On device buffers (calls with a stream): direct (ranks sharing one GPU; every
 * collective but alltoallv, send, recv and barrier), ipc (the ring kernel; allreduce, allgather,
 * reducescatter, broadcast, reduce) and staged (every collective), each used where it can run,
 * else the device engine's choice; direct applies to both. Errors: chorusInvalidArgument naming an entry that is
 * malformed or names an algorithm the collective does not have (nothing is changed then); chorusInvalidUsage. */
CHORUS_API chorusResult_t chorusCommSetAlgorithms(chorusComm_t comm, const char* algorithms);

/* The algorithms of a collective ("allreduce", "alltoall", ...), comma-separated, default first,
 * e.g. "ring,tree,recursive_doubling,rabenseifner,hierarchical,direct", on host buffers; NULL for an
 * unknown collective. Static string; any thread. */
CHORUS_API const char* chorusAlgorithmNames(const char* collective);

/* Writes the number of ranks / this process's rank. Errors: chorusInvalidUsage for a handle that
 * is not live, chorusInvalidArgument for a NULL output pointer. */
CHORUS_API chorusResult_t chorusCommCount(const chorusComm_t comm, int* count);
CHORUS_API chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank);

/* 1 when ptr points into CUDA device memory (cudaMalloc, cudaMallocManaged, ...), else 0: host
 * memory, NULL, a program that has not loaded the CUDA driver, or a build without CUDA. Asks the
 * driver (no CUDA start-up of its own). Any thread. */
CHORUS_API int chorusIsDeviceMemory(const void* ptr);

/* Collectives. Common rules:
 *  - count is in elements of datatype; count 0 is valid and moves nothing (buffers may be NULL).
 *  - Every rank of the communicator calls the same collective with the same count, datatype, op
 *    and root, in the same order.
 *  - Buffers must not overlap other than in the in-place form each call names.
 *  - stream: NULL for host buffers (the call returns when this rank's part is complete), or a
 *    CUDA stream for device buffers (enqueued; see the stream rule above).
 *  - Errors: chorusInvalidArgument for a NULL buffer with count > 0, a count whose byte size
 *    overflows, an unknown datatype or op, a root or peer out of range, a stream with host
 *    buffers (or without CUDA);
 *    chorusInvalidUsage for a handle that is not live; chorusRemoteError / chorusTimeout when a
 *    peer fails or stalls. On an argument error nothing is sent and no buffer is written. */

/* recvbuff[i] = op over ranks of sendbuff[i], on every rank. In place: sendbuff == recvbuff. */
CHORUS_API chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                          chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream);

/* recvbuff[r*sendcount + i] = sendbuff of rank r [i]. recvbuff holds nranks*sendcount elements.
 * In place: sendbuff == recvbuff + rank*sendcount. */
CHORUS_API chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream);

/* recvbuff[i] = op over ranks r of sendbuff_r[rank*recvcount + i]. sendbuff holds
 * nranks*recvcount elements. In place: recvbuff == sendbuff + rank*recvcount. */
CHORUS_API chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                              chorusStream_t stream);

/* Copies root's sendbuff into every rank's recvbuff (root's too). sendbuff is read on root only.
 * In place: sendbuff == recvbuff on root. */
CHORUS_API chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                          int root, chorusComm_t comm, chorusStream_t stream);

/* recvbuff on root = op over ranks of sendbuff. recvbuff is written on root only (it may be
 * NULL elsewhere). In place: sendbuff == recvbuff on root. */
CHORUS_API chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                       chorusRedOp_t op, int root, chorusComm_t comm, chorusStream_t stream);

/* All-to-all: rank r's block j (count elements at sendbuff + j*count) lands in rank j's block r
 * (recvbuff + r*count). Both buffers hold nranks*count elements and must not overlap (no in-place
 * form). */
CHORUS_API chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                         chorusComm_t comm, chorusStream_t stream);

/* All-to-all with per-peer sizes: sendcounts[j] elements at sendbuff + sdispls[j] go to rank j,
 * which receives them as recvcounts[r] elements at recvbuff + rdispls[r] (counts and
 * displacements in elements; the arrays have nranks entries; each pair must agree on its
 * count). Buffers must not overlap. */
CHORUS_API chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                                          void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                                          chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream);

/* Gather: root's recvbuff[r*sendcount + i] = rank r's sendbuff[i]. recvbuff is read on root only
 * (may be NULL elsewhere). In place on root: sendbuff == recvbuff + root*sendcount. */
CHORUS_API chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       chorusDataType_t datatype, int root, chorusComm_t comm, chorusStream_t stream);

/* Scatter: rank r's recvbuff[i] = root's sendbuff[r*recvcount + i]. sendbuff is read on root only.
 * In place on root: recvbuff == sendbuff + root*recvcount. */
CHORUS_API chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        chorusDataType_t datatype, int root, chorusComm_t comm, chorusStream_t stream);

/* Point to point. Messages between a pair of ranks match in the order they were posted; a send
 * and its recv must agree on count and datatype (a mismatch is an error on both sides).
 * Outside a group, each call returns when its buffer may be reused; two ranks that both send
 * first exchange safely only inside a group. peer may equal the caller's rank. */
CHORUS_API chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                                     chorusComm_t comm, chorusStream_t stream);
CHORUS_API chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                                     chorusComm_t comm, chorusStream_t stream);

/* Groups: calls between chorusGroupStart and chorusGroupEnd are collected on this thread and run
 * together at chorusGroupEnd, each rank posting all of them before waiting for any. Calls in a
 * group return chorusSuccess after validating their arguments; their buffers must stay valid
 * until chorusGroupEnd returns (device buffers: until their stream has run them). Groups nest
 * (only the outermost end runs them). A group may span communicators: one thread may drive
 * several ranks of a job, one communicator each, as NCCL's groups allow. Errors at
 * chorusGroupEnd: those of the collected calls; chorusInvalidUsage for chorusGroupEnd without a
 * start, or one communicator's device sends and receives on two streams. */
CHORUS_API chorusResult_t chorusGroupStart(void);
CHORUS_API chorusResult_t chorusGroupEnd(void);

/* Returns when every rank has entered the barrier. Errors: chorusInvalidUsage,
 * chorusRemoteError, chorusTimeout. */
CHORUS_API chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream);

/* Non-blocking operations (host memory), MPI style: each I-call validates its arguments as the
 * blocking call of the same name does, starts the operation and returns at once with a request
 * in *request (NULL on error). Many may be in flight on one communicator, mixed with blocking
 * calls; every rank must start the same collectives in the same order, as with blocking calls.
 * The buffers of a started operation must stay valid, and its send buffer unchanged, until
 * chorusTest reports it done or chorusWait returns. Operations progress inside chorus calls on
 * their communicator (test, wait, or any other call): a rank that computes between calls should
 * test now and then. An in-flight operation whose buffers overlap an earlier one's waits for it.
 * Not allowed inside a group (chorusInvalidUsage). Destroying a communicator first waits for its
 * operations (within the timeout); aborting ends them with chorusAborted. A request belongs to
 * its communicator's thread rule. chorusISend and chorusIRecv to oneself need no group. */
typedef struct chorusRequest* chorusRequest_t;
CHORUS_API chorusResult_t chorusIAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                           chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                           chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                           chorusDataType_t datatype, chorusComm_t comm, chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                               chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                               chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                           chorusDataType_t datatype, int root, chorusComm_t comm,
                                           chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                        chorusRedOp_t op, int root, chorusComm_t comm, chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                          chorusComm_t comm, chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                                           void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                                           chorusDataType_t datatype, chorusComm_t comm, chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        chorusDataType_t datatype, int root, chorusComm_t comm,
                                        chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         chorusDataType_t datatype, int root, chorusComm_t comm,
                                         chorusRequest_t* request);
CHORUS_API chorusResult_t chorusISend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                                      chorusComm_t comm, chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                                      chorusComm_t comm, chorusRequest_t* request);
CHORUS_API chorusResult_t chorusIBarrier(chorusComm_t comm, chorusRequest_t* request);

/* Progresses the request's communicator without blocking. *done = 1 when the operation is
 * complete: the request is then freed, *request set to NULL, and the result is the operation's
 * (chorusSuccess, or the error that ended it). *done = 0 and chorusSuccess while it runs. A NULL
 * *request counts as complete. Errors: chorusInvalidArgument (NULL pointers), chorusInvalidUsage
 * (a handle already completed), and the operation's errors. */
CHORUS_API chorusResult_t chorusTest(chorusRequest_t* request, int* done);
/* Blocks until the operation is complete (bounded by the timeout), then as chorusTest with done. */
CHORUS_API chorusResult_t chorusWait(chorusRequest_t* request);
/* chorusWait on each of count requests, all of them even after an error; returns the first error. */
CHORUS_API chorusResult_t chorusWaitAll(int count, chorusRequest_t* requests);

/* What this rank has sent on comm's links since the communicator was made: bytes as the
 * transports put them on the wire (payload plus their headers and framing; a message to oneself
 * crosses no link and counts nothing) and messages, device calls staged through host memory
 * included (device-to-device paths cross no host link and count nothing). The difference across a call is what that call
 * sent. Not collective. Errors: chorusInvalidArgument (NULL traffic), chorusInvalidUsage. */
typedef struct {
  uint64_t bytesSent;
  uint64_t messagesSent;
} chorusTraffic_t;
CHORUS_API chorusResult_t chorusCommGetTraffic(chorusComm_t comm, chorusTraffic_t* traffic);

/* Compressed all-reduce (gradient compression). A compressor holds the persistent state of the
 * compressed all-reduces of one buffer of fp32 tensors laid back to back (error-feedback memory,
 * PowerSGD's Q for its warm start, the call count that seeds draws shared by the ranks). spec
 * chooses the compressor and its parameters, "name[:param][,key=value...]":
 *   none          the fp32 sum, for comparison
 *   fp16, bf16    x/n rounded to 16 bits; each 1/n shard summed in fp32 by one rank, rounded once
 *                 and all-gathered (two roundings however many ranks)
 *   qsgd:s        s-level stochastic quantization (QSGD; 1 <= s <= 127; default 15), both hops
 *   sign          scaled sign, 1 bit per element and a scale per 1024, with error feedback
 *   topk:f        the fraction f of each tensor's largest entries, with error feedback; values and
 *                 indices all-gathered (bytes grow with the ranks)
 *   randomk:f     f of each tensor's entries at indices drawn alike from a shared seed, summed,
 *                 with error feedback
 *   powersgd:r    rank-r PowerSGD with warm start and error feedback; tensors with rows <= 1, and
 *                 those r (rows + cols) * min_rate > rows * cols, go whole, in bf16 as bf16 sends
 *                 them (whole=fp32: summed in fp32; whole=fp16) (default r 4)
 * keys: rank=, ratio=, levels=, ef=0|1 (error feedback), warm=0|1, seed=, min_rate= (default 2),
 * whole=bf16|fp16|fp32.
 * NULL spec: CHORUS_COMPRESS, else "none". tensors gives each tensor's element count, and rows its
 * first dimension (PowerSGD views it as rows x count/rows; NULL rows, or 0 or 1: a vector). Every
 * rank creates the compressor alike. Not collective (no message). The compressor is used with
 * communicators of comm's size. Errors: chorusInvalidArgument (a bad spec, counts, rows that do
 * not divide a count), chorusInvalidUsage. */
typedef struct chorusCompressor* chorusCompressor_t;
CHORUS_API chorusResult_t chorusCompressorCreate(chorusComm_t comm, const char* spec, int ntensors,
                                                 const size_t* counts, const size_t* rows,
                                                 chorusCompressor_t* compressor);
CHORUS_API chorusResult_t chorusCompressorDestroy(chorusCompressor_t compressor);

/* recvbuff = the sum (chorusSum) or mean (chorusAvg) over ranks of sendbuff, compressed by
 * compressor: every rank gets the same bits. count must be the compressor's total and datatype
 * chorusFloat32; in place: sendbuff == recvbuff. Blocking and collective, as chorusAllReduce (a
 * compressed all-reduce runs several collectives with local compute between them); no group and
 * no non-blocking form: to overlap it with compute, call it from another thread. Device buffers
 * take a stream, as the other collectives: the call is enqueued and staged through host memory
 * (the compressor runs on the host, on the communicator's proxy thread), and the compressor must
 * not be used otherwise until the stream has run it. Errors: those of chorusAllReduce, and
 * chorusInvalidArgument for a count or size that is not the compressor's. */
CHORUS_API chorusResult_t chorusCompressedAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                                    chorusDataType_t datatype, chorusRedOp_t op,
                                                    chorusCompressor_t compressor, chorusComm_t comm,
                                                    chorusStream_t stream);

/* What a compressor does: its spec written out in full, the payload bytes each call sends from
 * this rank by formula (what transports add is not in it: chorusCommGetTraffic counts that), the
 * compression ratio (fp32 all-reduce payload over this payload), the calls made. */
typedef struct {
  char spec[96];
  uint64_t payloadBytes;
  double ratio;
  uint64_t calls;
  size_t count;
} chorusCompressorInfo_t;
CHORUS_API chorusResult_t chorusCompressorGetInfo(chorusCompressor_t compressor, chorusCompressorInfo_t* info);

/* The error-feedback state after the last call, count floats each (either pointer may be NULL):
 * error, the memory carried to the next call (zero without error feedback), and contribution,
 * what this rank's compressed data stood for before the exchange. Error feedback conserves
 * sendbuff + the previous error = contribution + error; the result is the sum (or mean) of the
 * ranks' contributions, up to the rounding of the second hop where there is one. */
CHORUS_API chorusResult_t chorusCompressorGetResidual(chorusCompressor_t compressor, float* error, float* contribution,
                                                      size_t count);
/* The second hop's error-feedback memory (sign with error feedback: each rank owns a shard of the
 * sum, adds its memory to the shard's sum before encoding it again, and keeps what that encoding
 * dropped): count floats, this rank's memory on the elements of its shard, zero elsewhere (all
 * zero for compressors without a second hop's feedback), so the ranks' arrays add up to the whole
 * memory. It conserves the shard's mean of contributions + the previous memory = the result +
 * memory (with chorusAvg; chorusSum's result is n times the mean). */
CHORUS_API chorusResult_t chorusCompressorGetOwnerResidual(chorusCompressor_t compressor, float* error, size_t count);

/* Host memory that the ranks on one host can map (as ncclMemAlloc): collectives on buffers inside
 * such allocations move each shared-memory message with one copy, read by the receiver straight
 * from the sender's pages (any buffer works everywhere; these are faster for large messages). A
 * blocking all-reduce whose input and output lie in such allocations on every rank of a host goes
 * direct: each rank reduces its share of the elements from every rank's input into every rank's
 * output (CHORUS_SHM_DIRECT_BYTES).
 * *ptr is page-aligned and zeroed. chorusMemFree takes exactly a pointer chorusMemAlloc returned,
 * after the operations using it have completed. Errors: chorusInvalidArgument (NULL ptr, size 0,
 * a pointer not from chorusMemAlloc), chorusSystemError (no memory). */
CHORUS_API chorusResult_t chorusMemAlloc(void** ptr, size_t size);
CHORUS_API chorusResult_t chorusMemFree(void* ptr);

/* Helpers: size in bytes of one element, and the name of a type or op ("float32", "sum"). */
CHORUS_API size_t chorusTypeSize(chorusDataType_t datatype);
CHORUS_API const char* chorusTypeName(chorusDataType_t datatype);
CHORUS_API const char* chorusOpName(chorusRedOp_t op);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_CHORUS_H_ */
