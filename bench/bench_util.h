/* What the benchmarks share: the two model shapes the issues name, sorting
 * timings for medians, the process's peak resident memory, the token stream,
 * the LoRA training step of bench/train and bench/train_gpu, and running a
 * PyTorch peer (tools/bench_*_torch*.py) and reading its JSON line. Wall
 * time is at_now_seconds (base/progress.h). */
#ifndef AT_BENCH_UTIL_H
#define AT_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "device/cpu/cpu_features.h"
#include "model/adapter.h"
#include "model/config.h"
#include "model/decoder.h"
#include "train/optimizer.h"

/* A model shape of the benchmarks (random weights of this shape). */
typedef struct {
    const char *name;
    int hidden, inter, layers, heads, kv_heads, vocab, seq, batch, tied, qkv_bias;
    double theta;
    int runs; /* default repetitions of bench/forward */
} bench_shape;

/* The small model and the Qwen2.5-0.5B shape of the models issue. */
static const bench_shape BENCH_SHAPES[] = {
    {"small", 512, 1408, 8, 8, 4, 32000, 256, 4, 0, 0, 10000.0, 5},
    {"qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, 512, 1, 1, 1, 1000000.0, 3},
};
#define BENCH_N_SHAPES ((size_t)(sizeof BENCH_SHAPES / sizeof BENCH_SHAPES[0]))

/* The config of a shape (llama, or qwen2 with q/k/v bias). */
static inline void bench_make_config(const bench_shape *s, at_model_config *c)
{
    at_model_config_init(c);
    snprintf(c->model_type, sizeof c->model_type, "%s", s->qkv_bias ? "qwen2" : "llama");
    c->hidden_size = s->hidden;
    c->intermediate_size = s->inter;
    c->num_hidden_layers = s->layers;
    c->num_attention_heads = s->heads;
    c->num_key_value_heads = s->kv_heads;
    c->head_dim = s->hidden / s->heads;
    c->vocab_size = s->vocab;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = s->theta;
    c->tie_word_embeddings = s->tied;
    c->attn_qkv_bias = s->qkv_bias;
}

/* FLOPs per trained token of LoRA rank `rank` on all 7 linear modules of
 * shape s (BENCHMARKING.md): 6·N_lora + 4·N_frozen + 12·L·T·(H·D), N_frozen
 * counting every frozen matmul weight, the lm_head even when tied; T =
 * s->seq. The parameter counts behind it go to *n_lora, *n_frozen (either
 * may be NULL). */
static inline double bench_flops_per_token(const bench_shape *s, int rank, double *n_lora, double *n_frozen)
{
    at_model_config c;
    bench_make_config(s, &c);
    double lora = 0, frozen = 0;
    for (int m = 0; m < AT_MOD_COUNT; m++) {
        int64_t in, out;
        at_module_dims(&c, (at_module)m, &in, &out);
        lora += (double)rank * (double)(in + out);
        frozen += (double)in * (double)out;
    }
    lora *= s->layers;
    frozen = frozen * s->layers + (double)s->vocab * s->hidden;
    if (n_lora) *n_lora = lora;
    if (n_frozen) *n_frozen = frozen;
    return 6 * lora + 4 * frozen + 12.0 * s->layers * s->seq * (double)s->heads * c.head_dim;
}

/* qsort comparator of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Peak resident memory of this process so far (VmHWM), MiB; -1 if unknown. */
static inline double bench_peak_rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = atof(line + 6);
    fclose(f);
    return kb / 1024.0;
}

/* Hugging Face's initializer_range of Llama and Qwen2 configs. */
#define BENCH_INIT_STD 0.02f

/* Random weights of shape s as every benchmark makes them (seed 1234),
 * stored as dt on be (NULL: the CPU); std > 0: initialised as Hugging Face
 * does (at_decoder_weights_random_hf), what the training benchmarks and
 * their torch peers use (a first loss near ln(vocab)). The caller frees *w. */
