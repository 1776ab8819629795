#include "device/comm.h"

#include <dlfcn.h>
#include <stdio.h>
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
    long long calls;         /* collective calls made (at_comm_calls) */
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
    c->calls++;
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
    c->calls++;
    if (c->Bcast(id, (int)sizeof id, c->byte, 0, c->world) != 0) return at_error(AT_ERR_DEVICE, "MPI_Bcast failed");
    return be->comm_init(be, id, c->rank, c->size);
}

/* One MPI_Allreduce of n floats at p, in place. */
static at_status mpi_sum_f32(at_comm *c, float *p, size_t n, const char *what)
{
    if (n > 0x7fffffff) return at_error(AT_ERR_UNSUPPORTED, "all-reduce of %s: more than 2^31 elements", what);
    c->calls++;
    if (c->Allreduce((void *)1, p, (int)n, c->f32, c->sum, c->world) != 0)
        return at_error(AT_ERR_DEVICE, "MPI_Allreduce of %s (%zu values) failed", what, n);
    return AT_OK;
}

/* Host staging of ts[i0, i1): copied one after another into buf (big
 * enough), summed by one call, copied back. A lone host tensor is summed
 * where it lies. */
static at_status host_bucket(at_comm *c, at_tensor *const *ts, int i0, int i1, float *buf)
{
    at_backend *be = ts[i0]->buf->backend;
    if (i1 - i0 == 1 && be->is_host)
        return mpi_sum_f32(c, at_tensor_data(ts[i0]), (size_t)at_tensor_numel(ts[i0]), ts[i0]->name);
    size_t off = 0;
    for (int i = i0; i < i1; i++) {
        size_t n = (size_t)at_tensor_numel(ts[i]);
        if (be->is_host) memcpy(buf + off, at_tensor_data(ts[i]), n * sizeof *buf);
        else AT_TRY(at_tensor_download(ts[i], buf + off, n * sizeof *buf));
        off += n;
    }
    char what[256];
    if (i1 - i0 == 1) snprintf(what, sizeof what, "%s", ts[i0]->name);
    else snprintf(what, sizeof what, "%d tensors (%s ... %s)", i1 - i0, ts[i0]->name, ts[i1 - 1]->name);
    AT_TRY(mpi_sum_f32(c, buf, off, what));
    off = 0;
    for (int i = i0; i < i1; i++) {
        size_t n = (size_t)at_tensor_numel(ts[i]);
        if (be->is_host) memcpy(at_tensor_data(ts[i]), buf + off, n * sizeof *buf);
        else AT_TRY(at_tensor_upload(ts[i], buf + off, n * sizeof *buf));
        off += n;
    }
    return AT_OK;
}

at_status at_comm_allreduce_tensors(at_comm *c, at_tensor *const *ts, int n, size_t bucket_bytes)
{
    if (!c || c->size <= 1 || n <= 0) return AT_OK;
    at_backend *be = ts[0]->buf->backend;
    for (int i = 0; i < n; i++) {
        if (ts[i]->dtype != AT_F32) return at_error(AT_ERR_INVALID, "all-reduce of %s: only f32 tensors", ts[i]->name);
        if (ts[i]->buf->backend != be)
            return at_error(AT_ERR_INVALID, "all-reduce of %s and %s: tensors on two backends (%s, %s)", ts[0]->name,
                            ts[i]->name, be->name, ts[i]->buf->backend->name);
    }
    if (be->allreduce_sum && be->comm_id && be->comm_init) {
        if (c->device_comm != be && device_comm_init(c, be) == AT_OK) c->device_comm = be;
        if (c->device_comm == be) {
            c->calls++;
            return be->allreduce_sum(be, ts, n);
        }
        be->allreduce_sum = NULL; /* could not be set up: stage through the host from now on */
    }
    size_t cap = (bucket_bytes ? bucket_bytes : AT_COMM_BUCKET_BYTES) / sizeof(float);
    if (cap == 0) cap = 1;
    /* the staging buffer: one bucket, or the biggest lone tensor if bigger */
    size_t need = 0, total = 0;
    for (int i = 0; i < n; i++) {
        size_t e = (size_t)at_tensor_numel(ts[i]);
        total += e;
        if (e > need && !(e > cap && be->is_host)) need = e;
    }
    if (need < cap) need = total < cap ? total : cap;
    float *buf = malloc((need ? need : 1) * sizeof *buf);
    if (!buf) return at_error(AT_ERR_NOMEM, "all-reduce: out of host memory for %zu values", need);
    at_status st = AT_OK;
    for (int i0 = 0; i0 < n && st == AT_OK;) {
        /* consecutive tensors while they fit in one bucket (at least one) */
        int i1 = i0 + 1;
        size_t used = (size_t)at_tensor_numel(ts[i0]);
        while (i1 < n && used + (size_t)at_tensor_numel(ts[i1]) <= cap) used += (size_t)at_tensor_numel(ts[i1++]);
        st = host_bucket(c, ts, i0, i1, buf);
        i0 = i1;
    }
    free(buf);
    return st;
}

long long at_comm_calls(const at_comm *c) { return c ? c->calls : 0; }

void at_comm_abort(at_comm *c, int code)
{
    if (c && c->size > 1 && c->Abort) c->Abort(c->world, code);
}

void at_comm_finalize(void)
{
    if (g_ready && g_comm.size > 1 && g_comm.Finalize) g_comm.Finalize();
    g_ready = 0;
}
