#include "train/grpo_reward.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/json.h"
#include "base/log.h"
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>

static const char *const BUILTINS[] = {"accuracy", "format", "cosine", "repetition", "soft_overlong", NULL};

const char *at_grpo_builtin_name(int i) { return i >= 0 && i < 5 ? BUILTINS[i] : NULL; }

/* ---- answers ---- */

/* The content of the last \boxed{...} with balanced braces: [*b, *e). */
static int last_boxed(const char *s, const char **b, const char **e)
{
    int found = 0;
    for (const char *p = strstr(s, "\\boxed{"); p; p = strstr(p + 1, "\\boxed{")) {
        const char *q = p + 7;
        int depth = 1;
        const char *r = q;
        for (; *r && depth; r++) depth += *r == '{' ? 1 : *r == '}' ? -1 : 0;
        if (depth) continue;
        *b = q;
        *e = r - 1;
        found = 1;
    }
    return found;
}

static int last_tagged(const char *s, const char *open, const char *close, const char **b, const char **e)
{
    int found = 0;
    for (const char *p = strstr(s, open); p; p = strstr(p + 1, open)) {
        const char *q = p + strlen(open), *r = strstr(q, close);
        if (!r) continue;
        *b = q;
        *e = r;
        found = 1;
    }
    return found;
}

/* The last number of [b, e) (digits with an optional sign, thousands commas and decimals). */
static int last_number(const char *b, const char *e, const char **nb, const char **ne)
{
    int found = 0;
    for (const char *p = b; p < e;) {
        if (!isdigit((unsigned char)*p)) {
            p++;
            continue;
        }
        const char *s = p;
        if (s > b && s[-1] == '-') s--;
        while (p < e && (isdigit((unsigned char)*p) || ((*p == '.' || *p == ',') && p + 1 < e &&
                                                         isdigit((unsigned char)p[1]))))
            p++;
        *nb = s;
        *ne = p;
        found = 1;
    }
    return found;
}

/* [b, e) without white space and `$` into buf (cut to cap - 1). */
static size_t squeeze(const char *b, const char *e, char *buf, size_t cap)
{
    size_t n = 0;
    for (const char *p = b; p < e && n + 1 < cap; p++)
        if (!isspace((unsigned char)*p) && *p != '$') buf[n++] = *p;
    buf[n] = '\0';
    return n;
}

int at_grpo_extract_answer(const char *text, char *buf, size_t cap)
{
    const char *b, *e;
    if (!cap) return 0;
    buf[0] = '\0';
    if (!text) return 0;
    if (!last_boxed(text, &b, &e) && !last_tagged(text, "<answer>", "</answer>", &b, &e) &&
        !last_number(text, text + strlen(text), &b, &e))
        return 0;
    return squeeze(b, e, buf, cap) > 0;
}

/* A solution's answer: its \boxed{} or <answer>, else what follows GSM8K's "####", else all of it. */
static void solution_answer(const char *s, char *buf, size_t cap)
{
    const char *b, *e, *h;
    if (last_boxed(s, &b, &e) || last_tagged(s, "<answer>", "</answer>", &b, &e)) {
        squeeze(b, e, buf, cap);
        return;
    }
    h = strstr(s, "####");
    b = h ? h + 4 : s;
    squeeze(b, b + strlen(b), buf, cap);
}

/* The answer as a number (commas dropped), if it is one. */
static int as_number(const char *s, double *out)
{
    char tmp[128];
    size_t n = 0;
    for (const char *p = s; *p && n + 1 < sizeof tmp; p++)
        if (*p != ',') tmp[n++] = *p;
    tmp[n] = '\0';
    if (!n) return 0;
    char *end;
    errno = 0;
    double v = strtod(tmp, &end);
    if (*end || errno || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

at_status at_grpo_reward_accuracy(const char *completion, const char *solution, double *out)
{
    *out = 0;
    if (!solution)
        return at_error(AT_ERR_INVALID, "reward accuracy: the record has no \"solution\" to compare with (give each "
                        "record one, or drop accuracy from --reward_funcs)");
    char want[256], got[256];
    solution_answer(solution, want, sizeof want);
    if (!at_grpo_extract_answer(completion, got, sizeof got)) return AT_OK;
    double a, b;
    if (as_number(got, &a) && as_number(want, &b)) *out = fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b));
    else *out = strcmp(got, want) == 0;
    return AT_OK;
}

