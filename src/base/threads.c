#include "base/threads.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Seconds of one iteration of a wait loop like libgomp's (a load of a
 * shared word and a pause), best of 3 timings of 20000 iterations. */
static double spin_iteration_seconds(void)
{
    static volatile int flag;
    double best = 1;
    for (int r = 0; r < 3; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < 20000 && !flag; i++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ volatile("yield");
#endif
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = ((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9) / 20000;
        if (s < best) best = s;
    }
    return best > 1e-10 ? best : 1e-10;
}

void at_threads_setup(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("KMP_BLOCKTIME")) return;
    /* LLVM's libomp (it defines __kmpc_fork_call; it also offers libgomp's
     * GOMP_ entry points) reads its settings at the first parallel region:
     * setting the variable is enough. Its spin is bounded by KMP_BLOCKTIME,
     * 200 ms by default: long enough to starve a process sharing the core,
     * so passive, as before */
    if (dlsym(RTLD_DEFAULT, "__kmpc_fork_call") || !dlsym(RTLD_DEFAULT, "GOMP_parallel")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        return;
    }
    char v[32];
    snprintf(v, sizeof v, "%ld", (long)(AT_SPIN_SECONDS / spin_iteration_seconds()) + 1);
    if (setenv("GOMP_SPINCOUNT", v, 1) != 0) return;
    execv("/proc/self/exe", argv);
}

/* ---- one thread or many, by measurement ---- */

#define PAR_SIZES 48
#define PAR_KEYS (64 * PAR_SIZES)
#define PAR_WARM 3 /* timings of each count before choosing */

typedef struct {
    double t[2]; /* moving average of the seconds a call took: [0] one thread, [1] many */
    int n[2];    /* timings taken */
    unsigned calls;
} par_stat;

static par_stat par_stats[PAR_KEYS];
static pthread_mutex_t par_lock = PTHREAD_MUTEX_INITIALIZER;

unsigned at_par_key(unsigned kind, double bytes)
{
    int lg = bytes >= 1 ? (int)log2(bytes) : 0;
    if (lg >= PAR_SIZES) lg = PAR_SIZES - 1;
    return (kind % 64) * PAR_SIZES + (unsigned)lg;
}

/* ANYTUNE_PAR: 0 measure, 1 one thread, 2 all of them (read once) */
static int par_pin(void)
{
    static int pin = -1;
    if (pin < 0) {
        const char *v = getenv("ANYTUNE_PAR");
        pin = v && !strcmp(v, "1") ? 1 : v && !strcmp(v, "all") ? 2 : 0;
    }
    return pin;
}

int at_par_threads(unsigned key, int many)
{
    if (many <= 1) return 1;
    int pin = par_pin();
    if (pin) return pin == 1 ? 1 : many;
    par_stat *s = &par_stats[key % PAR_KEYS];
    int c;
    pthread_mutex_lock(&par_lock);
    if (s->n[0] < PAR_WARM || s->n[1] < PAR_WARM) c = s->n[1] <= s->n[0];
    else {
        c = s->t[1] <= s->t[0];
        /* a choice that lost by far is timed again less often */
        double lose = c ? s->t[0] : s->t[1], win = c ? s->t[1] : s->t[0];
        unsigned every = lose > 1.5 * win ? 4 * AT_PAR_EXPLORE : AT_PAR_EXPLORE;
        if (++s->calls % every == 0) c = !c;
    }
    pthread_mutex_unlock(&par_lock);
    return c ? many : 1;
}

void at_par_record(unsigned key, int used, double seconds)
{
    if (par_pin()) return;
    par_stat *s = &par_stats[key % PAR_KEYS];
    int c = used > 1;
    pthread_mutex_lock(&par_lock);
    if (s->n[c] == 0) s->t[c] = seconds;
    else if (s->n[c] < PAR_WARM) {
        /* the first calls pay for what is cold (weights read from a file
         * the first time, buffers allocated): the best of them counts */
        if (seconds < s->t[c]) s->t[c] = seconds;
    } else {
        /* one call that lost its time slice must not flip the choice alone */
        if (seconds > 4 * s->t[c]) seconds = 4 * s->t[c];
        s->t[c] += 0.25 * (seconds - s->t[c]);
    }
    if (s->n[c] < PAR_WARM) s->n[c]++;
    pthread_mutex_unlock(&par_lock);
}
