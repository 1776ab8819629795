/* Models and datasets by name (hub/), against a fake hub that the test
 * starts on 127.0.0.1 (tests/js/fake_hub.mjs: the Hugging Face and
 * ModelScope routes, a 302 to a "CDN" on another host name, ranges, a gated
 * repository, a connection that drops mid-file, a wrong sha256, a hostile
 * file name). The cache each download leaves is checked file by file:
 * blobs named by sha256 / git blob id, refs/<rev> holding the commit,
 * snapshots/<commit>/<path> relative symlinks, ModelScope's plain folders,
 * no partial file anywhere. Then `anytune download` and `anytune infer
 * --model ORG/NAME` through the program. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "base/sha256.h"
#include "data/dataset.h"
#include "hub/hub.h"
#include "testing.h"

static char tmp[64], origin[128], hf[128], ms[128], endpoint[64];
static pid_t hub_pid;
static int hub_stdin = -1;

static void start_hub(void)
{
    int in[2], out[2];
    if (pipe(in) || pipe(out)) return;
    hub_pid = fork();
    if (hub_pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execlp("node", "node", "tests/js/fake_hub.mjs", "demo/stories260K", "demo/identity.json", origin, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    hub_stdin = in[1];
    char line[64] = "";
    FILE *f = fdopen(out[0], "r");
    int port = 0;
    if (f && fgets(line, sizeof line, f)) sscanf(line, "port %d", &port);
    CHECK_MSG(port > 0, "the fake hub did not start (got '%s')", line);
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
}

static void stop_hub(void)
{
    if (hub_stdin >= 0) close(hub_stdin);
    int status;
    if (hub_pid > 0) waitpid(hub_pid, &status, 0);
}

static at_hub_options opts(at_hub_kind hub)
{
    at_hub_options o;
    memset(&o, 0, sizeof o);
    o.hub = hub;
    o.http.quiet = 1;
    o.http.backoff_s = 0.05;
    return o;
}

/* The requests the fake hub saw whose URL contains `part`. */
static int requests(const char *part, int want_range, int *with_auth)
{
    char url[128];
    snprintf(url, sizeof url, "%s/__log", endpoint);
    cJSON *log = NULL;
    at_http_options ho = {0};
    int n = 0;
    if (with_auth) *with_auth = 0;
    if (at_http_get_json(&ho, url, &log, NULL) != AT_OK) return -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, log)
    {
        const char *u = cJSON_GetObjectItem(e, "url")->valuestring;
        const cJSON *range = cJSON_GetObjectItem(e, "range");
        if (!strstr(u, part) || (want_range && !cJSON_IsString(range))) continue;
        n++;
        if (with_auth && cJSON_IsString(cJSON_GetObjectItem(e, "auth"))) ++*with_auth;
    }
    cJSON_Delete(log);
    return n;
}

static int same_file(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t lx = 0, ly = 0;
    int same = at_read_file(a, &x, &lx) == AT_OK && at_read_file(b, &y, &ly) == AT_OK && lx == ly && !memcmp(x, y, lx);
    free(x);
    free(y);
    return same;
}

static char *git_blob_id_of(const char *path, char hex[65])
{
    /* blob ids are the hub's; read them back from the symlink instead */
    (void)path;
    return hex;
}

/* snapshots/<commit>/<rel> must be a symlink to `depth` ../ + blobs/<name>,
 * the blob equal to the origin file, its name the sha256 for LFS files. */
static void check_linked(const char *snap, const char *repo_key, const char *rel, int lfs)
{
    char link[512], want[512], target[512];
    snprintf(link, sizeof link, "%s/%s", snap, rel);
    snprintf(want, sizeof want, "%s/%s/%s", origin, repo_key, rel);
    struct stat sb;
    CHECK_MSG(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "%s is not a symlink", link);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return;
    target[n] = '\0';
    int depth = 2;
    for (const char *s = rel; *s; s++) depth += *s == '/';
    char prefix[128] = "";
    for (int i = 0; i < depth; i++) strcat(prefix, "../");
    strcat(prefix, "blobs/");
    CHECK_MSG(!strncmp(target, prefix, strlen(prefix)), "%s -> %s, expected %s...", link, target, prefix);
    const char *blob = target + strlen(prefix);
    CHECK(strlen(blob) == (lfs ? 64u : 40u));
    if (lfs) {
        char hex[65];
        CHECK_OK(at_sha256_file(want, hex));
        CHECK_MSG(!strcmp(hex, blob), "%s: blob %s is not its sha256 %s", rel, blob, hex);
    }
    (void)git_blob_id_of;
    CHECK_MSG(same_file(link, want), "%s differs from what the hub served", link);
}

