/* allreduce.c: a C program using the installed chorus, built with pkg-config (Makefile): every rank
 * sums rank + 1 and checks the closed form. Start it with chorusrun (or torchrun, srun, mpiexec). */
#include <chorus/chorus.h>
#include <stdio.h>

int main(void) {
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm, NULL) != chorusSuccess) {
    fprintf(stderr, "init: %s\n", chorusGetLastError(NULL));
    return 1;
  }
  int rank = 0, nranks = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &nranks);
  double value = rank + 1, sum = 0;
  if (chorusAllReduce(&value, &sum, 1, chorusFloat64, chorusSum, comm, NULL) != chorusSuccess) {
    fprintf(stderr, "allreduce: %s\n", chorusGetLastError(comm));
    return 1;
  }
  chorusCommDestroy(comm);
  if (sum != nranks * (nranks + 1) / 2.0) {
    fprintf(stderr, "rank %d: sum %g, expected %g\n", rank, sum, nranks * (nranks + 1) / 2.0);
    return 1;
  }
  printf("example ok (rank %d of %d)\n", rank, nranks);
  return 0;
}
