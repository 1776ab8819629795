/* The web UI's training job: one `anytune sft` child process at a time.
 *
 * A request body (JSON object of ms-swift option names) is checked against
 * an allow-list of options, each with its value type and range; paths may
 * hold no shell metacharacters and the inputs must exist. The accepted
 * options become an argv array ("sft", "--name=value", ...) for the
 * program's own executable; nothing goes through a shell. The child is
 * started with posix_spawn (no fork of a server holding a model), in its
 * own process group, with no descriptor of the server's but its output
 * pipe. Its stdout and stderr are read into a ring of recent lines by a
 * monitor thread, which also reaps the child when it exits (no zombies).
 * at_train_job_free stops a running one; when the server dies (even by
 * SIGKILL) the child stops as Stop stops it and checkpoints its last step
 * (the trainer asks for a death signal: ANYTUNE_WEBUI_SERVER_PID). */
#ifndef AT_SERVE_WEBUI_TRAIN_H
#define AT_SERVE_WEBUI_TRAIN_H

#include <stddef.h>
#include "base/status.h"

/* The argv of a job: argv[0] is the program, argv[1] "sft" ("rlhf" when the
 * body sets rlhf_type, which allows rlhf's options), then one "--name=value"
 * per option given; NULL-terminated. */
typedef struct at_train_argv {
    char **argv;
    int argc;
} at_train_argv;

/* Checks body[0..len) and builds the argv (argv[0] = program). On failure:
 * AT_ERR_FORMAT (not a JSON object) or AT_ERR_INVALID (an unknown option, a
 * value of the wrong type or out of range, a bad path), with a message
 * naming the option and param[0..cap) set to it ("" when none). The caller
 * frees a->argv with at_train_argv_free (also after a failure). */
at_status at_train_argv_build(const char *body, size_t len, const char *program, at_train_argv *a, char *param,
                              size_t cap);
void at_train_argv_free(at_train_argv *a);

typedef struct at_train_job at_train_job;

/* A job slot that starts `program` (NULL: /proc/self/exe, this program).
 * Caller frees with at_train_job_free. */
at_status at_train_job_new(const char *program, at_train_job **out);

/* Validates the body (as at_train_argv_build) and starts the child.
 * AT_ERR_FORMAT / AT_ERR_INVALID: bad request (param names the option);
 * AT_ERR_UNSUPPORTED: a job is already running; AT_ERR_IO: the process
 * could not be started. */
at_status at_train_job_start(at_train_job *j, const char *body, size_t len, char *param, size_t cap);

/* Sends SIGTERM to the running child and the processes it started (its
 * process group). The trainer's checkpoints are written atomically, so those
 * on disk stay whole; steps since the last one are lost. AT_ERR_NOT_FOUND
 * when none runs. */
at_status at_train_job_stop(at_train_job *j);

/* The job as JSON: state (idle, running, finished, failed, stopped), pid,
 * exit_code, signal, argv, run_dir (parsed from the trainer's output), the
 * last lines of its output, and the rows of run_dir/logging.jsonl from
 * index `since` on (log_total: how many complete rows there are; a row
 * that is not JSON comes as {} so that indices stay aligned). Caller
 * frees the string; NULL when out of memory. */
char *at_train_job_status_json(at_train_job *j, long since);

/* Stops a running child and its process group (SIGTERM; SIGKILL after
 * grace_s seconds), waits for it and frees j. NULL ok. */
void at_train_job_free(at_train_job *j, double grace_s);

#endif
