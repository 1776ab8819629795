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

#endif
