/* Data-parallel communication: one process per device, started by
 * `mpirun -np N anytune ...` (OpenMPI), summing gradients across processes.
 *
 * The MPI library is loaded at run time (dlopen of OpenMPI's libmpi), so one
 * build runs with or without it; a process not started by mpirun (or started
 * with one rank) is a world of one and never touches MPI. Tensors on a
 * backend with its own collectives (the CUDA backend's NCCL) are summed by
 * the backend; others are staged through host memory and summed by MPI.
 *
 * Every rank must make the same calls in the same order (collectives). */
#ifndef AT_DEVICE_COMM_H
#define AT_DEVICE_COMM_H

#include "base/status.h"
#include "device/backend.h"
#include "device/tensor.h"

typedef struct at_comm at_comm;

/* The process's communicator, created on first call from the launcher's
 * environment (OMPI_COMM_WORLD_SIZE / _RANK). With more than one rank this
 * initializes MPI; an error says what is missing (no libmpi, MPI_Init failed).
 * The communicator lives until at_comm_finalize. */
at_status at_comm_world(at_comm **out);

int at_comm_rank(const at_comm *c);
int at_comm_size(const at_comm *c);

/* Sums n doubles over every rank, in place (for counts and loss sums). */
at_status at_comm_allreduce_f64(at_comm *c, double *values, int n);

/* Default size of the host buckets of at_comm_allreduce_tensors. */
#define AT_COMM_BUCKET_BYTES ((size_t)64 << 20)

/* Sums each of n f32 tensors (all on one backend) over every rank, in place,
 * in as few collective calls as possible: per-call latency, not bandwidth,
 * dominates for the ~170 small tensors of a LoRA adapter.
 *  - A backend with allreduce_sum (NCCL) gets them all at once (one NCCL
 *    group: one fused launch); its collective is set up on first use (rank
 *    0's id broadcast through MPI).
 *  - Otherwise they are staged through host buckets of at most bucket_bytes
 *    (0: AT_COMM_BUCKET_BYTES), consecutive tensors packed together, one
 *    MPI_Allreduce per bucket; a tensor bigger than a bucket goes alone (in
 *    place when it is in host memory).
 * Every rank must pass the same tensors (shapes, order) and bucket size. */
at_status at_comm_allreduce_tensors(at_comm *c, at_tensor *const *ts, int n, size_t bucket_bytes);

/* Collective calls (MPI all-reduces and broadcasts, device all-reduce
 * groups) this process has made: for tests and logs. */
long long at_comm_calls(const at_comm *c);

/* Ends every rank's run after an error on one rank (the others may be waiting
 * in a collective): MPI_Abort with `code`. Does nothing in a world of one. */
void at_comm_abort(at_comm *c, int code);

/* MPI_Finalize (a world of one: nothing). */
void at_comm_finalize(void);

#endif
