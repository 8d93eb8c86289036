#!/usr/bin/env bash
# Applies the build fixes Horovod 0.28.1 needs with today's toolchain to an unpacked sdist:
#   patch-horovod-source.sh SRC_DIR
# - C++14 -> C++20 for Horovod and its torch extension: torch 2.14's headers use std::strong_ordering
#   (c10/util/intrusive_ptr.h), which C++17 lacks.
# The other fix, for CMake >= 4 refusing the bundled gloo's cmake_minimum_required < 3.5, is an
# environment setting (CMAKE_POLICY_VERSION_MINIMUM=3.5) exported by install-horovod.sh.
# This file's hash is part of the wheel cache key: change it and the wheel is rebuilt.
set -euo pipefail
src="$1"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' \
  "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
for file in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
  grep -q 'CMAKE_CXX_STANDARD 20' "$file" ||
    { echo "patch-horovod-source: the C++ standard fix no longer applies to $file" >&2; exit 1; }
done
