/* mpi_comm_test.c: chorusCommInitFromMpi (chorus_mpi.h) under mpiexec: a communicator over
 * MPI_COMM_WORLD and one over each half of an MPI_Comm_split (ranks numbered in reverse), each
 * checked by an all-reduce against MPI_Allreduce of the same values and by its rank and size. */
#include <chorus/chorus_mpi.h>
#include <mpi.h>
#include <stdio.h>

static int check(MPI_Comm mpi, const char* name) {
  int rank = 0, size = 0;
  MPI_Comm_rank(mpi, &rank);
  MPI_Comm_size(mpi, &size);
  chorusComm_t comm = NULL;
  if (chorusCommInitFromMpi(&comm, mpi, NULL) != chorusSuccess) {
    fprintf(stderr, "%s rank %d: chorusCommInitFromMpi: %s\n", name, rank, chorusGetLastError(NULL));
    return 1;
  }
  int chorusRank = -1, chorusSize = -1;
  chorusCommUserRank(comm, &chorusRank);
  chorusCommCount(comm, &chorusSize);
  int failed = chorusRank != rank || chorusSize != size;
  double mine[100], viaChorus[100], viaMpi[100];
  for (int i = 0; i < 100; ++i) mine[i] = rank * 1000.0 + i * 0.25;
  if (chorusAllReduce(mine, viaChorus, 100, chorusFloat64, chorusMax, comm, NULL) != chorusSuccess) {
    fprintf(stderr, "%s rank %d: chorusAllReduce: %s\n", name, rank, chorusGetLastError(comm));
    failed = 1;
  }
  MPI_Allreduce(mine, viaMpi, 100, MPI_DOUBLE, MPI_MAX, mpi);
  for (int i = 0; i < 100; ++i) failed |= viaChorus[i] != viaMpi[i];
  chorusCommDestroy(comm);
  if (failed) fprintf(stderr, "%s rank %d of %d: chorus rank %d of %d, or values differ from MPI's\n", name, rank,
                      size, chorusRank, chorusSize);
  return failed;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failed = check(MPI_COMM_WORLD, "world");
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, world % 2, -world, &half);
  failed |= check(half, world % 2 ? "odd" : "even");
  MPI_Comm_free(&half);
  int anyFailed = 0;
  MPI_Allreduce(&failed, &anyFailed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world == 0 && !anyFailed) printf("chorusCommInitFromMpi ok on %d ranks\n", size);
  MPI_Finalize();
  return anyFailed;
}
