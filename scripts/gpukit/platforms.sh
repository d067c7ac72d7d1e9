# Sourced by build.sh and check_imports.sh: pip's options for the GPU machine's wheels (CPython 3.12,
# manylinux x86_64; pip matches each manylinux_2_N tag exactly, so every N the wheels use is listed).
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in 5 12 17 18 24 25 26 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 --platform any)
