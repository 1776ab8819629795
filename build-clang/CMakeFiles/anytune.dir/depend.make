# Empty dependencies file for anytune.
# This may be replaced when dependencies are built.
