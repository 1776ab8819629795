/* Decoding speed against llama.cpp on the same GGUF files, in one run.
 *
 * For each shape (bench_util.h: the small model, the Qwen2.5-0.5B shape) and
 * format (f16, q8_0, q4_0): random weights (seed 1234) are written as a GGUF
 * file by the exporter (as `anytune export` writes it; the tokenizer is the
 * demo model's, padded to the vocabulary), then
 *  - anytune loads the file as `anytune infer` does and prefills a prompt of
 *    P tokens (default 512) and decodes D tokens greedily (default 32);
 *  - llama.cpp (npm's node-llama-cpp, prebuilt CPU binaries:
 *    bench/js/llama_bench.mjs) does the same on the same file, at the same
 *    thread count and at 1 thread; the better of the two is the peer (its
 *    threads spin while waiting, so on a machine where other processes take
 *    cores its 2-thread figures collapse); both are printed;
 *  - the ratio anytune / llama.cpp is printed for prefill and decode.
 * Like for like: when ANYTUNE_CPU_ISA lowers our kernels below the host's
 * best, llama.cpp runs its CPU library of that level too (llama_variant:
 * AVX2 -> ggml's "haswell", the baseline -> "x64"); at the host's level it
 * picks its best. The peer line names the CPU library llama.cpp loaded, as
 * its log says (bench/js/llama_bench.mjs).
 * Decoding is memory-bound: a token reads every weight once, so the decode
 * line also shows GB/s of weights read (bytes of the layers' matrices and
 * the lm_head, per token) against this machine's measured copy bandwidth
 * (a parallel memcpy of 2 x 256 MiB; read + written bytes per second).
 * A line per shape and format decodes again while another process keeps
 * one core busy (a spinning loop), against the quiet figure: the target is
 * >= 40% of it (--no-load skips it). The bench sets its threads up as the
 * CLI does (at_threads_setup: passive OpenMP waiting unless OMP_WAIT_POLICY
 * is set), so it measures what users get; the llama.cpp peer inherits the
 * environment.
 * A last line per shape and format times the server's batching: 8 streams
 * decoded together by the scheduler (as `anytune serve` runs them) against
 * one stream alone; the target is more than 1x aggregate throughput (8
 * streams beat 8 x one stream).
 *
 *   bench_infer [--shape small|qwen|all] [--formats f16,q8_0,q4_0] [--prompt P]
 *               [--decode D] [--runs N] [--no-llama] [--streams S] [--keep]
 *               [--no-load] [--source DIR]
 *
 * --keep leaves the GGUF files in the temporary folder it prints.
 * It reads demo/'s tokenizer and bench/js/ from the source tree: the one
 * it was built from (AT_SOURCE_DIR), or --source DIR. Threads: OpenMP's
 * (OMP_NUM_THREADS), given to llama.cpp as its thread count too. Figures
 * are medians of N runs (default 3) after a warm-up. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/progress.h"
#include "base/threads.h"
#include "bench_util.h"
#include "device/cpu/cpu_features.h"
#include "device/cpu/gemm.h"
#include "export/export_gguf.h"
#include "infer/bundle.h"
#include "infer/generate.h"
#include "infer/scheduler.h"
#include "model/loader.h"
#include "text/tokenizer.h"

#define TOKENIZER "demo/stories260K/tokenizer.bin"
#define LLAMA_SCRIPT "bench/js/llama_bench.mjs"

typedef struct {
    int prompt, decode, runs, llama, streams, keep, load;
    char script[1024];       /* LLAMA_SCRIPT under the source tree */
    const char *llama_cpu;   /* ggml CPU variant llama.cpp must run ("": its best) */
} opts;

/* The prompt of run r (bench/js/llama_bench.mjs uses the same rule):
 * id_i = 3 + (i·7919 + r·104729) mod (vocab − 3); ids of the tokenizer's
 * vocabulary (llama.cpp refuses ids past it). */
static void prompt_ids(int32_t *ids, int n, int vocab, int r)
{
    for (int i = 0; i < n; i++) ids[i] = 3 + (int32_t)(((int64_t)i * 7919 + (int64_t)r * 104729) % (vocab - 3));
}

