/* What the CPU we run on can do: cpuid + OS register-state support on x86-64,
 * getauxval (Linux) or sysctl (macOS) on aarch64. */
#ifndef AT_DEVICE_CPU_FEATURES_H
#define AT_DEVICE_CPU_FEATURES_H

typedef struct {
    char model[64]; /* brand string, or the ARM part's name */
    /* x86-64 (all zero elsewhere) */
    int sse42, avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avx512fp16;
    int amx_bf16;
    /* aarch64 (all zero elsewhere): Advanced SIMD, half-precision arithmetic,
     * SDOT/UDOT (ARMv8.2), BFDOT/BFMMLA, SMMLA (ARMv8.6), SVE */
    int neon, fp16, dotprod, bf16, i8mm, sve;
    /* per-core data caches in bytes, 0 where the system does not say
     * (Linux: sysconf, else /sys/devices/system/cpu/cpu0/cache; macOS: sysctl) */
    long l1d_bytes, l2_bytes;
} at_cpu_features;

/* Detected once. */
const at_cpu_features *at_cpu_get_features(void);

/* Writes the names of the features present (as Linux's /proc/cpuinfo spells
 * them) into names[0..cap); returns how many there are. The strings are static. */
int at_cpu_feature_names(const char **names, int cap);

/* Kernel levels, lowest first: each level's kernels use what the ones below
 * use and more. The names are per architecture; the numbers are ordered tiers
 * so that loops over levels (tests) work on every architecture.
 * ANYTUNE_CPU_ISA=<name of a level> caps what kernels may use (for tests of
 * every path on one machine). */
typedef enum {
    AT_ISA_SCALAR = 0, /* the baseline build (x86-64 SSE2, or ARMv8-A compiled as plain C) */
#if defined(__aarch64__)
    AT_ISA_NEON = 1,         /* hand-written Advanced SIMD kernels */
    AT_ISA_NEON_DOTPROD = 2, /* + SDOT for the quantized dot products */
    AT_ISA_NEON_BF16 = 3,    /* + BFMMLA / BFDOT for bf16 GEMMs */
#else
    AT_ISA_AVX2 = 1, /* AVX2 + FMA + F16C */
    AT_ISA_AVX512 = 2,
    AT_ISA_AVX512_BF16 = 3,
#endif
    AT_ISA_TOP = 3 /* the highest tier of any architecture */
} at_cpu_isa;

/* The best kernel level usable here (after the ANYTUNE_CPU_ISA cap). */
at_cpu_isa at_cpu_isa_level(void);
/* Sets the cap programmatically (tests); returns the previous level. */
at_cpu_isa at_cpu_isa_force(at_cpu_isa level);
/* "scalar", "avx2+fma", "neon+dotprod", ... ("?" for a tier this
 * architecture does not have). */
const char *at_cpu_isa_name(at_cpu_isa level);
/* The ANYTUNE_CPU_ISA value that selects each level, lowest first: the
 * levels this architecture has, NULL-terminated. */
extern const char *const at_cpu_isa_env_names[];
/* Whether bf16 matrix products run natively (AVX512_BF16, or ARM BF16) at
 * the current level: the planner prefers bf16 weights then. */
int at_cpu_fast_bf16(void);

#endif
