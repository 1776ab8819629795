/* What the CPU we run on can do (cpuid + OS support for the register state). */
#ifndef AT_DEVICE_CPU_FEATURES_H
#define AT_DEVICE_CPU_FEATURES_H

typedef struct {
    char model[64];   /* brand string */
    int sse42, avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avx512fp16;
    int amx_bf16;
} at_cpu_features;

/* Detected once; ANYTUNE_CPU_ISA=scalar|avx2|avx512 caps what kernels may use
 * (for tests of every path on one machine). */
const at_cpu_features *at_cpu_get_features(void);

typedef enum { AT_ISA_SCALAR = 0, AT_ISA_AVX2 = 1, AT_ISA_AVX512 = 2, AT_ISA_AVX512_BF16 = 3 } at_cpu_isa;
/* The best kernel level usable here (after the ANYTUNE_CPU_ISA cap). */
at_cpu_isa at_cpu_isa_level(void);
/* Sets the cap programmatically (tests); returns the previous level. */
at_cpu_isa at_cpu_isa_force(at_cpu_isa level);
const char *at_cpu_isa_name(at_cpu_isa level);

#endif
