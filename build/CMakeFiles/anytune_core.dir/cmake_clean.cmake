file(REMOVE_RECURSE
  "CMakeFiles/anytune_core.dir/src/base/file.c.o"
  "CMakeFiles/anytune_core.dir/src/base/file.c.o.d"
  "CMakeFiles/anytune_core.dir/src/base/json.c.o"
  "CMakeFiles/anytune_core.dir/src/base/json.c.o.d"
  "CMakeFiles/anytune_core.dir/src/base/log.c.o"
  "CMakeFiles/anytune_core.dir/src/base/log.c.o.d"
  "CMakeFiles/anytune_core.dir/src/base/status.c.o"
  "CMakeFiles/anytune_core.dir/src/base/status.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/backend.c.o"
  "CMakeFiles/anytune_core.dir/src/device/backend.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_backend.c.o"
  "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_backend.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_features.c.o"
  "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_features.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_kernels.c.o"
  "CMakeFiles/anytune_core.dir/src/device/cpu/cpu_kernels.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/cpu/gemm.c.o"
  "CMakeFiles/anytune_core.dir/src/device/cpu/gemm.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/dtype.c.o"
  "CMakeFiles/anytune_core.dir/src/device/dtype.c.o.d"
  "CMakeFiles/anytune_core.dir/src/device/tensor.c.o"
  "CMakeFiles/anytune_core.dir/src/device/tensor.c.o.d"
  "CMakeFiles/anytune_core.dir/src/ops/ops.c.o"
  "CMakeFiles/anytune_core.dir/src/ops/ops.c.o.d"
  "libanytune_core.a"
  "libanytune_core.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/anytune_core.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