static int exists(const char *fmt, const char *a, const char *b)
{
    char p[512];
    snprintf(p, sizeof p, fmt, a, b);
    struct stat sb;
    return lstat(p, &sb) == 0;
}

/* No *.incomplete file left under dir. */
static int partial_files(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test -z \"$(find %s -name '*.incomplete')\"", dir);
    return system(cmd) != 0;
}

static void test_model(void)
{
    at_hub_options o = opts(AT_HUB_HF);
    o.token = "public-token"; /* sent to the hub, never to the CDN */
    char *dir = NULL;
    CHECK_OK(at_hub_snapshot("org/tiny", AT_REPO_MODEL, &o, &dir));
    if (!dir) return;
    char root[256], ref[512];
    snprintf(root, sizeof root, "%s/hub/models--org--tiny", hf);
    CHECK_MSG(!strncmp(dir, root, strlen(root)) && strstr(dir, "/snapshots/"), "snapshot at %s", dir);
    const char *commit = strrchr(dir, '/') + 1;
    snprintf(ref, sizeof ref, "%s/refs/main", root);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(ref, &text, &len));
    CHECK(text && len == 40 && !strncmp(text, commit, 40));
    free(text);
    check_linked(dir, "models/org/tiny", "config.json", 0);
    check_linked(dir, "models/org/tiny", "tokenizer.json", 0);
    check_linked(dir, "models/org/tiny", "model.safetensors", 1);
    CHECK(!exists("%s/%s", dir, "pytorch_model.bin")); /* only what a model needs */
    CHECK(!exists("%s/%s", dir, "README.md"));
    CHECK(!exists("%s/%s", dir, "sub"));
    CHECK(!partial_files(hf));
    int auth = 0;
    CHECK(requests("/cdn/", 0, &auth) == 1); /* the safetensors went through the 302 */
    CHECK_MSG(auth == 0, "the token reached the CDN host");
    CHECK(requests("/api/models/org/tiny/revision/main?blobs=true", 0, &auth) == 1 && auth == 1);
    /* a second call downloads nothing */
    int before = requests("/resolve/", 0, NULL);
    char *again = NULL;
    CHECK_OK(at_hub_snapshot("org/tiny", AT_REPO_MODEL, &o, &again));
    CHECK(again && !strcmp(again, dir));
    CHECK(requests("/resolve/", 0, NULL) == before);
    free(again);
    /* --include: a nested file, two levels of ../ more */
    const char *inc[] = {"sub/*"};
    o.include = inc;
    o.n_include = 1;
    CHECK_OK(at_hub_snapshot("org/tiny@main", AT_REPO_MODEL, &o, &again));
    check_linked(dir, "models/org/tiny", "sub/extra.json", 0);
    free(again);
    /* the same revision by commit */
    char byc[128];
    snprintf(byc, sizeof byc, "org/tiny@%s", commit);
    o.n_include = 0;
    CHECK_OK(at_hub_snapshot(byc, AT_REPO_MODEL, &o, &again));
    CHECK(again && !strcmp(again, dir));
    free(again);
    /* offline: the cache alone, no request */
    int all = requests("/", 0, NULL);
    o.offline = 1;
    CHECK_OK(at_hub_snapshot("org/tiny", AT_REPO_MODEL, &o, &again));
    CHECK(again && !strcmp(again, dir));
    free(again);
    CHECK_FAILS(at_hub_snapshot("org/flaky", AT_REPO_MODEL, &o, &again), AT_ERR_NOT_FOUND);
    CHECK(strstr(at_last_error(), "HF_HUB_OFFLINE") != NULL);
    CHECK(requests("/", 0, NULL) == all + 1); /* the only new request: this look at the log */
    /* HF_HUB_CACHE wins over HF_HOME */
    char hc[128];
    snprintf(hc, sizeof hc, "%s/hubcache", tmp);
    setenv("HF_HUB_CACHE", hc, 1);
    o.offline = 0;
    CHECK_OK(at_hub_snapshot("org/tiny", AT_REPO_MODEL, &o, &again));
    CHECK(again && !strncmp(again, hc, strlen(hc)) && strstr(again, "/models--org--tiny/snapshots/"));
    free(again);
    unsetenv("HF_HUB_CACHE");
    free(dir);
}

