// peer_mpi.cc: MPI as a collbench peer: the collective of the same name on MPI_COMM_WORLD
// (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall(v), MPI_Bcast, MPI_Reduce,
// MPI_Gather, MPI_Scatter, MPI_Sendrecv, MPI_Barrier), the MPI library choosing its algorithm.
// bfloat16 and the average reduction have no MPI equivalent and are left out (N/A).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/peers.h"

namespace chorus::bench {
namespace {

// MPI_DATATYPE_NULL for types MPI lacks.
MPI_Datatype mpiType(chorusDataType_t type) {
  switch (type) {
    case chorusInt8:
      return MPI_INT8_T;
    case chorusUint8:
      return MPI_UINT8_T;
    case chorusInt32:
      return MPI_INT32_T;
    case chorusUint32:
      return MPI_UINT32_T;
    case chorusInt64:
      return MPI_INT64_T;
    case chorusUint64:
      return MPI_UINT64_T;
#ifdef MPIX_C_FLOAT16
    case chorusFloat16:
      return MPIX_C_FLOAT16;
#endif
    case chorusFloat32:
      return MPI_FLOAT;
    case chorusFloat64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

// MPI_OP_NULL for reductions MPI lacks.
MPI_Op mpiOp(chorusRedOp_t op) {
  switch (op) {
    case chorusSum:
      return MPI_SUM;
    case chorusProd:
      return MPI_PROD;
    case chorusMax:
      return MPI_MAX;
    case chorusMin:
      return MPI_MIN;
    default:
      return MPI_OP_NULL;
  }
}

class MpiPeer : public Peer {
 public:
  MpiPeer(int rank, int nranks) : rank_(rank), nranks_(nranks) {
    // Errors come back as codes, turned into exceptions that name the call, not an abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }

  const char* name() const override { return "mpi"; }

  std::vector<std::string> algorithms(const Call& call) const override {
    if (call.op == Op::kBarrier) return {""};
    // MPI counts are ints; larger calls would need derived types.
    // (An alltoallv's receive side may hold up to n times a send's: n x count x n in all.)
    const size_t whole = call.count * static_cast<size_t>(nranks_) * (call.op == Op::kAllToAllv ? nranks_ : 1);
    if (mpiType(call.type) == MPI_DATATYPE_NULL || whole > INT_MAX) return {};
    const bool reduces = infoOf(call.op).reduces != 0;
    if (reduces && mpiOp(call.redop) == MPI_OP_NULL) return {};
    return {""};
  }

  void run(const Call& call, const std::string&) override {
    const MPI_Datatype type = mpiType(call.type);
    const MPI_Op op = mpiOp(call.redop);
    const int count = static_cast<int>(call.count);
    const void* in = call.send;
    void* out = call.recv;
    int code = MPI_SUCCESS;
    switch (call.op) {
      case Op::kAllReduce:
        code = MPI_Allreduce(in, out, count, type, op, MPI_COMM_WORLD);
        break;
      case Op::kAllGather:
        code = MPI_Allgather(in, count, type, out, count, type, MPI_COMM_WORLD);
        break;
      case Op::kReduceScatter:
        code = MPI_Reduce_scatter_block(in, out, count, type, op, MPI_COMM_WORLD);
        break;
      case Op::kAllToAll:
        code = MPI_Alltoall(in, count, type, out, count, type, MPI_COMM_WORLD);
        break;
      case Op::kAllToAllv: {
        // MPI's counts and displacements are ints (algorithms() checked that the whole fits).
        std::vector<int> v(4 * static_cast<size_t>(nranks_));
        int* sc = v.data();
        int* sd = sc + nranks_;
        int* rc = sd + nranks_;
        int* rd = rc + nranks_;
        for (int r = 0; r < nranks_; ++r) {
          sc[r] = static_cast<int>(call.sendCounts[r]);
          sd[r] = static_cast<int>(call.sendDispls[r]);
          rc[r] = static_cast<int>(call.recvCounts[r]);
          rd[r] = static_cast<int>(call.recvDispls[r]);
        }
        code = MPI_Alltoallv(in, sc, sd, type, out, rc, rd, type, MPI_COMM_WORLD);
        break;
      }
      case Op::kBroadcast:
        // MPI broadcasts in place: the root's input is copied to its output first.
        if (rank_ == call.root && in != out) std::memcpy(out, in, call.count * chorusTypeSize(call.type));
        code = MPI_Bcast(out, count, type, call.root, MPI_COMM_WORLD);
        break;
      case Op::kReduce:
        code = MPI_Reduce(in, out, count, type, op, call.root, MPI_COMM_WORLD);
        break;
      case Op::kGather:
        code = MPI_Gather(in, count, type, out, count, type, call.root, MPI_COMM_WORLD);
        break;
      case Op::kScatter:
        code = MPI_Scatter(in, count, type, out, count, type, call.root, MPI_COMM_WORLD);
        break;
      case Op::kSendRecv: {
        const int next = (rank_ + 1) % nranks_;
        const int prev = (rank_ + nranks_ - 1) % nranks_;
        code = MPI_Sendrecv(in, count, type, next, 0, out, count, type, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        break;
      }
      case Op::kBarrier:
        code = MPI_Barrier(MPI_COMM_WORLD);
        break;
    }
    if (code != MPI_SUCCESS) {
      char text[MPI_MAX_ERROR_STRING] = {};
      int length = 0;
      MPI_Error_string(code, text, &length);
      throw std::runtime_error(std::string("mpi ") + call.opName + " of " + std::to_string(call.count) + " " +
                               chorusTypeName(call.type) + " failed on rank " + std::to_string(rank_) + ": " + text);
    }
  }

 private:
  int rank_;
  int nranks_;
};

}  // namespace

std::unique_ptr<Peer> makeMpiPeer(int rank, int nranks) {
  int initialized = 0, worldRank = -1, worldSize = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
    MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  }
  if (worldRank != rank || worldSize != nranks) {
    throw std::runtime_error("mpi: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                             " is not the same rank of MPI_COMM_WORLD (MPI " +
                             (initialized ? "rank " + std::to_string(worldRank) + " of " + std::to_string(worldSize)
                                          : std::string("not initialised")) +
                             "): start collbench under mpiexec, or with -g N");
  }
  return std::make_unique<MpiPeer>(rank, nranks);
}

int runWithMpi(int* argc, char*** argv, const std::function<int(chorusComm_t)>& body) {
  if (MPI_Init(argc, argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "collbench: MPI_Init failed\n");
    return 2;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Rank 0's id, or an empty one when it could not make one: every rank then stops.
  chorusUniqueId id{};
  int made = rank == 0 ? chorusGetUniqueId(&id) == chorusSuccess : 0;
  if (rank == 0 && !made) std::fprintf(stderr, "collbench: %s\n", chorusGetLastError(nullptr));
  MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  int code = 2;
  chorusComm_t comm = nullptr;
  if (made) {
    if (chorusCommInitRank(&comm, size, id, rank) == chorusSuccess) {
      code = body(comm);
    } else {
      std::fprintf(stderr, "collbench rank %d: init failed: %s\n", rank, chorusGetLastError(nullptr));
    }
  }
  MPI_Finalize();
  return code;
}

}  // namespace chorus::bench