double at_grpo_reward_format(const char *s)
{
    if (strncmp(s, "<think>", 7) != 0) return 0;
    size_t n = strlen(s);
    if (n < 9 || strcmp(s + n - 9, "</answer>") != 0) return 0;
    /* some </think>, then white space, then <answer> whose content runs to the final </answer> */
    for (const char *p = strstr(s + 7, "</think>"); p; p = strstr(p + 1, "</think>")) {
        const char *q = p + 8;
        while (isspace((unsigned char)*q)) q++;
        if (!strncmp(q, "<answer>", 8) && q + 8 <= s + n - 9) return 1;
    }
    return 0;
}

double at_grpo_reward_cosine(const at_grpo_config *c, int correct, int tokens)
{
    int L = c->cosine_max_len > 0 ? c->cosine_max_len : c->max_completion_length;
    double hi = correct ? c->cosine_min_len_value_correct : c->cosine_min_len_value_wrong;
    double lo = correct ? c->cosine_max_len_value_correct : c->cosine_max_len_value_wrong;
    double t = tokens < L ? tokens : L;
    return hi - (hi - lo) * (1 - cos(t * 3.14159265358979323846 / L)) / 2;
}

/* The word starting at *p (lower-cased into w, cut to cap - 1), *p moved past it; 0 at the end. */
static int next_word(const char **p, char *w, size_t cap)
{
    while (**p && isspace((unsigned char)**p)) (*p)++;
    if (!**p) return 0;
    size_t n = 0;
    for (; **p && !isspace((unsigned char)**p); (*p)++)
        if (n + 1 < cap) w[n++] = (char)tolower((unsigned char)**p);
    w[n] = '\0';
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

double at_grpo_reward_repetition(const at_grpo_config *c, const char *s)
{
    int ng = (int)c->repetition_n_grams;
    if (ng < 1) ng = 1;
    size_t nw = 0, cap = 16;
    char **words = malloc(cap * sizeof *words), w[256];
    const char *p = s;
    double r = 0;
    while (words && next_word(&p, w, sizeof w)) {
        if (nw == cap) {
            char **nwp = realloc(words, 2 * cap * sizeof *words);
            if (!nwp) break;
            words = nwp;
            cap *= 2;
        }
        words[nw++] = strdup(w);
    }
    if (words && nw >= (size_t)ng) {
        /* each n-gram as one string (words joined by a space), sorted to count the distinct ones */
        size_t total = nw - (size_t)ng + 1, distinct = 0;
        char **grams = calloc(total, sizeof *grams);
        for (size_t i = 0; grams && i < total; i++) {
            size_t len = 0;
            for (int k = 0; k < ng; k++) len += (words[i + k] ? strlen(words[i + k]) : 0) + 1;
            grams[i] = malloc(len + 1);
            if (!grams[i]) continue;
            grams[i][0] = '\0';
            for (int k = 0; k < ng; k++) {
                if (k) strcat(grams[i], "\x1f");
                if (words[i + k]) strcat(grams[i], words[i + k]);
            }
        }
        if (grams) {
            int ok = 1;
            for (size_t i = 0; i < total; i++) ok &= grams[i] != NULL;
            if (ok) {
                qsort(grams, total, sizeof *grams, cmp_str);
                for (size_t i = 0; i < total; i++) distinct += i == 0 || strcmp(grams[i], grams[i - 1]) != 0;
                r = (1 - (double)distinct / (double)total) * c->repetition_max_penalty;
            }
            for (size_t i = 0; i < total; i++) free(grams[i]);
            free(grams);
        }
    }
    for (size_t i = 0; words && i < nw; i++) free(words[i]);
    free(words);
    return r;
}

double at_grpo_reward_soft_overlong(const at_grpo_config *c, int tokens)
{
    int max_len = c->soft_max_length > 0 ? c->soft_max_length : c->max_completion_length;
    double cache = c->soft_cache_length;
    double exceed = tokens - (max_len - cache);
    double r = -exceed / cache;
    return r < 0 ? r : 0;
}

/* ---- the set ---- */

/* Each function's name keys its column: rewards/NAME/mean in logging.jsonl
 * and NAME in completions.jsonl, beside that file's own keys. Two functions
 * of one name would write over each other there. */
static int name_taken(const at_grpo_rewards *r, const char *name)
{
    static const char *const line_keys[] = {"generation", "prompt", "completion", "solution",
                                            "reward", "advantage", "tokens"};
    for (size_t i = 0; i < sizeof line_keys / sizeof line_keys[0]; i++)
        if (!strcmp(name, line_keys[i])) return 1;
    for (int i = 0; i < r->n; i++)
        if (!strcmp(name, r->names[i])) return 1;
    return 0;
}

at_status at_grpo_rewards_init(const at_grpo_config *c, at_grpo_rewards *r)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    for (int i = 0; i < c->n_reward_funcs; i++) {
        int k = 0;
        while (BUILTINS[k] && strcmp(BUILTINS[k], c->reward_funcs[i])) k++;
        if (!BUILTINS[k])
            return at_error(AT_ERR_INVALID, "--reward_funcs %s: unknown; the built-ins are accuracy, format, cosine, "
                            "repetition and soft_overlong (or --reward_command CMD for your own)",
                            c->reward_funcs[i]);
        if (!strcmp(BUILTINS[k], "soft_overlong")) {
            int max_len = c->soft_max_length > 0 ? c->soft_max_length : c->max_completion_length;
            if (c->soft_cache_length <= 0 || c->soft_cache_length >= max_len)
                return at_error(AT_ERR_INVALID, "--reward_funcs soft_overlong needs --soft_cache_length in (0, "
                                "soft_max_length %d)", max_len);
        }
        if (name_taken(r, BUILTINS[k]))
            return at_error(AT_ERR_INVALID, "--reward_funcs %s is listed twice (give it a larger "
                            "--reward_weights instead)", BUILTINS[k]);
        r->names[r->n++] = BUILTINS[k];
    }
    if (c->reward_model) {
        /* TRL names a reward model by its folder: the last part of the path (trailing slashes aside) */
        const char *path = c->reward_model_adapter ? c->reward_model_adapter : c->reward_model;
        size_t end = strlen(path);
        while (end > 1 && path[end - 1] == '/') end--;
        size_t start = end;
        while (start > 0 && path[start - 1] != '/') start--;
        snprintf(r->model_name, sizeof r->model_name, "%.*s", (int)(end - start), path + start);
        /* a folder named like a built-in, "reward_command" or a key of completions.jsonl ("reward") */
        if (name_taken(r, r->model_name) || !strcmp(r->model_name, "reward_command")) {
            size_t len = strlen(r->model_name);
            snprintf(r->model_name + len, sizeof r->model_name - len, "_model");
            at_log_info("--reward_model: its rewards are logged as %s (the folder's name is taken)", r->model_name);
        }
        r->names[r->n++] = r->model_name;
    }
    if (c->reward_command) r->names[r->n++] = "reward_command";
    for (int i = 0; i < r->n; i++) r->weights[i] = c->n_reward_weights ? c->reward_weights[i] : 1.0;
    return AT_OK;
}

