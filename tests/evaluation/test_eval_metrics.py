"""Zero-shot metrics against hand-computed examples and brute force, the original protocol's
integer logits, result files and the bundled metadata."""

import json

import numpy as np
import pytest
import torch

from src.evaluation.results import format_table, write_result
from src.open_alip.zero_shot import (
    class_logits,
    classification_metrics,
    list_metadata,
    load_metadata,
    prediction_metrics,
    retrieval_metrics,
    top_predictions,
)


def test_classification_metrics_by_hand():
    # 5 samples, 6 classes. Rows give the score order explicitly.
    logits = torch.tensor(
        [
            [9, 8, 7, 6, 5, 0],  # target 0: top-1 hit
            [9, 8, 7, 6, 5, 0],  # target 1: top-5 hit only
            [0, 1, 2, 3, 4, 9],  # target 5: top-1 hit
            [0, 1, 2, 3, 4, 9],  # target 0: top-5 miss (0 is ranked 6th)
            [1, 9, 0, 0, 0, 0],  # target 1: top-1 hit
        ],
        dtype=torch.float32,
    )
    targets = torch.tensor([0, 1, 5, 0, 1])
    m = classification_metrics(logits, targets)
    assert m["top1"] == pytest.approx(60.0)
    assert m["top5"] == pytest.approx(80.0)
    # per-class recall: class 0: 1/2, class 1: 1/2, class 5: 1/1 -> mean over present classes
    assert m["mean_per_class_recall"] == pytest.approx(100 * (0.5 + 0.5 + 1.0) / 3)


def test_retrieval_metrics_by_hand():
    # Images 0..2 along axes; captions: 0,1 -> image 0; 2,3 -> image 1; 4,5 -> image 2.
    images = torch.eye(3)
    texts = torch.tensor(
        [
            [1.0, 0.0, 0.0],  # cap0 (img0): best image 0                 -> rank 0
            [0.2, 0.9, 0.0],  # cap1 (img0): image 1 scores higher       -> rank 1
            [0.0, 0.3, 0.0],  # cap2 (img1): best image 1                 -> rank 0
            [0.5, 0.1, 0.4],  # cap3 (img1): images 0 and 2 score higher -> rank 2
            [0.0, 0.0, 0.7],  # cap4 (img2): rank 0
            [0.1, 0.0, 0.05],  # cap5 (img2): image 0 scores higher       -> rank 1
        ]
    )
    owner = [0, 0, 1, 1, 2, 2]
    m = retrieval_metrics(images, texts, owner, ks=(1, 2, 5))
    # text->image ranks: [0, 1, 0, 2, 0, 1]
    assert m["text_to_image_R@1"] == pytest.approx(100 * 3 / 6)
    assert m["text_to_image_R@2"] == pytest.approx(100 * 5 / 6)
    assert m["text_to_image_R@5"] == pytest.approx(100.0)
    # image->text: image 0 column scores [1, .2, 0, .5, 0, .1]: best own caption cap0 -> rank 0
    # image 1 column [0, .9, .3, .1, 0, 0]: best own cap2 (.3) beaten by cap1 (.9) -> rank 1
    # image 2 column [0, 0, 0, .4, .7, .05]: best own cap4 (.7) -> rank 0
    assert m["image_to_text_R@1"] == pytest.approx(100 * 2 / 3)
    assert m["image_to_text_R@2"] == pytest.approx(100.0)
    assert m["mean_recall"] == pytest.approx(sum(v for k, v in m.items() if "R@" in k) / 6)


def test_retrieval_metrics_chunked_equals_unchunked():
    g = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(37, 8, generator=g), dim=1)
    texts = torch.nn.functional.normalize(torch.randn(37 * 5, 8, generator=g), dim=1)
    owner = torch.arange(37).repeat_interleave(5)
    assert retrieval_metrics(images, texts, owner, chunk=7) == retrieval_metrics(
        images, texts, owner, chunk=4096
    )


