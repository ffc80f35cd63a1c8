// nccl_device_program.cc: a plain NCCL program, written against NCCL's own nccl.h and the CUDA
// runtime and nothing of chorus, as users write them: N processes (forked; rank 0 makes the unique
// id and hands it to the others through a pipe), each on GPU rank % GPUs with cudaMalloc'd
// buffers and a stream of its own, calling all-reduce, all-gather, broadcast and reduce-scatter
// at counts from 7 to 16,777,216 and checking every element against its closed form. Linked to
// libchorus_nccl only, it runs on chorus's device path.
//
//   nccl_device_program [ranks]      exit 0: every element right; 1: a wrong one or a failed call;
//                                    77: no CUDA device here
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                              \
  do {                                                                                                \
    const cudaError_t e = (call);                                                                     \
    if (e != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e));                 \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)
#define CHECK_NCCL(call)                                                                              \
  do {                                                                                                \
    const ncclResult_t r = (call);                                                                    \
    if (r != ncclSuccess) {                                                                           \
      std::fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #call, ncclGetErrorString(r), ncclGetLastError(comm)); \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)

// Small integers, exact in float at every count used here.
float input(int rank, size_t i) { return static_cast<float>((rank + 1) * 3 + static_cast<int>(i % 251)); }

int wrongOf(const std::vector<float>& got, size_t count, float (*expect)(size_t, int, int), int rank, int n,
            const char* what) {
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    if (got[i] != expect(i, rank, n)) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong > 0) {
    std::fprintf(stderr, "rank %d: %s count %zu: %zu wrong, first at %zu: %g, expected %g\n", rank, what, count, wrong,
                 first, static_cast<double>(got[first]), static_cast<double>(expect(first, rank, n)));
  }
  return wrong > 0 ? 1 : 0;
}

int runRank(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm = nullptr;
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  CHECK_CUDA(cudaSetDevice(rank % devices));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_NCCL(ncclCommInitRank(&comm, n, id, rank));
  int failed = 0;
  for (const size_t count : {size_t{7}, size_t{1000}, size_t{65537}, size_t{1} << 20, size_t{16777216}}) {
    float *send = nullptr, *recv = nullptr;
    CHECK_CUDA(cudaMalloc(&send, count * n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&recv, count * n * sizeof(float)));
    std::vector<float> host(count * n);
    for (size_t i = 0; i < host.size(); ++i) host[i] = input(rank, i);
    // Landed before the stream reads it: a plain cudaMemcpy may return before its copy has (on
    // the legacy stream, which a non-blocking stream does not wait for).
    CHECK_CUDA(cudaMemcpy(send, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    std::vector<float> got(count * n);
    // All-reduce: the sum over ranks of input(r, i).
    CHECK_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(got.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost));
    failed |= wrongOf(
        got, count,
        [](size_t i, int, int ranks) {
          float s = 0;
          for (int r = 0; r < ranks; ++r) s += input(r, i);
          return s;
        },
        rank, n, "all-reduce");
    // All-gather: block r is rank r's first count elements.
    CHECK_NCCL(ncclAllGather(send, recv, count, ncclFloat, comm, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(got.data(), recv, count * n * sizeof(float), cudaMemcpyDeviceToHost));
    static size_t blockCount;
    blockCount = count;
    failed |= wrongOf(
        got, count * n,
        [](size_t i, int, int) { return input(static_cast<int>(i / blockCount), i % blockCount); }, rank, n,
        "all-gather");
    // Broadcast from the last rank, in place.
    CHECK_CUDA(cudaMemcpyAsync(recv, send, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    CHECK_NCCL(ncclBroadcast(recv, recv, count, ncclFloat, n - 1, comm, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(got.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost));
    failed |= wrongOf(
        got, count, [](size_t i, int, int ranks) { return input(ranks - 1, i); }, rank, n, "broadcast");
    // Reduce-scatter: rank r gets the sum of every rank's block r.
    CHECK_NCCL(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(got.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost));
    failed |= wrongOf(
        got, count,
        [](size_t i, int me, int ranks) {
          float s = 0;
          for (int r = 0; r < ranks; ++r) s += input(r, me * blockCount + i);
          return s;
        },
        rank, n, "reduce-scatter");
    cudaFree(send);
    cudaFree(recv);
  }
  CHECK_NCCL(ncclCommDestroy(comm));
  cudaStreamDestroy(stream);
  return failed;
}

// Whether a CUDA device can be used, asked in a child so this process leaves CUDA untouched.
bool haveDevice() {
  const pid_t pid = fork();
  if (pid == 0) {
    int count = 0;
    _exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  if (!haveDevice()) {
    std::printf("SKIPPED: needs a CUDA device; run on a GPU machine\n");
    return 77;
  }
  std::vector<int> pipes(static_cast<size_t>(2 * n));
  for (int r = 0; r < n; ++r) {
    if (pipe(&pipes[static_cast<size_t>(2 * r)]) != 0) return 1;
  }
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      ncclUniqueId id;
      if (rank == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(1);
        for (int r = 1; r < n; ++r) {
          if (write(pipes[static_cast<size_t>(2 * r + 1)], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) _exit(1);
        }
      } else if (read(pipes[static_cast<size_t>(2 * rank)], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
        _exit(1);
      }
      _exit(runRank(rank, n, id));
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  std::printf("%s: %d ranks, all-reduce, all-gather, broadcast, reduce-scatter, counts 7 to 16777216 on device buffers\n",
              failed ? "FAILED" : "ok", n);
  return failed;
}
