#include "serve/webui_train.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/json.h"
#include "device/registry.h"
#include "train/objective.h"
#include "train/train_options.h"

/* ---- the allow-list ------------------------------------------------------------------ */

typedef enum {
    V_PATH_IN,  /* an existing file or folder */
    V_DATASET,  /* one or a list of existing files, each optionally FILE#N */
    V_PATH_OUT, /* a folder that may not exist yet */
    V_INT,
    V_NUM,
    V_ENUM,
    V_BOOL,
    V_DEVICE, /* auto or a device kind of device/registry.h (cuda:N) */
    V_TEXT    /* free text (self-cognition names), one line */
} vkind;

typedef struct {
    const char *name;
    vkind kind;
    const char *choices; /* V_ENUM: "a|b|c" when narrower than the option table's */
    int rlhf;            /* `anytune rlhf`'s (at_rlhf_options): given only with rlhf_type */
} field;

/* `anytune sft` and `anytune rlhf` options the Train tab may set. Their
 * types, ranges and choices are the option tables' (train/train_options.c),
 * checked by their own function; this list says which options and what kind
 * of path.
 * Left out on purpose: config (reads any file as options), adapters and
 * resume_from_checkpoint (paths into other runs), dry_run, simulate_device. */
static const field fields[] = {
    {"model", V_PATH_IN, NULL, 0},
    {"dataset", V_DATASET, NULL, 0},
    {"val_dataset", V_DATASET, NULL, 0},
    {"split_dataset_ratio", V_NUM, NULL, 0},
    {"template", V_ENUM, "chatml|llama-2|llama-3|mistral", 0},
    {"train_type", V_ENUM, NULL, 0},
    {"quant_bits", V_ENUM, "0|4|8", 0},
    {"lora_rank", V_INT, NULL, 0},
    {"lora_alpha", V_NUM, NULL, 0},
    {"lora_dropout", V_NUM, NULL, 0},
    {"neftune_noise_alpha", V_NUM, NULL, 0},
    {"learning_rate", V_NUM, NULL, 0},
    {"num_train_epochs", V_NUM, NULL, 0},
    {"max_steps", V_INT, NULL, 0},
    {"per_device_train_batch_size", V_INT, NULL, 0},
    {"gradient_accumulation_steps", V_INT, NULL, 0},
    {"max_length", V_INT, NULL, 0},
    {"packing", V_BOOL, NULL, 0},
    {"gradient_checkpointing", V_BOOL, NULL, 0},
    {"lr_scheduler_type", V_ENUM, NULL, 0},
    {"warmup_ratio", V_NUM, NULL, 0},
    {"weight_decay", V_NUM, NULL, 0},
    {"max_grad_norm", V_NUM, NULL, 0},
    {"logging_steps", V_INT, NULL, 0},
    {"save_steps", V_INT, NULL, 0},
    {"save_total_limit", V_INT, NULL, 0},
    {"output_dir", V_PATH_OUT, NULL, 0},
    {"torch_dtype", V_ENUM, NULL, 0},
    {"seed", V_INT, NULL, 0},
    {"device", V_DEVICE, NULL, 0},
    {"model_name", V_TEXT, NULL, 0},
    {"model_author", V_TEXT, NULL, 0},
    /* rlhf_type makes the job `anytune rlhf` (its choices: the objectives of
     * this build, train/objective.c), with its own options */
    {"rlhf_type", V_ENUM, NULL, 1},
    {"beta", V_NUM, NULL, 1},
    {"loss_type", V_ENUM, "sigmoid|ipo|hinge|simpo", 1},
    {"label_smoothing", V_NUM, NULL, 1},
    {"rpo_alpha", V_NUM, NULL, 1},
    {"cpo_alpha", V_NUM, NULL, 1},
    {"simpo_gamma", V_NUM, NULL, 1},
    {"desirable_weight", V_NUM, NULL, 1},
    {"undesirable_weight", V_NUM, NULL, 1},
    {"center_rewards_coefficient", V_NUM, NULL, 1},
    {"ref_model", V_PATH_IN, NULL, 1},
};
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))
#define MAX_PATH_LEN 4096
#define MAX_DATASETS 16

static const field *find_field(const char *name)
{
    for (int i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].name, name)) return &fields[i];
    return NULL;
}

