/* How the program's OpenMP threads wait for each other.
 *
 * By default libgomp's threads spin for a while (300k iterations, several
 * milliseconds) at every barrier and at the end of every parallel region
 * before they sleep. When another process holds one of the cores, the
 * spinning threads burn their time slices waiting for a thread that is not
 * running: decoding a small model fell from ~2000 to 17 tokens/s on two
 * cores with one busy. Sleeping at once (OMP_WAIT_POLICY=passive) avoids
 * that but pays a wake-up per parallel region, and waking a sleeping
 * virtual CPU is slow: 110-130 us per region on a 2-vCPU Zen 5 VM, against
 * 3-6 us when the other thread spins (tests of a region with nothing to do,
 * 0-100 us apart). A decode step runs hundreds of regions, so passive
 * waiting held decoding at a fraction of what the memory allows. So the
 * threads spin for a bounded time, AT_SPIN_SECONDS (the iterations for it
 * measured here: a pause takes 25 ns on that CPU, other CPUs differ), then
 * sleep: a decode step's regions follow each other within that time, and a
 * thread waiting for a preempted one gives its core back after at most
 * that long (7% of a 3 ms time slice). Whether a product is split over
 * threads at all is measured per kind of product (at_par_threads below).
 *
 * libgomp reads GOMP_SPINCOUNT once, in its constructor, before any of our
 * code runs; setting the variable later changes nothing. So the program sets
 * it and executes itself again (LLVM's libomp reads its settings at the
 * first parallel region and has no bounded spin: it gets passive waiting,
 * for which setting the variable is enough). */
#ifndef AT_BASE_THREADS_H
#define AT_BASE_THREADS_H

#define AT_SPIN_SECONDS 200e-6

/* Call first thing in main. When the user has not chosen how OpenMP threads
 * wait (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME set, even empty),
 * sets GOMP_SPINCOUNT to the iterations of AT_SPIN_SECONDS (about 1 ms to
 * measure) and re-executes the program (/proc/self/exe) with the same argv:
 * this call then does not return; under LLVM's libomp it sets
 * OMP_WAIT_POLICY=passive and returns. If the re-execution fails the
 * program goes on with the runtime's default (the variable still reaches
 * the processes it starts). */
void at_threads_setup(char **argv);

/* One thread or all of them, chosen by timing both on the machine at hand.
 *
 * A decode step runs a few hundred small matrix-vector products; each one
 * split over threads pays a wake-up of the other threads and a join. Whether
 * that pays depends on the machine (how fast a sleeping virtual CPU wakes,
 * how much bandwidth a second core adds), on the size of the work and on
 * what else runs (a core taken by another process makes every join wait for
 * its time slice). So the kernels ask, per kind of work (key: a caller's kind
 * and the size class, at_par_key), which count to use, time the call (wall
 * clock, what the caller waits for) and report it: both counts are tried a
 * few times, then the faster one (moving average of its recent times) is
 * used, and the other is timed again every AT_PAR_EXPLORE-th call (4 times
 * less often when it was 1.5x slower) so the choice follows a change of
 * load. The result must not depend on the count (the callers split work so
 * that each value is computed the same way).
 * Thread safe. ANYTUNE_PAR=1 or =all pins one thread or all of them. */
#define AT_PAR_EXPLORE 32

/* key for a kind of work (0 <= kind < 64) that reads `bytes` bytes: the size
 * class is the power of two. */
unsigned at_par_key(unsigned kind, double bytes);
/* The thread count for the next call of key: 1 or many (many <= 1: 1). */
int at_par_threads(unsigned key, int many);
/* Reports that the call of key ran on `used` threads in `seconds`. */
void at_par_record(unsigned key, int used, double seconds);

#endif
