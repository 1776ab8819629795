/* bench/load: decoding and training throughput on a quiet machine and with
 * one core taken by another process (a busy loop pinned to the last CPU this
 * program may use), and their ratio. The target (issue 16): keep >= 40% of
 * the quiet throughput under that load.
 *
 * It runs the anytune program as a user would (decode: `infer` on the demo
 * model, greedy, from BOS; training: `sft` on the demo model and data), once
 * with the environment as it is (the program's own choice of how threads
 * wait, base/threads.h) and once with OMP_WAIT_POLICY=active (spinning
 * threads, libgomp's default before that choice) for contrast.
 *
 * usage: bench_load [ANYTUNE] [RUNS]   (ANYTUNE: the program, default the
 *        anytune beside this one; RUNS: repetitions per figure, median; 3) */
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "bench_util.h"
#include "train/run_files.h"

/* A process that keeps one CPU busy; returns its pid. */
static pid_t start_busy(void)
{
    cpu_set_t set;
    int last = -1;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) last = c;
    pid_t pid = fork();
    if (pid == 0) {
        if (last >= 0) {
            CPU_ZERO(&set);
            CPU_SET(last, &set);
            sched_setaffinity(0, sizeof set, &set);
        }
        volatile unsigned long n = 0;
        for (;;) n++;
    }
    return pid;
}

static void stop_busy(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Runs `cmd` (sh) with its output in `log`; returns its exit status. */
static int run(const char *cmd, const char *log)
{
    char full[4096];
    snprintf(full, sizeof full, "%s > '%s' 2>&1", cmd, log);
    return system(full);
}

/* Decoding speed (tokens/s) of one `infer` run; NAN on failure. */
static double decode_once(const char *bin, const char *env, const char *tmp)
{
    char cmd[2048], log[1024];
    snprintf(log, sizeof log, "%s/infer.txt", tmp);
    snprintf(cmd, sizeof cmd, "%s '%s' infer --prompt '' --template none --max_new_tokens 400 --verbose", env, bin);
    char *text = NULL;
    double tps = NAN;
    if (run(cmd, log) == 0 && at_read_file(log, &text, NULL) == AT_OK) {
        const char *p = strstr(text, "decode: ");
        int n;
        double s, r;
        if (p && sscanf(p, "decode: %d tokens in %lf s, %lf tokens/s", &n, &s, &r) == 3) tps = r;
    }
    free(text);
    return tps;
}

/* Training speed (tokens/s, median over the steps after the first) of one
 * `sft` run; NAN on failure. */
static double train_once(const char *bin, const char *env, const char *tmp)
{
    char cmd[2048], log[1024];
    snprintf(log, sizeof log, "%s/sft.txt", tmp);
    snprintf(cmd, sizeof cmd,
             "%s '%s' sft --model demo/stories260K --dataset demo/identity.json --max_steps 12 --logging_steps 1 "
             "--save_steps 1000 --per_device_train_batch_size 4 --output_dir '%s/sft'",
             env, bin, tmp);
    char *text = NULL;
    double v[64];
    int n = 0;
    if (run(cmd, log) == 0 && at_read_file(log, &text, NULL) == AT_OK) {
        for (char *line = strtok(text, "\n"); line && n < 64; line = strtok(NULL, "\n")) {
            char *t = strstr(line, " tok/s");
            int step;
            if (!t || sscanf(line, "step %d/", &step) != 1 || step < 2) continue;
            while (t > line && t[-1] != ' ') t--;
            v[n++] = atof(t);
        }
    }
    free(text);
    char *dir = malloc(strlen(tmp) + 8);
    sprintf(dir, "%s/sft", tmp);
    at_remove_tree(dir);
    free(dir);
    return n ? bench_median(v, n) : NAN;
}

int main(int argc, char **argv)
{
    char bin[4096];
    if (argc > 1) snprintf(bin, sizeof bin, "%s", argv[1]);
    else {
        ssize_t k = readlink("/proc/self/exe", bin, sizeof bin - 16);
        if (k < 0) k = 0;
        bin[k] = 0;
        char *slash = strrchr(bin, '/');
        snprintf(slash ? slash + 1 : bin, 16, "anytune");
    }
    int runs = argc > 2 ? atoi(argv[2]) : 3;
    if (runs < 1 || runs > 32) runs = 3;
    char tmp[] = "/tmp/anytune-bench-load-XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("bench_load: mkdtemp");
        return 1;
    }
    printf("bench/load: %s, %ld CPUs, the busy process on the last one; median of %d runs\n", bin,
           sysconf(_SC_NPROCESSORS_ONLN), runs);
    printf("  %-7s %-28s %12s %12s %7s\n", "what", "threads wait", "quiet tok/s", "loaded tok/s", "ratio");
    static const struct {
        const char *name, *env;
    } POLICY[] = {
        {"as the program chooses", ""},
        {"OMP_WAIT_POLICY=active", "OMP_WAIT_POLICY=active"},
    };
    int ok = 1;
    for (int w = 0; w < 2; w++) {
        for (size_t p = 0; p < sizeof POLICY / sizeof POLICY[0]; p++) {
            double q[32], l[32];
            for (int r = 0; r < runs; r++) {
                q[r] = w ? train_once(bin, POLICY[p].env, tmp) : decode_once(bin, POLICY[p].env, tmp);
                pid_t busy = start_busy();
                l[r] = w ? train_once(bin, POLICY[p].env, tmp) : decode_once(bin, POLICY[p].env, tmp);
                stop_busy(busy);
            }
            double mq = bench_median(q, runs), ml = bench_median(l, runs), ratio = ml / mq;
            printf("  %-7s %-28s %12.1f %12.1f %6.2fx%s\n", w ? "train" : "decode", POLICY[p].name, mq, ml, ratio,
                   p == 0 ? (ratio >= 0.4 ? "  (target >= 0.40: met)" : "  (target >= 0.40: MISSED)") : "");
            fflush(stdout);
            if (p == 0 && !(ratio >= 0.4)) ok = 0;
        }
    }
    at_remove_tree(tmp);
    return ok ? 0 : 1;
}
