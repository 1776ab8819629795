/* Run folders, atomic checkpoints with manifests, pruning, and LR schedules. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/file.h"
#include "train/plot.h"
#include "train/run_files.h"
#include "train/schedule.h"
#include "testing.h"

static void write_text(const char *dir, const char *name, const char *text)
{
    char *p = at_path_join(dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    free(p);
}

static void test_checkpoints(void)
{
    char root[] = "/tmp/anytune-ckpt-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char *out = at_path_join(root, "output");
    char *run0 = NULL, *run1 = NULL;
    CHECK_OK(at_run_dir_create(out, &run0));
    CHECK_OK(at_run_dir_create(out, &run1));
    CHECK(run0 && strstr(run0, "/v0-") != NULL);
    CHECK(run1 && strstr(run1, "/v1-") != NULL);
    CHECK(strlen(strrchr(run0, '/')) == strlen("/v0-YYYYMMDD-HHMMSS"));

    char *dir = NULL, *last = NULL;
    int64_t step = 0;
    CHECK(at_ckpt_find_last(run0, &last, &step) == AT_ERR_NOT_FOUND);
    for (int s = 10; s <= 40; s += 10) {
        CHECK_OK(at_ckpt_begin(run0, s, &dir));
        char text[32];
        snprintf(text, sizeof text, "weights of step %d\n", s);
        write_text(dir, "adapter_model.safetensors", text);
        write_text(dir, "adapter_config.json", "{}\n");
        CHECK_OK(at_ckpt_commit(run0, s, dir));
        free(dir);
    }
    /* an interrupted save leaves only a .tmp folder, which is never taken for a checkpoint */
    CHECK_OK(at_ckpt_begin(run0, 50, &dir));
    write_text(dir, "adapter_model.safetensors", "half");
    free(dir);
    CHECK_OK(at_ckpt_find_last(run0, &last, &step));
    CHECK(step == 40 && strstr(last, "checkpoint-40") != NULL);
    CHECK_OK(at_manifest_verify(last));
    /* damage: a changed byte, an extra file, a missing file */
    write_text(last, "adapter_config.json", "{ }\n");
    CHECK_FAILS(at_manifest_verify(last), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "adapter_config.json") != NULL, "%s", at_last_error());
    free(last);
    CHECK_OK(at_ckpt_find_last(run0, &last, &step)); /* falls back to the newest intact one */
    CHECK(step == 30);
    write_text(last, "stray.bin", "x");
    CHECK_FAILS(at_manifest_verify(last), AT_ERR_FORMAT);
    char *stray = at_path_join(last, "stray.bin");
    unlink(stray);
    free(stray);
    CHECK_OK(at_manifest_verify(last));
    char *victim = at_path_join(last, "adapter_model.safetensors");
    unlink(victim);
    free(victim);
    CHECK_FAILS(at_manifest_verify(last), AT_ERR_FORMAT);
    free(last);
    /* re-saving a step replaces it whole */
    CHECK_OK(at_ckpt_begin(run0, 30, &dir));
    write_text(dir, "adapter_model.safetensors", "again");
    CHECK_OK(at_ckpt_commit(run0, 30, dir));
    free(dir);
    /* prune keeps the newest two and removes the leftover .tmp */
    CHECK_OK(at_ckpt_prune(run0, 2, 0));
    char *p10 = at_path_join(run0, "checkpoint-10"), *p20 = at_path_join(run0, "checkpoint-20");
    char *p30 = at_path_join(run0, "checkpoint-30"), *p50 = at_path_join(run0, "checkpoint-50.tmp");
    CHECK(!at_is_dir(p10) && !at_is_dir(p20) && at_is_dir(p30) && !at_is_dir(p50));
    free(p10);
    free(p20);
    free(p30);
    free(p50);
    CHECK_OK(at_remove_tree(root));
    CHECK(!at_is_dir(root));
    free(out);
    free(run0);
    free(run1);
}

/* --load_best_model_at_end (issue 21): the best checkpoint by the eval_loss
 * logged at its step, kept by the rotation as transformers keeps it. */
