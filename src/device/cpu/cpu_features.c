#include "device/cpu/cpu_features.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(__APPLE__) && !defined(__aarch64__)
#include <sys/sysctl.h>
#endif

static at_cpu_features features;
static int detected;
static int isa_level = -1;

#if defined(__x86_64__) || defined(__i386__)

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(at_cpu_features *f)
{
    unsigned a, b, c, d;
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
    }
}

static int hw_level(const at_cpu_features *f)
{
    int avx512 = f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma;
    if (avx512 && f->avx512bf16) return AT_ISA_AVX512_BF16;
    if (avx512) return AT_ISA_AVX512;
    if (f->avx2 && f->fma && f->f16c) return AT_ISA_AVX2;
    return AT_ISA_SCALAR;
}

static const char *const level_names[] = {"scalar", "avx2+fma", "avx512", "avx512+bf16"};
const char *const at_cpu_isa_env_names[] = {"scalar", "avx2", "avx512", "avx512bf16", NULL};

#elif defined(__aarch64__)

#if defined(__linux__)
/* The bits of AT_HWCAP / AT_HWCAP2 (Linux arch/arm64/include/uapi/asm/hwcap.h),
 * spelled here so an older libc's headers do not matter. */
#define HWCAP_ASIMD_BIT (1ul << 1)
#define HWCAP_ASIMDHP_BIT (1ul << 10)
#define HWCAP_CPUID_BIT (1ul << 11)
#define HWCAP_ASIMDDP_BIT (1ul << 20)
#define HWCAP_SVE_BIT (1ul << 22)
#define HWCAP2_I8MM_BIT (1ul << 13)
#define HWCAP2_BF16_BIT (1ul << 14)

/* Names of a few common cores by MIDR part number (implementer 0x41, Arm). */
static const struct {
    unsigned part;
    const char *name;
} arm_parts[] = {
    {0xd03, "Cortex-A53"},   {0xd08, "Cortex-A72"},   {0xd0b, "Cortex-A76"},   {0xd0c, "Neoverse N1"},
    {0xd40, "Neoverse V1"},  {0xd49, "Neoverse N2"},  {0xd4f, "Neoverse V2"},  {0xd41, "Cortex-A78"},
    {0xd44, "Cortex-X1"},    {0xd46, "Cortex-A510"},  {0xd47, "Cortex-A710"},  {0xd48, "Cortex-X2"},
};

/* The model from /proc/cpuinfo's "CPU implementer" and "CPU part" lines;
 * where the file has none (qemu's user mode shows the host's file; some
 * containers hide it) from MIDR_EL1 itself, whose reads from user space the
 * kernel (or qemu) emulates when HWCAP_CPUID says so. */
static void read_model(at_cpu_features *f, unsigned long hw)
{
    FILE *fp = fopen("/proc/cpuinfo", "r");
    char line[256];
    unsigned impl = 0, part = 0;
    int have = 0;
    while (fp && fgets(line, sizeof line, fp) && have != 3) {
        if (!strncmp(line, "CPU implementer", 15) && strchr(line, ':')) {
            impl = (unsigned)strtoul(strchr(line, ':') + 1, NULL, 0);
            have |= 1;
        } else if (!strncmp(line, "CPU part", 8) && strchr(line, ':')) {
            part = (unsigned)strtoul(strchr(line, ':') + 1, NULL, 0);
            have |= 2;
        }
    }
    if (fp) fclose(fp);
    if (have != 3 && (hw & HWCAP_CPUID_BIT)) {
        uint64_t midr;
        __asm__ volatile("mrs %0, MIDR_EL1" : "=r"(midr));
        impl = (unsigned)(midr >> 24) & 0xff;
        part = (unsigned)(midr >> 4) & 0xfff;
        have = 3;
    }
    if (have != 3) return;
    for (size_t i = 0; impl == 0x41 && i < sizeof arm_parts / sizeof arm_parts[0]; i++)
        if (arm_parts[i].part == part) {
            snprintf(f->model, sizeof f->model, "Arm %s", arm_parts[i].name);
            return;
        }
    snprintf(f->model, sizeof f->model, "ARM CPU (implementer 0x%02x, part 0x%03x)", impl, part);
}

static void detect(at_cpu_features *f)
{
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f->neon = (hw & HWCAP_ASIMD_BIT) != 0;
    f->fp16 = (hw & HWCAP_ASIMDHP_BIT) != 0;
    f->dotprod = (hw & HWCAP_ASIMDDP_BIT) != 0;
    f->sve = (hw & HWCAP_SVE_BIT) != 0;
    f->i8mm = (hw2 & HWCAP2_I8MM_BIT) != 0;
    f->bf16 = (hw2 & HWCAP2_BF16_BIT) != 0;
    read_model(f, hw);
}
#elif defined(__APPLE__)
static int sysctl_flag(const char *name)
{
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname(name, &v, &n, NULL, 0) == 0 && v;
}

static void detect(at_cpu_features *f)
{
    f->neon = 1; /* every Apple Silicon core */
    f->fp16 = sysctl_flag("hw.optional.arm.FEAT_FP16");
    f->dotprod = sysctl_flag("hw.optional.arm.FEAT_DotProd");
    f->bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
    f->i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
    size_t n = sizeof f->model - 1;
    if (sysctlbyname("machdep.cpu.brand_string", f->model, &n, NULL, 0) != 0) f->model[0] = '\0';
}
#else
static void detect(at_cpu_features *f)
{
    f->neon = 1; /* Advanced SIMD is part of ARMv8-A */
}
#endif

