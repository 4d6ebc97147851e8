"""Targets for backbones (`vizkit.targets`): each helper equals its definition computed
independently, reads the embedding from each library's output type, follows perturbed copies
of an image to that image's own reference, and runs through every registered method,
`compare_saliency`, `evaluate` and `sanity_check` on a timm backbone (``num_classes=0``),
transformers Dinov2Model / CLIP / SigLIP image towers and an open_clip CLIP. Class targets on a
backbone are refused, and the fixes the refusals print are executed."""

from __future__ import annotations

import re
import warnings

import pytest
import timm
import torch
import torch.nn.functional as F

import vizkit as vk

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

SMALL = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip
TEXT = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 100, "bos_token_id": 0, "eos_token_id": 1,
        "pad_token_id": 1, "max_position_embeddings": 8}  # fmt: skip


def open_clip_model():
    return open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    )


def hf_clip():
    config = transformers.CLIPConfig(text_config=TEXT, vision_config=SMALL, projection_dim=16)
    return transformers.CLIPModel(config)


BACKBONES = {
    "timm": lambda: timm.create_model(
        "vit_tiny_patch16_224", num_classes=0, img_size=32, patch_size=8, depth=2
    ),
    "dinov2": lambda: transformers.Dinov2Model(transformers.Dinov2Config(**SMALL)),
    "clip_vision": lambda: transformers.CLIPVisionModelWithProjection(
        transformers.CLIPVisionConfig(projection_dim=16, **SMALL)
    ),
    "siglip": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SMALL)),
    "open_clip": open_clip_model,
    "clip_image_tower": lambda: vk.models.image_tower(hf_clip()),
}


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on the tiny configs
        return BACKBONES[kind]().eval()


