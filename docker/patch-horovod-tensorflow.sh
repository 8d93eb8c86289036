#!/usr/bin/env bash
# Builds Horovod 0.28.1's TensorFlow extension against TensorFlow 2.21 (GPU: NCCL + MPI + Gloo; CPU: MPI + Gloo) and
# makes its TensorFlow/Keras API work with Keras 3 (TF >= 2.16's default `keras`):
#   patch-horovod-tensorflow.sh SRC_DIR
# (docker/install-horovod.sh applies it after docker/patch-horovod-source.sh; a second run changes nothing, and a
# source it does not know fails in one line naming the file)
# Build:
# - XLA ops (horovod/tensorflow/xla_mpi_ops.cc, used only with HOROVOD_ENABLE_XLA_OPS=1 and jit_compile) are not
#   built. The file includes TF's XLA headers even in a CPU build, and TF 2.21's wheel keeps them at new paths
#   (tensorflow/compiler/xla/* moved to xla/*, needing highwayhash and farmhash headers from include/external that
#   tf.sysconfig does not name, and xla::StatusOr became absl::StatusOr: upstream pull request 4302's moves). The
#   whole file compiles to nothing; tf.function(jit_compile=True) around a Horovod op fails as it does without them.
# - The GPU stream (horovod/tensorflow/mpi_ops.cc, 12 calls): Horovod declared
#   stream_executor::gpu::AsGpuStreamValue itself, which TF 2.21's libraries no longer export, so a GPU build
#   compiled and then failed to load (undefined symbol). TF 2.21's Stream has platform_specific_handle(), whose
#   `.stream` is the CUDA stream: a helper reads it instead.
# - One cudart and one NCCL per process, TensorFlow's: CMake links Horovod's CUDA code with the shared cudart instead
#   of its default static copy (CMAKE_CUDA_RUNTIME_LIBRARY), so its CUDA calls bind to the CUDA runtime API that
#   libtensorflow_framework.so.2 exports (TensorFlow's stub over the cudart of its own wheel); it links the NCCL of
#   TensorFlow's wheel (docker/install-horovod.sh points the build there), found through a RUNPATH of that folder
#   alone, so a rank needs no LD_LIBRARY_PATH (ranks on other nodes start through ssh).
# mpi_ops.cc otherwise builds as is (TF's errors:: helpers only warn as deprecated); the TF target already builds with
# C++17 (horovod/tensorflow/CMakeLists.txt sets it for TF >= 2.10), which TF 2.21 needs.
# Run time, Keras 3 (upstream issue 4290); the Keras 2 path (TF_USE_LEGACY_KERAS=1 + tf_keras) behaves as before:
# - Keras 3 variables are not tf.Variables: they have no .ref() and are unhashable, so every place Horovod
#   keys a dict or set by var.ref() failed ("'Variable' object has no attribute 'ref'" in
#   DistributedGradientTape.gradient, DistributedOptimizer and BroadcastGlobalVariablesCallback).
#   horovod.tensorflow.util._var_ref(v) keys a Keras 3 variable by the tf.Variable behind it
#   (keras.Variable.value on the TensorFlow backend), falling back to an identity key.
# - hvd.broadcast_variables passed Keras 3 variables into a tf.function, which turned them into read-only
#   tensors ("'SymbolicTensor' object has no attribute 'assign'"); it now broadcasts into their tf.Variables.
# - The gradient allreduce is a tf.function when made eagerly (DistributedOptimizer; a tape made outside
#   tf.function); tracing read the Keras 3 variables passed to it as `vars` ("NotImplementedError: numpy()
#   is only available when eager execution is enabled"); it now gets their tf.Variables.
# - Keras 3 optimizers take gradients in apply() (apply_gradients and model.fit call it) and never call the
#   Keras 2 hooks (_aggregate_gradients, get_gradients) that DistributedOptimizer overrides, so their
#   gradients were not averaged: the wrapped Keras 3 optimizer now allreduces in apply(). Its `variables`
#   is a property returning a plain list, so the `variables()` shim (and the broadcast callback's
#   optimizer.variables()) now accept both forms. backward_passes_per_step > 1 is refused for Keras 3
#   (use the optimizer's own gradient_accumulation_steps) instead of silently misbehaving.
# - MetricAverageCallback made its eager constant with `keras.backend.constant`, which Keras 3's backend
#   lacks ("module 'keras.backend' has no attribute 'constant'"); Horovod imports the `keras` package's
#   backend even when tf.keras is tf_keras, so this broke the Keras 2 model.fit path too. Now tf.constant.
# - The elastic state of a Keras model (hvd.elastic.TensorFlowKerasState) called optimizer.variables(): the same
#   property-or-method helper now, so a Keras 3 model and optimizer can be committed, restored and synced.
# - The learning-rate callbacks (LearningRateScheduleCallback, LearningRateWarmupCallback) read and set the rate with
#   keras.backend.get_value/set_value, absent from Keras 3's backend (which Horovod imports even under
#   TF_USE_LEGACY_KERAS=1), and as `optimizer.lr`, which Keras 3 optimizers lack: they now read `learning_rate` and
#   assign it (a variable in Keras 3 and Keras 2 alike). Their momentum correction needs a momentum the compiled step
#   reads at run time (Keras 2's legacy optimizers); Keras 3's and tf_keras's optimizers keep it as a number fixed
#   when the step is traced, so there it is skipped with one warning instead of failing.
# Keras 3 model.fit under hvd.elastic with horovod.tensorflow.keras.elastic's callbacks needs nothing more.
set -euo pipefail
src="${1:?usage: patch-horovod-tensorflow.sh SRC_DIR}"
fail() { echo "patch-horovod-tensorflow: $1" >&2; exit 1; }

