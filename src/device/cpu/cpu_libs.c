#include "device/cpu/cpu_libs.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#ifdef AT_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef AT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

void at_cpu_openblas_version(char *buf, size_t len)
{
#ifdef AT_HAVE_OPENBLAS
    snprintf(buf, len, "%s", openblas_get_config());
#else
    snprintf(buf, len, "not linked");
#endif
}

void at_cpu_onednn_version(char *buf, size_t len)
{
#ifdef AT_HAVE_DNNL
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, len, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
#else
    snprintf(buf, len, "not linked");
#endif
}

#if defined(__x86_64__)
static int tier_of_onednn_isa(unsigned isa)
{
    if (isa == 0) return AT_ISA_TOP; /* not a level it reports: the highest, never used below it */
    if (isa & 0x80u) return AT_ISA_AVX512_BF16;
    if (isa & 0x08u) return AT_ISA_AVX512;
    return AT_ISA_AVX2;
}
#endif

int at_cpu_onednn_tier(at_cpu_isa level)
{
#if defined(AT_HAVE_DNNL) && defined(__x86_64__)
    /* every f32 GEMM asks: the lock only until the first answer */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static _Atomic int tier = -2;
    if (tier != -2) return tier;
    pthread_mutex_lock(&lock);
    if (tier == -2) {
        static const dnnl_cpu_isa_t cap[] = {dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
                                             dnnl_cpu_isa_all};
        if (!getenv("ONEDNN_MAX_CPU_ISA") && !getenv("DNNL_MAX_CPU_ISA"))
            (void)dnnl_set_max_cpu_isa(cap[level < 0 ? 0 : level > AT_ISA_TOP ? AT_ISA_TOP : level]);
        tier = tier_of_onednn_isa((unsigned)dnnl_get_effective_cpu_isa());
    }
    int t = tier;
    pthread_mutex_unlock(&lock);
    return t;
#elif defined(AT_HAVE_DNNL)
    (void)level;
    return AT_ISA_SCALAR + 1; /* NEON: any level but the plain-C one */
#else
    (void)level;
    return -1;
#endif
}

int at_cpu_openblas_tier(void)
{
#if defined(AT_HAVE_OPENBLAS) && defined(__x86_64__)
    /* chosen once, when the library loaded: read once (every f32 GEMM asks) */
    static _Atomic int tier = -2;
    if (tier == -2) {
        static const char *const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
        const char *core = openblas_get_corename();
        int t = AT_ISA_AVX2;
        for (size_t i = 0; core && i < sizeof avx512 / sizeof avx512[0]; i++)
            if (!strcasecmp(core, avx512[i])) t = AT_ISA_AVX512;
        tier = t; /* racing threads store the same value */
    }
    return tier;
#elif defined(AT_HAVE_OPENBLAS)
    return AT_ISA_SCALAR + 1;
#else
    return -1;
#endif
}