static inline at_status bench_random_weights_std(const bench_shape *s, at_backend *be, at_dtype dt, float std,
                                                 at_decoder_weights **w)
{
    at_model_config cfg;
    bench_make_config(s, &cfg);
    at_status st = at_model_config_validate(&cfg, s->name);
    if (st != AT_OK) return st;
    return std > 0 ? at_decoder_weights_random_hf(&cfg, be, dt, 1234, std, w) : at_decoder_weights_random(&cfg, be, dt, 1234, w);
}

static inline at_status bench_random_weights(const bench_shape *s, at_backend *be, at_dtype dt, at_decoder_weights **w)
{
    return bench_random_weights_std(s, be, dt, 0.0f, w);
}

/* ---- the LoRA training step of bench/train and bench/train_gpu ------------------ */

/* LoRA on all 7 linear modules, as the torch peers' defaults (add_lora_args). */
#define BENCH_LORA_RANK 8
#define BENCH_LORA_ALPHA 16.0
#define BENCH_LORA_DROPOUT 0.05

/* The token stream both sides of every benchmark use (xorshift64), ids in [0, vocab). */
static inline void bench_token_ids(int32_t *ids, int64_t n, int vocab)
{
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

/* Sorts t[0..n) and returns its median t[n / 2]. */
static inline double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

/* What one training step needs; every pointer owned (bench_lora_free). */
typedef struct {
    at_decoder *d;
    at_adapter *ad;
    at_decoder_grads *g;
    at_decoder_acts *acts;
    at_optimizer opt;
    int opt_ready;
    at_tensor *ids, *labels; /* [batch, seq] on the weights' backend; labels = ids (the loss shifts them) */
    float scale;             /* 1 / targets: the mean loss of HF's causal LM */
} bench_lora;

/* Sets up the step of shape s on weights w, taken (freed here on failure):
 * the decoder, LoRA (BENCH_LORA_*, seed 42), gradients, AdamW (0.9, 0.999,
 * 1e-8, weight decay 0.01, clip 1.0), activations (gradient checkpointing
 * when ckpt) and the token stream as ids and labels. On failure what was
 * made is freed. */
static inline at_status bench_lora_new(bench_lora *b, at_decoder_weights *w, const bench_shape *s, int ckpt)
{
    memset(b, 0, sizeof *b);
    int64_t n = (int64_t)s->batch * s->seq, sh[2] = {s->batch, s->seq};
    int32_t *host = NULL;
    at_status st = at_decoder_new(w, &b->d);
    if (st != AT_OK) {
        at_decoder_weights_free(w);
        return st;
    }
    st = at_adapter_new(&b->d->cfg, b->d->be, BENCH_LORA_RANK, BENCH_LORA_ALPHA, BENCH_LORA_DROPOUT, 0,
                        (1u << AT_MOD_COUNT) - 1, 42, &b->ad);
    if (st == AT_OK) st = at_decoder_set_adapter(b->d, b->ad);
    if (st == AT_OK) st = at_decoder_grads_new(b->d, 0, &b->g);
    at_adamw_config oc = {0.9, 0.999, 1e-8, 0.01, 1.0};
    if (st == AT_OK && (st = at_optimizer_init(&b->opt, b->d, b->g, &oc)) == AT_OK) b->opt_ready = 1;
    unsigned flags = AT_ACTS_TRAIN | (ckpt ? AT_ACTS_CHECKPOINT : 0);
    if (st == AT_OK) st = at_decoder_acts_new_ex(b->d, s->batch, s->seq, flags, &b->acts);
    if (st == AT_OK) st = at_tensor_new(b->d->be, AT_I32, 2, sh, "ids", &b->ids);
    if (st == AT_OK) st = at_tensor_new(b->d->be, AT_I32, 2, sh, "labels", &b->labels);
    if (st == AT_OK && !(host = malloc((size_t)n * sizeof *host))) st = at_error(AT_ERR_NOMEM, "out of memory");
    if (st == AT_OK) {
        bench_token_ids(host, n, s->vocab);
        st = at_tensor_upload(b->ids, host, (size_t)n * sizeof *host);
    }
    if (st == AT_OK) st = at_tensor_upload(b->labels, host, (size_t)n * sizeof *host);
    free(host);
    b->scale = 1.0f / (float)(s->batch * (s->seq - 1));
    return st;
}

/* Step i (the dropout seed 1000 + i): zeroed gradients, forward and
 * backward, the global gradient norm, AdamW at lr 1e-4 clipped at norm 1.
 * The loss sums go to *ls. */
static inline at_status bench_lora_step(bench_lora *b, int i, at_loss_stats *ls)
{
    double norm = 0;
    at_status st = at_decoder_grads_zero(b->g);
    if (st == AT_OK)
        st = at_decoder_forward_backward(b->d, b->acts, b->ids, NULL, NULL, b->labels, (float)BENCH_LORA_DROPOUT,
                                         1000 + (uint64_t)i, b->scale, b->g, ls);
    if (st == AT_OK) st = at_optimizer_grad_norm(&b->opt, &norm);
    if (st == AT_OK) st = at_optimizer_step(&b->opt, 1e-4, norm, 1.0);
    return st;
}

static inline void bench_lora_free(bench_lora *b)
{
    at_tensor_free(b->ids);
    at_tensor_free(b->labels);
    at_decoder_acts_free(b->acts);
    if (b->opt_ready) at_optimizer_free(&b->opt);
    at_decoder_grads_free(b->g);
    at_decoder_free(b->d);
    at_adapter_free(b->ad);
    memset(b, 0, sizeof *b);
}

/* ---- the PyTorch peers (tools/bench_*_torch*.py), run as subprocesses ------------ */

/* The peers' model-shape options (add_shape_args there) into buf. */
static inline void bench_shape_args(const bench_shape *s, char *buf, size_t n)
{
    snprintf(buf, n,
             "--hidden %d --intermediate %d --layers %d --heads %d --kv-heads %d --vocab %d --seq %d --batch %d %s %s "
             "--rope-theta %g",
             s->hidden, s->inter, s->layers, s->heads, s->kv_heads, s->vocab, s->seq, s->batch,
             s->tied ? "--tied" : "", s->qkv_bias ? "--qkv-bias" : "", s->theta);
}

/* The multiarch library folders where Debian-like systems keep shared
 * libraries; the first that holds `name` (a file under it) is written to
 * buf. Returns buf, or NULL when none holds it. */
static inline const char *bench_find_lib_dir(const char *name, char *buf, size_t n)
{
    static const char *dirs[] = {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        if (access(path, R_OK) == 0) {
            snprintf(buf, n, "%s", dirs[i]);
            return buf;
        }
    }
    return NULL;
}

/* The folder of OpenBLAS's OpenMP build (libblas.so.3): ANYTUNE_OPENBLAS_OPENMP_DIR,
 * else the multiarch location when present; NULL when none. */
static inline const char *bench_openblas_openmp_dir(void)
{
    const char *e = getenv("ANYTUNE_OPENBLAS_OPENMP_DIR");
    if (e && *e) return e;
    static char buf[512];
    if (!bench_find_lib_dir("openblas-openmp/libblas.so.3", buf, sizeof buf - 16)) return NULL;
    strcat(buf, "/openblas-openmp");
    return buf;
}

/* Whether ANYTUNE_CPU_ISA holds our kernels to AVX2 on a CPU that has
 * AVX-512: then a peer runs at AVX2 too, as it would on an AVX2 machine
 * (like for like), held there by the variables of bench_peer_isa_env. */
static inline int bench_isa_lowered_to_avx2(void)
{
#if defined(__x86_64__)
    return at_cpu_isa_level() == AT_ISA_AVX2 && at_cpu_get_features()->avx512f;
#else
    return 0;
#endif
}

/* The environment that holds a peer's libraries to AVX2 (a shell prefix of
 * assignments, "" when bench_isa_lowered_to_avx2 is false): PyTorch's own
 * kernels (ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA, and its old
 * name DNNL_MAX_CPU_ISA) and OpenBLAS's (OPENBLAS_CORETYPE). Each library
 * reads its variable when it loads. */
/* The libraries' variables that hold them to AVX2, for both sides. */
#define BENCH_AVX2_LIB_VARS 3
static const char *const bench_avx2_lib_env[BENCH_AVX2_LIB_VARS][2] = {
    {"ONEDNN_MAX_CPU_ISA", "AVX2"}, {"DNNL_MAX_CPU_ISA", "AVX2"}, {"OPENBLAS_CORETYPE", "Haswell"}};

static inline const char *bench_peer_isa_env(void)
{
    static char env[160];
    if (!bench_isa_lowered_to_avx2()) return "";
    int n = snprintf(env, sizeof env, "ATEN_CPU_CAPABILITY=avx2 ");
    for (int i = 0; i < BENCH_AVX2_LIB_VARS && n > 0 && (size_t)n < sizeof env; i++)
        n += snprintf(env + n, sizeof env - (size_t)n, "%s=%s ", bench_avx2_lib_env[i][0], bench_avx2_lib_env[i][1]);
    return env;
}

/* Our process's libraries at the ISA level our kernels run at, so that a
 * ratio compares like with like. The CPU backend holds oneDNN to the level
 * itself, and leaves out an OpenBLAS whose core is above it (cpu_libs.h);
 * an AVX2 machine would have OpenBLAS's AVX2 core, so at the AVX2 level on
 * an AVX-512 CPU the bench runs itself again with OPENBLAS_CORETYPE=Haswell
 * (and ONEDNN_MAX_CPU_ISA=AVX2, the same cap as the backend's): each
 * library reads its variable when it loads. With at_host, at the host's own
 * AVX-512 level, the variables are unset instead, so that each library
 * picks its best (bench_gemm). Returns only when nothing had to change. */
static inline void bench_libraries_at_our_level(char **argv, int at_host)
{
    if (getenv("AT_BENCH_LIBS_SET")) return;
    int changed = 0;
#if defined(__x86_64__)
    if (at_host && at_cpu_isa_level() >= AT_ISA_AVX512 && at_cpu_get_features()->avx512f) {
        changed = getenv("OPENBLAS_CORETYPE") || getenv("OPENBLAS_L2_SIZE") || getenv("ONEDNN_MAX_CPU_ISA") ||
                  getenv("DNNL_MAX_CPU_ISA");
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("OPENBLAS_L2_SIZE");
        unsetenv("ONEDNN_MAX_CPU_ISA");
        unsetenv("DNNL_MAX_CPU_ISA");
    } else if (bench_isa_lowered_to_avx2()) {
        for (int i = 0; i < BENCH_AVX2_LIB_VARS; i++) setenv(bench_avx2_lib_env[i][0], bench_avx2_lib_env[i][1], 1);
        changed = 1;
    }
#else
    (void)at_host;
#endif
    if (!changed) return;
    setenv("AT_BENCH_LIBS_SET", "1", 1);
    fflush(stdout);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        execv(self, argv);
    }
    fprintf(stderr, "%s: could not run itself again with the libraries' ISA set; measuring as is\n", argv[0]);
}