static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "a list";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* Characters a shell would act on, and the comma that splits list options:
 * refused in paths so that what the user typed is what the trainer opens
 * (the value goes to the trainer as one argv item either way). */
static const char bad_path_chars[] = ";|&$`<>(){}*?!\"'\\,";

static at_status check_text(const char *name, const char *s, size_t max)
{
    size_t n = strlen(s);
    if (!n) return at_error(AT_ERR_INVALID, "%s: must not be empty", name);
    if (n > max) return at_error(AT_ERR_INVALID, "%s: longer than %zu characters", name, max);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return at_error(AT_ERR_INVALID, "%s: control character (code %d) at position %zu", name, s[i], i);
    return AT_OK;
}

static at_status check_path(const char *name, const char *s, int must_exist, int allow_count)
{
    AT_TRY(check_text(name, s, MAX_PATH_LEN));
    if (s[0] == '-') return at_error(AT_ERR_INVALID, "%s: a path may not begin with '-': %s", name, s);
    size_t bad = strcspn(s, bad_path_chars);
    if (s[bad])
        return at_error(AT_ERR_INVALID, "%s: the character '%c' is not allowed in a path (got \"%.200s\")", name,
                        s[bad], s);
    char path[MAX_PATH_LEN + 1];
    snprintf(path, sizeof path, "%s", s);
    char *hash = strchr(path, '#');
    if (hash) {
        /* FILE#N: N samples of FILE */
        const char *d = hash + 1;
        if (!allow_count || !*d || strspn(d, "0123456789") != strlen(d))
            return at_error(AT_ERR_INVALID, "%s: '#' is allowed only as FILE#N (N samples), got \"%.200s\"", name, s);
        *hash = 0;
    }
    if (must_exist && !at_file_exists(path))
        return at_error(AT_ERR_INVALID, "%s: no such file or folder: %.300s", name, path);
    return AT_OK;
}

static at_status check_enum(const char *name, const char *s, const char *choices)
{
    size_t n = strlen(s);
    for (const char *p = choices; *p;) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, s, n)) return AT_OK;
        p += len + (p[len] == '|');
    }
    return at_error(AT_ERR_INVALID, "%s: \"%.100s\" is not one of %s", name, s, choices);
}

/* Appends "--name=value" to a. */
static at_status push_arg(at_train_argv *a, const char *name, const char *value)
{
    char **p = realloc(a->argv, (size_t)(a->argc + 2) * sizeof *p);
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    a->argv = p;
    size_t n = strlen(name) + strlen(value) + 4;
    char *s = malloc(n);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
    if (name[0])
        snprintf(s, n, "--%s=%s", name, value);
    else
        snprintf(s, n, "%s", value);
    a->argv[a->argc++] = s;
    a->argv[a->argc] = NULL;
    return AT_OK;
}

