/* chorus_mpi.h: a chorus communicator over the ranks of an MPI communicator, for MPI programs.
 * Header only: it calls the program's own MPI (MPI_Comm_rank, MPI_Comm_size, MPI_Bcast), so
 * libchorus itself needs no MPI.
 *
 *   #include <mpi.h>
 *   #include <chorus/chorus_mpi.h>
 *   chorusComm_t comm;
 *   chorusCommInitFromMpi(&comm, MPI_COMM_WORLD, NULL);   // rank i of the MPI communicator is rank i
 */
#ifndef CHORUS_CHORUS_MPI_H_
#define CHORUS_CHORUS_MPI_H_

#include <mpi.h>

#include "chorus/chorus.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a communicator of the ranks of mpiComm, each keeping its MPI rank: rank 0 makes a
 * unique id (chorusGetUniqueId) and broadcasts it over mpiComm, then every rank calls
 * chorusCommInitRankConfig. Collective over mpiComm; blocking. Errors: those of
 * chorusGetUniqueId (on every rank alike: rank 0's result is broadcast first) and of
 * chorusCommInitRankConfig; chorusSystemError when an MPI call fails. */
static inline chorusResult_t chorusCommInitFromMpi(chorusComm_t* comm, MPI_Comm mpiComm,
                                                   const chorusConfig_t* config) {
  int rank = 0, size = 0;
  if (MPI_Comm_rank(mpiComm, &rank) != MPI_SUCCESS || MPI_Comm_size(mpiComm, &size) != MPI_SUCCESS) {
    return chorusSystemError;
  }
  chorusUniqueId id;
  int made = (int)chorusSuccess;
  if (rank == 0) made = (int)chorusGetUniqueId(&id);
  if (MPI_Bcast(&made, 1, MPI_INT, 0, mpiComm) != MPI_SUCCESS) return chorusSystemError;
  if (made != (int)chorusSuccess) return (chorusResult_t)made;
  if (MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, mpiComm) != MPI_SUCCESS) return chorusSystemError;
  return chorusCommInitRankConfig(comm, size, id, rank, config);
}

#ifdef __cplusplus
}
#endif

#endif /* CHORUS_CHORUS_MPI_H_ */
