#!/usr/bin/env bash
# Applies the build fixes Horovod 0.28.1 needs with today's toolchain to an unpacked sdist:
#   patch-horovod-source.sh SRC_DIR
# - C++14 -> C++20 for Horovod and its torch extension: torch 2.14's headers use std::strong_ordering
#   (c10/util/intrusive_ptr.h), which C++17 lacks.
# - GCC 13 and 14 no longer pull <cstdint> and <string> in through other standard headers, so Horovod's own
#   headers and its bundled gloo's stop compiling ("'string' in namespace 'std' does not name a type" in
#   horovod/common/group_table.h). Each of those headers gets the standard includes it relies on, as
#   Horovod did after 0.28.1; older compilers are unaffected.
# - GCC 14 also checks template bodies that are never used: the bundled flatbuffers' span::operator= assigns
#   its const member count_ (and returns nothing), which is now an error; it is never called, so it is removed
#   (as flatbuffers itself did later).
# - Gloo controller (horovodrun --gloo, elastic jobs): a process set's Gloo context made its device without the
#   global context's network interface (HOROVOD_GLOO_IFACE, --network-interface), so Gloo fell back to resolving
#   the host's name; on hosts whose name maps to a loopback address (host networking; Debian's 127.0.1.1) every
#   rank then advertised 127.0.0.1 and the job failed at start ("connect [127.0.0.1]:N: Connection refused").
#   The process set's context now takes the global one's interface.
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

marker='// horovod-stack: standard includes for GCC >= 13'
headers=$(find "$src/horovod/common" "$src/horovod/torch" "$src/third_party/gloo/gloo" -name '*.h')
[ -n "$headers" ] && grep -q 'std::string' "$src/horovod/common/group_table.h" ||
  { echo "patch-horovod-source: the header layout changed; check the GCC 13 include fix" >&2; exit 1; }
for header in $headers; do
  grep -qF "$marker" "$header" && continue
  sed -i "1i $marker\n#include <cstdint>\n#include <stdexcept>\n#include <string>" "$header"
done

span="$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
perl -0pi -e 's/\n  FLATBUFFERS_CONSTEXPR_CPP14 span &operator=\(const span &other\)\n\s*FLATBUFFERS_NOEXCEPT \{\n\s*data_ = other\.data_;\n\s*count_ = other\.count_;\n\s*\}\n//' "$span"
if grep -q 'count_ = other.count_' "$span"; then
  echo "patch-horovod-source: the flatbuffers span fix no longer applies to $span" >&2; exit 1
fi

gloo_context="$src/horovod/common/gloo/gloo_context.cc"
grep -q 'gloo_iface_ = global_context.gloo_iface_;' "$gloo_context" ||
  perl -0pi -e 's/(  attr device_attr;\n)(  device_attr\.iface = gloo_iface_;\n  device_attr\.ai_family = AF_UNSPEC;\n  auto dev = CreateDevice\(device_attr\);\n\n  global_ctx = global_context\.ctx;)/  gloo_iface_ = global_context.gloo_iface_;  \/\/ horovod-stack: the process set uses the global NIC\n$1$2/' "$gloo_context"
grep -q 'gloo_iface_ = global_context.gloo_iface_;' "$gloo_context" ||
  { echo "patch-horovod-source: the Gloo process-set interface fix no longer applies to $gloo_context" >&2; exit 1; }