# 1. XLA ops in no build.
xla="$src/horovod/tensorflow/xla_mpi_ops.cc"
grep -q '^#if 0  // horovod-stack: XLA ops not built' "$xla" ||
  sed -i 's|^#if TENSORFLOW_VERSION >= 2006000000$|#if 0  // horovod-stack: XLA ops not built (docker/patch-horovod-tensorflow.sh)|' "$xla"
grep -q '^#if 0  // horovod-stack: XLA ops not built' "$xla" && ! grep -q '^#if TENSORFLOW_VERSION >= 2006000000$' "$xla" ||
  fail "the XLA-ops guard no longer applies to $xla"

# 2. Helpers: hashable key, backing tf.Variable, optimizer variables.
util="$src/horovod/tensorflow/util.py"
if ! grep -q '^def _optimizer_variables' "$util"; then
  grep -q '^    return vars.ref()$' "$util" || fail "the variable-key helper no longer applies to $util"
  sed -i 's/^    return vars.ref()$/    return _var_ref(vars)/' "$util"
  cat >>"$util" <<'PY'


# horovod-stack: Keras 3 variables (docker/patch-horovod-tensorflow.sh).
class _IdentityRef(object):
    """Hashable stand-in for Variable.ref() for variables without it (Keras 3 variables)."""
    __slots__ = ('_obj',)

    def __init__(self, obj):
        self._obj = obj

    def __hash__(self):
        return id(self._obj)

    def __eq__(self, other):
        return isinstance(other, _IdentityRef) and other._obj is self._obj

    def deref(self):
        return self._obj


def _tf_variable(var):
    """The tf.Variable behind a Keras 3 variable (its `value` on the TensorFlow backend); others as given."""
    if isinstance(var, tf.Variable):
        return var
    value = getattr(var, 'value', None)
    return value if isinstance(value, tf.Variable) else var


def _tf_variables(vars):
    """_tf_variable over a list (or None)."""
    return None if vars is None else [_tf_variable(var) for var in vars]


def _var_ref(var):
    """A hashable key for a variable: its tf.Variable's ref() (the same key for a Keras 3 variable and the
    tf.Variable behind it; deref() gives the tf.Variable), else an identity key."""
    var = _tf_variable(var)
    return var.ref() if hasattr(var, 'ref') else _IdentityRef(var)


def _optimizer_variables(optimizer):
    """An optimizer's variables: a method in Keras 2's legacy optimizers, a property (list) in Keras 3."""
    variables = optimizer.variables
    return variables() if callable(variables) else variables
PY
fi
grep -q '^def _optimizer_variables' "$util" && grep -q '^def _tf_variables' "$util" && grep -q '    return _var_ref(vars)' "$util" ||
  fail "the Keras 3 helpers no longer apply to $util"

# 3. .ref() -> _var_ref() where Keras 3 variables reach: the tape, the Keras optimizer, the broadcast callback.
tfinit="$src/horovod/tensorflow/__init__.py"
kinit="$src/horovod/_keras/__init__.py"
kcb="$src/horovod/_keras/callbacks.py"
if ! grep -q '_cache, vars_to_refs, refs_to_vars, _var_ref, _tf_variables' "$tfinit"; then
  grep -q '^from horovod.tensorflow.util import _executing_eagerly, _make_subgraph, _cache, vars_to_refs, refs_to_vars$' "$tfinit" ||
    fail "the variable-key change no longer applies to $tfinit"
  sed -i 's/^\(from horovod.tensorflow.util import _executing_eagerly, _make_subgraph, _cache, vars_to_refs, refs_to_vars\)$/\1, _var_ref, _tf_variables  # horovod-stack: Keras 3/' "$tfinit"