/* Read + written bytes per second of a parallel memcpy of 2 x 256 MiB, best of 5. */
static double copy_bandwidth(void)
{
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int r = 0; r < 5; r++) {
            double t0 = at_now_seconds();
#pragma omp parallel
            {
                int t = omp_get_thread_num(), nt = omp_get_num_threads();
                size_t lo = n / (size_t)nt * (size_t)t, hi = t == nt - 1 ? n : n / (size_t)nt * (size_t)(t + 1);
                memcpy(b + lo, a + lo, hi - lo);
            }
            double bw = 2.0 * (double)n / (at_now_seconds() - t0);
            if (bw > best) best = bw;
        }
    }
    free(a);
    free(b);
    return best;
}

/* Bytes a decode step reads from the weights: the layers' matrices and the lm_head. */
static double weight_bytes_per_token(const at_decoder_weights *w)
{
    double b = (double)at_tensor_nbytes(w->lm_head);
    for (int l = 0; l < w->cfg.num_hidden_layers; l++) {
        const at_layer_weights *L = &w->layers[l];
        const at_tensor *m[] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < 7; i++)
            if (m[i]) b += (double)at_tensor_nbytes(m[i]);
    }
    return b;
}

static at_status write_gguf(const bench_shape *s, at_dtype quant, const at_tokenizer *tok, const char *path)
{
    at_decoder_weights *w = NULL;
    AT_TRY(bench_random_weights(s, NULL, AT_F32, &w));
    at_export_gguf_opts eo = {.quant = quant, .tok = tok, .name = s->name};
    at_status st = at_export_gguf_model(w, path, &eo);
    at_decoder_weights_free(w);
    return st;
}

typedef struct {
    double prefill, decode; /* tokens/s, medians */
} speeds;

/* anytune on the GGUF at path: prefill P tokens, decode D; medians of runs. */
static at_status run_anytune(at_bundle *b, int vocab, const opts *o, speeds *out)
{
    at_generator *g = NULL;
    AT_TRY(at_generator_new(b->decoder, b->tokenizer, o->prompt + o->decode + 8, &g));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)o->prompt);
    double pf[16], dc[16];
    at_status st = ids ? AT_OK : at_error(AT_ERR_NOMEM, "bench_infer: out of memory");
    for (int r = 0; st == AT_OK && r <= o->runs; r++) { /* run 0 warms up */
        prompt_ids(ids, o->prompt, vocab, r);
        at_gen_params gp = {.max_new_tokens = o->decode + 1, .sampling = at_sampling_defaults()};
        char *text = NULL;
        at_finish_reason fin;
        at_gen_stats stats;
        st = at_generator_run(g, ids, (size_t)o->prompt, &gp, NULL, NULL, &text, &fin, &stats);
        free(text);
        if (st != AT_OK || r == 0) continue;
        pf[r - 1] = stats.prefilled_tokens / stats.prefill_s;
        dc[r - 1] = (stats.new_tokens - 1) / stats.decode_s;
    }
    if (st == AT_OK) {
        out->prefill = bench_median(pf, o->runs);
        out->decode = bench_median(dc, o->runs);
    }
    free(ids);
    at_generator_free(g);
    return st;
}

/* Aggregate decode tokens/s of `streams` sequences run together by the
 * scheduler (short prompts, D tokens each), timed from the step where all
 * are decoding to the end. */