static void test_failures(void)
{
    at_hub_options o = opts(AT_HUB_HF);
    char *dir = NULL, want[256];
    /* gated without a token: what to do, naming the page */
    CHECK_FAILS(at_hub_snapshot("org/gated", AT_REPO_MODEL, &o, &dir), AT_ERR_INVALID);
    snprintf(want, sizeof want, "Accept the license at %s/org/gated and set HF_TOKEN", endpoint);
    CHECK_MSG(strstr(at_last_error(), want) != NULL, "%s", at_last_error());
    o.token = "secret";
    CHECK_OK(at_hub_snapshot("org/gated", AT_REPO_MODEL, &o, &dir));
    int auth = 0;
    CHECK(requests("/cdn/", 0, &auth) >= 2 && auth == 0);
    free(dir);
    o.token = NULL;
    /* 404: the name, the revision */
    CHECK_FAILS(at_hub_snapshot("org/nothing", AT_REPO_MODEL, &o, &dir), AT_ERR_NOT_FOUND);
    CHECK(strstr(at_last_error(), "not found") && strstr(at_last_error(), "check the name"));
    CHECK_FAILS(at_hub_snapshot("org/tiny@v9", AT_REPO_MODEL, &o, &dir), AT_ERR_NOT_FOUND);
    CHECK(strstr(at_last_error(), "no revision 'v9'") != NULL);
    /* a connection cut mid-file: resumed with a range in the same run */
    CHECK_OK(at_hub_snapshot("org/flaky", AT_REPO_MODEL, &o, &dir));
    if (dir) check_linked(dir, "models/org/flaky", "model.safetensors", 1);
    CHECK(requests("/cdn/", 1, NULL) >= 1);
    free(dir);
    /* an interrupted run: the next one resumes from the partial blob */
    char src[256], part[512], hex[65];
    snprintf(src, sizeof src, "%s/models/org/resume/model.safetensors", origin);
    CHECK_OK(at_sha256_file(src, hex));
    snprintf(part, sizeof part, "%s/hub/models--org--resume/blobs", hf);
    CHECK_OK(at_mkdirs(part));
    snprintf(part + strlen(part), sizeof part - strlen(part), "/%s.incomplete", hex);
    char *data = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(src, &data, &len));
    CHECK_OK(at_write_file_atomic(part, data, len / 3));
    free(data);
    int ranged = requests("/cdn/", 1, NULL);
    CHECK_OK(at_hub_snapshot("org/resume", AT_REPO_MODEL, &o, &dir));
    if (dir) check_linked(dir, "models/org/resume", "model.safetensors", 1);
    CHECK(requests("/cdn/", 1, NULL) == ranged + 1);
    free(dir);
    /* a wrong sha256: refused, nothing in place, nothing to resume from */
    CHECK_FAILS(at_hub_snapshot("org/badsha", AT_REPO_MODEL, &o, &dir), AT_ERR_FORMAT);
    CHECK(strstr(at_last_error(), "sha256 mismatch") != NULL);
    char blobs[256];
    snprintf(blobs, sizeof blobs, "%s/hub/models--org--badsha", hf);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test -z \"$(find %s -type f -path '*blobs*' ! -name '*.json' -size +2k)\"", blobs);
    CHECK_MSG(system(cmd) == 0, "a blob of the bad file is in the cache");
    CHECK(!exists("%s/%s", blobs, "snapshots"));
    CHECK(!partial_files(blobs));
    /* a file name that leaves the repository: refused before any write */
    CHECK_FAILS(at_hub_snapshot("org/evil", AT_REPO_MODEL, &o, &dir), AT_ERR_FORMAT);
    CHECK(strstr(at_last_error(), "would leave") != NULL);
    snprintf(cmd, sizeof cmd, "test -z \"$(find %s -name evil.json)\"", tmp);
    CHECK(system(cmd) == 0);
    /* a listing with data after its JSON object: refused, naming where (not read up to the object) */
    CHECK_FAILS(at_hub_snapshot("org/trailing", AT_REPO_MODEL, &o, &dir), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "unexpected data after JSON value") != NULL, "%s", at_last_error());
    CHECK(!exists("%s/%s", hf, "hub/models--org--trailing/snapshots"));
    /* a full disk: the partial blob is /dev/full */
    snprintf(src, sizeof src, "%s/models/org/full/model.safetensors", origin);
    CHECK_OK(at_sha256_file(src, hex));
    snprintf(part, sizeof part, "%s/hub/models--org--full/blobs", hf);
    CHECK_OK(at_mkdirs(part));
    snprintf(part + strlen(part), sizeof part - strlen(part), "/%s.incomplete", hex);
    CHECK(symlink("/dev/full", part) == 0);
    CHECK_FAILS(at_hub_snapshot("org/full", AT_REPO_MODEL, &o, &dir), AT_ERR_IO);
    CHECK_MSG(strstr(at_last_error(), "disk is full") != NULL, "%s", at_last_error());
    unlink(part);
    /* a listing without blob ids: HEAD each file, as huggingface_hub does */
    CHECK_OK(at_hub_snapshot("org/mirror", AT_REPO_MODEL, &o, &dir));
    if (dir) {
        check_linked(dir, "models/org/mirror", "config.json", 0);
        check_linked(dir, "models/org/mirror", "model.safetensors", 1);
    }
    free(dir);
    /* GGUF: one quantization, all its shards, no projector */
    CHECK_OK(at_hub_snapshot("org/quant", AT_REPO_MODEL, &o, &dir));
    if (dir) {
        CHECK(exists("%s/%s", dir, "tiny-Q4_K_M-00001-of-00002.gguf"));
        CHECK(exists("%s/%s", dir, "tiny-Q4_K_M-00002-of-00002.gguf"));
        CHECK(!exists("%s/%s", dir, "tiny-Q8_0.gguf"));
        CHECK(!exists("%s/%s", dir, "mmproj-tiny.gguf"));
        CHECK(exists("%s/%s", dir, "config.json"));
    }
    free(dir);
    o.gguf = "Q8_0";
    CHECK_OK(at_hub_snapshot("org/quant", AT_REPO_MODEL, &o, &dir));
    if (dir) CHECK(exists("%s/%s", dir, "tiny-Q8_0.gguf"));
    free(dir);
}

