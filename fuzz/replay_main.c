/* Replays every file of a seed corpus folder through a fuzz target once: the
 * fuzz targets run in builds without libFuzzer too. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        fprintf(stderr, "%s: cannot open corpus folder\n", argv[1]);
        return 1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *p = at_path_join(argv[1], e->d_name);
        char *buf = NULL;
        size_t len = 0;
        if (p && at_read_file(p, &buf, &len) == AT_OK) {
            LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
            n++;
        }
        free(buf);
        free(p);
    }
    closedir(d);
    printf("replayed %d inputs from %s\n", n, argv[1]);
    return n > 0 ? 0 : 1;
}
