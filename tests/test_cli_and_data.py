"""`vizkit info`, normalized entropy, the digits sample batch."""

import math

import pytest
import torch

import vizkit as vk
from vizkit.analysis import normalized_entropy
from vizkit.cli import main
from vizkit.datasets import digit_images


def test_info_prints_names_shapes_and_entropy(capsys):
    assert main(["info", "--model", "test_vit", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "blocks.{0..5}.attn.hook_pattern" in out
    assert "captured 6 attention maps" in out
    rows = [
        line.split()
        for line in out.splitlines()
        if line.strip().startswith("blocks.") and "(2, 2," in line
    ]
    assert len(rows) == 6
    for row in rows:
        mean, low, high = map(float, row[-3:])
        assert 0 <= low <= mean <= high <= 1


def test_info_reports_bad_model_name(capsys):
    assert main(["info", "--model", "no_such_model"]) == 2
    assert "neither a zoo model" in capsys.readouterr().err


def test_info_on_a_cnn(capsys):
    assert main(["info", "--model", "resnet18", "--batch", "1"]) == 0
    assert "no attention patterns" in capsys.readouterr().out


def test_normalized_entropy_known_answers():
    uniform = torch.full((2, 3, 5, 5), 0.2)
    assert torch.allclose(normalized_entropy(uniform), torch.ones(2, 3, 5))
    one_hot = torch.eye(5).expand(2, 3, 5, 5)
    assert torch.equal(normalized_entropy(one_hot), torch.zeros(2, 3, 5))
    half = torch.tensor([0.5, 0.5, 0.0, 0.0])
    assert math.isclose(normalized_entropy(half).item(), math.log(2) / math.log(4), rel_tol=1e-6)
    with pytest.raises(ValueError, match="probabilities"):
        normalized_entropy(torch.tensor([0.9, -0.2, 0.3]))
    with pytest.raises(ValueError, match="at least 2"):
        normalized_entropy(torch.ones(3, 1))


def test_digit_images():
    images, labels = digit_images(5, image_size=(24, 16), mean=(0.5,) * 3, std=(0.5,) * 3)
    assert images.shape == (5, 3, 24, 16) and labels.tolist() == [0, 1, 2, 3, 4]
    assert images.min() >= -1 and images.max() <= 1 and images.std() > 0.3
    assert torch.equal(images[:, 0], images[:, 2])
    with pytest.raises(ValueError, match="there are 1797"):
        digit_images(10, offset=1790)


def test_cka_command_writes_the_matrix(tmp_path, capsys):
    import json

    out = tmp_path / "cka.json"
    assert main(["cka", "--samples", "32", "--batch-size", "16", "--out", str(out)]) == 0
    result = vk.CKAResult.from_dict(json.loads(out.read_text()))
    assert result.matrix.shape == (4, 4) and len(result.layers_a) == 4  # vit_tiny_shapes' blocks
    assert result.matrix[0, 0].item() == pytest.approx(1.0)
    assert result.options["examples"] == 32 and result.image_size == (32, 32)
    assert "blocks.3.hook_resid_post" in capsys.readouterr().out


def test_cka_command_reports_bad_options(capsys):
    with pytest.raises(SystemExit):
        main(["cka", "--tokens", "patches"])
    assert "invalid choice: 'patches'" in capsys.readouterr().err
    assert main(["cka", "--samples", "34", "--batch-size", "16"]) == 2  # last batch: 2 images
    assert "needs >= 4 per batch" in capsys.readouterr().err
