#include "device/cpu/cpu_libs.h"

#include <stdio.h>
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