/* Checks one option's value and appends its argument(s). */
static at_status add_field(at_train_argv *a, const field *f, const cJSON *v)
{
    char buf[64], types[256];
    const at_opt_spec *row = f->rlhf ? at_opt_find(at_rlhf_options, at_rlhf_n_options, f->name)
                                     : at_opt_find(at_train_options, at_train_n_options, f->name);
    if (!row) return at_error(AT_ERR_INTERNAL, "%s: not in the option table", f->name);
    const char *choices = f->choices ? f->choices : row->choices ? row->choices : "";
    if (!strcmp(f->name, "rlhf_type")) {
        at_objective_rlhf_names(types, sizeof types);
        choices = types;
    }
    switch (f->kind) {
    case V_PATH_IN:
    case V_PATH_OUT:
        if (!cJSON_IsString(v)) return at_error(AT_ERR_INVALID, "%s: expected a path (a string), got %s", f->name, type_name(v));
        AT_TRY(check_path(f->name, v->valuestring, f->kind == V_PATH_IN, 0));
        return push_arg(a, f->name, v->valuestring);
    case V_DATASET: {
        if (cJSON_IsString(v)) {
            AT_TRY(check_path(f->name, v->valuestring, 1, 1));
            return push_arg(a, f->name, v->valuestring);
        }
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 || cJSON_GetArraySize(v) > MAX_DATASETS)
            return at_error(AT_ERR_INVALID, "%s: expected a path or a list of 1 to %d paths, got %s", f->name,
                            MAX_DATASETS, type_name(v));
        const cJSON *it;
        cJSON_ArrayForEach(it, v)
        {
            if (!cJSON_IsString(it))
                return at_error(AT_ERR_INVALID, "%s: expected paths (strings) in the list, got %s", f->name,
                                type_name(it));
            AT_TRY(check_path(f->name, it->valuestring, 1, 1));
            AT_TRY(push_arg(a, f->name, it->valuestring));
        }
        return AT_OK;
    }
    case V_INT: {
        if (!cJSON_IsNumber(v)) return at_error(AT_ERR_INVALID, "%s: expected an integer, got %s", f->name, type_name(v));
        double d = v->valuedouble;
        if (d != floor(d) || fabs(d) > 9e18)
            return at_error(AT_ERR_INVALID, "%s: expected an integer, got %g", f->name, d);
        snprintf(buf, sizeof buf, "%lld", (long long)d);
        AT_TRY(at_opt_check_value(row, buf, f->name));
        return push_arg(a, f->name, buf);
    }
    case V_NUM: {
        if (!cJSON_IsNumber(v)) return at_error(AT_ERR_INVALID, "%s: expected a number, got %s", f->name, type_name(v));
        snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
        AT_TRY(at_opt_check_value(row, buf, f->name));
        return push_arg(a, f->name, buf);
    }
    case V_ENUM: {
        const char *s = NULL;
        if (cJSON_IsString(v)) {
            s = v->valuestring;
        } else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 1e9) {
            snprintf(buf, sizeof buf, "%lld", (long long)v->valuedouble); /* quant_bits: 4 */
            s = buf;
        } else {
            return at_error(AT_ERR_INVALID, "%s: expected one of %s, got %s", f->name, choices, type_name(v));
        }
        AT_TRY(check_enum(f->name, s, choices));
        return push_arg(a, f->name, s);
    }
    case V_BOOL:
        if (!cJSON_IsBool(v)) return at_error(AT_ERR_INVALID, "%s: expected true or false, got %s", f->name, type_name(v));
        return push_arg(a, f->name, cJSON_IsTrue(v) ? "true" : "false");
    case V_DEVICE: {
        if (!cJSON_IsString(v)) return at_error(AT_ERR_INVALID, "%s: expected a string, got %s", f->name, type_name(v));
        const char *s = v->valuestring;
        /* the device words come from the registry's table of device kinds */
        AT_TRY(at_device_spec_check(s, f->name));
        return push_arg(a, f->name, s);
    }
    case V_TEXT:
        if (!cJSON_IsString(v)) return at_error(AT_ERR_INVALID, "%s: expected a string, got %s", f->name, type_name(v));
        AT_TRY(check_text(f->name, v->valuestring, 200));
        return push_arg(a, f->name, v->valuestring);
    }
    return at_error(AT_ERR_INTERNAL, "%s: unknown kind", f->name);
}

void at_train_argv_free(at_train_argv *a)
{
    for (int i = 0; a->argv && i < a->argc; i++) free(a->argv[i]);
    free(a->argv);
    a->argv = NULL;
    a->argc = 0;
}

static void set_param(char *param, size_t cap, const char *name)
{
    if (cap) snprintf(param, cap, "%s", name ? name : "");
}

