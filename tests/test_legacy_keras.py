"""Keras 2 code on Keras 3 (launcher/core/legacy_keras.py): the rule that reads a rank's traceback, its fix as each
launch method words it, and the watch over a job's tagged output that the job agent keeps. The tracebacks are as Python
3.11 and TensorFlow 2.21 write them in horovod-stack:tensorflow; the agent's cause: test_agent.py; the smoke role's last
line: test_smoke_report.py; the image itself: test_tensorflow.py."""

from __future__ import annotations

import pytest

from launcher.core import legacy_keras
from launcher.core.legacy_keras import Watch, explained, fix, keras2_asked, keras2_on_keras3

EAGER = """\
Traceback (most recent call last):
  File "/workdir/tensorflow2_mnist.py", line 64, in <module>
    hvd.broadcast_variables(opt.variables(), root_rank=0)
                            ^^^^^^^^^^^^^^^
TypeError: 'list' object is not callable"""
"""`opt.variables()` run eagerly, `opt` a Keras 3 optimizer (tf.optimizers.SGD): Python's own traceback."""

IN_TF_FUNCTION = """\
Traceback (most recent call last):
  File "/workdir/tensorflow2_mnist.py", line 89, in <module>
    loss_value = training_step(images, labels, batch == 0)
                 ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 153, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/tmp/__autograph_generated_filepkbm0v9x.py", line 37, in tf__training_step
    ag__.if_stmt(ag__.ld(first_batch), if_body, else_body, get_state, set_state, (), 0)
  File "/tmp/__autograph_generated_filepkbm0v9x.py", line 32, in if_body
    ag__.converted_call(ag__.ld(hvd).broadcast_variables, (ag__.converted_call(ag__.ld(opt).variables, (), None, \
fscope),), dict(root_rank=0), fscope)
TypeError: in user code:

    File "/workdir/tensorflow2_mnist.py", line 73, in training_step  *
        hvd.broadcast_variables(opt.variables(), root_rank=0)

    TypeError: 'list' object is not callable
"""
"""Horovod's examples/tensorflow2/tensorflow2_mnist.py as it is: the first batch's broadcast inside its @tf.function
step, which TensorFlow reports under `TypeError: in user code:`, the user's frame and the error indented."""

OTHER_CALL = """\
Traceback (most recent call last):
  File "/workdir/train.py", line 12, in <module>
    for batch in batches():
                 ^^^^^^^^^
TypeError: 'list' object is not callable"""

OTHER_ERROR = """\
Traceback (most recent call last):
  File "/workdir/train.py", line 30, in <module>
    hvd.broadcast_variables(opt.variables(), root_rank=0)
                            ^^^^^^^^^^^^^^^
TypeError: 'NoneType' object is not callable"""

OUTER_FRAME_ONLY = """\
Traceback (most recent call last):
  File "/workdir/train.py", line 30, in <module>
    hvd.broadcast_variables(opt.variables(), root_rank=0)
  File "/workdir/helpers.py", line 8, in broadcast_variables
    return hooks()
           ^^^^^^^
TypeError: 'list' object is not callable"""
"""`.variables()` in a frame further out: the list called is another one."""

KERAS2_FRAME = """\
Traceback (most recent call last):
  File "/workdir/train.py", line 40, in <module>
    model.fit(x, y, callbacks=callbacks)
  File "/opt/venv/lib/python3.11/site-packages/tf_keras/src/utils/traceback_utils.py", line 70, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/workdir/callbacks.py", line 12, in on_train_begin
    weights = self.model.variables()
              ^^^^^^^^^^^^^^^^^^^^^^
TypeError: 'list' object is not callable"""
"""Keras 2 already runs (tf_keras's frames): a Keras model's `variables` is a list in Keras 2 too."""


@pytest.mark.parametrize(
    "output, words, found",
    [
        (EAGER, (), True),
        (IN_TF_FUNCTION, (), True),
        (f"step 1\n{EAGER}\n", ("NCCL_DEBUG=WARN",), True),
        (EAGER, ("TF_USE_LEGACY_KERAS=1",), False),  # Keras 2 was asked for: the fix is no fix
        (IN_TF_FUNCTION, ("-x", "TF_USE_LEGACY_KERAS=true"), False),
        (EAGER, ("TF_USE_LEGACY_KERAS=0",), True),
        (OTHER_CALL, (), False),
        (OTHER_ERROR, (), False),
        (OUTER_FRAME_ONLY, (), False),
        (KERAS2_FRAME, (), False),
        ("TypeError: 'list' object is not callable", (), False),  # no traceback, no frame to read
        ("", (), False),
    ],
)
def test_a_rank_that_died_of_keras2_code_on_keras3_is_told_from_its_traceback(output, words, found):
    assert keras2_on_keras3(output.splitlines(), words) is found


