/* Fuzz target: the safetensors reader on arbitrary bytes, then every tensor
 * made into an at_tensor (zero-copy and converted). Must not crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy, so that reads past `size` are caught by ASan and the data is 8-aligned
     * like a mapping. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    for (size_t i = 0; i < size; i++) buf[i] = data[i];
    at_st_file *f = NULL;
    if (at_st_parse(buf, size, "fuzz", &f) == AT_OK) {
        for (size_t i = 0; i < at_st_count(f); i++) {
            const at_st_info *info = at_st_info_at(f, i);
            (void)at_st_find(f, info->name);
            at_tensor *t = NULL;
            if (at_st_tensor(info, AT_ST_KEEP_DTYPE, &t) == AT_OK) at_tensor_free(t);
            if (info->nbytes <= (1u << 20) && at_st_tensor(info, AT_F32, &t) == AT_OK) at_tensor_free(t);
        }
        for (size_t i = 0; i < at_st_metadata_count(f); i++) {
            const char *k, *v;
            at_st_metadata_at(f, i, &k, &v);
            (void)at_st_metadata(f, k);
        }
        at_st_close(f);
    }
    free(buf);
    return 0;
}
