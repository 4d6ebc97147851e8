"""Names checked on held-out images (`vizkit.concepts.check_names`): the AUC against
scikit-learn's, the Shapes ViT's named channels and latents on a split they were not named on,
the table's order, the store path, refusals."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

import vizkit as vk
from vizkit.concepts import NamedUnits, check_names, dissect, image_auc, shapes_concepts

LAYER = "blocks.3.hook_resid_post"


def test_image_auc_equals_scikit_learns_with_ties():
    generator = torch.Generator().manual_seed(0)
    values = torch.randint(0, 6, (40, 5), generator=generator).float()  # many ties
    present = torch.rand(40, 3, generator=generator) < 0.4
    present[:, 2] = True  # in every image: no AUC
    auc = image_auc(values, present)
    for k in range(2):
        for u in range(5):
            expected = roc_auc_score(present[:, k].numpy(), values[:, u].numpy())
            assert auc[k, u].item() == pytest.approx(expected, abs=1e-12)
    assert auc[2].isnan().all()


@pytest.fixture(scope="module")
def shapes_named():
    """The Shapes ViT's last block dissected on 200 test images (seed 0), and 200 others."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, concepts = shapes_concepts(200)
    named = dissect(model, images, concepts, LAYER, progress=False)
    held_images, held_concepts = shapes_concepts(200, seed=1)
    return model, named, held_images, held_concepts


def test_shape_detectors_fire_on_new_images_of_their_shape(shapes_named):
    """The channels that detect a shape class (IoU > 0.04; 33 on these 200 images) all fire
    more on held-out images of that shape than on others (AUC 0.62 to 0.94, chance 0.5), and
    26 of them (79 %) reach 0.75."""
    model, named, images, concepts = shapes_named
    checked = check_names(model, named, images, concepts, progress=False)
    assert isinstance(checked, NamedUnits) and checked.score == "IoU"
    assert checked.units == named.units and checked.names == named.labels
    torch.testing.assert_close(checked.scores, named.best_iou)
    classes = vk.zoo.card("vit_tiny_shapes")["classes"]
    pairs = zip(named.detectors.tolist(), named.labels, strict=True)
    shape_detectors = torch.tensor([detects and name in classes for detects, name in pairs])
    assert int(shape_detectors.sum()) >= 20
    assert checked.held_out_auc[shape_detectors].min() > 0.55, checked.markdown(k=None)
    confirmed = checked.confirmed(0.75)[shape_detectors].float().mean().item()
    assert confirmed >= 0.5, checked.markdown(k=None)
    # a concept every image holds ("object", "background") has no AUC
    always = [i for i, name in enumerate(checked.names) if name in ("object", "background")]
    assert all(math.isnan(checked.held_out_auc[i]) for i in always)
    assert checked.positives[shape_detectors].min() >= 5


def test_the_table_sorts_by_either_column_with_missing_aucs_last(shapes_named):
    model, named, images, concepts = shapes_named
    checked = check_names(model, named, images[:60], _masks(concepts, 60), progress=False)
    by_score = checked.table()
    assert [row[2] for row in by_score] == sorted((row[2] for row in by_score), reverse=True)
    by_auc = checked.table("held_out_auc", k=None)
    aucs = [row[3] for row in by_auc]
    known = [a for a in aucs if not math.isnan(a)]
    assert aucs[: len(known)] == sorted(known, reverse=True)
    assert all(math.isnan(a) for a in aucs[len(known) :])
    assert len(checked.table(k=3)) == 3
    lines = checked.markdown(k=4).splitlines()
    assert lines[0] == "| unit | name | IoU | held-out AUC |" and len(lines) == 6
    with pytest.raises(ValueError, match="by must be one of"):
        checked.table("name")


def _masks(concepts, count):
    return vk.concepts.Concepts(concepts.names, concepts.masks[:count])


def test_latent_names_checked_from_a_store_equal_the_model_path(tmp_path, shapes_sae):
    model, sae = shapes_sae
    images, concepts = shapes_concepts(40)
    named = dissect(model, images, concepts, sae, progress=False)
    held, held_concepts = shapes_concepts(30, seed=2)
    ran = check_names(model, named, held, held_concepts, units=sae, progress=False)
    store = vk.cache_activations(model, held, tmp_path / "held", layers=[sae.source["layer"]],
                                 tokens="patches", progress=False)  # fmt: skip
    read = check_names(model, named, None, held_concepts, units=sae, batch_size=7,
                       progress=False, store=store)  # fmt: skip
    torch.testing.assert_close(read.held_out_auc, ran.held_out_auc, equal_nan=True)
    assert read.options["store"] == str(store.folder) and ran.options["images"] == 30
    presence = held_concepts.masks.flatten(2).any(2)
    as_tensor = check_names(model, named, held, presence, units=sae, progress=False)
    torch.testing.assert_close(as_tensor.held_out_auc, ran.held_out_auc, equal_nan=True)


def test_refusals(shapes_named, shapes_sae):
    model, named, images, concepts = shapes_named
    with pytest.raises(TypeError, match="Dissection or a CLIPDissection"):
        check_names(model, named.table(), images, concepts, progress=False)
    with pytest.raises(ValueError, match="holds 200 images but present says .* 10 images"):
        check_names(model, named, images, _masks(concepts, 10), progress=False)
    few = vk.concepts.Concepts(concepts.names[:3], concepts.masks[:, :3])
    with pytest.raises(ValueError, match="lack"):
        check_names(model, named, images, few, progress=False)
    with pytest.raises(ValueError, match="one column per concept"):
        check_names(model, named, images, torch.zeros(200, 2, dtype=torch.bool), progress=False)
    with pytest.raises(TypeError, match="bool tensor"):
        check_names(model, named, images, torch.zeros(200, 2), progress=False)
    with pytest.raises(ValueError, match="channels of blocks.3"):
        check_names(model, named, images, concepts, units="blocks.2.hook_resid_post",
                    progress=False)  # fmt: skip
    _, sae = shapes_sae
    latents = dissect(model, images[:20], _masks(concepts, 20), sae, progress=False)
    with pytest.raises(ValueError, match="pass it: units="):
        check_names(model, latents, images, concepts, progress=False)