at_status at_train_argv_build(const char *body, size_t len, const char *program, at_train_argv *a, char *param,
                              size_t cap)
{
    memset(a, 0, sizeof *a);
    set_param(param, cap, NULL);
    at_status st = AT_OK;
    cJSON *j = NULL;
    char why[256] = "";
    /* strict: bytes after the object (a second object, a stray option) are refused, not ignored */
    if (at_json_parse(body ? body : "", body ? len : 0, "request body", &j) != AT_OK)
        snprintf(why, sizeof why, "%s; ", at_last_error());
    if (!j || !cJSON_IsObject(j)) {
        st = at_error(AT_ERR_FORMAT, "%sthe body must be a JSON object of `anytune sft` (with rlhf_type: rlhf) "
                                     "options, e.g. "
                                     "{\"model\": \"demo/stories260K\", \"dataset\": \"demo/identity.json\"}",
                      why);
        goto done;
    }
    /* rlhf_type: an `anytune rlhf` job (its own options allowed) */
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(j, "rlhf_type");
    int rlhf = rt && !cJSON_IsNull(rt);
    AT_CHECK(push_arg(a, "", program));
    AT_CHECK(push_arg(a, "", rlhf ? "rlhf" : "sft"));
    const cJSON *v;
    int have_model = 0, have_data = 0;
    cJSON_ArrayForEach(v, j)
    {
        const char *name = v->string ? v->string : "";
        const field *f = find_field(name);
        if (!f) {
            char list[1024] = "";
            for (int i = 0; i < NFIELDS; i++) {
                size_t n = strlen(list);
                snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", fields[i].name);
            }
            set_param(param, cap, name);
            st = at_error(AT_ERR_INVALID, "%.80s: not an option the Train tab accepts (%s)", name, list);
            goto done;
        }
        /* a key given twice would make the second silently win */
        for (const cJSON *w = j->child; w != v; w = w->next)
            if (w->string && !strcmp(w->string, name)) {
                set_param(param, cap, name);
                st = at_error(AT_ERR_INVALID, "%s: given twice", name);
                goto done;
            }
        if (cJSON_IsNull(v)) continue; /* unset: the trainer's default */
        if (f->rlhf && !rlhf) {
            set_param(param, cap, name);
            st = at_error(AT_ERR_INVALID, "%s: an option of `anytune rlhf`: set rlhf_type too", name);
            goto done;
        }
        st = add_field(a, f, v);
        if (st != AT_OK) {
            set_param(param, cap, name);
            goto done;
        }
        have_model |= !strcmp(name, "model");
        have_data |= !strcmp(name, "dataset");
    }
    if (!have_model || !have_data) {
        set_param(param, cap, have_model ? "dataset" : "model");
        st = at_error(AT_ERR_INVALID, "%s: required", have_model ? "dataset" : "model");
    }
done:
    cJSON_Delete(j);
    return st;
}

/* ---- the child process ----------------------------------------------------------------- */

typedef enum { S_IDLE = 0, S_STARTING, S_RUNNING, S_FINISHED, S_FAILED, S_STOPPED } job_state;

static const char *state_name(job_state s)
{
    static const char *const n[] = {"idle", "starting", "running", "finished", "failed", "stopped"};
    return n[s];
}

#define RING 64 /* lines of output kept */
/* bytes kept of one line: room for the trainer's "...; output in DIR" line
 * with the longest output_dir accepted, so that run_dir is never cut */
#define LINE_CAP (MAX_PATH_LEN + 512)

struct at_train_job {
    char *program;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_state state;
    int thread_live; /* th is joinable */
    pthread_t th;
    pid_t pid;
    int exit_code, term_signal; /* -1 when not applicable */
    int stop_requested;
    char error[256]; /* why the process could not start */
    at_train_argv args;
    char *run_dir;
    char *lines[RING];
    long n_lines; /* lines seen in all; lines[i % RING] */
    char partial[LINE_CAP];
    size_t partial_len;
    double started, ended;
};

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Under j->mu: one whole line of the child's output. */
static void push_line(at_train_job *j)
{
    j->partial[j->partial_len] = 0;
    j->partial_len = 0;
    char *s = strdup(j->partial);
    if (!s) return;
    /* the trainer says where the run goes: "...; output in DIR" */
    const char *at = strstr(s, "; output in ");
    if (at && !j->run_dir) j->run_dir = strdup(at + 12);
    free(j->lines[j->n_lines % RING]);
    j->lines[j->n_lines % RING] = s;
    j->n_lines++;
}

/* Under j->mu: bytes of output; '\r' ends a line as '\n' does (progress bars). */
static void feed(at_train_job *j, const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\n' || c == '\r') {
            if (j->partial_len) push_line(j);
        } else if (j->partial_len < LINE_CAP - 1) {
            j->partial[j->partial_len++] = c;
        }
    }
}

/* Under j->mu, while the job runs: sig to the child's process group (it made
 * one with setpgid), so that a process it started, holding the output pipe
 * open, ends with it instead of keeping the monitor (and a server stopping)
 * waiting; the child alone when the group is gone. */
static void signal_job(at_train_job *j, int sig)
{
    if (kill(-j->pid, sig) != 0) kill(j->pid, sig);
}

static void set_state(at_train_job *j, job_state s)
{
    j->state = s;
    pthread_cond_broadcast(&j->cv);
}

