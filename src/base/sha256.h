/* SHA-256 (FIPS 180-4): streaming and one-shot, and hashing a file. */
#ifndef AT_BASE_SHA256_H
#define AT_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t block[64];
    size_t used;
} at_sha256;

void at_sha256_init(at_sha256 *s);
void at_sha256_update(at_sha256 *s, const void *data, size_t len);
void at_sha256_final(at_sha256 *s, uint8_t digest[32]);
void at_sha256_digest(const void *data, size_t len, uint8_t digest[32]);
/* 64 lowercase hex characters + NUL into hex[65]. */
void at_sha256_hex(const uint8_t digest[32], char hex[65]);
/* Hashes a whole file (streamed) into hex[65]. */
at_status at_sha256_file(const char *path, char hex[65]);

#endif
