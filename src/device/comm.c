#include "device/comm.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"

/* OpenMPI's handles are addresses of predefined objects exported by libmpi
 * (MPI_COMM_WORLD is &ompi_mpi_comm_world, MPI_DOUBLE &ompi_mpi_double, ...),
 * so with dlopen they are the addresses dlsym returns. */
typedef void *mpi_handle;

struct at_comm {
    int rank, size;
    void *lib;
    mpi_handle world, f64, f32, byte, sum;
    int (*Init)(int *, char ***);
    int (*Finalize)(void);
    int (*Allreduce)(const void *, void *, int, mpi_handle, mpi_handle, mpi_handle);
    int (*Bcast)(void *, int, mpi_handle, int, mpi_handle);
    int (*Abort)(mpi_handle, int);
    int (*Comm_rank)(mpi_handle, int *);
    int (*Comm_size)(mpi_handle, int *);
    at_backend *device_comm; /* the backend whose collectives are set up (one per process) */
};

static at_comm g_comm;
static int g_ready;

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static at_status load_mpi(at_comm *c)
{
    static const char *names[] = {"libmpi.so.40", "libmpi.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !c->lib; i++)
        /* GLOBAL: OpenMPI's own plugins resolve libmpi's symbols through it */
        c->lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!c->lib)
        return at_error(AT_ERR_NOT_FOUND,
                        "started by mpirun with %d ranks, but OpenMPI's library (libmpi.so.40) cannot be loaded: %s "
                        "(install OpenMPI: scripts/setup.sh does)",
                        c->size, dlerror());
#define SYM(field, name)                                                                                   \
    do {                                                                                                   \
        *(void **)&c->field = dlsym(c->lib, name);                                                         \
        if (!c->field) return at_error(AT_ERR_UNSUPPORTED, "libmpi has no %s: OpenMPI is required", name); \
    } while (0)
    SYM(Init, "MPI_Init");
    SYM(Finalize, "MPI_Finalize");
    SYM(Allreduce, "MPI_Allreduce");
    SYM(Bcast, "MPI_Bcast");
    SYM(Abort, "MPI_Abort");
    SYM(Comm_rank, "MPI_Comm_rank");
    SYM(Comm_size, "MPI_Comm_size");
    SYM(world, "ompi_mpi_comm_world");
    SYM(f64, "ompi_mpi_double");
    SYM(f32, "ompi_mpi_float");
    SYM(byte, "ompi_mpi_byte");
    SYM(sum, "ompi_mpi_op_sum");
#undef SYM
    return AT_OK;
}

at_status at_comm_world(at_comm **out)
{
    *out = NULL;
    if (!g_ready) {
        at_comm c;
        memset(&c, 0, sizeof c);
        c.size = env_int("OMPI_COMM_WORLD_SIZE", 1);
        c.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
        if (c.size > 1) {
            AT_TRY(load_mpi(&c));
            if (c.Init(NULL, NULL) != 0) return at_error(AT_ERR_DEVICE, "MPI_Init failed");
            int r = -1, s = -1;
            c.Comm_rank(c.world, &r);
            c.Comm_size(c.world, &s);
            if (r != c.rank || s != c.size)
                at_log_warn("MPI reports rank %d of %d, the launcher's environment %d of %d; using MPI's", r, s, c.rank,
                            c.size);
            c.rank = r;
            c.size = s;
        }
        g_comm = c;
        g_ready = 1;
    }
    *out = &g_comm;
    return AT_OK;
}

int at_comm_rank(const at_comm *c) { return c ? c->rank : 0; }
int at_comm_size(const at_comm *c) { return c ? c->size : 1; }

at_status at_comm_allreduce_f64(at_comm *c, double *values, int n)
{
    if (!c || c->size <= 1 || n <= 0) return AT_OK;
    /* MPI_IN_PLACE is ((void *) 1) in OpenMPI's mpi.h */
    if (c->Allreduce((void *)1, values, n, c->f64, c->sum, c->world) != 0)
        return at_error(AT_ERR_DEVICE, "MPI_Allreduce of %d values failed", n);
    return AT_OK;
}

/* Sets up the backend's own collective (NCCL): rank 0 makes the id, MPI
 * broadcasts it, every rank joins. */
static at_status device_comm_init(at_comm *c, at_backend *be)
{
    unsigned char id[AT_COMM_ID_BYTES];
    memset(id, 0, sizeof id);
    at_status st = AT_OK;
    if (c->rank == 0) st = be->comm_id(be, id);
    /* every rank learns whether rank 0 could make an id */
    double ok = c->rank != 0 || st == AT_OK ? 1 : 0;
    AT_TRY(at_comm_allreduce_f64(c, &ok, 1));
    if (ok < c->size) {
        if (c->rank == 0) at_log_warn("%s: %s; summing gradients through host memory and MPI", be->name, at_last_error());
        return at_error(AT_ERR_UNSUPPORTED, "%s: no device collectives", be->name);
    }
    if (c->Bcast(id, (int)sizeof id, c->byte, 0, c->world) != 0) return at_error(AT_ERR_DEVICE, "MPI_Bcast failed");
    return be->comm_init(be, id, c->rank, c->size);
}

at_status at_comm_allreduce_tensor(at_comm *c, at_tensor *t)
{
    if (!c || c->size <= 1) return AT_OK;
    if (t->dtype != AT_F32) return at_error(AT_ERR_INVALID, "all-reduce of %s: only f32 tensors", t->name);
    at_backend *be = t->buf->backend;
    if (be->allreduce_sum && be->comm_id && be->comm_init) {
        if (c->device_comm != be && device_comm_init(c, be) == AT_OK) c->device_comm = be;
        if (c->device_comm == be) return be->allreduce_sum(be, t);
        be->allreduce_sum = NULL; /* could not be set up: stage through the host from now on */
    }
    int64_t n = at_tensor_numel(t);
    if (n > 0x7fffffff) return at_error(AT_ERR_UNSUPPORTED, "all-reduce of %s: more than 2^31 elements", t->name);
    float *host = be->is_host ? at_tensor_data(t) : malloc((size_t)n * sizeof *host);
    if (!host) return at_error(AT_ERR_NOMEM, "all-reduce of %s: out of host memory", t->name);
    at_status st = be->is_host ? AT_OK : at_tensor_download(t, host, (size_t)n * sizeof *host);
    if (st == AT_OK && c->Allreduce((void *)1, host, (int)n, c->f32, c->sum, c->world) != 0)
        st = at_error(AT_ERR_DEVICE, "MPI_Allreduce of %s (%lld values) failed", t->name, (long long)n);
    if (st == AT_OK && !be->is_host) st = at_tensor_upload(t, host, (size_t)n * sizeof *host);
    if (!be->is_host) free(host);
    return st;
}

void at_comm_abort(at_comm *c, int code)
{
    if (c && c->size > 1 && c->Abort) c->Abort(c->world, code);
}

void at_comm_finalize(void)
{
    if (g_ready && g_comm.size > 1 && g_comm.Finalize) g_comm.Finalize();
    g_ready = 0;
}
