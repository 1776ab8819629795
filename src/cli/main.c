/* anytune: fine-tune LLMs on whatever hardware is at hand. */
#include <stdio.h>
#include <string.h>
#include "base/status.h"
#include "base/threads.h"
#include "cli/cli.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"env", at_cmd_env, "what devices and features this machine has (--json for programs)"},
    {"infer", at_cmd_infer, "one-shot or interactive generation"},
    {"serve", at_cmd_serve, "OpenAI-compatible HTTP API and a chat page"},
    {"web-ui", at_cmd_webui, "the chat page plus a Train tab (start, watch, stop sft runs) in a browser"},
    {"sft", at_cmd_sft, "LoRA or full fine-tuning on conversations (no options: the bundled demo)"},
    {"pt", at_cmd_pt, "continued pre-training on plain text"},
    {"rlhf", at_cmd_rlhf, "preference alignment on chosen/rejected pairs (dpo, simpo, cpo, orpo), labeled examples (kto); reward models (rm)"},
    {"deploy", at_cmd_serve, "the same as serve (ms-swift's name)"},
    {"app", at_cmd_webui, "the same as web-ui (ms-swift's name)"},
    {"export", at_cmd_export, "merge adapters, write Hugging Face folders and GGUF files"},
    {"eval", at_cmd_eval, "multiple-choice accuracy (MMLU, C-Eval) and perplexity"},
    {"download", at_cmd_download, "fetch a model or dataset by name from the Hugging Face Hub or ModelScope"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: anytune COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\nRun 'anytune COMMAND --help' for a command's options; 'anytune --version' for the version.\n");
}

int main(int argc, char **argv)
{
    at_threads_setup(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("anytune %s\n", AT_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "anytune: error: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
