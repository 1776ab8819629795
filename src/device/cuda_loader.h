/* Loading the CUDA backend library (device/cuda/, built separately with
 * nvcc) at run time, so the core never links CUDA.
 *
 * Where the library is looked for, first match wins:
 *   1. ANYTUNE_CUDA_LIBRARY (a file path),
 *   2. libanytune_cuda.so next to the running executable,
 *   3. the build folder it was built in (AT_CUDA_LIBRARY_DIR, set by CMake),
 *   4. the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig). */
#ifndef AT_DEVICE_CUDA_LOADER_H
#define AT_DEVICE_CUDA_LOADER_H

#include <stddef.h>
#include "base/status.h"
#include "device/backend.h"

/* Writes the path of the CUDA backend library that would be loaded into buf
 * and returns 1; returns 0 (buf = "libanytune_cuda.so", for the linker's
 * search) when none of the first three places has it. */
int at_cuda_library_find(char *buf, size_t len);

/* Loads the backend library at `library` (NULL: at_cuda_library_find) and
 * opens CUDA device `device_index`. The backend is owned by the library and
 * lives until the process ends; loading again returns the same one. Errors
 * name the library and what failed (not found, missing entry point, wrong
 * interface version, the device's own error). */
at_status at_cuda_backend_load(const char *library, int device_index, at_backend **out);

#endif
