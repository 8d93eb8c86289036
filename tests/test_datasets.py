"""The trainers' data, the same for both frameworks: the digits' upscaling as torch does it, MNIST's IDX files, and
how an epoch is shared out over the ranks (fixed-size and elastic)."""

import gzip

import pytest

from tests.extras import skip_module_without

skip_module_without("numpy", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from app import datasets  # noqa: E402


def test_the_upscaling_is_torchs_bilinear_without_corner_alignment():
    images = np.random.default_rng(0).random((3, 8, 8), dtype=np.float32)
    expected = F.interpolate(torch.from_numpy(images)[:, None], size=(28, 28), mode="bilinear", align_corners=False)
    assert np.allclose(datasets.resize_bilinear(images, 28), expected[:, 0].numpy(), atol=1e-6)


def test_digits_are_the_same_80_20_split_of_normalised_28x28_images_for_both_frameworks():
    (train_x, train_y), (val_x, val_y) = datasets.digits(seed=0)
    assert train_x.shape == (1438, 1, 28, 28) and val_x.shape == (359, 1, 28, 28)
    assert train_x.dtype == np.float32 and train_y.dtype == np.int64
    assert set(val_y.tolist()) == set(range(10))
    (again_x, _), _ = datasets.digits(seed=0)
    assert np.array_equal(train_x, again_x)


def write_idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_mnist_is_read_from_torchvisions_layout(tmp_path):
    raw = datasets.mnist_raw_dir(tmp_path)
    raw.mkdir(parents=True)
    for images_name, labels_name in datasets.MNIST_FILES.values():
        write_idx(raw / images_name, np.full((4, 28, 28), 255))
        write_idx(raw / labels_name, np.array([1, 2, 3, 4]))
    assert datasets.mnist_present(tmp_path)
    (images, labels), _ = datasets.mnist(tmp_path)
    assert images.shape == (4, 1, 28, 28) and labels.tolist() == [1, 2, 3, 4]
    assert np.allclose(images, (1 - datasets.MNIST_MEAN) / datasets.MNIST_STD)


def test_a_file_that_is_not_idx_is_refused(tmp_path):
    (tmp_path / "bad").write_bytes(gzip.compress(b"not idx"))
    with pytest.raises(ValueError, match="not an IDX file"):
        datasets.read_idx(tmp_path / "bad")


@pytest.mark.parametrize(("count", "size"), [(10, 2), (10, 3), (7, 4), (1, 2)])
def test_every_rank_gets_as_many_samples_and_together_they_cover_the_epoch(count, size):
    shards = [datasets.shard(count, rank, size, seed=1, epoch=2, shuffle=True) for rank in range(size)]
    assert len({len(shard) for shard in shards}) == 1
    assert set(np.concatenate(shards).tolist()) == set(range(count))


@pytest.mark.parametrize(("count", "batch", "sizes"), [(10, 2, [2]), (10, 3, [3]), (11, 2, [3, 3, 2, 2]), (5, 4, [2])])
def test_dealing_covers_the_epoch_once_in_the_same_number_of_steps_on_every_rank(count, batch, sizes):
    """`sizes`: the world size at each step, the last one repeated (an elastic job shrinks between steps)."""
    order = np.random.default_rng(0).permutation(count)
    done, seen, step = 0, [], 0
    while done < count:
        size = sizes[min(step, len(sizes) - 1)]
        dealt = [datasets.deal(order, done, batch, rank, size) for rank in range(size)]
        assert all(len(indices) >= 1 for indices, _ in dealt)
        assert len({covered for _, covered in dealt}) == 1
        seen += sorted(set(np.concatenate([indices for indices, _ in dealt]).tolist()))
        done += dealt[0][1]
        step += 1
    assert sorted(seen) == list(range(count))
