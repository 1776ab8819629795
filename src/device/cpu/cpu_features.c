#include "device/cpu/cpu_features.h"

#include <cpuid.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static at_cpu_features features;
static int detected;
static int isa_level = -1;

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(void)
{
    unsigned a, b, c, d;
    at_cpu_features *f = &features;
    memset(f, 0, sizeof *f);
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    unsigned maxleaf = a;
    __get_cpuid(1, &a, &b, &c, &d);
    int osxsave = (c >> 27) & 1;
    f->sse42 = (c >> 20) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    int avx_hw = (c >> 28) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    int ymm_ok = (xcr0 & 6) == 6;
    int zmm_ok = (xcr0 & 0xe6) == 0xe6;
    f->avx = avx_hw && ymm_ok;
    if (!f->avx) f->fma = f->f16c = 0;
    if (maxleaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = f->avx && ((b >> 5) & 1);
        if (zmm_ok) {
            f->avx512f = (b >> 16) & 1;
            f->avx512dq = (b >> 17) & 1;
            f->avx512bw = (b >> 30) & 1;
            f->avx512vl = (b >> 31) & 1;
            f->avx512vnni = (c >> 11) & 1;
            f->avx512fp16 = (d >> 23) & 1;
        }
        f->amx_bf16 = (d >> 22) & 1;
        __cpuid_count(7, 1, a, b, c, d);
        if (zmm_ok) f->avx512bf16 = (a >> 5) & 1;
    }
    __get_cpuid(0x80000000, &a, &b, &c, &d);
    if (a >= 0x80000004) {
        unsigned regs[12];
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
        memcpy(f->model, regs, 48);
        f->model[48] = '\0';
        /* trim */
        char *s = f->model;
        while (*s == ' ') s++;
        memmove(f->model, s, strlen(s) + 1);
        size_t n = strlen(f->model);
        while (n > 0 && f->model[n - 1] == ' ') f->model[--n] = '\0';
    }
}

const at_cpu_features *at_cpu_get_features(void)
{
    if (!detected) {
        detect();
        detected = 1;
    }
    return &features;
}

static int hw_level(void)
{
    const at_cpu_features *f = at_cpu_get_features();
    int avx512 = f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma;
    if (avx512 && f->avx512bf16) return AT_ISA_AVX512_BF16;
    if (avx512) return AT_ISA_AVX512;
    if (f->avx2 && f->fma && f->f16c) return AT_ISA_AVX2;
    return AT_ISA_SCALAR;
}

at_cpu_isa at_cpu_isa_level(void)
{
    if (isa_level < 0) {
        int lvl = hw_level();
        const char *cap = getenv("ANYTUNE_CPU_ISA");
        if (cap) {
            int c = lvl;
            if (!strcmp(cap, "scalar")) c = AT_ISA_SCALAR;
            else if (!strcmp(cap, "avx2")) c = AT_ISA_AVX2;
            else if (!strcmp(cap, "avx512")) c = AT_ISA_AVX512;
            if (c < lvl) lvl = c;
        }
        isa_level = lvl;
    }
    return (at_cpu_isa)isa_level;
}

at_cpu_isa at_cpu_isa_force(at_cpu_isa level)
{
    at_cpu_isa old = at_cpu_isa_level();
    int hw = hw_level();
    isa_level = (int)level < hw ? (int)level : hw;
    return old;
}

const char *at_cpu_isa_name(at_cpu_isa level)
{
    switch (level) {
    case AT_ISA_SCALAR: return "scalar";
    case AT_ISA_AVX2: return "avx2+fma";
    case AT_ISA_AVX512: return "avx512";
    case AT_ISA_AVX512_BF16: return "avx512+bf16";
    }
    return "?";
}
