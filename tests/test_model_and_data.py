from pathlib import Path

import pytest

from tests.extras import skip_module_without

skip_module_without("torch")

import torch  # noqa: E402

from app import consistency, datasets, torch_datasets  # noqa: E402
from app.model import SimpleNet  # noqa: E402


def test_simplenet_gives_log_probabilities_for_28x28_batches():
    output = SimpleNet()(torch.randn(5, 1, 28, 28))
    assert output.shape == (5, 10)
    assert torch.allclose(output.exp().sum(dim=1), torch.ones(5), atol=1e-5)


def test_digits_are_real_28x28_images_in_an_80_20_split():
    train, val = torch_datasets.load_dataset("digits", Path("unused"), seed=0)
    assert isinstance(train, torch.utils.data.TensorDataset) and isinstance(val, torch.utils.data.TensorDataset)
    assert (len(train), len(val)) == (1438, 359)
    image, label = train[0]
    assert image.shape == (1, 28, 28) and 0 <= int(label) <= 9
    assert set(val.tensors[1].tolist()) == set(range(10))


def test_splits_are_identical_for_the_same_seed():
    (a, _), _ = datasets.synthetic(seed=3, size=64)
    (b, _), _ = datasets.synthetic(seed=3, size=64)
    assert (a == b).all()


def test_mnist_missing_message_names_both_flags(tmp_path):
    message = datasets.mnist_unavailable_message(tmp_path, "URLError: no route")
    assert "--data-dir" in message and "--dataset" in message and "\n" not in message


def test_parameter_digest_tells_models_apart():
    train_torch = pytest.importorskip("app.train_torch")  # imports horovod.torch

    def digest(model: SimpleNet) -> str:
        return consistency.digest_arrays(train_torch.named_arrays(model))

    torch.manual_seed(0)
    a, b = SimpleNet(), SimpleNet()
    b.load_state_dict(a.state_dict())
    assert digest(a) == digest(b)
    with torch.no_grad():
        b.fc1.bias[0] += 1e-7
    assert digest(a) != digest(b)


def test_ranks_differing_from_root():
    assert consistency.ranks_differing_from_root(["x", "x", "x"]) == []
    assert consistency.ranks_differing_from_root(["x", "y", "x", "z"]) == [1, 3]