/* The reward model's value of each sample into out[i·r->n + f]. */
static at_status model_rewards(const at_grpo_rewards *r, const at_grpo_sample *s, size_t n, int f, double *out)
{
    if (!r->model)
        return at_error(AT_ERR_INVALID, "--reward_model %s: the reward model is not open", r->c->reward_model);
    cJSON **prompts = calloc(n ? n : 1, sizeof *prompts);
    const char **replies = calloc(n ? n : 1, sizeof *replies);
    double *v = malloc((n ? n : 1) * sizeof *v);
    cJSON **own = calloc(n ? n : 1, sizeof *own); /* the prompts made here (a string each) */
    at_status st = prompts && replies && v && own ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == AT_OK && i < n; i++) {
        if (s[i].messages) {
            prompts[i] = (cJSON *)s[i].messages;
        } else if (!(prompts[i] = own[i] = cJSON_CreateString(s[i].prompt ? s[i].prompt : ""))) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
        }
        replies[i] = s[i].completion ? s[i].completion : "";
    }
    if (st == AT_OK) st = at_reward_model_score(r->model, (const cJSON *const *)prompts, replies, n, v);
    if (st != AT_OK) st = at_error_wrap(st, "--reward_model %s", r->model_name);
    for (size_t i = 0; st == AT_OK && i < n; i++) out[i * (size_t)r->n + (size_t)f] = v[i];
    for (size_t i = 0; own && i < n; i++) cJSON_Delete(own[i]);
    free(own);
    free(prompts);
    free(replies);
    free(v);
    return st;
}