static int hw_level(const at_cpu_features *f)
{
    if (!f->neon) return AT_ISA_SCALAR;
    if (f->dotprod && f->bf16 && f->i8mm) return AT_ISA_NEON_BF16;
    if (f->dotprod) return AT_ISA_NEON_DOTPROD;
    return AT_ISA_NEON;
}

static const char *const level_names[] = {"scalar", "neon", "neon+dotprod", "neon+bf16"};
const char *const at_cpu_isa_env_names[] = {"scalar", "neon", "dotprod", "bf16", NULL};

#else

static void detect(at_cpu_features *f)
{
    (void)f;
}

static int hw_level(const at_cpu_features *f)
{
    (void)f;
    return AT_ISA_SCALAR;
}

static const char *const level_names[] = {"scalar"};
const char *const at_cpu_isa_env_names[] = {"scalar", NULL};

#endif

/* ---- cache sizes (the GEMM's blocks follow them: gemm.c) ---- */

#if defined(__linux__)
/* The size of cpu0's cache of `level` holding data (type Data or Unified),
 * from sysfs ("48K"); 0 if absent. */
static long sysfs_cache(int level)
{
    for (int i = 0; i < 8; i++) {
        char path[96], buf[32];
        long lv = 0, size = 0;
        int data = 0;
        static const char *const what[] = {"level", "type", "size"};
        for (int w = 0; w < 3; w++) {
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, what[w]);
            FILE *fp = fopen(path, "r");
            if (!fp) return 0;
            int ok = fgets(buf, sizeof buf, fp) != NULL;
            fclose(fp);
            if (!ok) return 0;
            if (w == 0) lv = strtol(buf, NULL, 10);
            else if (w == 1) data = strncmp(buf, "Instruction", 11) != 0;
            else {
                char *end;
                size = strtol(buf, &end, 10);
                if (*end == 'K') size *= 1024;
                else if (*end == 'M') size *= 1024 * 1024;
            }
        }
        if (lv == level && data && size > 0) return size;
    }
    return 0;
}
#endif

static void read_caches(at_cpu_features *f)
{
#if defined(__linux__)
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    f->l1d_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    f->l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (f->l1d_bytes <= 0) f->l1d_bytes = sysfs_cache(1);
    if (f->l2_bytes <= 0) f->l2_bytes = sysfs_cache(2);
#elif defined(__APPLE__)
    int64_t v = 0;
    size_t n = sizeof v;
    if (sysctlbyname("hw.l1dcachesize", &v, &n, NULL, 0) == 0) f->l1d_bytes = (long)v;
    v = 0;
    n = sizeof v;
    if (sysctlbyname("hw.l2cachesize", &v, &n, NULL, 0) == 0) f->l2_bytes = (long)v;
#endif
    if (f->l1d_bytes < 0) f->l1d_bytes = 0;
    if (f->l2_bytes < 0) f->l2_bytes = 0;
}

const at_cpu_features *at_cpu_get_features(void)
{
    if (!detected) {
        at_cpu_features *f = &features;
        memset(f, 0, sizeof *f);
        detect(f);
        read_caches(f);
        /* trim the brand string's padding */
        char *s = f->model;
        while (*s == ' ') s++;
        memmove(f->model, s, strlen(s) + 1);
        size_t n = strlen(f->model);
        while (n > 0 && f->model[n - 1] == ' ') f->model[--n] = '\0';
        detected = 1;
    }
    return &features;
}

int at_cpu_feature_names(const char **names, int cap)
{
    const at_cpu_features *f = at_cpu_get_features();
    const struct {
        const char *name;
        int on;
    } all[] = {
        {"sse4.2", f->sse42},        {"avx", f->avx},
        {"avx2", f->avx2},           {"fma", f->fma},
        {"f16c", f->f16c},           {"avx512f", f->avx512f},
        {"avx512bw", f->avx512bw},   {"avx512vl", f->avx512vl},
        {"avx512dq", f->avx512dq},   {"avx512_vnni", f->avx512vnni},
        {"avx512_bf16", f->avx512bf16}, {"avx512_fp16", f->avx512fp16},
        {"amx_bf16", f->amx_bf16},   {"asimd", f->neon},
        {"asimdhp", f->fp16},        {"asimddp", f->dotprod},
        {"bf16", f->bf16},           {"i8mm", f->i8mm},
        {"sve", f->sve},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].on) {
            if (n < cap) names[n] = all[i].name;
            n++;
        }
    return n;
}

at_cpu_isa at_cpu_isa_level(void)
{
    if (isa_level < 0) {
        int lvl = hw_level(at_cpu_get_features());
        const char *cap = getenv("ANYTUNE_CPU_ISA");
        for (int c = 0; cap && at_cpu_isa_env_names[c]; c++)
            if (!strcmp(cap, at_cpu_isa_env_names[c]) && c < lvl) lvl = c;
        isa_level = lvl;
    }
    return (at_cpu_isa)isa_level;
}

at_cpu_isa at_cpu_isa_force(at_cpu_isa level)
{
    at_cpu_isa old = at_cpu_isa_level();
    int hw = hw_level(at_cpu_get_features());
    isa_level = (int)level < hw ? (int)level : hw;
    return old;
}

const char *at_cpu_isa_name(at_cpu_isa level)
{
    if ((int)level < 0 || (size_t)level >= sizeof level_names / sizeof level_names[0]) return "?";
    return level_names[level];
}

int at_cpu_fast_bf16(void)
{
    return at_cpu_isa_level() >= AT_ISA_TOP; /* AVX512_BF16, or BFMMLA (gemm_neon_bf16.c) */
}
