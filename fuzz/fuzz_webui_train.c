/* Fuzz target: the body of a web UI training request (POST /ui/api/train)
 * checked against the allow-list and turned into an argv (serve/webui_train.h).
 * Must not crash or leak whatever the bytes; a refusal names an option. */
#include <stdint.h>
#include <string.h>
#include "serve/webui_train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    at_train_argv a = {0};
    char param[64];
    if (at_train_argv_build((const char *)data, size, "anytune", &a, param, sizeof param) == AT_OK) {
        /* an accepted body: argv[0] the program, argv[1] "sft" (or "rlhf" with rlhf_type), options as
         * --name=value */
        if (a.argc < 2 || (strcmp(a.argv[1], "sft") != 0 && strcmp(a.argv[1], "rlhf") != 0) || a.argv[a.argc] != NULL)
            __builtin_trap();
        for (int i = 2; i < a.argc; i++)
            if (strncmp(a.argv[i], "--", 2) != 0 || !strchr(a.argv[i], '=')) __builtin_trap();
    }
    at_train_argv_free(&a);
    return 0;
}