static void test_best_checkpoint(void)
{
    char root[] = "/tmp/anytune-best-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    static const int steps[] = {2, 4, 6, 8};
    for (int i = 0; i < 4; i++) {
        char *dir = NULL;
        CHECK_OK(at_ckpt_begin(root, steps[i], &dir));
        write_text(dir, "adapter_model.safetensors", "x");
        CHECK_OK(at_ckpt_commit(root, steps[i], dir));
        free(dir);
    }
    int64_t step = 0;
    double v = 0;
    CHECK_FAILS(at_run_best_checkpoint(root, &step, &v), AT_ERR_NOT_FOUND); /* no log yet */
    /* step 4 is the best; step 5's eval has no checkpoint; a torn last line is skipped */
    write_text(root, "logging.jsonl",
               "{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"loss\": 2.0, \"eval_loss\": 1.0}\n"
               "{\"step\": 4, \"eval_loss\": 0.5}\n{\"step\": 5, \"eval_loss\": 0.1}\n"
               "{\"step\": 6, \"eval_loss\": 0.7}\n{\"step\": 8, \"eval_loss\": 0.5}\n{\"step\": 9, \"eval");
    CHECK_OK(at_run_best_checkpoint(root, &step, &v));
    CHECK_MSG(step == 4 && v == 0.5, "best %lld (%g): the first of equals is kept", (long long)step, v);
    char *p[4];
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "checkpoint-%d", steps[i]);
        p[i] = at_path_join(root, name);
    }
    /* limit 2: the best and the newest stay (transformers' _sorted_checkpoints) */
    CHECK_OK(at_ckpt_prune(root, 2, 1));
    CHECK(!at_is_dir(p[0]) && at_is_dir(p[1]) && !at_is_dir(p[2]) && at_is_dir(p[3]));
    /* limit 1 keeps the newest beside the best */
    CHECK_OK(at_ckpt_prune(root, 1, 1));
    CHECK(at_is_dir(p[1]) && at_is_dir(p[3]));
    /* without keep_best the rotation keeps the newest alone */
    CHECK_OK(at_ckpt_prune(root, 1, 0));
    CHECK(!at_is_dir(p[1]) && at_is_dir(p[3]));
    CHECK_OK(at_run_best_checkpoint(root, &step, &v));
    CHECK(step == 8 && v == 0.5);
    for (int i = 0; i < 4; i++) free(p[i]);
    CHECK_OK(at_remove_tree(root));
}

static void test_schedules(void)
{
    at_schedule s = {AT_SCHED_COSINE, 1e-3, 10, 110};
    CHECK_NEAR(at_schedule_lr(&s, 0), 0.0, 1e-12);
    CHECK_NEAR(at_schedule_lr(&s, 5), 0.5e-3, 1e-12);
    CHECK_NEAR(at_schedule_lr(&s, 10), 1e-3, 1e-12);
    CHECK_NEAR(at_schedule_lr(&s, 60), 0.5e-3, 1e-12); /* half way through the decay: cos(π/2) */
    CHECK_NEAR(at_schedule_lr(&s, 110), 0.0, 1e-12);
    s.kind = AT_SCHED_LINEAR;
    CHECK_NEAR(at_schedule_lr(&s, 35), 0.75e-3, 1e-12);
    s.kind = AT_SCHED_CONSTANT;
    CHECK_NEAR(at_schedule_lr(&s, 0), 1e-3, 1e-12); /* transformers' "constant" has no warmup */
    s.kind = AT_SCHED_CONSTANT_WARMUP;
    CHECK_NEAR(at_schedule_lr(&s, 2), 0.2e-3, 1e-12);
    CHECK_NEAR(at_schedule_lr(&s, 100), 1e-3, 1e-12);
    CHECK(at_schedule_warmup_steps(0, 0.05, 101) == 6); /* ceil(5.05) */
    CHECK(at_schedule_warmup_steps(3, 0.5, 100) == 3);
    at_schedule_kind k;
    CHECK_OK(at_schedule_parse("cosine", &k));
    CHECK_FAILS(at_schedule_parse("cosine_with_restarts_and_jazz", &k), AT_ERR_INVALID);
}

static void test_plot(void)
{
    int64_t steps[5] = {1, 2, 3, 4, 5}, esteps[2] = {2, 4};
    double loss[5] = {3.0, 2.5, NAN, 1.8, 1.5}, eval[2] = {2.7, 2.0}, lr[5] = {1e-4, 1e-4, 9e-5, 7e-5, 5e-5};
    at_plot_series l = {steps, loss, 5}, e = {esteps, eval, 2}, r = {steps, lr, 5};
    char path[] = "/tmp/anytune-plot-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(at_plot_loss_svg(path, &l, &e, &r));
    char *svg = NULL;
    CHECK_OK(at_read_file(path, &svg, NULL));
    if (svg) {
        CHECK(!strncmp(svg, "<svg ", 5) && strstr(svg, "</svg>") != NULL);
        int polylines = 0, points = 0;
        for (char *p = svg; (p = strstr(p, "<polyline")); p++) polylines++;
        char *first = strstr(svg, "points=\"");
        for (char *p = first + 8; *p && *p != '"'; p++) points += *p == ',';
        CHECK(polylines == 3);
        CHECK(points == 4); /* the NaN loss is left out, not drawn as garbage */
        CHECK(strstr(svg, "nan") == NULL && strstr(svg, "inf") == NULL);
    }
    free(svg);
    unlink(path);
}

