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
# - Idle wait (performance, not a build fix): Horovod's background thread negotiates with every other rank once per
#   cycle (HOROVOD_CYCLE_TIME, 1 ms) even while no rank has a tensor queued, as during the forward pass. Over MPI
#   that negotiation is a few microseconds of shared memory; over Gloo it is a TCP collective handed between
#   Horovod's thread and Gloo's event loop, 0.2-1 ms of CPU on a busy host, about 13 of them per SimpleNet step
#   on 2 cores (docs/performance.md). With nothing queued and none in flight, the thread now waits for the first
#   tensor (at most HOROVOD_STACK_IDLE_WAIT_MS, default 50, so a rank that enqueues nothing still takes part in
#   its peers' negotiations), then a full cycle as the fusion window. Ranks stay in step: a rank that negotiates
#   waits for its peers inside the collective, as before. 0 turns it off (Horovod's own loop); it is off for a
#   joined rank and with several or dynamic process sets.
# - Blocking wait (performance): hvd.synchronize (every DistributedOptimizer step) waited for a handle by calling
#   sched_yield in a loop, a quarter of a core per rank that the Gloo threads carrying the very allreduce it waits
#   for then lack on a busy host. It now sleeps on a condition variable that MarkDone signals.
# - Rendezvous wait (elastic jobs): a rank waited for a peer's key at a Gloo rendezvous no longer than the collective
#   timeout (HOROVOD_GLOO_TIMEOUT_SECONDS), then aborted. Elastic jobs keep that timeout short so a silent peer's
#   loss is noticed soon, but a worker that joins or comes back is started by horovodrun only as the others enter
#   the rendezvous, and its Python and torch take longer than that to start on a busy or cold node: the running
#   ranks aborted and the job failed. A rendezvous now waits HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS for a key when
#   that is longer (unset: as before); collectives keep their own timeout.
# - Rendezvous secret (security): every request a rank's Gloo makes to horovodrun's rendezvous server carries the
#   job's secret (HOROVOD_STACK_RENDEZVOUS_TOKEN, which the patched horovodrun makes per job and hands to its ranks
#   through their environment, never a command line) as `Authorization: Bearer`; the server refuses a request without
#   it (docker/horovod-runner/stack_guard.py).
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

queue_h="$src/horovod/common/tensor_queue.h"
queue_cc="$src/horovod/common/tensor_queue.cc"
operations="$src/horovod/common/operations.cc"
idle_marker='horovod-stack: idle wait'
if ! grep -q "$idle_marker" "$queue_h"; then
  perl -0pi -e 's/#include <mutex>\n/#include <chrono>\n#include <condition_variable>\n#include <mutex>\n/; s/(  void RemoveJoinTensor\(\);\n)/$1\n  \/\/ horovod-stack: idle wait. True once a tensor is in the table (at once if one is), false on timeout.\n  bool WaitForTensors(std::chrono::microseconds timeout);\n\n  bool IsEmpty() const;\n/; s/(  mutable std::mutex mutex_;\n)/$1\n  std::condition_variable tensors_added_;\n/' "$queue_h"
  perl -0pi -e 's/(  tensor_table_\.emplace\(e\.tensor_name, std::move\(e\)\);\n  message_queue_\.push\(std::move\(message\)\);\n)/$1  tensors_added_.notify_one();\n/; s/(    message_queue_\.push\(std::move\(messages\[i\]\)\);\n  \}\n)/$1  tensors_added_.notify_one();\n/' "$queue_cc"
  cat >>"$queue_cc" <<'CC'

namespace horovod {
namespace common {

// horovod-stack: idle wait (docker/patch-horovod-source.sh).
bool TensorQueue::WaitForTensors(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return tensors_added_.wait_for(lock, timeout, [this] { return !tensor_table_.empty(); });
}

bool TensorQueue::IsEmpty() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return tensor_table_.empty();
}

} // namespace common
} // namespace horovod
CC
  perl -0pi -e 's/(bool RunLoopOnce\(HorovodGlobalState& state\) \{\n)/$1  \/\/ horovod-stack: idle wait (docker\/patch-horovod-source.sh): with nothing queued and none in flight, wait for\n  \/\/ the first tensor instead of negotiating every cycle; then a full cycle from it, the fusion window.\n  static const int idle_wait_ms = GetIntEnvOrDefault("HOROVOD_STACK_IDLE_WAIT_MS", 50);\n  if (idle_wait_ms > 0 && !state.shut_down && !state.dynamic_process_sets &&\n      state.process_set_table.Ids().size() == 1) {\n    auto& global_set = state.process_set_table.Get(0);\n    if (!global_set.joined && global_set.tensor_queue.IsEmpty() &&\n        global_set.tensor_queue.WaitForTensors(std::chrono::milliseconds(idle_wait_ms))) {\n      state.last_cycle_start = std::chrono::steady_clock::now();\n    }\n  }\n/' "$operations"
fi
grep -q 'tensors_added_.wait_for' "$queue_cc" && [ "$(grep -c 'tensors_added_.notify_one' "$queue_cc")" = 2 ] &&
  grep -q 'HOROVOD_STACK_IDLE_WAIT_MS' "$operations" && grep -q 'bool WaitForTensors' "$queue_h" ||
  { echo "patch-horovod-source: the idle-wait change no longer applies to $src/horovod/common" >&2; exit 1; }

