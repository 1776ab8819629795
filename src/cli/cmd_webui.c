/* anytune web-ui: `anytune serve` with the page's Train tab, as ms-swift's
 * web-ui: chat with the model (and its adapters) and start, watch and stop
 * `anytune sft` runs from the browser. It listens on 127.0.0.1 unless
 * --host says otherwise (a training job reads and writes files as the user
 * who runs it) and prints the page's URL. Loopback is every local
 * account's, so the page and its API want a key: --api_key, or else a
 * random token made at start (cmd_serve.c), carried by the printed URL. */
#include "cli/cli.h"
#include "cli/cmd_serve.h"

int at_cmd_webui(int argc, char **argv)
{
    const at_serve_cli c = {"web-ui",
                            "usage: anytune web-ui [--model DIR] [--adapters NAME=DIR ...] [--port 7860] [OPTIONS]\n"
                            "  a browser page to chat with the model and to fine-tune it (anytune sft)\n"
                            "  Open the URL it prints: http://127.0.0.1:PORT/?token=TOKEN. Every request needs the\n"
                            "  token (Authorization: Bearer TOKEN) so that other users of this machine cannot\n"
                            "  start jobs as you; it is random on each start unless --api_key KEY sets it.\n"
                            "  The page keeps it for the tab's session and drops it from the address bar.",
                            1, "7860"};
    return at_cli_serve(argc, argv, &c);
}