/* How a CPU peer (PyTorch) is set up; flags of bench_cpu_peer_prefix. */
enum {
    BENCH_PEER_AS_GIVEN = 0,
    /* OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (a machine's Haswell
     * setting holds OpenBLAS to AVX2 on an AVX-512 CPU) */
    BENCH_PEER_LIBS_BEST = 1,
    /* tcmalloc preloaded (else jemalloc, which keeps freed pages), as
     * PyTorch's own CPU launcher (torch.backends.xeon.run_cpu) does: glibc's
     * malloc hands blocks over 32 MiB back to the OS at each free, and a
     * step then spends its time in page faults (in this VM a small-shape
     * step was 3x slower: fill_ of fresh gradients 30% of it) */
    BENCH_PEER_ALLOCATOR = 2,
};

/* The start of a CPU peer's command line, up to the script (shared
 * BENCHMARKING.md): `env`, the set-up of `how` (BENCH_PEER_* flags),
 * OpenBLAS's OpenMP build preloaded when found, and the quoted Python:
 * ANYTUNE_PYTHON, default /usr/bin/python3 (Debian's, which has torch). */
static inline void bench_cpu_peer_prefix(int how, char *buf, size_t n)
{
    const char *py = getenv("ANYTUNE_PYTHON");
    if (!py || !*py) py = "/usr/bin/python3";
    const char *blas = bench_openblas_openmp_dir();
    char libs[1600] = "", dir[512];
    const char *conf = "";
    if (how & BENCH_PEER_ALLOCATOR) {
        if (bench_find_lib_dir("libtcmalloc_minimal.so.4", dir, sizeof dir))
            snprintf(libs, sizeof libs, "%s/libtcmalloc_minimal.so.4", dir);
        else if (bench_find_lib_dir("libjemalloc.so.2", dir, sizeof dir)) {
            snprintf(libs, sizeof libs, "%s/libjemalloc.so.2", dir);
            conf = "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 ";
        }
    }
    if (blas) {
        size_t l = strlen(libs);
        snprintf(libs + l, sizeof libs - l, "%s%s/libblas.so.3:%s/liblapack.so.3", l ? ":" : "", blas, blas);
    }
    char pre[1800] = "";
    if (*libs) snprintf(pre, sizeof pre, "%sLD_PRELOAD=%s ", conf, libs);
    /* env applies its -u before the assignments: a lowered level's
     * OPENBLAS_CORETYPE (bench_peer_isa_env) stands */
    snprintf(buf, n, "env %s %s%s'%s'", how & BENCH_PEER_LIBS_BEST ? "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE" : "",
             bench_peer_isa_env(), pre, py);
}