def images(batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def char_tokens(prompts: list[str], length: int = 8) -> torch.Tensor:
    """Token ids of the prompts' characters (a stand-in tokenizer for the tiny models' vocab
    of 100: nothing downloaded)."""
    ids = [[2 + ord(c) % 90 for c in p][: length - 1] + [1] for p in prompts]
    return torch.tensor([row + [1] * (length - len(row)) for row in ids])


class CharTokenizer:
    """The transformers tokenizer call ``tok(prompts, padding=..., return_tensors="pt")``."""

    def __call__(self, prompts, **kwargs):
        return {"input_ids": char_tokens(prompts)}


# --- each helper against its definition -------------------------------------------------


def test_each_helper_equals_its_definition():
    torch.manual_seed(0)
    e, ref = torch.randn(5, 8), torch.randn(5, 8)
    torch.testing.assert_close(vk.targets.embedding_norm()(e), torch.linalg.norm(e, dim=-1))
    torch.testing.assert_close(vk.targets.similar_to(ref)(e), F.cosine_similarity(e, ref))
    one = vk.targets.similar_to(ref[:1])  # embed() of one image: the reference of every image
    torch.testing.assert_close(one(e), F.cosine_similarity(e, ref[:1]))
    assert not one.per_image
    torch.testing.assert_close(
        vk.targets.similar_to(ref[0], versus=ref[1])(e),
        F.cosine_similarity(e, ref[:1]) - F.cosine_similarity(e, ref[1:2]),
    )
    weight, bias = torch.randn(3, 8), torch.randn(3)
    classes = [0, 2, 1, 1, 0]
    logits = F.linear(e, weight, bias)
    torch.testing.assert_close(
        vk.targets.probe(weight, bias, classes)(e), logits[range(5), classes]
    )
    cosines = F.cosine_similarity(e[:, None], weight[None], dim=-1)
    torch.testing.assert_close(vk.targets.prototypes(weight, 2)(e), cosines[:, 2])
    vector, center = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(vk.targets.direction(vector, center)(e), (e - center) @ vector)


def test_pca_component_equals_scikit_learns_projection_up_to_its_sign_convention():
    from sklearn.decomposition import PCA

    data = torch.randn(40, 6, generator=torch.Generator().manual_seed(2)).double()
    data[:, 0] *= 5  # a clear first component
    pca = PCA(n_components=3).fit(data.numpy())
    for k in range(3):
        ours = vk.targets.pca_component(data.float(), k)(data.float())
        theirs = torch.from_numpy(pca.transform(data.numpy())[:, k]).float()
        sign = torch.sign((ours * theirs).sum())
        torch.testing.assert_close(ours, sign * theirs, rtol=1e-4, atol=1e-4)
        component = vk.targets.pca_component(data.float(), k).vector
        assert component[component.abs().argmax()] > 0  # the sign is fixed


def test_the_embedding_is_read_from_each_librarys_output_type():
    e = torch.randn(2, 4)
    model_output = transformers.modeling_outputs.BaseModelOutputWithPooling(
        last_hidden_state=torch.randn(2, 5, 4), pooler_output=e
    )
    projected = transformers.models.clip.modeling_clip.CLIPVisionModelOutput(image_embeds=e)
    for output in (e, model_output, projected, (e, None, torch.tensor(1.0)), {"image_features": e}):
        assert vk.targets.embedding_of(output) is e
    with pytest.raises(TypeError, match="holds no image embedding"):
        vk.targets.embedding_of({"logits": e})
    with pytest.raises(ValueError, match=r"\(B, N, D\) must be pooled"):
        vk.targets.embedding_of(torch.randn(2, 5, 4))


def test_text_targets_are_cosines_to_the_mean_prompt_embedding():
    model, x = build("open_clip"), images()
    prompts = ["a dog", "a photo of a dog"]
    target = vk.targets.text(model, prompts, tokenizer=char_tokens, versus="a cat")
    with torch.no_grad():
        text = F.normalize(model.encode_text(char_tokens(prompts)), dim=-1).mean(0)
        other = F.normalize(model.encode_text(char_tokens(["a cat"])), dim=-1)[0]
        image = model.encode_image(x)
        expected = F.cosine_similarity(image, text[None]) - F.cosine_similarity(image, other[None])
        torch.testing.assert_close(target(model(x)), expected)
    clip = hf_clip().eval()  # transformers: the tower's embedding against get_text_features
    target = vk.targets.text(clip, "a dog", tokenizer=CharTokenizer())
    with torch.no_grad():
        text = clip.get_text_features(input_ids=char_tokens(["a dog"])).pooler_output
        image = clip.get_image_features(pixel_values=x).pooler_output
        torch.testing.assert_close(
            target(vk.models.image_tower(clip)(x)), F.cosine_similarity(image, text)
        )
    assert target.label == "'a dog'"


def test_zero_shot_takes_what_get_text_features_returns():
    clip, x = hf_clip().eval(), images()
    with torch.no_grad():
        text = clip.get_text_features(input_ids=char_tokens(["a dog", "a cat"]))
    assert not isinstance(text, torch.Tensor)  # a ModelOutput since transformers 5
    logits = vk.models.zero_shot(clip, text)(x)
    assert logits.shape == (3, 2)


# --- every method, metric and check on each library's backbone ---------------------------


def reference(model, seed: int = 5) -> torch.Tensor:
    return vk.targets.embed(model, images(seed=seed))


@pytest.mark.parametrize("kind", list(BACKBONES))
def test_every_method_explains_a_backbone_by_an_embedding_target(kind):
    model, x = build(kind), images()
    target = vk.targets.similar_to(reference(model))  # one reference per image
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, method in vk.methods.METHODS.items():
            try:
                result = method(model, x, target=target)
            except ValueError as error:  # a model without a class token
                assert "class token" in str(error), (name, error)
                assert kind == "siglip", (name, error)
                continue
            assert result.maps.shape[0] == 3 and result.targets is None, name
            assert bool(torch.isfinite(result.maps).all()), name


def kinds_of_target(kind: str, model) -> dict:
    embeddings = reference(model)
    dim = embeddings.shape[-1]
    weight = torch.randn(4, dim, generator=torch.Generator().manual_seed(3))
    targets = {
        "norm": vk.targets.embedding_norm(),
        "similar_to": vk.targets.similar_to(embeddings[0]),
        "pca": vk.targets.pca_component(embeddings),
        "probe": vk.targets.probe(weight, torch.zeros(4), 1),
        "prototypes": vk.targets.prototypes(weight, 2),
        "callable": lambda out: vk.targets.embedding_of(out)[:, 0],
    }
    if kind == "open_clip":
        targets["text"] = vk.targets.text(model, "dog", tokenizer=char_tokens, versus="cat")
    return targets


@pytest.mark.parametrize("kind", ["timm", "dinov2", "open_clip"])
def test_compare_evaluate_and_sanity_check_take_every_kind_of_target(kind):
    model, x = build(kind), images()
    labels = torch.zeros(3, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, target in kinds_of_target(kind, model).items():
            table = vk.compare_saliency(model, x, methods=["saliency", "random"],
                                        target=target, steps=4, progress=False)  # fmt: skip
            assert table.near_chance is None and "score" in table.options, name
            assert bool(torch.isfinite(table.mean).all()), name
            evaluated = vk.evaluate(model, (x, labels), methods=["saliency"], batch_size=2,
                                    targets=target, progress=False)  # fmt: skip
            assert "road_morf_auc" in evaluated.metrics, name
            assert "average_drop" not in evaluated.metrics, name
            assert not evaluated.mean[:, 0].isnan().any(), name
            check = vk.sanity_check(model, x[:2], target=target, progress=False)
            assert check.targets is None and check.maps.shape[0] == len(check.layers), name


@pytest.mark.parametrize("method", ["integrated_gradients", "occlusion", "scorecam",
                                    "ablationcam", "smoothgrad", "gradientshap"])  # fmt: skip
def test_copies_of_an_image_are_scored_against_that_images_own_reference(method):
    """The copies a method makes (steps, noise samples, masked images) keep their image's
    reference: the batch's maps equal each image's alone."""
    model, x = build("timm"), images()
    refs = reference(model)
    batch = vk.methods.METHODS[method](model, x, target=vk.targets.similar_to(refs)).maps
    for i in range(len(x)):
        alone = vk.methods.METHODS[method](model, x[i : i + 1],
                                           target=vk.targets.similar_to(refs[i])).maps  # fmt: skip
        if method in ("smoothgrad", "gradientshap"):  # noise drawn for the whole batch
            assert F.cosine_similarity(batch[i].flatten(), alone[0].flatten(), dim=0) > 0.5
        else:
            torch.testing.assert_close(batch[i], alone[0], rtol=1e-4, atol=1e-6)


def test_deletion_curves_score_each_image_against_its_own_reference():
    model, x = build("dinov2"), images()
    refs = reference(model)
    maps = torch.rand(3, 4, 4, generator=torch.Generator().manual_seed(0))
    target = vk.targets.similar_to(refs)
    batch = vk.metrics.deletion(model, x, maps, target=target, progress=False)
    assert batch.targets is None
    for i in range(3):
        own = vk.targets.similar_to(refs[i])
        alone = vk.metrics.deletion(model, x[i : i + 1], maps[i : i + 1], own, progress=False)
        torch.testing.assert_close(batch.scores[i], alone.scores[0], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the curve starts at the clean image's similarity
        clean = F.cosine_similarity(vk.targets.embed(model, x), refs)
    torch.testing.assert_close(batch.scores[:, 0], clean, rtol=1e-5, atol=1e-6)


# --- refusals, and the fixes they print ----------------------------------------------------


@pytest.mark.parametrize("kind", list(BACKBONES))
def test_a_class_target_on_a_backbone_is_refused_and_the_printed_fixes_run(kind):
    model, x = build(kind), images()
    for target in (None, 3, [0, 1, 2]):
        with pytest.raises(ValueError, match="is a backbone: it returns image embeddings") as info:
            vk.gradcam(model, x, target=target)
    message = str(info.value)
    fixes = re.findall(r"target=(vk\.targets\.embedding_norm\(\)|lambda out: .+?\])", message)
    assert len(fixes) == 2, message
    for fix in fixes:
        result = vk.gradcam(model, x, target=eval(fix, {"vk": vk}))
        assert result.maps.shape[0] == 3
    with pytest.raises(ValueError, match="is a backbone") as info:
        vk.evaluate(model, (x, torch.zeros(3, dtype=torch.long)), methods=["gradcam"],
                    metrics=["deletion_auc"], progress=False)  # fmt: skip
    fix = re.search(r"For example: targets=(vk\.targets\.embedding_norm\(\))", str(info.value))
    table = vk.evaluate(model, (x, torch.zeros(3, dtype=torch.long)), methods=["gradcam"],
                        metrics=["deletion_auc"], targets=eval(fix.group(1), {"vk": vk}),
                        progress=False)  # fmt: skip
    assert not table.mean.isnan().any()


def test_a_clip_model_whose_forward_needs_text_points_at_its_image_tower():
    clip, x = hf_clip().eval(), images()
    for analysis in (vk.attention, vk.gradcam):
        with pytest.raises(TypeError, match=r"vk\.models\.image_tower\(model\)"):
            analysis(clip, x)
    tower = vk.models.image_tower(clip)
    target = vk.targets.text(clip, "a photo of a dog", tokenizer=CharTokenizer())
    assert vk.gradcam(tower, x, target=target).maps.shape == (3, 4, 4)
    assert vk.attention(tower, x).patterns.shape[:2] == (2, 3)


def test_targets_that_differ_by_image_are_refused_over_a_data_set_and_class_metrics_by_name():
    model, x = build("timm"), images()
    data = (x, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="every image needs the same target"):
        vk.evaluate(model, data, targets=vk.targets.similar_to(reference(model)), progress=False)
    with pytest.raises(ValueError, match=r"\['average_drop'\] score a class's probability"):
        vk.evaluate(model, data, metrics=["average_drop"], progress=False,
                    targets=vk.targets.embedding_norm())  # fmt: skip


def test_road_tracks_a_score_target_on_each_image_own_imputed_copies():
    """ROAD (noise 0: the imputation is deterministic) reads the score of each image's own
    imputed copy at each fraction: equal to the embedding norm of that copy computed here."""
    from vizkit.metrics.road import noisy_linear_imputation

    model, x = build("timm"), images()
    maps = torch.rand(3, 4, 4, generator=torch.Generator().manual_seed(2))
    curve = vk.metrics.road(model, x, maps, target=vk.targets.embedding_norm(), noise=0.0,
                            fractions=(0.25, 0.5, 0.75))  # fmt: skip
    pixels = F.interpolate(maps[:, None], size=(32, 32), mode="bilinear")[:, 0].flatten(1)
    order = pixels.argsort(dim=1, descending=True, stable=True).argsort(dim=1)
    for k, share in enumerate((0.25, 0.5, 0.75)):
        removed = (order < round(share * 1024)).view(3, 32, 32)
        imputed = noisy_linear_imputation(x, removed, 0.0, torch.Generator())
        with torch.no_grad():
            expected = model(imputed).norm(dim=-1)
        torch.testing.assert_close(curve.scores[:, k], expected, rtol=1e-4, atol=1e-5)
    assert curve.targets is None
    table = vk.evaluate(model, (x, torch.zeros(3, dtype=torch.long)), methods=["gradcam"],
                        metrics=["road_morf_auc", "road_lerf_auc"], progress=False,
                        targets=vk.targets.embedding_norm())  # fmt: skip
    assert not table.mean.isnan().any()


def test_bad_helper_inputs_are_refused():
    with pytest.raises(ValueError, match=r"floating \(D,\) or \(B, D\)"):
        vk.targets.similar_to(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="out of range"):
        vk.targets.probe(torch.randn(3, 4), None, 3)
    with pytest.raises(ValueError, match="one per class"):
        vk.targets.probe(torch.randn(3, 4), torch.zeros(2), 0)
    with pytest.raises(ValueError, match="dimensions"):
        vk.targets.similar_to(torch.randn(5))(torch.randn(2, 4))
    with pytest.raises(ValueError, match="non-empty string"):
        vk.targets.text(open_clip_model(), "")
    with pytest.raises(TypeError, match="no text tower"):
        vk.targets.text(build("timm"), "a dog")
    rows_unknown = vk.targets.similar_to(torch.randn(4, 4))
    with pytest.raises(ValueError, match="which row is of which image is unknown"):
        rows_unknown(torch.randn(3, 4))  # never silently the first rows


def test_a_resumed_evaluation_refuses_another_score_target(tmp_path):
    """The log records a score target by label and content: a resume with another reference of
    the same label is refused, never answered with the first reference's scores; a plain
    callable, which cannot be checked, is refused with out=."""
    model, x = build("timm"), images()
    data, out = (x, torch.zeros(3, dtype=torch.long)), tmp_path / "log.jsonl"
    first = vk.targets.similar_to(reference(model)[0])
    run = dict(methods=["saliency"], metrics=["deletion_auc"], out=out, progress=False)  # noqa: C408
    table = vk.evaluate(model, data, targets=first, **run)
    again = vk.evaluate(model, data, targets=vk.targets.similar_to(reference(model)[0]), **run)
    torch.testing.assert_close(again.per_image, table.per_image)  # the same target resumes
    with pytest.raises(ValueError, match="targets"):
        vk.evaluate(model, data, targets=vk.targets.similar_to(reference(model)[1]), **run)
    with pytest.raises(ValueError, match="a plain callable cannot be checked"):
        vk.evaluate(model, data, targets=lambda out: out[:, 0], **run)


def test_the_saliency_comparer_explains_a_backbone_through_a_score_target():
    """SaliencyComparer on a backbone: refused without a target (naming the helpers); with a
    per-image reference, each image's maps, ROAD curves and sanity check are of that image's
    own reference, and the evaluation over all images (which needs one target) says why not;
    with the embedding norm, every view draws."""
    from vizkit.widgets import SaliencyComparer

    model, x = build("timm"), images()
    with pytest.raises(ValueError, match=r"backbone.*vk\.targets\.embedding_norm\(\)"):
        SaliencyComparer(model, x, methods=["gradcam"], progress=False)
    ref = reference(model)
    comparer = SaliencyComparer(model, x, methods=["gradcam", "random"], steps=2,
                                progress=False, target=vk.targets.similar_to(ref))  # fmt: skip
    comparer.image.value = 1
    own = vk.gradcam(model, x[1:2], target=vk.targets.similar_to(ref[1:2]))
    torch.testing.assert_close(comparer.table(1).results["gradcam"].maps, own.maps)
    comparer.view.value = "ROAD curves"
    morf = comparer.road_curves(1)["gradcam"][0]
    expected = vk.metrics.road(model, x[1:2], own, target=vk.targets.similar_to(ref[1:2]))
    torch.testing.assert_close(morf.scores, expected.scores)
    comparer.view.value = "sanity check"
    assert "no sanity check" not in comparer.status.value
    comparer.view.value = "all images"
    assert "every image needs the same target" in comparer.status.value
    norm = SaliencyComparer(model, x, methods=["gradcam"], steps=2, progress=False,
                            target=vk.targets.embedding_norm())  # fmt: skip
    norm.view.value = "all images"
    assert norm.status.value == "3 images, the target explained"
    assert not norm.evaluation().mean.isnan().all()


def test_similarity_to_a_region_of_the_same_image():
    """The region's embedding is the model's embedding of the crop resized back (torchvision's
    resize computed here); the whole image as its own region scores 1; maps of the target are
    each image's own; a box outside the image is refused."""
    from torchvision.transforms.functional import resize

    model, x = build("timm"), images()
    crops = resize(x[..., 8:24, 4:20], [32, 32], antialias=True)
    with torch.no_grad():
        expected = model(crops)
    torch.testing.assert_close(vk.targets.region(model, x, (8, 4, 16, 16)), expected)
    whole = vk.targets.similar_to_region(model, x, (0, 0, 32, 32))
    with torch.no_grad():
        torch.testing.assert_close(whole(model(x), torch.arange(3)), torch.ones(3))
    target = vk.targets.similar_to_region(model, x, (8, 4, 16, 16))
    assert target.label == "similarity to region (8, 4, 16, 16)"
    alone = vk.gradcam(model, x[2:], target=vk.targets.similar_to(expected[2:]))
    torch.testing.assert_close(vk.gradcam(model, x, target=target).maps[2:], alone.maps)
    for box in [(0, 0, 33, 8), (-1, 0, 4, 4), (0, 0, 0, 4), (0, 0, 4)]:
        with pytest.raises(ValueError, match="box"):
            vk.targets.region(model, x, box)


def test_patching_and_ablation_score_a_probe_as_the_same_head_scores_its_class():
    """Activation patching and ablation on a backbone with a linear-probe target (one class per
    image, so each patched copy must be scored against its own image's class) equal the same
    views on the model whose head is that probe, scoring the class logits."""
    import copy

    torch.manual_seed(0)
    classifier = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32,
                                   patch_size=8, depth=2).eval()  # fmt: skip
    backbone = copy.deepcopy(classifier)
    backbone.reset_classifier(0)
    x, corrupted, classes = images(), images(seed=7), torch.tensor([3, 7, 1])
    probe = vk.targets.probe(classifier.head.weight, classifier.head.bias, classes)
    for view, args in ((vk.activation_patching, (x, corrupted)), (vk.ablation, (x,))):
        with_head = view(classifier, *args, target=classes, progress=False)
        on_probe = view(backbone, *args, target=probe, progress=False)
        assert on_probe.targets is None
        for name in ("resid", "attn", "mlp", "heads", "change", "clean_score", "score"):
            if getattr(with_head, name, None) is not None:
                torch.testing.assert_close(getattr(on_probe, name), getattr(with_head, name),
                                           rtol=1e-4, atol=1e-5, msg=name)  # fmt: skip


def test_class_logit_views_refuse_a_backbone_and_their_printed_fixes_run():
    from vizkit.widgets import MechanisticExplorer

    x, corrupted = images(), images(seed=7)
    for kind in ("timm", "dinov2"):
        model = build(kind)
        for view in (vk.logit_lens, vk.direct_logit_attribution, MechanisticExplorer):
            with pytest.raises(ValueError, match="is a backbone") as refused:
                view(model, x)
            fixes = re.findall(
                r"(vk\.(?:ablation|activation_patching)\(.*?\)\))", str(refused.value)
            )
            assert len(fixes) == 2, refused.value
            for fix in fixes:
                result = eval(fix, {"vk": vk, "model": model, "x": x, "corrupted": corrupted})
                assert result.targets is None and result.options, fix
        with pytest.raises(ValueError, match="versus= subtracts a second class"):
            vk.ablation(model, x, target=vk.targets.embedding_norm(), versus=2)
        with pytest.raises(ValueError, match="Leave labels out"):
            vk.ablation(model, x, target=vk.targets.embedding_norm(), labels=torch.zeros(3).long())