/* glibc >= 2.34 can close every inherited descriptor in the child */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
#define HAVE_CLOSEFROM_NP 1
#endif

/* Starts the child with posix_spawn, not fork: a server holding a model
 * would have its page tables copied (slow; ENOMEM under strict overcommit)
 * only for an exec. What the child gets:
 *  - stdin /dev/null, stdout and stderr the write end of `out_w`;
 *  - no other descriptor: ours are O_CLOEXEC (libmicrohttpd's sockets too),
 *    and on glibc >= 2.34 every descriptor >= 3 is closed, so that one
 *    opened without O_CLOEXEC elsewhere in the server (or inherited by it)
 *    does not reach the trainer either;
 *  - an empty signal mask (the server blocks SIGTERM/SIGINT for sigwait)
 *    and SIGPIPE/SIGTERM/SIGINT at their defaults (ignored dispositions
 *    survive exec; caught ones are reset by exec anyway);
 *  - its own process group, so that a Ctrl-C at the server's terminal goes
 *    to the server (which stops the job) and a stop reaches the processes
 *    the child starts;
 *  - the server's environment and working directory, plus
 *    ANYTUNE_WEBUI_SERVER_PID=<our pid>: posix_spawn cannot set
 *    PR_SET_PDEATHSIG in the child as fork could, so the trainer sets it
 *    itself (cli/cmd_train.c): if the server dies, the job stops as Stop
 *    stops it (one SIGTERM: the step under way is checkpointed), instead of
 *    training on unseen or dying of SIGPIPE with its work since the last
 *    checkpoint lost. The death signal comes when the thread that started
 *    the child ends; this one lives until the child is reaped.
 * Returns 0 or the errno posix_spawn reports (exec failures included). */
static int spawn_child(char *const argv[], int out_w, pid_t *pid)
{
    /* environ plus our pid */
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = calloc(n_env + 2, sizeof *envp);
    char server_pid[64];
    if (!envp) return ENOMEM;
    snprintf(server_pid, sizeof server_pid, "ANYTUNE_WEBUI_SERVER_PID=%ld", (long)getpid());
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "ANYTUNE_WEBUI_SERVER_PID=", 25)) envp[k++] = environ[i];
    envp[k++] = server_pid;
    envp[k] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int have_fa = 0, have_at = 0, e;
    if ((e = posix_spawn_file_actions_init(&fa)) != 0) goto done;
    have_fa = 1;
    if ((e = posix_spawnattr_init(&at)) != 0) goto done;
    have_at = 1;
    /* 1 and 2 before 0: out_w may itself be 0 (a server started with
     * stdin closed); dup2(fd, fd) clears FD_CLOEXEC as POSIX asks */
    if ((e = posix_spawn_file_actions_adddup2(&fa, out_w, 1)) != 0) goto done;
    if ((e = posix_spawn_file_actions_adddup2(&fa, out_w, 2)) != 0) goto done;
    if ((e = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) != 0) goto done;
#ifdef HAVE_CLOSEFROM_NP
    if ((e = posix_spawn_file_actions_addclosefrom_np(&fa, 3)) != 0) goto done;
#endif
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGINT);
    if ((e = posix_spawnattr_setsigmask(&at, &none)) != 0) goto done;
    if ((e = posix_spawnattr_setsigdefault(&at, &dfl)) != 0) goto done;
    if ((e = posix_spawnattr_setpgroup(&at, 0)) != 0) goto done;
    if ((e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)) !=
        0)
        goto done;
    e = posix_spawn(pid, argv[0], &fa, &at, argv, envp);
done:
    if (have_fa) posix_spawn_file_actions_destroy(&fa);
    if (have_at) posix_spawnattr_destroy(&at);
    free(envp);
    return e;
}