def test_bundled_metadata():
    names, templates = load_metadata("imagenet")  # the original's name for imagenet1k
    assert len(names) == 1000 and len(templates) == 80
    assert names[0] == "tench" and names[-1] == "toilet paper"
    assert len(set(templates)) == 80 and all("{}" in t for t in templates)
    for dataset, count in {
        "cifar10": 10,
        "cifar100": 100,
        "food101": 101,
        "pets": 37,
        "flowers": 102,
    }.items():
        names, templates = load_metadata(dataset)
        assert len(names) == count and templates
    assert load_metadata("no-such-dataset") == (None, None)
    assert {"imagenet1k", "cifar10", "cifar100", "sun397", "dtd"} <= set(list_metadata())


def test_write_result_and_table(tmp_path):
    result = {
        "dataset": "../evil/name",
        "task": "classification",
        "chance_top1": 10.0,
        "metrics": {"top1": 55.5, "top5": 90.0},
        "predictions": [1, 2],
    }
    path = write_result(result, tmp_path)
    assert path.parent == tmp_path and path.name == "classification_evil_name.json"
    saved = json.loads(path.read_text())
    assert saved["metrics"]["top1"] == 55.5 and "predictions" not in saved
    table = format_table([result, {"dataset": "b", "task": "retrieval", "metrics": {"mean_recall": 1.0}}])
    lines = table.splitlines()
    assert lines[0].split() == ["dataset", "top1", "top5", "mean_recall", "chance_top1"]
    assert lines[2].split()[1:] == ["55.50", "90.00", "-", "10.00"]


# ---------------------------------------------------------------------------------------------
# the original protocol's integer logits, one test per metric, and retrieval ranks by position


def _unit(angle_deg: float) -> torch.Tensor:
    import math

    a = math.radians(angle_deg)
    return torch.tensor([math.cos(a), math.sin(a)])


def test_integer_logits_truncate_toward_zero():
    image = _unit(0.0)[None]
    classes = torch.stack(
        [_unit(a) for a in (74.985, 75.5, 90.4, 180.0)], dim=1
    )  # cos: .2589, .2504, -.007, -1
    float_logits = class_logits(image, classes)
    int_logits = class_logits(image, classes, integer=True)
    assert int_logits.dtype == torch.int64
    assert -1 < float_logits[0, 2] < 0 and float_logits[0, 3] == pytest.approx(-100)
    assert int_logits.tolist() == [[25, 25, 0, -100]]  # toward zero: -0.7 -> 0, not -1
    assert float_logits[0, 0] > float_logits[0, 1]  # class 0 wins with floats, ties with integers


def test_top1_of_tied_integer_logits_is_cpus_topk():
    # The original ranks its int64 logits with CPU topk(1, 1, True, True); keep that op for ties.
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-2, 3, (64, 10), generator=g)
    top1, top5 = top_predictions(logits)
    assert torch.equal(top1, logits.topk(1, 1, True, True).indices[:, 0])
    assert torch.equal(top5, logits.topk(5, 1, True, True).indices)
    targets = torch.randint(0, 10, (64,), generator=g)
    m = prediction_metrics(top1, top5, targets, 10)
    assert m["top1"] == pytest.approx(100 * (top1 == targets).float().mean().item())


def test_top5_metric():
    top1 = torch.tensor([0, 1, 2])
    top5 = torch.tensor([[0, 1, 2, 3, 4], [1, 0, 2, 3, 4], [2, 9, 8, 7, 6]])
    assert prediction_metrics(top1, top5, torch.tensor([4, 5, 2]), 10)["top5"] == pytest.approx(100 * 2 / 3)


def test_mean_per_class_metric_weighs_classes_not_images():
    # class 0: 9 images all right; class 1: 1 image wrong -> top-1 90%, mean per class 50%
    targets = torch.tensor([0] * 9 + [1])
    top1 = torch.zeros(10, dtype=torch.long)
    m = prediction_metrics(top1, top1[:, None], targets, 3)  # class 2 has no image: left out
    assert m["top1"] == pytest.approx(90.0) and m["mean_per_class_recall"] == pytest.approx(50.0)


