// peers.h: the other collective libraries collbench times beside chorus (--compare): Gloo over
// its tcp transport and MPI (the MPICH collective of the same name), on the buffers collbench
// filled for chorus, so their results are checked against the same closed-form values.
#pragma once

#include <chorus/chorus.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace chorus::bench {

enum class Op {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kSendRecv,
  kAllToAll,
  kAllToAllv,
  kGather,
  kScatter,
  kBarrier
};

// What an op is, from the library (chorusGetCollectiveInfo) for `count` on nranks ranks: a
// sendrecv is a send whose rank also receives count elements.
chorusCollectiveInfo_t infoOf(Op op, int nranks = 1, size_t count = 0);

// One call as collbench makes it of chorus (out of place): count elements per rank, buffers
// sized as for chorus (see Bench::fillInputs), root for rooted ops. An alltoallv's counts and
// displacements (elements, one per rank) are given with it; null for the other ops.
struct Call {
  Op op = Op::kAllReduce;
  const char* opName = "";
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  chorusDataType_t type = chorusFloat32;
  chorusRedOp_t redop = chorusSum;
  int root = 0;
  const size_t* sendCounts = nullptr;
  const size_t* sendDispls = nullptr;
  const size_t* recvCounts = nullptr;
  const size_t* recvDispls = nullptr;
};

class Peer {
 public:
  virtual ~Peer() = default;
  virtual const char* name() const = 0;
  // The peer's algorithms for this call, each timed, the fastest reported ("" where the peer has
  // one); empty where it cannot make the call (an op, type or reduction it lacks).
  virtual std::vector<std::string> algorithms(const Call& call) const = 0;
  // Makes the call with one of algorithms(call); throws std::runtime_error naming the peer, the
  // rank and the op when the peer fails.
  virtual void run(const Call& call, const std::string& algorithm) = 0;
};

// Gloo over tcp, its ranks meeting through a file store in storeDir (a directory every rank can
// reach, empty, made for this run). Throws std::runtime_error when the mesh cannot be built.
std::unique_ptr<Peer> makeGlooPeer(int rank, int nranks, const std::string& storeDir);

// MPI on MPI_COMM_WORLD, which must hold the same ranks in the same order: throws
// std::runtime_error when MPI is not initialised or its world differs (runWithMpi makes it so).
std::unique_ptr<Peer> makeMpiPeer(int rank, int nranks);

// For a process mpiexec started: initialises MPI, starts a chorus communicator of the same ranks
// in the same order (rank 0's unique id broadcast over MPI_COMM_WORLD), runs body on it and
// finalises MPI. body's exit code, or 2 when MPI or chorus cannot start (the reason on stderr).
int runWithMpi(int* argc, char*** argv, const std::function<int(chorusComm_t)>& body);

}  // namespace chorus::bench
