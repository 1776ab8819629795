file(REMOVE_RECURSE
  "CMakeFiles/anytune.dir/src/cli/main.c.o"
  "CMakeFiles/anytune.dir/src/cli/main.c.o.d"
  "anytune"
  "anytune.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/anytune.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
