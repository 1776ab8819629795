# Empty compiler generated dependencies file for anytune_core.
# This may be replaced when dependencies are built.
