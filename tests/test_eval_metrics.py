"""Zero-shot metrics against hand-computed examples, result files and the bundled metadata."""


import json

import pytest
import torch

from src.evaluation.run import (
    format_table,
    write_result,
)
from src.open_alip.zero_shot import classification_metrics, list_metadata, load_metadata, retrieval_metrics


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
    assert retrieval_metrics(images, texts, owner, chunk=7) == retrieval_metrics(images, texts, owner, chunk=4096)


def test_bundled_metadata():
    names, templates = load_metadata("imagenet")  # the original's name for imagenet1k
    assert len(names) == 1000 and len(templates) == 80
    assert names[0] == "tench" and names[-1] == "toilet paper"
    assert len(set(templates)) == 80 and all("{}" in t for t in templates)
    for dataset, count in {"cifar10": 10, "cifar100": 100, "food101": 101, "pets": 37, "flowers": 102}.items():
        names, templates = load_metadata(dataset)
        assert len(names) == count and templates
    assert load_metadata("no-such-dataset") == (None, None)
    assert {"imagenet1k", "cifar10", "cifar100", "sun397", "dtd"} <= set(list_metadata())


def test_write_result_and_table(tmp_path):
    result = {"dataset": "../evil/name", "task": "classification", "chance_top1": 10.0,
              "metrics": {"top1": 55.5, "top5": 90.0}, "predictions": [1, 2]}
    path = write_result(result, tmp_path)
    assert path.parent == tmp_path and path.name == "classification_evil_name.json"
    saved = json.loads(path.read_text())
    assert saved["metrics"]["top1"] == 55.5 and "predictions" not in saved
    table = format_table([result, {"dataset": "b", "task": "retrieval", "metrics": {"mean_recall": 1.0}}])
    lines = table.splitlines()
    assert lines[0].split() == ["dataset", "top1", "top5", "mean_recall", "chance_top1"]
    assert lines[2].split()[1:] == ["55.50", "90.00", "-", "10.00"]
