/* How the program's OpenMP threads wait for each other.
 *
 * By default libgomp's threads spin for a while (~300k iterations) at every
 * barrier and at the end of every parallel region before they sleep. On a
 * quiet machine that saves a wake-up; when another process holds one of the
 * cores, the spinning threads burn their time slices waiting for a thread
 * that is not running, and decoding a small model fell from ~2000 to 17
 * tokens/s on two cores with one busy. Passive waiting (sleep at once on a
 * futex) kept 50-80% of the quiet speed there, so it is the default here.
 *
 * libgomp reads OMP_WAIT_POLICY once, in its constructor, before any of our
 * code runs; setting the variable later changes nothing. So the program sets
 * it and executes itself again (LLVM's libomp reads its settings at the
 * first parallel region: there setting it is enough). */
#ifndef AT_BASE_THREADS_H
#define AT_BASE_THREADS_H

/* Call first thing in main. When the user has not chosen how OpenMP threads
 * wait (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME set, even empty),
 * sets OMP_WAIT_POLICY=passive and, under libgomp, re-executes the program
 * (/proc/self/exe) with the same argv: this call then does not return. If
 * the re-execution fails the program goes on with the runtime's default
 * (the variable still reaches the processes it starts). */
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
