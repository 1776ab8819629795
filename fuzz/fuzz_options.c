/* Fuzz target: config files of options (--config FILE.yaml|.json) read
 * against the training table (train/train_options.c): YAML or JSON by the
 * first byte's parity, through a file as the parser reads them. Must not
 * crash or leak; an accepted file's values must store and check. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "base/options.h"
#include "train/train_options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    char path[64];
    snprintf(path, sizeof path, "/tmp/anytune-fuzz-options-%d.%s", (int)getpid(), data[0] & 1 ? "json" : "yaml");
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data + 1, 1, size - 1, f);
    fclose(f);
    char *argv[] = {"sft", "--config", path, NULL};
    at_options *o = NULL;
    if (at_options_parse(at_train_options, at_train_n_options, 3, argv, &o) == AT_OK) {
        at_train_args a;
        at_train_args_defaults(&a);
        at_options_store(o, &a);
        if (at_train_args_check(&a) != AT_OK) abort(); /* the parser let through what the library refuses */
        cJSON_Delete(at_options_to_json(o));
        at_options_free(o);
    }
    remove(path);
    return 0;
}
