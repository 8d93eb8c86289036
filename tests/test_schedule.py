import pytest

from app.schedule import learning_rate, scaled_lr


@pytest.mark.parametrize("world, adasum, expected", [(1, False, 0.01), (4, False, 0.04), (4, True, 0.01)])
def test_scaled_lr(world, adasum, expected):
    assert scaled_lr(0.01, world, adasum) == pytest.approx(expected)


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, 0.01),  # warm-up starts at the single-rank rate
        (50, 0.025),  # halfway through one warm-up epoch of 100 steps
        (100, 0.04),  # warm-up done: the scaled rate
        (250, 0.04),
    ],
)
def test_warmup_is_linear_then_flat(step, expected):
    assert learning_rate(step, steps_per_epoch=100, base_lr=0.01, target_lr=0.04, warmup_epochs=1) == pytest.approx(
        expected
    )


def test_no_warmup_starts_at_target():
    assert learning_rate(0, 100, 0.01, 0.04, warmup_epochs=0) == 0.04
