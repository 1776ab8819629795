/* The server's engine: one thread that owns the scheduler (continuous
 * batching, infer/scheduler.h) and runs its steps, fed by a queue of jobs
 * that HTTP threads submit and then read from.
 *
 * A job is shared by the engine and the thread that submitted it (reference
 * counted): the engine appends text and finally a finish reason; the
 * submitter waits for news with at_job_wait, and may cancel it (a client that
 * went away) — the engine then frees its slot at the next step. */
#ifndef AT_SERVE_ENGINE_H
#define AT_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "infer/bundle.h"
#include "infer/generate.h"
#include "infer/vlm.h"

typedef struct at_engine at_engine;
typedef struct at_job at_job;

/* Starts the engine thread on bundle b (borrowed) with max_batch slots of
 * max_seq tokens and at most max_queue jobs waiting for a slot. Caller stops
 * it with at_engine_stop. */
at_status at_engine_start(at_bundle *b, int max_batch, int max_seq, int max_queue, at_engine **out);

/* Queues a job: prompt ids and parameters are copied (stop strings too).
 * *out is the caller's reference (at_job_release). AT_ERR_UNSUPPORTED when
 * the engine is shutting down, AT_ERR_NOMEM when the queue is full (the
 * message says which). */
at_status at_engine_submit(at_engine *e, const int32_t *ids, size_t n, const at_gen_params *p, at_job **out);

/* at_engine_submit for a prompt with images: takes *images and *media
 * (at_vlm_media of ids) on success and failure alike, leaving them zeroed. */
at_status at_engine_submit_media(at_engine *e, const int32_t *ids, size_t n, at_vlm_images *images,
                                 at_prompt_media *media, const at_gen_params *p, at_job **out);

/* What a job has produced since the last call. */
typedef struct at_job_news {
    char *text;        /* new text (a new string, caller frees; NULL when none) */
    size_t len;
    int finished;
    at_finish_reason finish;
    int prompt_tokens, completion_tokens;
    int cached_tokens;  /* prompt tokens the prefix cache held */
    int images_encoded; /* images the vision tower ran on for this job */
    char error[256];   /* when finish is AT_FINISH_ERROR */
} at_job_news;

/* Waits up to timeout_ms for text or the end (returns at once when there is
 * some), and fills *news. Returns 1 when there was news, 0 on timeout. */
int at_job_wait(at_job *j, int timeout_ms, at_job_news *news);
/* Asks the engine to stop the job (its slot is freed at the next step). */
void at_job_cancel(at_job *j);
void at_job_release(at_job *j); /* the caller's reference; NULL ok */

/* Counters for /health. */
typedef struct at_engine_stats {
    int running, waiting, max_batch;
    int peak_batch;         /* most sequences that produced a token in one step */
    long long steps, tokens;
    long long images_encoded; /* images run through the vision tower (the prefix cache spares repeats) */
    long long cached_tokens;  /* prompt tokens taken from the prefix cache */
} at_engine_stats;
void at_engine_get_stats(at_engine *e, at_engine_stats *s);

/* Stops taking jobs (submit fails from now on), lets the running and waiting
 * jobs finish for up to grace_s seconds, cancels what is left and joins the
 * thread. The engine stays valid (submit refuses, stats answer) until
 * at_engine_free. Jobs still referenced by submitters stay valid until
 * released. */
void at_engine_stop(at_engine *e, double grace_s);
void at_engine_free(at_engine *e); /* stops first if needed; NULL ok */

#endif
