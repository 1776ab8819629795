/* A tiny test harness: CHECK keeps going and counts failures; the test's main
 * returns at_test_result(). */
#ifndef AT_TESTS_TESTING_H
#define AT_TESTS_TESTING_H

#include <stdio.h>
#include "base/status.h"
#include "train/trainer.h"

extern int at_test_failures;
extern int at_test_checks;

#define CHECK(cond) do { at_test_checks++; if (!(cond)) { at_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { at_test_checks++; if (!(cond)) { at_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
/* The call must return AT_OK; otherwise the error message is printed. */
#define CHECK_OK(expr) do { at_status s_ = (expr); at_test_checks++; if (s_ != AT_OK) { at_test_failures++; \
    fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr, at_status_name(s_), \
    at_last_error()); } } while (0)
/* The call must fail with the given status. */
#define CHECK_FAILS(expr, code) do { at_status s_ = (expr); at_test_checks++; if (s_ != (code)) { \
    at_test_failures++; fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr, \
    at_status_name(s_), at_status_name(code)); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); at_test_checks++; \
    if (!(fabs(a_ - b_) <= (tol))) { at_test_failures++; \
    fprintf(stderr, "%s:%d: %s = %.9g, %s = %.9g, differ by more than %g\n", __FILE__, __LINE__, #a, a_, #b, \
    b_, (double)(tol)); } } while (0)

/* Prints a summary; returns the process exit code. */
int at_test_result(const char *name);

/* Maximum relative error of got vs want over n values:
 * max |g - w| / max(max |w|, floor). */
double at_test_max_rel_err(const float *got, const float *want, size_t n, double floor);

/* The backend of a real CUDA GPU (cuda:0) when this machine has one and the
 * build has the CUDA backend library; NULL otherwise (with a line saying
 * why). The GPU runs of the suite: conformance and the training goldens. */
struct at_backend;
struct at_backend *at_test_gpu_backend(void);

/* Whether the npm package `name` of the JavaScript checkers is installed in
 * tests/js/node_modules (scripts/setup.sh runs npm ci there; the tests do
 * not, since two of them installing at once would collide). When it is not,
 * a failed check says so and 0 is returned. */
int at_test_js_ready(const char *name);

/* The expectations `expect` (JSON) written to dir/expect.json and checked by
 * the node script tests/js/SCRIPT with the npm package `package` (a failed
 * check names `reader` when the script disagrees). */
struct cJSON;
void at_test_js_check(const char *dir, const struct cJSON *expect, const char *package, const char *script,
                      const char *reader);

/* The settings the trainer tests share: `model`, the one dataset `dataset`
 * (a path or FILE#N; kept until the next call), output under `out`, the
 * demo's self-cognition names, learning rate 1e-3, a log line a step, no
 * checkpoint before step 1000, max_length 256; the rest the defaults. */
void at_test_train_args(at_train_args *a, const char *model, const char *dataset, const char *out);

/* Runs argv (argv[0] a program path, no shell) with stdout to /dev/null and
 * stderr into err_path (NULL: /dev/null); returns the wait status. */
int at_test_run(char *const argv[], const char *err_path);

/* Whether the file at path exists and contains text. */
int at_test_file_has(const char *path, const char *text);

/* 1 when the test programs run under a CPU emulator (a cross build whose
 * CMAKE_CROSSCOMPILING_EMULATOR is set, e.g. the aarch64 suite under qemu,
 * where a float operation costs ~100 times what it costs natively): a test
 * may then take a smaller case that asserts the same things. 0 in every
 * native build, which keeps the full case. */
#ifdef AT_TEST_EMULATED
#define AT_TEST_UNDER_EMULATOR 1
#else
#define AT_TEST_UNDER_EMULATOR 0
#endif

/* 1 in the AddressSanitizer build (gcc's __SANITIZE_ADDRESS__ or clang's
 * feature test), where a test may skip what sanitizers cannot see (RSS
 * measured against the planner: the shadow memory counts too) or run a
 * long end-to-end job shorter, with the release build asserting the rest. */
#if defined(__SANITIZE_ADDRESS__)
#define AT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AT_TEST_ASAN 1
#endif
#endif
#ifndef AT_TEST_ASAN
#define AT_TEST_ASAN 0
#endif

#endif
