file(REMOVE_RECURSE
  "libanytune_core.a"
)