/* Starts the child, reads its output, reaps it. */
static void *monitor(void *arg)
{
    at_train_job *j = arg;
    int out[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0) {
        pthread_mutex_lock(&j->mu);
        snprintf(j->error, sizeof j->error, "cannot create a pipe: %s", strerror(errno));
        set_state(j, S_FAILED);
        pthread_mutex_unlock(&j->mu);
        goto done;
    }
    pid_t pid = 0;
    int e = spawn_child(j->args.argv, out[1], &pid);
    close(out[1]); /* the child's copy is the only writer: EOF when it and its own children are done */
    out[1] = -1;
    if (e != 0) {
        pthread_mutex_lock(&j->mu);
        snprintf(j->error, sizeof j->error, "cannot run %.150s: %s", j->args.argv[0], strerror(e));
        set_state(j, S_FAILED);
        pthread_mutex_unlock(&j->mu);
        goto done;
    }
    pthread_mutex_lock(&j->mu);
    j->pid = pid;
    set_state(j, S_RUNNING);
    pthread_mutex_unlock(&j->mu);

    char buf[4096];
    for (;;) {
        ssize_t n = read(out[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        pthread_mutex_lock(&j->mu);
        feed(j, buf, (size_t)n);
        pthread_mutex_unlock(&j->mu);
    }
    /* wait without reaping, then reap under the lock: while the state says
     * running, the pid is still ours, so a stop never signals a reused pid */
    siginfo_t si;
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR) {}
    pthread_mutex_lock(&j->mu);
    int status = 0;
    pid_t w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {}
    int wait_errno = errno;
    if (j->partial_len) push_line(j);
    j->ended = mono_now();
    if (w != pid) {
        /* reaped by someone else (SIGCHLD ignored, a waitpid(-1) elsewhere):
         * the outcome is unknown, which is not a success */
        snprintf(j->error, sizeof j->error, "the training process %d ended but its exit status is lost: %s", (int)pid,
                 strerror(wait_errno));
        set_state(j, j->stop_requested ? S_STOPPED : S_FAILED);
    } else if (WIFEXITED(status)) {
        j->exit_code = WEXITSTATUS(status);
        set_state(j, j->exit_code == 0 ? S_FINISHED : j->stop_requested ? S_STOPPED : S_FAILED);
    } else {
        j->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : -1;
        set_state(j, j->stop_requested ? S_STOPPED : S_FAILED);
    }
    pthread_mutex_unlock(&j->mu);
done:
    for (int i = 0; i < 2; i++)
        if (out[i] >= 0) close(out[i]);
    return NULL;
}

at_status at_train_job_new(const char *program, at_train_job **out)
{
    *out = NULL;
    at_train_job *j = calloc(1, sizeof *j);
    if (!j) return at_error(AT_ERR_NOMEM, "out of memory");
    j->program = strdup(program && program[0] ? program : "/proc/self/exe");
    if (!j->program) {
        free(j);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->exit_code = j->term_signal = -1;
    *out = j;
    return AT_OK;
}

/* Under j->mu, with no job running: forgets the previous job. */
static void reset(at_train_job *j)
{
    if (j->thread_live) {
        pthread_join(j->th, NULL); /* it ended: the state is final */
        j->thread_live = 0;
    }
    at_train_argv_free(&j->args);
    free(j->run_dir);
    j->run_dir = NULL;
    for (int i = 0; i < RING; i++) {
        free(j->lines[i]);
        j->lines[i] = NULL;
    }
    j->n_lines = 0;
    j->partial_len = 0;
    j->pid = 0;
    j->exit_code = j->term_signal = -1;
    j->stop_requested = 0;
    j->error[0] = 0;
    j->state = S_IDLE;
}

at_status at_train_job_start(at_train_job *j, const char *body, size_t len, char *param, size_t cap)
{
    at_train_argv a;
    at_status st = at_train_argv_build(body, len, j->program, &a, param, cap);
    if (st != AT_OK) {
        at_train_argv_free(&a);
        return st;
    }
    pthread_mutex_lock(&j->mu);
    if (j->state == S_RUNNING || j->state == S_STARTING) {
        st = at_error(AT_ERR_UNSUPPORTED, "a training job is already running (pid %d): stop it or wait for it to end",
                      (int)j->pid);
        pthread_mutex_unlock(&j->mu);
        at_train_argv_free(&a);
        return st;
    }
    reset(j);
    j->args = a;
    j->state = S_STARTING;
    j->started = mono_now();
    if (pthread_create(&j->th, NULL, monitor, j) != 0) {
        j->state = S_IDLE;
        pthread_mutex_unlock(&j->mu);
        return at_error(AT_ERR_IO, "cannot start a thread for the training job");
    }
    j->thread_live = 1;
    while (j->state == S_STARTING) pthread_cond_wait(&j->cv, &j->mu);
    if (j->state == S_FAILED && j->error[0]) st = at_error(AT_ERR_IO, "%s", j->error);
    pthread_mutex_unlock(&j->mu);
    return st;
}

at_status at_train_job_stop(at_train_job *j)
{
    pthread_mutex_lock(&j->mu);
    at_status st = AT_OK;
    if (j->state != S_RUNNING) {
        st = at_error(AT_ERR_NOT_FOUND, "no training job is running (state: %s)", state_name(j->state));
    } else {
        j->stop_requested = 1;
        signal_job(j, SIGTERM);
    }
    pthread_mutex_unlock(&j->mu);
    return st;
}

/* Appends the rows of DIR/logging.jsonl from index `since` on (complete lines only). */
static void add_log_rows(cJSON *o, const char *run_dir, long since)
{
    cJSON *rows = cJSON_AddArrayToObject(o, "log");
    long total = 0;
    char *path = run_dir ? at_path_join(run_dir, "logging.jsonl") : NULL, *text = NULL;
    size_t len = 0;
    if (path && at_file_exists(path) && at_read_file(path, &text, &len) == AT_OK) {
        const char *p = text, *end = text + len;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl) break; /* a row being written */
            if (total >= since && rows) {
                /* a row that is not JSON stays as {}: row i of the answer is row since+i of the file */
                cJSON *row = cJSON_ParseWithLength(p, (size_t)(nl - p));
                cJSON_AddItemToArray(rows, row ? row : cJSON_CreateObject());
            }
            total++;
            p = nl + 1;
        }
    }
    at_clear_error();
    cJSON_AddNumberToObject(o, "log_total", (double)total);
    free(text);
    free(path);
}