at_status at_grpo_rewards_score(const at_grpo_rewards *r, const at_grpo_sample *s, size_t n, double *out)
{
    const at_grpo_config *c = r->c;
    for (int f = 0; f < r->n; f++) {
        const char *name = r->names[f];
        if (name == r->model_name) {
            AT_TRY(model_rewards(r, s, n, f, out));
            continue;
        }
        if (!strcmp(name, "reward_command")) {
            double *v = malloc((n ? n : 1) * sizeof *v);
            if (!v) return at_error(AT_ERR_NOMEM, "out of memory");
            at_status st = at_grpo_reward_command(c->reward_command, c->reward_timeout, s, n, v);
            for (size_t i = 0; st == AT_OK && i < n; i++) out[i * (size_t)r->n + (size_t)f] = v[i];
            free(v);
            AT_TRY(st);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            double v = 0;
            if (!strcmp(name, "accuracy")) {
                AT_TRY(at_grpo_reward_accuracy(s[i].completion, s[i].solution, &v));
            } else if (!strcmp(name, "format")) {
                v = at_grpo_reward_format(s[i].completion);
            } else if (!strcmp(name, "cosine")) {
                double acc;
                AT_TRY(at_grpo_reward_accuracy(s[i].completion, s[i].solution, &acc));
                v = at_grpo_reward_cosine(c, acc > 0, s[i].tokens);
            } else if (!strcmp(name, "repetition")) {
                v = at_grpo_reward_repetition(c, s[i].completion);
            } else {
                v = at_grpo_reward_soft_overlong(c, s[i].tokens);
            }
            out[i * (size_t)r->n + (size_t)f] = v;
        }
    }
    return AT_OK;
}

/* ---- an external program ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Splits cmd at spaces into argv (a malloc'd copy in *buf). */
static char **split_args(const char *cmd, char **buf)
{
    *buf = strdup(cmd);
    size_t cap = strlen(cmd) / 2 + 2;
    char **argv = calloc(cap, sizeof *argv);
    if (!*buf || !argv) {
        free(argv);
        return NULL;
    }
    size_t n = 0;
    for (char *tok = strtok(*buf, " \t"); tok && n + 1 < cap; tok = strtok(NULL, " \t")) argv[n++] = tok;
    argv[n] = NULL;
    return argv;
}

/* The reward on one answer line: a number, or {"reward": number}. */
static int parse_reward_line(const char *line, double *out)
{
    cJSON *j = at_json_value(line); /* strict: "0.5 junk" is no reward */
    int ok = 0;
    if (cJSON_IsNumber(j)) {
        *out = j->valuedouble;
        ok = 1;
    } else if (cJSON_IsObject(j) && cJSON_IsNumber(cJSON_GetObjectItem(j, "reward"))) {
        *out = cJSON_GetObjectItem(j, "reward")->valuedouble;
        ok = 1;
    }
    cJSON_Delete(j);
    return ok && isfinite(*out);
}