/* Runs the shell line cmd (stdout flushed first, so the peer's messages
 * come in order; its stderr passes through) and parses the last line of its
 * output that starts with '{'. Returns that JSON (the caller cJSON_Deletes
 * it) with its numbers tok_s and median_s in *tok_s, *median_s; NULL with
 * the reason in err when the command could not start, exited non-zero,
 * printed no such line, or the line lacks those numbers. */
static inline cJSON *bench_run_peer(const char *cmd, double *tok_s, double *median_s, char *err, size_t errlen)
{
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(err, errlen, "cannot run the torch peer");
        return NULL;
    }
    char line[8192], last[8192] = "";
    while (fgets(line, sizeof line, p))
        if (line[0] == '{') snprintf(last, sizeof last, "%s", line);
    int rc = pclose(p);
    cJSON *j = cJSON_Parse(last);
    const cJSON *a = cJSON_GetObjectItem(j, "tok_s"), *b = cJSON_GetObjectItem(j, "median_s");
    if (rc != 0 || !j) {
        snprintf(err, errlen, "torch peer failed (exit status %d; its messages are above)", rc);
    } else if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b)) {
        snprintf(err, errlen, "torch peer printed no tok_s");
    } else {
        *tok_s = a->valuedouble;
        *median_s = b->valuedouble;
        return j;
    }
    cJSON_Delete(j);
    return NULL;
}

/* ---- the competing-load rows (issue: no collapse under load) ------------------- */

/* Starts a process that keeps one core busy (a spinning loop, as another
 * user's program would); returns its pid, or -1 when fork failed. */
static inline pid_t bench_busy_start(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        volatile unsigned long x = 0;
        for (;;) x++;
    }
    return pid;
}

/* Ends the process bench_busy_start started. */
static inline void bench_busy_stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* The number at key of j, dflt when absent or not a number. */
static inline double bench_json_num(const cJSON *j, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* The string at key of j, dflt when absent or not a string. */
static inline const char *bench_json_str(const cJSON *j, const char *key, const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

#endif