fi
# The gradient allreduce is a tf.function when made eagerly (a Keras optimizer, a tape made outside
# tf.function): Keras 3 variables passed to it as `vars` are turned into tensors by tracing, which reads
# them ("numpy() is only available when eager execution is enabled"); it gets their tf.Variables.
if ! grep -q 'return allreduce_grads(grads, _tf_variables(vars), use_generic_names)' "$tfinit"; then
  perl -0pi -e 's/(    groups = vars_to_refs\(groups\) if isinstance\(groups, list\) else groups\n)    return (_make_cached_allreduce_grads_fn\(name, device_dense, device_sparse,\n\s*compression, sparse_as_dense, op,\n\s*gradient_predivide_factor, groups,\n\s*process_set\))\n/$1    allreduce_grads = $2\n\n    def allreduce_grads_of_tf_variables(grads, vars=None, use_generic_names=False):\n        # horovod-stack: Keras 3 variables reach the (maybe tf.function) allreduce as their tf.Variables\n        return allreduce_grads(grads, _tf_variables(vars), use_generic_names)\n    return allreduce_grads_of_tf_variables\n/' "$tfinit"
fi
grep -q '_cache, vars_to_refs, refs_to_vars, _var_ref, _tf_variables' "$tfinit" &&
  grep -q 'return allreduce_grads(grads, _tf_variables(vars), use_generic_names)' "$tfinit" ||
  fail "the allreduce-of-tf.Variables change no longer applies to $tfinit"
for file in "$tfinit" "$kinit" "$kcb"; do
  perl -pi -e 's/\b(var|rv|rs|source|s)\.ref\(\)/_var_ref($1)/g' "$file"
  ! grep -q '\.ref()' "$file" || fail "the variable-key change left a .ref() in $file"
done
for file in "$kinit" "$kcb"; do
  grep -q "^from horovod.tensorflow.util import _var_ref" "$file" ||
    perl -0pi -e 's/^(import horovod\.tensorflow as hvd\n)/$1from horovod.tensorflow.util import _var_ref, _optimizer_variables  # horovod-stack: Keras 3\n/m' "$file"
  grep -q "^from horovod.tensorflow.util import _var_ref" "$file" || fail "the helper import no longer applies to $file"
done

# 4. broadcast_variables: broadcast into the tf.Variable behind a Keras 3 variable.
funcs="$src/horovod/tensorflow/functions.py"
if ! grep -q '_tf_variable(var) for var in variables' "$funcs"; then
  perl -0pi -e 's/(        inplace: whether to perform in-place broadcasts\n    """\n)/$1    variables = [_tf_variable(var) for var in variables]  # horovod-stack: Keras 3 variables\n/' "$funcs"
  perl -0pi -e 's/^(from horovod\.tensorflow\.util import .*)$/$1\nfrom horovod.tensorflow.util import _tf_variable  # horovod-stack: Keras 3/m' "$funcs"
fi
grep -q 'variables = \[_tf_variable(var) for var in variables\]' "$funcs" && grep -q '^from horovod.tensorflow.util import _tf_variable' "$funcs" ||
  fail "the broadcast_variables change no longer applies to $funcs"

# 5. Keras DistributedOptimizer: variables property both ways; Keras 3 allreduces in apply().
if ! grep -q '^def _is_keras3_optimizer' "$kinit"; then
  perl -0pi -e 's/                return CallableList\(super\(self\.__class__, self\)\.variables\(\)\)\n/                # horovod-stack: Keras 3: the base `variables` is a property (a list), not a method\n                return CallableList(_optimizer_variables(super(self.__class__, self)))\n/' "$kinit"
  perl -0pi -e 's/(        def register_local_var\(self, var\):\n)/        if _is_keras3_optimizer(optimizer):\n            def apply(self, grads, trainable_variables=None):\n                """horovod-stack: Keras 3 optimizers take gradients here (apply_gradients and model.fit\n                call it) and never call the Keras 2 hooks above, so the allreduce happens here."""\n                grads = list(grads)\n                variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)\n                if grads:\n                    grads = self._allreduce(grads, variables)\n                return super(self.__class__, self).apply(grads, trainable_variables)\n\n$1/' "$kinit"
  perl -0pi -e 's/(                                 scale_local_gradients=True\):\n)(    class _DistributedOptimizer)/$1    if backward_passes_per_step > 1 and _is_keras3_optimizer(optimizer):  # horovod-stack: Keras 3\n        raise ValueError("backward_passes_per_step > 1 is not supported with Keras 3 optimizers; "\n                         "use the optimizer\x27s gradient_accumulation_steps instead.")\n\n$2/' "$kinit"
  cat >>"$kinit" <<'PY'