static at_status run_streams(at_bundle *b, int vocab, int streams, int decode, double *tok_s)
{
    at_scheduler *s = NULL;
    AT_TRY(at_scheduler_new(b->decoder, b->tokenizer, streams, 64 + decode + 8, &s));
    at_status st = AT_OK;
    int32_t ids[32];
    for (int i = 0; i < streams && st == AT_OK; i++) {
        prompt_ids(ids, 32, vocab, 100 + i);
        at_gen_params gp = {.max_new_tokens = decode + 1, .sampling = at_sampling_defaults()};
        int slot;
        st = at_scheduler_add(s, ids, 32, &gp, NULL, &slot);
    }
    double t0 = 0;
    long tokens = 0;
    int steps = 0;
    while (st == AT_OK && at_scheduler_in_use(s) > 0) {
        const at_sched_event *ev;
        int n;
        st = at_scheduler_step(s, &ev, &n);
        if (++steps == 1) { /* the prefill step: every stream has its first token */
            t0 = at_now_seconds();
            continue;
        }
        for (int i = 0; i < n; i++) tokens += ev[i].token >= 0;
    }
    double t = at_now_seconds() - t0;
    *tok_s = t > 0 ? tokens / t : 0;
    at_scheduler_free(s);
    return st;
}

/* The ggml CPU library (libggml-cpu-NAME.so of node-llama-cpp's prebuilt
 * binaries) at our ISA level when ANYTUNE_CPU_ISA lowered it on this CPU, as
 * bench/gemm.c holds OpenBLAS and oneDNN there: AVX2 (+FMA +F16C) is ggml's
 * "haswell", the SSE2 baseline its "x64". "" at the host's own level (and
 * at a lowered AVX-512 one): llama.cpp picks its best. */
static const char *llama_variant(void)
{
#if defined(__x86_64__)
    const at_cpu_features *f = at_cpu_get_features();
    at_cpu_isa isa = at_cpu_isa_level();
    if (isa == AT_ISA_AVX2 && f->avx512f) return "haswell";
    if (isa == AT_ISA_SCALAR && f->avx2) return "x64";
#endif
    return "";
}

/* llama.cpp at `threads` threads on the GGUF at path (bench/js/llama_bench.mjs);
 * build gets its version and the CPU library it loaded. */
static int run_llama_at(const char *path, int threads, const opts *o, speeds *out, char *build, size_t blen)
{
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node '%s' '%s' %d %d %d %d '%s' 2>/dev/null",
             o->script, path, threads, o->prompt, o->decode, o->runs, o->llama_cpu);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[4096], last[4096] = "";
    while (fgets(line, sizeof line, p))
        if (line[0] == '{') snprintf(last, sizeof last, "%s", line);
    int rc = pclose(p);
    cJSON *j = cJSON_Parse(last);
    int ok = rc == 0 && j != NULL;
    if (ok) {
        out->prefill = bench_json_num(j, "prefill_tok_s", 0);
        out->decode = bench_json_num(j, "decode_tok_s", 0);
        const cJSON *bv = cJSON_GetObjectItemCaseSensitive(j, "build");
        const cJSON *cv = cJSON_GetObjectItemCaseSensitive(j, "cpu_variant");
        const cJSON *fv = cJSON_GetObjectItemCaseSensitive(j, "cpu_features");
        snprintf(build, blen, "%s, CPU library \"%s\"%s [%s]", cJSON_IsString(bv) ? bv->valuestring : "llama.cpp",
                 cJSON_IsString(cv) ? cv->valuestring : "?", o->llama_cpu[0] ? " (as asked, at our ISA level)" : "",
                 cJSON_IsString(fv) ? fv->valuestring : "");
        ok = out->prefill > 0 && out->decode > 0;
    }
    cJSON_Delete(j);
    return ok;
}

/* The peer at its best: at our thread count, and at 1 thread when that is
 * more (llama.cpp's threads spin while waiting: on a machine whose other
 * processes take cores, 2 threads collapse; *same gets the same-count figures). */
static int run_llama(const char *path, const opts *o, speeds *best, speeds *same, char *build, size_t blen)
{
    int nt = omp_get_max_threads();
    if (!run_llama_at(path, nt, o, same, build, blen)) return 0;
    *best = *same;
    speeds one;
    if (nt > 1 && run_llama_at(path, 1, o, &one, build, blen)) {
        if (one.prefill > best->prefill) best->prefill = one.prefill;
        if (one.decode > best->decode) best->decode = one.decode;
    }
    return 1;
}

static const char *fmt_name(at_dtype q) { return q == AT_F16 ? "f16" : q == AT_Q8_0 ? "q8_0" : "q4_0"; }

