/* allreduce.c: an NCCL program, written against NCCL's own nccl.h and nothing of chorus, in NCCL's
 * single-process form: ncclCommInitAll makes 4 ranks, one group drives an all-reduce on each, and
 * each result is checked. Linked to chorus's NCCL API library, it runs on host buffers (chorus's
 * extension), so on machines without a GPU:
 *   cc -std=c11 allreduce.c -I/usr/local/cuda/include -L<prefix>/lib -lchorus_nccl -o allreduce
 *   LD_LIBRARY_PATH=<prefix>/lib ./allreduce */
#include <nccl.h>
#include <stdio.h>

#define RANKS 4
#define COUNT 1024

int main(void) {
  ncclComm_t comms[RANKS];
  static float data[RANKS][COUNT];
  if (ncclCommInitAll(comms, RANKS, NULL) != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  for (int r = 0; r < RANKS; ++r) {
    for (int i = 0; i < COUNT; ++i) data[r][i] = (float)(r + i);
  }
  ncclGroupStart();
  for (int r = 0; r < RANKS; ++r) ncclAllReduce(data[r], data[r], COUNT, ncclFloat, ncclSum, comms[r], NULL);
  if (ncclGroupEnd() != ncclSuccess) {
    fprintf(stderr, "ncclGroupEnd: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  for (int r = 0; r < RANKS; ++r) {
    for (int i = 0; i < COUNT; ++i) {
      const float want = (float)(RANKS * i + RANKS * (RANKS - 1) / 2);
      if (data[r][i] != want) {
        fprintf(stderr, "rank %d: element %d is %g, expected %g\n", r, i, data[r][i], want);
        return 1;
      }
    }
    ncclCommDestroy(comms[r]);
  }
  int version = 0;
  ncclGetVersion(&version);
  printf("example ok (NCCL API %d, %d ranks)\n", version, RANKS);
  return 0;
}