static void test_modelscope(void)
{
    at_hub_options o = opts(AT_HUB_MODELSCOPE);
    char *dir = NULL, want[256];
    CHECK_OK(at_hub_snapshot("org/tiny", AT_REPO_MODEL, &o, &dir));
    snprintf(want, sizeof want, "%s/models/org/tiny", ms);
    CHECK_MSG(dir && !strcmp(dir, want), "ModelScope folder %s", dir ? dir : "(none)");
    const char *files[] = {"config.json", "tokenizer.json", "model.safetensors"};
    for (size_t i = 0; dir && i < 3; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/models/org/tiny/%s", origin, files[i]);
        CHECK_MSG(same_file(a, b), "%s", a);
    }
    CHECK(dir && !exists("%s/%s", dir, "pytorch_model.bin"));
    CHECK(!partial_files(ms));
    CHECK(requests("/api/v1/models/org/tiny/repo?Revision=master&FilePath=model.safetensors", 0, NULL) == 1);
    free(dir);
    CHECK_FAILS(at_hub_snapshot("org/badsha", AT_REPO_MODEL, &o, &dir), AT_ERR_FORMAT);
    CHECK(!exists("%s/models/org/badsha/%s", ms, "model.safetensors"));
    CHECK_FAILS(at_hub_snapshot("org/gated", AT_REPO_MODEL, &o, &dir), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "MODELSCOPE_API_TOKEN") != NULL);
    /* a dataset by name: the train split only */
    char **fs = NULL;
    size_t n = 0;
    CHECK_OK(at_hub_dataset_files("org/chat", &o, &fs, &n));
    CHECK(n == 1 && fs && strstr(fs[0], "/datasets/org/chat/data/train.json"));
    for (size_t i = 0; i < n; i++) free(fs[i]);
    free(fs);
}

