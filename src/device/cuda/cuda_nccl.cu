/* Gradient all-reduce across processes with NCCL (data parallel, one process
 * per GPU; device/comm.h sets it up through MPI). NCCL is loaded with dlopen,
 * so the backend works without it: then comm_id fails and the core sums
 * through host memory and MPI instead. The emulator has no NCCL. */
#include <dlfcn.h>
#include <string.h>
#include "device/cuda/cuda_internal.h"

/* NCCL's ABI as nccl.h declares it (ncclUniqueId is 128 bytes passed by value). */
typedef struct {
    char internal[AT_COMM_ID_BYTES];
} nccl_unique_id;
typedef void *nccl_comm;
enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

static struct {
    int tried;
    void *lib;
    int (*get_unique_id)(nccl_unique_id *);
    int (*comm_init_rank)(nccl_comm *, int, nccl_unique_id, int);
    int (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm, cudaStream_t);
    int (*group_start)(void);
    int (*group_end)(void);
    const char *(*error_string)(int);
} nccl;

static nccl_comm g_comm; /* one communicator per process: one process per GPU */

static at_status load_nccl(cuda_ctx *c)
{
#ifdef AT_CUDA_EMULATE
    return c->host->error(AT_ERR_UNSUPPORTED, "the CUDA emulator has no NCCL");
#else
    if (!nccl.tried) {
        nccl.tried = 1;
        nccl.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!nccl.lib) nccl.lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
        if (nccl.lib) {
            *(void **)&nccl.get_unique_id = dlsym(nccl.lib, "ncclGetUniqueId");
            *(void **)&nccl.comm_init_rank = dlsym(nccl.lib, "ncclCommInitRank");
            *(void **)&nccl.all_reduce = dlsym(nccl.lib, "ncclAllReduce");
            *(void **)&nccl.group_start = dlsym(nccl.lib, "ncclGroupStart");
            *(void **)&nccl.group_end = dlsym(nccl.lib, "ncclGroupEnd");
            *(void **)&nccl.error_string = dlsym(nccl.lib, "ncclGetErrorString");
        }
    }
    if (!nccl.get_unique_id || !nccl.comm_init_rank || !nccl.all_reduce || !nccl.group_start || !nccl.group_end)
        return c->host->error(AT_ERR_NOT_FOUND, "NCCL (libnccl.so.2) not found");
    return AT_OK;
#endif
}

static at_status nccl_check(cuda_ctx *c, int rc, const char *what)
{
    if (rc == NCCL_SUCCESS) return AT_OK;
    return c->host->error(AT_ERR_DEVICE, "%s: NCCL error %d (%s)", what, rc,
                          nccl.error_string ? nccl.error_string(rc) : "?");
}

at_status cu_comm_id(at_backend *be, void *id)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    CU_TRY(load_nccl(c));
    nccl_unique_id u;
    CU_TRY(nccl_check(c, nccl.get_unique_id(&u), "ncclGetUniqueId"));
    memcpy(id, u.internal, sizeof u.internal);
    return AT_OK;
}

at_status cu_comm_init(at_backend *be, const void *id, int rank, int world)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    CU_TRY(load_nccl(c));
    nccl_unique_id u;
    memcpy(u.internal, id, sizeof u.internal);
    CU_TRY(cu_check(c, cudaSetDevice(c->device), "cudaSetDevice"));
    return nccl_check(c, nccl.comm_init_rank(&g_comm, world, u, rank), "ncclCommInitRank");
}

/* Every tensor's all-reduce inside one NCCL group: NCCL aggregates the
 * group's collectives into one launch, so a LoRA adapter's ~170 small
 * gradients cost one round of latency, not 170. */
at_status cu_allreduce_sum(at_backend *be, at_tensor *const *ts, int n)
{
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (!g_comm) return c->host->error(AT_ERR_INTERNAL, "all-reduce of %s before the NCCL communicator", ts[0]->name);
    CU_TRY(cu_check(c, cudaSetDevice(c->device), "cudaSetDevice")); /* the stream's device (see cu_ctx) */
    CU_TRY(nccl_check(c, nccl.group_start(), "ncclGroupStart"));
    at_status st = AT_OK;
    for (int i = 0; i < n && st == AT_OK; i++) {
        void *p = cu_ptr(ts[i]);
        st = nccl_check(c, nccl.all_reduce(p, p, (size_t)cu_numel(ts[i]), NCCL_FLOAT32, NCCL_SUM, g_comm, c->stream),
                        "ncclAllReduce");
    }
    /* the group is closed on every path: NCCL requires balanced calls */
    at_status end = nccl_check(c, nccl.group_end(), "ncclGroupEnd");
    return st != AT_OK ? st : end;
}