@pytest.mark.parametrize(
    "words, asked",
    [
        (("TF_USE_LEGACY_KERAS=1",), True),
        (("mpirun", "-x", "TF_USE_LEGACY_KERAS=True", "python", "t.py"), True),
        (("env", "TF_USE_LEGACY_KERAS=1", "python", "t.py"), True),
        (("TF_USE_LEGACY_KERAS=0",), False),
        (("TF_USE_LEGACY_KERAS=",), False),
        (("MY_TF_USE_LEGACY_KERAS=1",), False),
        ((), False),
    ],
)
def test_keras2_is_asked_for_by_the_values_tensorflow_takes(words, asked):
    assert keras2_asked(words) is asked


@pytest.mark.parametrize(
    "launch_method, command, told",
    [
        ("launcher", (), "launcher start --env TF_USE_LEGACY_KERAS=1 ..."),
        ("mpijob", (), "launcher export mpijob --env TF_USE_LEGACY_KERAS=1 ..."),
        ("smoke", (), "docker run -e TF_USE_LEGACY_KERAS=1 ... smoke ..."),
        ("compose", ("python", "tensorflow2_mnist.py"),
         'TRAIN_COMMAND="env TF_USE_LEGACY_KERAS=1 python tensorflow2_mnist.py" in .env'),
        ("compose", (), 'TRAIN_COMMAND="env TF_USE_LEGACY_KERAS=1 python ..." in .env'),
    ],
)  # fmt: skip
def test_each_launch_method_names_its_way_to_give_every_rank_the_setting(launch_method, command, told):
    assert fix(launch_method, command) == told


def test_the_line_names_the_problem_and_the_fix_first_and_pythons_error_after():
    assert explained(legacy_keras.ERROR, "launcher") == (
        "Keras 2 code on Keras 3, horovod-stack:tensorflow's default (a Keras 3 optimizer's `variables` is a list, "
        "not a method): run it with TF_USE_LEGACY_KERAS=1 for Keras 2, launcher start --env TF_USE_LEGACY_KERAS=1 "
        "... (TypeError: 'list' object is not callable)"
    )
    assert explained(None, "smoke").endswith("docker run -e TF_USE_LEGACY_KERAS=1 ... smoke ...")


def tagged(rank: int, text: str, tag: str = "[1,{}]<stderr>:") -> list[str]:
    return [tag.format(rank) + line + "\n" for line in text.splitlines()]


def interleaved(*outputs: list[str]) -> list[str]:
    """The lines of several ranks, one of each in turn, as mpirun passes them on."""
    lines = []
    for index in range(max(len(output) for output in outputs)):
        lines += [output[index] for output in outputs if index < len(output)]
    return lines


@pytest.mark.parametrize(
    "lines, argv, rank",
    [
        (interleaved(tagged(0, "epoch 1"), tagged(1, IN_TF_FUNCTION), tagged(0, IN_TF_FUNCTION)), (), 1),
        (tagged(3, EAGER, "[3]<stderr>:"), (), 3),  # elastic horovodrun's tag
        (tagged(2, EAGER, "[prterun-node-4242@1,2]<stderr>: "), (), 2),  # Open MPI 5's
        (tagged(0, IN_TF_FUNCTION), ("mpirun", "-x", "TF_USE_LEGACY_KERAS=1", "python", "t.py"), None),
        (interleaved(tagged(0, OTHER_CALL), tagged(1, OUTER_FRAME_ONLY)), (), None),
        ([line.split(":", 1)[1] for line in tagged(0, EAGER)], (), None),  # untagged: not a rank's line
    ],
)
def test_the_watch_names_the_first_rank_whose_output_shows_it(lines, argv, rank):
    watch = Watch(argv)
    for line in lines:
        watch.feed(line)
    assert watch.rank == rank