def _is_keras3_optimizer(optimizer):
    """horovod-stack: Keras 3 (the default `keras` of TF >= 2.16; tf_keras is Keras 2)."""
    try:
        import keras as _keras3
    except ImportError:
        return False
    return (version.parse(_keras3.__version__).major >= 3 and
            isinstance(optimizer, _keras3.optimizers.Optimizer))
PY
fi
grep -q 'return CallableList(_optimizer_variables(super(self.__class__, self)))' "$kinit" &&
  grep -q 'grads = self._allreduce(grads, variables)' "$kinit" &&
  grep -q 'raise ValueError("backward_passes_per_step > 1 is not supported with Keras 3' "$kinit" &&
  grep -q '^def _is_keras3_optimizer' "$kinit" ||
  fail "the Keras 3 DistributedOptimizer change no longer applies to $kinit"

# 6. Callbacks: optimizer variables either way; eager metric constant without keras.backend.constant.
perl -pi -e 's/hvd\.broadcast_variables\(self\.model\.optimizer\.variables\(\),/hvd.broadcast_variables(_optimizer_variables(self.model.optimizer),/; s/hvd\.allreduce\(self\.backend\.constant\(value, name=metric\)\)/hvd.allreduce(tf.constant(value, name=metric))/' "$kcb"
grep -q 'hvd.broadcast_variables(_optimizer_variables(self.model.optimizer),' "$kcb" &&
  grep -q 'hvd.allreduce(tf.constant(value, name=metric))' "$kcb" ||
  fail "the Keras 3 callback change no longer applies to $kcb"

# 7. The elastic state of a Keras model and optimizer: optimizer variables either way.
elastic="$src/horovod/tensorflow/elastic.py"
if ! grep -q '_optimizer_variables' "$elastic"; then
  perl -pi -e 's/\b((?:self\.)?optimizer)\.variables\(\)/_optimizer_variables($1)/g' "$elastic"
  perl -0pi -e 's/^(from horovod\.tensorflow\.mpi_ops import .*)$/$1\nfrom horovod.tensorflow.util import _optimizer_variables  # horovod-stack: Keras 3/m' "$elastic"
fi
[ "$(grep -c '_optimizer_variables(' "$elastic")" = 4 ] && ! grep -q 'optimizer\.variables()' "$elastic" ||
  fail "the Keras 3 elastic-state change no longer applies to $elastic"

