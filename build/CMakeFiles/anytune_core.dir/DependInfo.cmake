
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/src/base/file.c" "CMakeFiles/anytune_core.dir/src/base/file.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/base/file.c.o.d"
  "/work/main/src/base/json.c" "CMakeFiles/anytune_core.dir/src/base/json.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/base/json.c.o.d"
  "/work/main/src/base/log.c" "CMakeFiles/anytune_core.dir/src/base/log.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/base/log.c.o.d"
  "/work/main/src/base/status.c" "CMakeFiles/anytune_core.dir/src/base/status.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/base/status.c.o.d"
  "/work/main/src/device/backend.c" "CMakeFiles/anytune_core.dir/src/device/backend.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/backend.c.o.d"
  "/work/main/src/device/cpu/cpu_backend.c" "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_backend.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_backend.c.o.d"
  "/work/main/src/device/cpu/cpu_features.c" "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_features.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_features.c.o.d"
  "/work/main/src/device/cpu/cpu_kernels.c" "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_kernels.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_kernels.c.o.d"
  "/work/main/src/device/cpu/gemm.c" "CMakeFiles/anytune_core.dir/src/device/cpu/gemm.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/cpu/gemm.c.o.d"
  "/work/main/src/device/dtype.c" "CMakeFiles/anytune_core.dir/src/device/dtype.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/dtype.c.o.d"
  "/work/main/src/device/tensor.c" "CMakeFiles/anytune_core.dir/src/device/tensor.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/device/tensor.c.o.d"
  "/work/main/src/ops/ops.c" "CMakeFiles/anytune_core.dir/src/ops/ops.c.o" "gcc" "CMakeFiles/anytune_core.dir/src/ops/ops.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