static void test_datasets(void)
{
    at_hub_options o = opts(AT_HUB_HF);
    char **fs = NULL;
    size_t n = 0;
    CHECK_OK(at_hub_dataset_files("org/chat", &o, &fs, &n));
    CHECK(n == 1);
    if (n == 1) {
        CHECK(strstr(fs[0], "/hub/datasets--org--chat/snapshots/") && strstr(fs[0], "/data/train.json"));
        CHECK(same_file(fs[0], "demo/identity.json"));
    }
    for (size_t i = 0; i < n; i++) free(fs[i]);
    free(fs);
    /* no data files in the repository: the Hub's Parquet conversion */
    CHECK_OK(at_hub_dataset_files("org/scripted", &o, &fs, &n));
    CHECK(n == 1 && fs && strstr(fs[0], "/default/train/0000.parquet"));
    CHECK(exists("%s/hub/datasets--org--scripted/refs/refs/convert/%s", hf, "parquet"));
    if (n == 1) {
        const char *specs[] = {fs[0]};
        at_dataset *ds = NULL;
        CHECK_OK(at_dataset_load(specs, 1, NULL, &ds));
        CHECK(ds && ds->train.n == 3 && ds->train.items[0]->messages.n == 2);
        at_dataset_free(ds);
    }
    for (size_t i = 0; i < n; i++) free(fs[i]);
    free(fs);
    CHECK_FAILS(at_hub_dataset_files("org/chat:nosuch", &o, &fs, &n), AT_ERR_NOT_FOUND);
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli(void)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) return;
    char cmd[1024], log[256];
    snprintf(log, sizeof log, "%s/cli.log", tmp);
    snprintf(cmd, sizeof cmd, "%s download org/stories > %s/path.txt 2> %s", bin, tmp, log);
    CHECK_MSG(run(cmd) == 0, "anytune download failed (see %s)", log);
    snprintf(cmd, sizeof cmd, "grep -q '/hub/models--org--stories/snapshots/' %s/path.txt", tmp);
    CHECK(run(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s download org/nothing 2> %s", bin, log);
    CHECK(run(cmd) == 1);
    snprintf(cmd, sizeof cmd, "grep -q 'not found' %s", log);
    CHECK(run(cmd) == 0);
    /* a model by name in a job: the program resolves it, then runs as with a folder */
    snprintf(cmd, sizeof cmd,
             "%s infer --model org/stories --prompt 'Once upon' --max_new_tokens 4 --temperature 0 > %s/out.txt 2> %s", bin,
             tmp, log);
    CHECK_MSG(run(cmd) == 0, "anytune infer --model org/stories failed (see %s)", log);
    snprintf(cmd, sizeof cmd, "%s infer --model demo/stories260K --prompt 'Once upon' --max_new_tokens 4 --temperature 0 "
             "> %s/want.txt 2>/dev/null", bin, tmp);
    CHECK(run(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/out.txt", tmp);
    char want[256];
    snprintf(want, sizeof want, "%s/want.txt", tmp);
    CHECK(same_file(cmd, want));
    /* a gated model by name with --hub_token: fetched, and the token kept out of args.json */
    snprintf(cmd, sizeof cmd, "%s download org/gated --hub_token secret > /dev/null 2> %s", bin, log);
    CHECK(run(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "%s sft --model org/stories --dataset org/chat#4 --hub_token secret --max_steps 1 "
             "--output_dir %s/run > %s 2>&1", bin, tmp, log);
    CHECK_MSG(run(cmd) == 0, "anytune sft with hub names failed (see %s)", log);
    snprintf(cmd, sizeof cmd, "grep -q '%s/hf/hub/models--org--stories/snapshots/' %s/run/v*/args.json", tmp, tmp);
    CHECK_MSG(run(cmd) == 0, "args.json does not name the cached model");
    snprintf(cmd, sizeof cmd, "grep -q secret %s/run/v*/args.json", tmp);
    CHECK_MSG(run(cmd) == 1, "the token is in args.json");
    /* --hub modelscope and --use_hf false go to ModelScope's routes */
    snprintf(cmd, sizeof cmd, "%s download org/stories --use_hf false --include '*.json' > %s/ms.txt 2> %s", bin, tmp, log);
    CHECK(run(cmd) == 0);
    CHECK(exists("%s/models/org/stories/%s", ms, "config.json"));
    CHECK(!exists("%s/models/org/stories/%s", ms, "model.safetensors"));
}

int main(void)
{
    if (!at_test_js_ready("parquet-wasm")) return at_test_result("hub");
    snprintf(tmp, sizeof tmp, "/tmp/at_hub_XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(origin, sizeof origin, "%s/origin", tmp);
    snprintf(hf, sizeof hf, "%s/hf", tmp);
    snprintf(ms, sizeof ms, "%s/ms", tmp);
    at_mkdirs(origin);
    signal(SIGPIPE, SIG_IGN);
    start_hub();
    setenv("HF_HOME", hf, 1);
    setenv("MODELSCOPE_CACHE", ms, 1);
    setenv("HF_ENDPOINT", endpoint, 1);
    setenv("MODELSCOPE_DOMAIN", endpoint, 1);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_TOKEN");
    unsetenv("HF_HUB_OFFLINE");
    unsetenv("MODELSCOPE_ENDPOINT");
    unsetenv("MODELSCOPE_API_TOKEN");
    if (endpoint[0]) {
        test_model();
        test_failures();
        test_modelscope();
        test_datasets();
        test_cli();
    }
    stop_hub();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (at_test_failures == 0) CHECK(system(cmd) == 0);
    return at_test_result("hub");
}