/* One writer per run: a second is refused naming the holder's pid; the lock
 * of a process that died (kill -9) does not block; release lets the next in. */
static void test_run_lock(void)
{
    char root[] = "/tmp/anytune-lock-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    at_run_lock a = {-1, NULL}, b = {-1, NULL};
    CHECK_OK(at_run_lock_take(root, &a));
    CHECK_FAILS(at_run_lock_take(root, &b), AT_ERR_INVALID);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    CHECK_MSG(strstr(at_last_error(), pid) != NULL, "%s", at_last_error());
    CHECK(b.fd < 0 && b.path == NULL);
    at_run_lock_release(&a);
    at_run_lock_release(&a); /* twice is harmless */
    CHECK_OK(at_run_lock_take(root, &b));
    at_run_lock_release(&b);
    /* a holder killed with its lock held: the file stays, the lock does not */
    pid_t child = fork();
    if (child == 0) {
        at_run_lock c = {-1, NULL};
        if (at_run_lock_take(root, &c) != AT_OK) _exit(1);
        raise(SIGKILL);
        _exit(2);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    char *lf = at_path_join(root, ".anytune.lock");
    CHECK(at_file_exists(lf));
    free(lf);
    CHECK_OK(at_run_lock_take(root, &a));
    at_run_lock_release(&a);
    CHECK_OK(at_remove_tree(root));
}

/* --resume_from_checkpoint: a folder names its run; "last" takes the newest
 * run with a complete checkpoint; a missing folder is said to be missing. */
static void test_find_resume(void)
{
    char root[] = "/tmp/anytune-resume-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char *run0 = NULL, *run1 = NULL, *dir = NULL, *rd = NULL, *ck = NULL;
    int64_t step = 0;
    CHECK_FAILS(at_run_find_resume(root, "last", 1, &rd, &ck, &step), AT_ERR_NOT_FOUND);
    CHECK_OK(at_run_dir_create(root, &run0));
    CHECK_OK(at_ckpt_begin(run0, 4, &dir));
    write_text(dir, "adapter_model.safetensors", "w");
    CHECK_OK(at_ckpt_commit(run0, 4, dir));
    free(dir);
    CHECK_OK(at_run_dir_create(root, &run1)); /* newer, no checkpoint */
    CHECK_OK(at_run_find_resume(root, "last", 1, &rd, &ck, &step));
    CHECK(rd && !strcmp(rd, run0) && step == 4 && ck && strstr(ck, "checkpoint-4"));
    char given[1100];
    snprintf(given, sizeof given, "%s/", ck);
    free(rd);
    free(ck);
    CHECK_OK(at_run_find_resume(root, given, 1, &rd, &ck, &step));
    CHECK(rd && !strcmp(rd, run0) && step == 4);
    free(rd);
    free(ck);
    CHECK_FAILS(at_run_find_resume(root, "/nonexistent/checkpoint-3", 1, &rd, &ck, &step), AT_ERR_NOT_FOUND);
    CHECK_MSG(strstr(at_last_error(), "no such checkpoint folder"), "%s", at_last_error());
    /* --add_version false: the folder given is the run */
    CHECK_OK(at_run_find_resume(run0, "last", 0, &rd, &ck, &step));
    CHECK(rd && !strcmp(rd, run0) && step == 4);
    free(rd);
    free(ck);
    CHECK_FAILS(at_run_find_resume(run1, "last", 0, &rd, &ck, &step), AT_ERR_NOT_FOUND);
    CHECK(rd == NULL && ck == NULL);
    CHECK_OK(at_remove_tree(root));
    free(run0);
    free(run1);
}

int main(void)
{
    test_run_lock();
    test_find_resume();
    test_plot();
    test_checkpoints();
    test_best_checkpoint();
    test_schedules();
    return at_test_result("test_run_files");
}