at_status at_grpo_reward_command(const char *cmd, double timeout_s, const at_grpo_sample *s, size_t n, double *out)
{
    at_status st = AT_OK;
    char *argbuf = NULL, *input = NULL, *output = NULL;
    char **argv = split_args(cmd, &argbuf);
    size_t in_len = 0, in_cap = 0, out_len = 0, out_cap = 4096;
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    pid_t pid = -1;
    if (!argv || !argv[0]) {
        st = at_error(AT_ERR_INVALID, "--reward_command is empty");
        goto done;
    }
    /* the input: one JSON object per line */
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prompt", s[i].prompt ? s[i].prompt : "");
        cJSON_AddStringToObject(o, "completion", s[i].completion ? s[i].completion : "");
        if (s[i].solution) cJSON_AddStringToObject(o, "solution", s[i].solution);
        else cJSON_AddNullToObject(o, "solution");
        char *line = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!line) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        size_t l = strlen(line);
        if (in_len + l + 2 > in_cap) {
            size_t nc = (in_len + l + 2) * 2;
            char *ni = realloc(input, nc);
            if (!ni) {
                free(line);
                st = at_error(AT_ERR_NOMEM, "out of memory");
                goto done;
            }
            input = ni;
            in_cap = nc;
        }
        memcpy(input + in_len, line, l);
        in_len += l;
        input[in_len++] = '\n';
        free(line);
    }
    output = malloc(out_cap);
    if (!output || pipe(to_child) || pipe(from_child)) {
        st = at_error(AT_ERR_IO, "--reward_command: cannot make pipes: %s", strerror(errno));
        goto done;
    }
    pid = fork();
    if (pid < 0) {
        st = at_error(AT_ERR_IO, "--reward_command: fork failed: %s", strerror(errno));
        goto done;
    }
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[0]);
        close(to_child[1]);
        close(from_child[0]);
        close(from_child[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "anytune: --reward_command %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_child[0] = from_child[1] = -1;
    fcntl(to_child[1], F_SETFL, O_NONBLOCK);
    /* a child that exits early must not kill us with SIGPIPE: writes fail with EPIPE instead */
    struct sigaction ign = {0}, old_pipe;
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_pipe);
    size_t written = 0;
    if (!in_len) {
        close(to_child[1]);
        to_child[1] = -1;
    }
    double deadline = now_s() + timeout_s;
    int eof = 0;
    while (!eof && st == AT_OK) {
        struct pollfd fds[2] = {{from_child[0], POLLIN, 0}, {to_child[1], POLLOUT, 0}};
        int nf = to_child[1] >= 0 ? 2 : 1;
        double left = deadline - now_s();
        if (left <= 0) {
            st = at_error(AT_ERR_IO, "--reward_command %s: no complete answer within %g s (--reward_timeout)",
                          cmd, timeout_s);
            break;
        }
        int r = poll(fds, (nfds_t)nf, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = at_error(AT_ERR_IO, "--reward_command: poll: %s", strerror(errno));
            break;
        }
        if (nf == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = write(to_child[1], input + written, in_len - written);
            if (w > 0) written += (size_t)w;
            if (w < 0 && errno != EAGAIN) written = in_len; /* the child stopped reading: its answer will say */
            if (written == in_len) {
                close(to_child[1]);
                to_child[1] = -1;
            }
        }
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (out_len + 4096 > out_cap) {
                char *no = realloc(output, out_cap * 2);
                if (!no) {
                    st = at_error(AT_ERR_NOMEM, "out of memory");
                    break;
                }
                output = no;
                out_cap *= 2;
            }
            ssize_t k = read(from_child[0], output + out_len, out_cap - out_len - 1);
            if (k > 0) out_len += (size_t)k;
            else if (k == 0) eof = 1;
            else if (errno != EINTR && errno != EAGAIN) eof = 1;
        }
    }
    sigaction(SIGPIPE, &old_pipe, NULL);
    int status = 0;
    if (st != AT_OK) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    pid = -1;
    if (st != AT_OK) goto done;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        st = at_error(AT_ERR_INVALID, "--reward_command %s: exited with %s %d", cmd,
                      WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status)
                                                                                 : WTERMSIG(status));
        goto done;
    }
    output[out_len] = '\0';
    size_t got = 0;
    char *p = output;
    while (*p) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (*p) {
            if (got == n) {
                st = at_error(AT_ERR_INVALID, "--reward_command %s: more answer lines than the %zu completions "
                              "given", cmd, n);
                goto done;
            }
            if (!parse_reward_line(p, &out[got])) {
                st = at_error(AT_ERR_INVALID, "--reward_command %s: answer line %zu is not a number nor "
                              "{\"reward\": number}: %.80s", cmd, got + 1, p);
                goto done;
            }
            got++;
        }
        if (!nl) break;
        p = nl + 1;
    }
    if (got != n)
        st = at_error(AT_ERR_INVALID, "--reward_command %s: %zu answer lines for %zu completions (one each)", cmd,
                      got, n);
done:
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    for (int i = 0; i < 2; i++) {
        if (to_child[i] >= 0) close(to_child[i]);
        if (from_child[i] >= 0) close(from_child[i]);
    }
    free(argv);
    free(argbuf);
    free(input);
    free(output);
    return st;
}