char *at_train_job_status_json(at_train_job *j, long since)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    pthread_mutex_lock(&j->mu);
    job_state s = j->state;
    cJSON_AddStringToObject(o, "state", state_name(s));
    if (j->pid > 0)
        cJSON_AddNumberToObject(o, "pid", j->pid);
    else
        cJSON_AddNullToObject(o, "pid");
    if (j->exit_code >= 0)
        cJSON_AddNumberToObject(o, "exit_code", j->exit_code);
    else
        cJSON_AddNullToObject(o, "exit_code");
    if (j->term_signal >= 0)
        cJSON_AddNumberToObject(o, "signal", j->term_signal);
    else
        cJSON_AddNullToObject(o, "signal");
    if (j->error[0]) cJSON_AddStringToObject(o, "error", j->error);
    if (s != S_IDLE)
        cJSON_AddNumberToObject(o, "elapsed_s", (s == S_RUNNING || s == S_STARTING ? mono_now() : j->ended) - j->started);
    cJSON *argv = cJSON_AddArrayToObject(o, "argv");
    for (int i = 0; argv && i < j->args.argc; i++) cJSON_AddItemToArray(argv, cJSON_CreateString(j->args.argv[i]));
    if (j->run_dir)
        cJSON_AddStringToObject(o, "run_dir", j->run_dir);
    else
        cJSON_AddNullToObject(o, "run_dir");
    cJSON *lines = cJSON_AddArrayToObject(o, "output");
    long first = j->n_lines > RING ? j->n_lines - RING : 0;
    for (long i = first; lines && i < j->n_lines; i++)
        cJSON_AddItemToArray(lines, cJSON_CreateString(j->lines[i % RING]));
    char *run_dir = j->run_dir ? strdup(j->run_dir) : NULL;
    pthread_mutex_unlock(&j->mu);
    add_log_rows(o, run_dir, since < 0 ? 0 : since);
    free(run_dir);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

void at_train_job_free(at_train_job *j, double grace_s)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    while (j->state == S_STARTING) pthread_cond_wait(&j->cv, &j->mu);
    if (j->state == S_RUNNING) {
        j->stop_requested = 1;
        signal_job(j, SIGTERM);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + (grace_s > 0 ? grace_s : 0);
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        while (j->state == S_RUNNING)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT) break;
        if (j->state == S_RUNNING) signal_job(j, SIGKILL);
        while (j->state == S_RUNNING) pthread_cond_wait(&j->cv, &j->mu);
    }
    reset(j);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->program);
    free(j);
}