handles_h="$src/horovod/torch/handle_manager.h"
handles_cc="$src/horovod/torch/handle_manager.cc"
torch_ops="$src/horovod/torch/mpi_ops_v2.cc"
if ! grep -q 'WaitForHandle' "$handles_h"; then
  perl -0pi -e 's/#include <atomic>\n/#include <atomic>\n#include <condition_variable>\n/; s/(  bool PollHandle\(int handle\);\n)/$1  \/\/ horovod-stack: blocks until the handle is done (docker\/patch-horovod-source.sh).\n  void WaitForHandle(int handle);\n/; s/(  std::mutex mutex_;\n)/$1  std::condition_variable done_;\n/' "$handles_h"
  perl -0pi -e 's/(  results_\[handle\] = std::make_shared<Status>\(status\);\n)/$1  done_.notify_all();\n/; s/(  results_\.clear\(\);\n  last_handle_ = 0;\n)/$1  done_.notify_all();\n/' "$handles_cc"
  cat >>"$handles_cc" <<'CC'

namespace horovod {
namespace torch {

// horovod-stack: blocking wait (docker/patch-horovod-source.sh).
void HandleManager::WaitForHandle(int handle) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this, handle] {
    auto result = results_.find(handle);
    return result == results_.end() || result->second != nullptr;
  });
  if (results_.find(handle) == results_.end()) {
    throw std::invalid_argument("Handle " + std::to_string(handle) +
                                " was not created or has been cleared.");
  }
}

} // namespace torch
} // namespace horovod
CC
  perl -0pi -e 's/  while \(true\) \{\n    if \(handle_manager\.PollHandle\(handle\)\) break;\n    \{\n      py::gil_scoped_release release_python_gil;\n      std::this_thread::yield\(\);\n    \}\n  \}\n/  {  \/\/ horovod-stack: blocking wait, not a sched_yield loop\n    py::gil_scoped_release release_python_gil;\n    handle_manager.WaitForHandle(handle);\n  }\n/' "$torch_ops"
fi
grep -q 'handle_manager.WaitForHandle(handle);' "$torch_ops" && ! grep -q 'std::this_thread::yield' "$torch_ops" &&
  [ "$(grep -c 'done_.notify_all' "$handles_cc")" = 2 ] ||
  { echo "patch-horovod-source: the blocking-wait change no longer applies to $src/horovod/torch" >&2; exit 1; }

http_store="$src/horovod/common/gloo/http_store.cc"
if ! grep -q 'HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS' "$http_store"; then
  perl -0pi -e 's/(#include "gloo_context.h"\n)/$1#include "..\/utils\/env_parser.h"\n\n#include <algorithm>\n/' "$http_store"
  perl -0pi -e 's/(void HTTPStore::wait\(const std::vector<std::string>& keys,\n\s*const std::chrono::milliseconds& )timeout(\) \{\n)/$1collective_timeout$2  \/\/ horovod-stack: rendezvous wait (docker\/patch-horovod-source.sh): a peer still starting gets longer.\n  static const auto rendezvous_timeout =\n      std::chrono::milliseconds(1000 * GetIntEnvOrDefault("HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS", 0));\n  const auto timeout = collective_timeout == gloo::kNoTimeout ? collective_timeout\n                       : std::max(collective_timeout, rendezvous_timeout);\n/' "$http_store"
  perl -0pi -e 's/(                                             HOROVOD_GLOO_TIMEOUT_SECONDS)\)\);/$1, " or HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS"));/' "$http_store"
fi
grep -q 'std::max(collective_timeout, rendezvous_timeout)' "$http_store" && grep -q '#include <algorithm>' "$http_store" &&
  grep -q ' or HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS"' "$http_store" ||
  { echo "patch-horovod-source: the rendezvous-wait change no longer applies to $http_store" >&2; exit 1; }

if ! grep -q 'HOROVOD_STACK_RENDEZVOUS_TOKEN' "$http_store"; then
  perl -0pi -e 's/(\/\/ Perform http request to rendezvous server with retry logic\n)/\/\/ horovod-stack: rendezvous secret (docker\/patch-horovod-source.sh): the job'"'"'s secret on every request.\nstatic std::vector<std::string> JobSecretHeaders() {\n  const char* token = std::getenv("HOROVOD_STACK_RENDEZVOUS_TOKEN");\n  if (token == nullptr || *token == '"'"'\\0'"'"') return {};\n  return {std::string("Authorization: Bearer ") + token};\n}\n\n$1/; s/request\.send\(method, body\);/request.send(method, body, JobSecretHeaders());/' "$http_store"
fi
grep -q 'request.send(method, body, JobSecretHeaders());' "$http_store" &&
  grep -q 'std::getenv("HOROVOD_STACK_RENDEZVOUS_TOKEN")' "$http_store" ||
  { echo "patch-horovod-source: the rendezvous-secret change no longer applies to $http_store" >&2; exit 1; }