# 8. Learning-rate callbacks: the rate (and momentum) read and set without keras.backend.get_value/set_value.
if ! grep -q '^def _get_hyper' "$kcb"; then
  perl -pi -e 's/self\.backend\.get_value\(self\.model\.optimizer\.(lr|momentum)\)/_get_hyper(self.model.optimizer, "$1")/g;
    s/self\.backend\.set_value\(self\.model\.optimizer\.(lr|momentum),/_set_hyper(self.model.optimizer, "$1",/g;
    s/if hasattr\(self\.model\.optimizer, .momentum.\) and self\.momentum_correction:/if self.momentum_correction and _momentum_correctable(self.model.optimizer):/' "$kcb"
  cat >>"$kcb" <<'PY'


# horovod-stack: the learning-rate callbacks on Keras 3 and tf_keras (docker/patch-horovod-tensorflow.sh).
def _get_hyper(optimizer, name):
    """An optimizer's learning rate ('lr') or momentum as a float: `learning_rate` is the name both Kerases have."""
    value = getattr(optimizer, 'learning_rate' if name == 'lr' else name)
    return float(value.numpy()) if hasattr(value, 'numpy') else float(value)


def _set_hyper(optimizer, name, value):
    """Assigns a variable hyperparameter in place (what the compiled step reads); sets a plain one."""
    name = 'learning_rate' if name == 'lr' else name
    current = getattr(optimizer, name)
    if hasattr(current, 'assign'):
        current.assign(value)
    else:
        setattr(optimizer, name, value)


_momentum_warned = []


def _momentum_correctable(optimizer):
    """Whether momentum correction can act: the momentum must be a variable the compiled step reads at run time
    (Keras 2's legacy optimizers). Keras 3's and tf_keras's optimizers hold a number fixed when the step is traced:
    skipped, with one warning."""
    momentum = getattr(optimizer, 'momentum', None)
    if momentum is None or hasattr(momentum, 'assign'):
        return momentum is not None
    if not _momentum_warned:
        import warnings
        _momentum_warned.append(True)
        warnings.warn('horovod: momentum correction skipped: this optimizer fixes its momentum when its step is '
                      'compiled (Keras 3, tf_keras); pass momentum_correction=False to the learning-rate callback')
    return False
PY
fi
grep -q '^def _get_hyper' "$kcb" && ! grep -q 'backend\.[gs]et_value(self\.model\.optimizer' "$kcb" &&
  grep -q 'if self.momentum_correction and _momentum_correctable(self.model.optimizer):' "$kcb" ||
  fail "the learning-rate callback change no longer applies to $kcb"

# 9. GPU builds: the stream through platform_specific_handle(); TensorFlow's cudart and NCCL, no static copy.
ops="$src/horovod/tensorflow/mpi_ops.cc"
if ! grep -q 'HorovodStackGpuStream' "$ops"; then
  [ "$(grep -c 'stream_executor::gpu::AsGpuStreamValue(' "$ops")" = 12 ] ||
    fail "the GPU stream change no longer applies to $ops (expected 12 AsGpuStreamValue calls)"
  perl -0pi -e 's{// Forward declaration of AsGpuStreamValue\nnamespace stream_executor \{\nnamespace gpu \{\nGpuStreamHandle AsGpuStreamValue\(Stream\* stream\);\n\} // namespace stream_executor\n\} // namespace gpu\n}{}' "$ops"
  perl -0pi -e 's{(#include "tensorflow/stream_executor/stream.h"\n#endif // TENSORFLOW_VERSION >= 2011000000\n)}{$1// horovod-stack: the CUDA stream of a TensorFlow stream (docker/patch-horovod-tensorflow.sh): TF 2.21 no longer\n// exports the helper Horovod declared for it.\nstatic GpuStreamHandle HorovodStackGpuStream(stream_executor::Stream* stream) {\n  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\n}\n}' "$ops"
  sed -i 's/stream_executor::gpu::AsGpuStreamValue(/HorovodStackGpuStream(/' "$ops"
fi
! grep -q 'AsGpuStreamValue' "$ops" && [ "$(grep -c 'HorovodStackGpuStream(' "$ops")" = 13 ] ||
  fail "the GPU stream change no longer applies to $ops"

cmake_top="$src/CMakeLists.txt"
grep -q '^    set(CMAKE_CUDA_RUNTIME_LIBRARY "Shared")  # horovod-stack' "$cmake_top" ||
  sed -i 's|^    set(CMAKE_CUDA_RUNTIME_LIBRARY "Static")  # Set to "Static" or "Shared".*$|    set(CMAKE_CUDA_RUNTIME_LIBRARY "Shared")  # horovod-stack: TensorFlow'"'"'s own cudart|' "$cmake_top"
grep -q '^    set(CMAKE_CUDA_RUNTIME_LIBRARY "Shared")  # horovod-stack' "$cmake_top" && ! grep -q 'CMAKE_CUDA_RUNTIME_LIBRARY "Static"' "$cmake_top" ||
  fail "the shared-cudart change no longer applies to $cmake_top"

cmake_tf="$src/horovod/tensorflow/CMakeLists.txt"
if ! grep -q 'horovod-stack (docker/patch-horovod-tensorflow.sh): a RUNPATH of exactly' "$cmake_tf"; then
  grep -q '^target_link_libraries(${TF_TARGET_LIB} ${LINKER_LIBS} ${TF_LINKER_LIBS})$' "$cmake_tf" ||
    fail "the RUNPATH change no longer applies to $cmake_tf"
  cat >>"$cmake_tf" <<'CMAKE'
# horovod-stack (docker/patch-horovod-tensorflow.sh): a RUNPATH of exactly the folder of TensorFlow's NCCL wheel
# (site-packages/nvidia/nccl/lib), instead of CMake's build-tree paths (the build's temporary CUDA folder must not be
# searched at run time). Its CUDA calls need none: libtensorflow_framework.so.2 exports the CUDA runtime's API (the
# stub through which TensorFlow loads the cudart of its own wheel), and the link takes them from there.
set_target_properties(${TF_TARGET_LIB} PROPERTIES BUILD_WITH_INSTALL_RPATH TRUE
                      INSTALL_RPATH "$ORIGIN/../../nvidia/nccl/lib")
CMAKE
fi
grep -q 'horovod-stack (docker/patch-horovod-tensorflow.sh): a RUNPATH of exactly' "$cmake_tf" || fail "the RUNPATH change no longer applies to $cmake_tf"