int main(int argc, char **argv)
{
    at_threads_setup(argv);
    bench_libraries_at_our_level(argv, 0);
    opts o = {.prompt = 512, .decode = 32, .runs = 3, .llama = 1, .streams = 8, .load = 1, .llama_cpu = llama_variant()};
    const char *shape = "all", *formats = "f16,q8_0,q4_0", *src = AT_SOURCE_DIR;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) formats = argv[++i];
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) o.prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) o.decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) o.runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc) o.streams = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-llama")) o.llama = 0;
        else if (!strcmp(argv[i], "--keep")) o.keep = 1;
        else if (!strcmp(argv[i], "--no-load")) o.load = 0;
        else if (!strcmp(argv[i], "--source") && i + 1 < argc) src = argv[++i];
        else {
            fprintf(stderr, "usage: bench_infer [--shape small|qwen|all] [--formats f16,q8_0,q4_0] [--prompt P] "
                            "[--decode D] [--runs N] [--streams S] [--no-llama] [--keep] [--no-load] "
                            "[--source DIR]\n");
            return 2;
        }
    }
    if (o.runs < 1) o.runs = 1;
    if (o.runs > 16) o.runs = 16;
    if (o.prompt < 1 || o.decode < 1 || o.streams < 1) {
        fprintf(stderr, "bench_infer: --prompt, --decode and --streams must be positive\n");
        return 2;
    }
    char tok_path[1024];
    snprintf(o.script, sizeof o.script, "%s/%s", src, LLAMA_SCRIPT);
    snprintf(tok_path, sizeof tok_path, "%s/%s", src, TOKENIZER);
    if (strchr(src, '\'')) { /* it goes into a shell command between single quotes */
        fprintf(stderr, "bench_infer: --source %s: a path with a single quote is not supported\n", src);
        return 2;
    }
    if (access(tok_path, R_OK) != 0) {
        fprintf(stderr, "bench_infer: %s not found: give the anytune source tree with --source DIR (it was built "
                        "from %s)\n", tok_path, AT_SOURCE_DIR);
        return 2;
    }
    if (o.llama && access(o.script, R_OK) != 0) {
        fprintf(stderr, "bench_infer: %s not found; llama.cpp skipped\n", o.script);
        o.llama = 0;
    }
    at_tokenizer *tok = NULL;
    if (at_tokenizer_load(tok_path, NULL, &tok) != AT_OK) {
        fprintf(stderr, "bench_infer: %s\n", at_last_error());
        return 1;
    }
    int tvocab = (int)at_tokenizer_vocab_size(tok);
    char dir[] = "/tmp/anytune-bench-infer-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const at_cpu_features *f = at_cpu_get_features();
    double bw = copy_bandwidth();
    double la[3] = {0};
    if (getloadavg(la, 3) > 0) printf("load average at start: %.2f %.2f %.2f (other processes)\n", la[0], la[1], la[2]);
    printf("CPU: %s, ISA level %s, %d threads; copy bandwidth %.1f GB/s (read + written)\n", f->model,
           at_cpu_isa_name(at_cpu_isa_level()), omp_get_max_threads(), bw * 1e-9);
    printf("prompt %d tokens, decode %d tokens, median of %d runs%s\n", o.prompt, o.decode, o.runs,
           o.llama ? "" : " (llama.cpp skipped)");
    int failed = 0, peer_shown = 0, peer_hinted = 0;
    for (size_t si = 0; si < BENCH_N_SHAPES; si++) {
        const bench_shape *s = &BENCH_SHAPES[si];
        if (strcmp(shape, "all") && !strstr(s->name, shape)) continue;
        printf("\n== %s (hidden %d, inter %d, %d layers, vocab %d) ==\n", s->name, s->hidden, s->inter, s->layers,
               s->vocab);
        static const at_dtype qs[] = {AT_F16, AT_Q8_0, AT_Q4_0};
        for (int qi = 0; qi < 3; qi++) {
            if (!strstr(formats, fmt_name(qs[qi]))) continue;
            char path[256];
            snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, s->name, fmt_name(qs[qi]));
            at_bundle *b = NULL;
            at_bundle_opts bo = {.model = path, .dtype = AT_LOAD_KEEP_DTYPE};
            speeds ours = {0}, loaded = {0}, ll = {0}, ll_same = {0};
            double one = 0, many = 0;
            at_status st = write_gguf(s, qs[qi], tok, path);
            if (st == AT_OK) st = at_bundle_load(&bo, &b);
            if (st == AT_OK) st = run_anytune(b, tvocab, &o, &ours);
            if (st == AT_OK && o.load) {
                pid_t busy = bench_busy_start();
                st = run_anytune(b, tvocab, &o, &loaded);
                bench_busy_stop(busy);
            }
            if (st == AT_OK && o.streams > 1) st = run_streams(b, tvocab, 1, o.decode, &one);
            if (st == AT_OK && o.streams > 1) st = run_streams(b, tvocab, o.streams, o.decode, &many);
            double wbytes = b ? weight_bytes_per_token(b->decoder->w) : 0;
            at_bundle_free(b);
            if (st != AT_OK) {
                printf("%-5s anytune failed: %s\n", fmt_name(qs[qi]), at_last_error());
                failed = 1;
                remove(path);
                continue;
            }
            char build[768] = "";
            int have = o.llama && run_llama(path, &o, &ll, &ll_same, build, sizeof build);
            if (o.llama && !have && !peer_hinted) {
                /* its messages go nowhere (they would drown the table): say
                 * what to look at. npm ci refuses bench/js's lock file on
                 * newer npm (it lists no optional platform packages); npm
                 * install takes it and leaves it as it is */
                fflush(stdout);
                fprintf(stderr, "bench_infer: llama.cpp gave no figures. Is its package installed? "
                                "NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix '%s/bench/js'; "
                                "its own messages: node '%s' FILE.gguf 2 512 32 1\n", src, o.script);
                peer_hinted = 1;
            }
            if (!o.keep) remove(path);
            printf("%-5s prefill  anytune %8.1f tok/s", fmt_name(qs[qi]), ours.prefill);
            if (have)
                printf("  llama.cpp %8.1f tok/s  ratio %.2fx  (llama.cpp at %d threads: %.1f)", ll.prefill,
                       ours.prefill / ll.prefill, omp_get_max_threads(), ll_same.prefill);
            printf("\n      decode   anytune %8.1f tok/s", ours.decode);
            if (have)
                printf("  llama.cpp %8.1f tok/s  ratio %.2fx  (llama.cpp at %d threads: %.1f)", ll.decode,
                       ours.decode / ll.decode, omp_get_max_threads(), ll_same.decode);
            printf("\n      decode reads %.0f MB of weights a token: anytune %.1f GB/s (%.0f%% of copy bandwidth)",
                   wbytes * 1e-6, wbytes * ours.decode * 1e-9, 100.0 * wbytes * ours.decode / bw);
            if (have) printf(", llama.cpp %.1f GB/s", wbytes * ll.decode * 1e-9);
            printf("\n");
            if (o.load)
                printf("      one core busy with another process: decode %.1f tok/s, %.0f%% of quiet (target >= 40%%)"
                       "\n", loaded.decode, 100.0 * loaded.decode / ours.decode);
            if (o.streams > 1)
                printf("      serve    %d streams batched %.1f tok/s vs 1 stream %.1f tok/s: %.2fx aggregate "
                       "(target > 1)\n", o.streams, many, one, one > 0 ? many / one : 0);
            if (have && !peer_shown) printf("      (peer: %s)\n", build);
            peer_shown |= have;
        }
    }
    if (getloadavg(la, 3) > 0) printf("\nload average at end: %.2f %.2f %.2f", la[0], la[1], la[2]);
    printf("\nGEMM engine: f32 %s; peak RSS %.0f MiB\n", at_cpu_gemm_engine(AT_F32), bench_peak_rss_mib());
    if (o.keep) printf("GGUF files kept in %s\n", dir);
    else rmdir(dir);
    at_tokenizer_free(tok);
    return failed;
}
