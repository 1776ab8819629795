#include "base/threads.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

void at_threads_setup(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("KMP_BLOCKTIME")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    /* LLVM's libomp (it defines __kmpc_fork_call; it also offers libgomp's
     * GOMP_ entry points) has not read its settings yet */
    if (dlsym(RTLD_DEFAULT, "__kmpc_fork_call") || !dlsym(RTLD_DEFAULT, "GOMP_parallel")) return;
    execv("/proc/self/exe", argv);
}
