#include "serve/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/log.h"
#include "device/cpu/gemm.h"
#include "infer/scheduler.h"
#include "infer/vlm.h"

struct at_job {
    /* input, owned */
    int32_t *ids;
    size_t n;
    at_gen_params p;
    char *stop[AT_GEN_MAX_STOP];
    int32_t *stop_ids;
    at_vlm_images images;
    at_prompt_media media; /* media.vision NULL: none */
    /* output, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text;
    size_t len, cap, read;
    int finished;
    at_finish_reason finish;
    int prompt_tokens, completion_tokens;
    int cached_tokens, images_encoded;
    char error[256];
    atomic_int cancelled;
    atomic_int refs;
    at_job *next; /* queue link (engine mutex) */
};

struct at_engine {
    at_bundle *b;
    at_scheduler *sched;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    at_job *head, *tail; /* waiting jobs */
    int n_waiting, max_queue;
    at_job **active;     /* [max_batch] the job in each slot */
    int draining, stopping;
    double deadline;     /* when draining: cancel what runs after this (monotonic seconds) */
    at_engine_stats stats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void job_free(at_job *j)
{
    free(j->ids);
    for (int i = 0; i < AT_GEN_MAX_STOP; i++) free(j->stop[i]);
    free(j->stop_ids);
    at_vlm_media_free(&j->media);
    at_vlm_images_free(&j->images);
    free(j->text);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void at_job_release(at_job *j)
{
    if (j && atomic_fetch_sub(&j->refs, 1) == 1) job_free(j);
}

void at_job_cancel(at_job *j) { atomic_store(&j->cancelled, 1); }

/* Appends text and/or finishes; wakes the submitter. */
static void job_update(at_job *j, const char *text, size_t len, at_finish_reason fin, int prompt_tokens,
                       int completion_tokens, const char *error)
{
    pthread_mutex_lock(&j->mu);
    if (len && j->len + len + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 256;
        while (cap < j->len + len + 1) cap *= 2;
        char *p = realloc(j->text, cap);
        if (p) {
            j->text = p;
            j->cap = cap;
        } else {
            len = 0;
            fin = AT_FINISH_ERROR;
            error = "out of memory";
        }
    }
    if (len) {
        memcpy(j->text + j->len, text, len);
        j->len += len;
    }
    j->prompt_tokens = prompt_tokens;
    j->completion_tokens = completion_tokens;
    if (fin != AT_FINISH_NONE && !j->finished) {
        j->finished = 1;
        j->finish = fin;
        if (error) snprintf(j->error, sizeof j->error, "%s", error);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

int at_job_wait(at_job *j, int timeout_ms, at_job_news *news)
{
    memset(news, 0, sizeof *news);
    pthread_mutex_lock(&j->mu);
    if (j->read == j->len && !j->finished && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (j->read == j->len && !j->finished)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    int any = j->read < j->len || j->finished;
    if (j->read < j->len) {
        news->text = malloc(j->len - j->read + 1);
        if (news->text) {
            news->len = j->len - j->read;
            memcpy(news->text, j->text + j->read, news->len);
            news->text[news->len] = 0;
            j->read = j->len;
        }
    }
    news->finished = j->finished;
    news->finish = j->finish;
    news->prompt_tokens = j->prompt_tokens;
    news->completion_tokens = j->completion_tokens;
    news->cached_tokens = j->cached_tokens;
    news->images_encoded = j->images_encoded;
    memcpy(news->error, j->error, sizeof news->error);
    pthread_mutex_unlock(&j->mu);
    return any;
}

at_status at_engine_submit(at_engine *e, const int32_t *ids, size_t n, const at_gen_params *p, at_job **out)
{
    return at_engine_submit_media(e, ids, n, NULL, NULL, p, out);
}

at_status at_engine_submit_media(at_engine *e, const int32_t *ids, size_t n, at_vlm_images *images,
                                 at_prompt_media *media, const at_gen_params *p, at_job **out)
{
    *out = NULL;
    at_vlm_images im = {0};
    at_prompt_media md = {0};
    if (images) {
        im = *images;
        memset(images, 0, sizeof *images);
    }
    if (media) {
        md = *media;
        memset(media, 0, sizeof *media);
    }
    at_job *j = p->n_stop <= AT_GEN_MAX_STOP ? calloc(1, sizeof *j) : NULL;
    if (!j) {
        at_vlm_media_free(&md);
        at_vlm_images_free(&im);
        if (p->n_stop > AT_GEN_MAX_STOP) return at_error(AT_ERR_INVALID, "too many stop strings");
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    j->images = im;
    j->media = md;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancelled, 0);
    j->p = *p;
    j->ids = malloc((n ? n : 1) * sizeof *ids);
    j->stop_ids = malloc((size_t)(p->n_stop_ids > 0 ? p->n_stop_ids : 1) * sizeof *j->stop_ids);
    int ok = j->ids && j->stop_ids;
    for (int i = 0; ok && i < p->n_stop; i++) ok = (j->stop[i] = strdup(p->stop[i])) != NULL;
    if (!ok) {
        job_free(j);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    memcpy(j->ids, ids, n * sizeof *ids);
    j->n = n;
    if (p->n_stop_ids > 0) memcpy(j->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *j->stop_ids);
    j->p.stop = (const char *const *)j->stop;
    j->p.stop_ids = j->stop_ids;
    j->prompt_tokens = (int)n;

    at_status st = AT_OK;
    pthread_mutex_lock(&e->mu);
    if (e->draining) {
        st = at_error(AT_ERR_UNSUPPORTED, "the server is shutting down");
    } else if (e->n_waiting >= e->max_queue) {
        st = at_error(AT_ERR_NOMEM, "the server is busy: %d requests are waiting", e->n_waiting);
    } else {
        atomic_fetch_add(&j->refs, 1); /* the engine's reference */
        if (e->tail) e->tail->next = j;
        else e->head = j;
        e->tail = j;
        e->n_waiting++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (st != AT_OK) {
        job_free(j);
        return st;
    }
    *out = j;
    return AT_OK;
}

/* Under e->mu: moves waiting jobs into free slots. */
static void admit(at_engine *e)
{
    while (e->head && at_scheduler_in_use(e->sched) < at_scheduler_capacity(e->sched)) {
        at_job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        e->n_waiting--;
        j->next = NULL;
        if (atomic_load(&j->cancelled)) {
            job_update(j, NULL, 0, AT_FINISH_CANCELLED, (int)j->n, 0, NULL);
            at_job_release(j);
            continue;
        }
        int slot = -1;
        at_status st = at_scheduler_add_media(e->sched, j->ids, j->n, j->media.vision ? &j->media : NULL, &j->p, j,
                                              &slot);
        if (st != AT_OK) {
            job_update(j, NULL, 0, AT_FINISH_ERROR, (int)j->n, 0, at_last_error());
            at_job_release(j);
            continue;
        }
        e->active[slot] = j;
    }
}

static void *engine_main(void *arg)
{
    at_engine *e = arg;
    int B = at_scheduler_capacity(e->sched);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        admit(e);
        int late = e->draining && now_s() > e->deadline;
        if (late) { /* the grace period is over: cancel what waits and what runs */
            while (e->head) {
                at_job *j = e->head;
                e->head = j->next;
                e->n_waiting--;
                job_update(j, NULL, 0, AT_FINISH_CANCELLED, (int)j->n, 0, NULL);
                at_job_release(j);
            }
            e->tail = NULL;
        }
        e->stats.running = at_scheduler_in_use(e->sched);
        e->stats.waiting = e->n_waiting;
        if (e->stats.running == 0) {
            if (e->stopping && !e->head) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&e->mu);

        for (int b = 0; b < B; b++)
            if (e->active[b] && (late || atomic_load(&e->active[b]->cancelled))) at_scheduler_cancel(e->sched, b);
        const at_sched_event *ev = NULL;
        int n_ev = 0;
        at_status st = at_scheduler_step(e->sched, &ev, &n_ev);
        if (st != AT_OK) at_log_warn("serve: a decoder step failed: %s", at_last_error());
        int produced = 0;
        for (int i = 0; i < n_ev; i++) {
            at_job *j = ev[i].user;
            produced += ev[i].token >= 0;
            pthread_mutex_lock(&j->mu);
            int first = j->completion_tokens == 0 && ev[i].completion_tokens > 0;
            j->cached_tokens = ev[i].cached_tokens;
            int new_images = ev[i].images_encoded - j->images_encoded;
            j->images_encoded = ev[i].images_encoded;
            pthread_mutex_unlock(&j->mu);
            pthread_mutex_lock(&e->mu);
            e->stats.images_encoded += new_images;
            if (first) e->stats.cached_tokens += ev[i].cached_tokens;
            pthread_mutex_unlock(&e->mu);
            job_update(j, ev[i].text, ev[i].len, ev[i].finish, ev[i].prompt_tokens, ev[i].completion_tokens,
                       ev[i].finish == AT_FINISH_ERROR ? (st != AT_OK ? at_last_error() : "generation failed")
                                                      : NULL);
            if (ev[i].finish != AT_FINISH_NONE) {
                e->active[ev[i].slot] = NULL;
                at_job_release(j);
            }
        }

        pthread_mutex_lock(&e->mu);
        e->stats.steps++;
        e->stats.tokens += produced;
        if (produced > e->stats.peak_batch) e->stats.peak_batch = produced;
    }
    pthread_mutex_unlock(&e->mu);
    /* the CPU GEMM keeps packing buffers per thread; this thread ends here */
    at_cpu_gemm_release_buffers();
    return NULL;
}

at_status at_engine_start(at_bundle *b, int max_batch, int max_seq, int max_queue, at_engine **out)
{
    *out = NULL;
    at_engine *e = calloc(1, sizeof *e);
    if (!e) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->b = b;
    e->max_queue = max_queue > 0 ? max_queue : 1;
    e->stats.max_batch = max_batch;
    AT_CHECK(at_scheduler_new(b->decoder, b->tokenizer, max_batch, max_seq, &e->sched));
    e->active = calloc((size_t)max_batch, sizeof *e->active);
    if (!e->active) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        st = at_error(AT_ERR_INTERNAL, "serve: cannot start the engine thread");
        goto done;
    }
    e->thread_started = 1;
done:
    if (st != AT_OK) {
        at_scheduler_free(e->sched);
        free(e->active);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        free(e);
        return st;
    }
    *out = e;
    return AT_OK;
}

void at_engine_get_stats(at_engine *e, at_engine_stats *s)
{
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    pthread_mutex_unlock(&e->mu);
}

void at_engine_stop(at_engine *e, double grace_s)
{
    if (!e || !e->thread_started) return;
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    e->stopping = 1;
    e->deadline = now_s() + (grace_s > 0 ? grace_s : 0);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_started = 0;
    /* nothing runs now; jobs left in slots (none after a clean exit) are released */
    int B = at_scheduler_capacity(e->sched);
    for (int b = 0; b < B; b++)
        if (e->active[b]) {
            job_update(e->active[b], NULL, 0, AT_FINISH_CANCELLED, 0, 0, NULL);
            at_job_release(e->active[b]);
            e->active[b] = NULL;
        }
    e->stats.running = e->stats.waiting = 0;
}

void at_engine_free(at_engine *e)
{
    if (!e) return;
    at_engine_stop(e, 0);
    at_scheduler_free(e->sched);
    free(e->active);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