def _stable_ranks(image_emb, text_emb, owner):
    """Brute force: argsort each query's scores (stable, descending) and find the positions."""
    sim = image_emb @ text_emb.t()
    i2t = []
    for i in range(sim.shape[0]):
        order = torch.sort(sim[i], descending=True, stable=True).indices.tolist()
        i2t.append(min(order.index(j) for j in range(len(owner)) if owner[j] == i))
    t2i = []
    for j in range(sim.shape[1]):
        order = torch.sort(sim[:, j], descending=True, stable=True).indices.tolist()
        t2i.append(order.index(owner[j]))
    return torch.tensor(i2t), torch.tensor(t2i)


def test_retrieval_ranks_are_positions_with_ties_in_dataset_order():
    # Coarse embeddings make many exact ties; compare with a stable argsort, K by K.
    g = torch.Generator().manual_seed(3)
    images = torch.randint(-1, 2, (9, 3), generator=g).float()
    texts = torch.randint(-1, 2, (27, 3), generator=g).float()
    owner = torch.arange(9).repeat_interleave(3)[torch.randperm(27, generator=g)]
    i2t, t2i = _stable_ranks(images, texts, owner.tolist())
    m = retrieval_metrics(images, texts, owner, ks=(1, 2, 5), chunk=4)
    for k in (1, 2, 5):
        assert m[f"image_to_text_R@{k}"] == pytest.approx(100 * (i2t < k).float().mean().item())
        assert m[f"text_to_image_R@{k}"] == pytest.approx(100 * (t2i < k).float().mean().item())


def test_identical_captions_do_not_all_rank_first():
    # 12 images whose captions are the same text: a query can have only one caption at position 0.
    images = torch.nn.functional.normalize(
        torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), dim=1
    )
    texts = torch.nn.functional.normalize(torch.ones(12, 4), dim=1)
    m = retrieval_metrics(images, texts, torch.arange(12), ks=(1, 12))
    assert m["image_to_text_R@1"] == pytest.approx(100 / 12)  # only image 0's caption comes first
    assert m["image_to_text_R@12"] == 100.0


def test_duplicate_captions_and_images_follow_the_position_rule():
    # 8 images x 12 captions whose texts repeat: caption j is text j % 12, so every image owns one copy of
    # each of the 12 texts (96 candidates per image query, past the size where CPU argsort/topk order ties
    # arbitrarily). Rule: among equal scores the candidate listed first ranks first. The best own caption of
    # image i is the copy of its best text at index 12 i + b; the copies at b, 12 + b, ... come before it,
    # so image i ranks at position i exactly.
    g = torch.Generator().manual_seed(4)
    texts = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=1).repeat(8, 1)
    images = torch.nn.functional.normalize(torch.randn(8, 8, generator=g), dim=1)
    images[6:] = images[:2]  # images 6 and 7 repeat images 0 and 1: text queries tie on them
    owner = torch.arange(8).repeat_interleave(12)
    m = retrieval_metrics(images, texts, owner, ks=(1, 5, 8))
    assert [m[f"image_to_text_R@{k}"] for k in (1, 5, 8)] == pytest.approx([100 / 8, 500 / 8, 100.0])
    # both directions equal a stable descending sort (numpy's stable argsort of the negated scores too)
    i2t, t2i = _stable_ranks(images, texts, owner.tolist())
    sim = (texts @ images.t()).numpy()
    numpy_t2i = [list(np.argsort(-sim[j], kind="stable")).index(int(owner[j])) for j in range(96)]
    assert t2i.tolist() == numpy_t2i
    for k in (1, 5, 8):
        assert m[f"text_to_image_R@{k}"] == pytest.approx(100 * (t2i < k).float().mean().item())
    # a caption of image 6 ties with image 0, listed first: it can never rank first
    assert (t2i[owner == 6] >= 1).all() and (t2i[owner == 7] >= 1).all()
