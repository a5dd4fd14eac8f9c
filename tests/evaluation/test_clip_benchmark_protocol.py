"""`--protocol clip_benchmark` on miniature copies of the paper's datasets: CLIP_benchmark 1.6.2's
definitions (SUN397 and Caltech101 whole, Caltech101's background class, its class names), the
original's templates and splits elsewhere, top-1 as the headline and its result form."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import zero_shot as zero_shot_cli
from src.evaluation.clip_benchmark_protocol import CLIP_BENCHMARK_NAMES, read_clip_benchmark_dataset
from src.evaluation.datasets import EvalDataError
from src.evaluation.paper_datasets import PAPER_DATASETS, find_paper_dataset, read_paper_dataset
from src.evaluation.run import evaluate_classification
from src.evaluation.specs import load_classification_data
from src.open_alip.model import get_model_config
from src.open_alip.zero_shot import load_metadata
from tests import _eval_layouts as layouts


def _read(name: str, path: Path):
    return read_clip_benchmark_dataset(find_paper_dataset(name), path)


def test_sun397_is_every_image_with_spaced_names(tmp_path):
    paths, labels = layouts.write_sun397(tmp_path, per_class=5, all_classes=True)
    data, templates = _read("sun397", tmp_path)
    assert data.images == paths and data.labels == labels  # all 20, no split
    assert data.classnames[:4] == ["abbey", "apartment building outdoor", "bakery shop", "youth hostel"]
    assert len(data.classnames) == 397 and data.classnames[4] == "zz scene 000"
    assert templates == load_metadata("sun397")[1]


def test_caltech101_keeps_the_background_class_and_every_image(tmp_path):
    listing = layouts.write_caltech101(tmp_path, total=202)  # 2 images per class, 1 background image
    data, _ = _read("caltech101", tmp_path)
    background = tmp_path / "caltech101" / "101_ObjectCategories" / "BACKGROUND_Google" / "image_0001.jpg"
    assert data.images == [background] + [p for p, _ in listing]
    assert data.labels == [0] + [label + 1 for _, label in listing]
    assert len(data.classnames) == 102 and data.classnames[0] == "background"
    assert data.classnames[1:] == load_metadata("caltech101")[0]
    # the original's definition needs its 8,677-image split; this tree is refused there
    with pytest.raises(EvalDataError, match="the split"):
        read_paper_dataset(find_paper_dataset("caltech101"), tmp_path)


def test_pets_names_come_from_the_split_file_without_the_typos(tmp_path):
    paths, labels = layouts.write_pets(tmp_path, every_breed=True)
    data, _ = _read("pets", tmp_path)
    assert data.images == paths and data.labels == labels
    original = load_metadata("pets")[0]
    assert "Persian'" in original and "Yorkshire Terrie" in original
    assert data.classnames[23] == "Persian" and data.classnames[36] == "Yorkshire Terrier"
    assert data.classnames[2] == "American Pit Bull Terrier" and data.classnames[9] == "British Shorthair"
    typos = {i for i, (a, b) in enumerate(zip(original, data.classnames)) if a != b}
    assert typos == {23, 36}


def test_pets_with_a_partial_split_file_is_one_line(tmp_path):
    layouts.write_pets(tmp_path)  # three breeds only
    with pytest.raises(EvalDataError, match=r"names images of 3 of the 37 breeds") as info:
        _read("pets", tmp_path)
    assert "\n" not in str(info.value)


def test_class_names_as_the_dataset_files_spell_them(tmp_path):
    names = [f"fine_name_{i}" for i in range(100)]
    layouts.write_cifar(tmp_path, "cifar100", [5, 99], names=names)
    data, _ = _read("cifar100", tmp_path)
    assert data.classnames == names and data.labels == [5, 99]  # underscores kept, as torchvision's classes
    assert (
        read_paper_dataset(find_paper_dataset("cifar100"), tmp_path)[0].classnames
        == load_metadata("cifar100")[0]
    )

    paths, labels = layouts.write_food101(tmp_path)
    data, _ = _read("food101", tmp_path)
    assert data.images == paths and data.labels == labels
    assert data.classnames[:2] == ["apple pie", "dish 000"] and data.classnames[-1] == "waffles"

    layouts.write_dtd(tmp_path)
    assert _read("dtd", tmp_path)[0].classnames[:3] == ["banded", "lined", "texture00"]
    layouts.write_stanford_cars(tmp_path)
    assert _read("stanford_car", tmp_path)[0].classnames[195] == "Car Model 195 2012"
    layouts.write_aircraft(tmp_path)
    assert _read("aircraft", tmp_path)[0].classnames[-2:] == ["Cessna 172", "DHC-1"]
    paths, labels = layouts.write_flowers(tmp_path)
    data, _ = _read("flowers", tmp_path)
    assert data.images == paths and data.classnames == load_metadata("flowers")[0]


def test_every_paper_dataset_has_a_clip_benchmark_name():
    assert set(CLIP_BENCHMARK_NAMES) == set(PAPER_DATASETS)
    assert (
        CLIP_BENCHMARK_NAMES["stanford_car"] == "cars" and CLIP_BENCHMARK_NAMES["aircraft"] == "fgvc_aircraft"
    )


def test_evaluation_reports_top1_and_clip_benchmarks_form(tmp_path):
    layouts.write_pets(tmp_path, every_breed=True)
    model = layouts.micro_model()
    spec = f"pets={tmp_path}"
    result = evaluate_classification(model, spec, 32, "cpu", batch_size=16, protocol="clip_benchmark")
    assert (
        result["protocol"] == "clip_benchmark" and result["num_classes"] == 37 and result["num_images"] == 37
    )
    assert result["metric"] == "top1" and result["score"] == result["metrics"]["top1"]
    form = result["clip_benchmark_metrics"]
    assert form["acc1"] == pytest.approx(result["metrics"]["top1"] / 100)
    assert form["mean_per_class_recall"] == pytest.approx(result["metrics"]["mean_per_class_recall"] / 100)
    data, _ = load_classification_data(spec, "clip_benchmark")
    assert data.classnames[36] == "Yorkshire Terrier"
    standard = evaluate_classification(model, spec, 32, "cpu", batch_size=16, protocol="standard")
    assert standard["metric"] == "mean_per_class_recall" and "clip_benchmark_metrics" not in standard


def test_zero_shot_cli_takes_the_protocol(tmp_path, capsys):
    layouts.write_sun397(tmp_path / "data", per_class=2, all_classes=True)
    config = tmp_path / "micro.json"
    config.write_text(json.dumps(get_model_config("RWKV_CLIP_tiny", **layouts.MICRO)))
    rc = zero_shot_cli.main(
        [
            "--model-name",
            str(config),
            "--random-init",
            "--device",
            "cpu",
            "--workers",
            "0",
            "--no-progress",
            "--wkv-impl",
            "reference",
            "--protocol",
            "clip_benchmark",
            "--datasets",
            f"sun397={tmp_path / 'data'}",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    saved = json.loads((tmp_path / "out" / "classification_sun397.json").read_text())
    assert saved["protocol"] == "clip_benchmark" and saved["num_images"] == 8 and saved["metric"] == "top1"


def test_retrieval_is_the_standard_one_with_clip_benchmarks_form(tmp_path):
    from PIL import Image

    from src.evaluation.run import evaluate_retrieval

    entries = []
    for i, colour in enumerate([(250, 0, 0), (0, 250, 0), (0, 0, 250)]):
        Image.new("RGB", (20, 12), colour).save(tmp_path / f"{i}.jpg")
        entries.append({"image": f"{i}.jpg", "caption": [f"colour {i}", f"picture {i}"]})
    (tmp_path / "test.json").write_text(json.dumps(entries))
    model = layouts.micro_model()
    ours = evaluate_retrieval(model, f"set={tmp_path / 'test.json'}", 32, "cpu", protocol="clip_benchmark")
    standard = evaluate_retrieval(model, f"set={tmp_path / 'test.json'}", 32, "cpu", protocol="standard")
    assert ours["protocol"] == "clip_benchmark" and ours["metrics"] == standard["metrics"]
    form = ours["clip_benchmark_metrics"]
    assert form["image_retrieval_recall@5"] == ours["metrics"]["text_to_image_R@5"] / 100
    assert form["text_retrieval_recall@1"] == ours["metrics"]["image_to_text_R@1"] / 100 and len(form) == 6


def _clip_benchmark_annotations(root: Path) -> dict:
    """CLIP_benchmark's two retrieval annotation files in their layouts, with their images: COCO's
    caption JSON (images listed out of id order, a seventh caption, captions interleaved across
    images) and Flickr's IMAGE.jpg,caption text (a caption holding a comma)."""
    from PIL import Image

    (root / "val2014").mkdir(parents=True)
    for i, colour in enumerate([(250, 0, 0), (0, 250, 0), (0, 0, 250)]):
        Image.new("RGB", (20, 12), colour).save(root / "val2014" / f"COCO_val2014_{i:012d}.jpg")
        Image.new("RGB", (12, 20), colour).save(root / f"{1000 + i}.jpg")
    coco = {
        "images": [
            {"id": 7, "file_name": "COCO_val2014_000000000002.jpg"},
            {"id": 3, "file_name": "COCO_val2014_000000000000.jpg"},
            {"id": 5, "file_name": "COCO_val2014_000000000001.jpg"},
        ],
        "annotations": [
            {"image_id": 5, "id": 1, "caption": "green one"},
            {"image_id": 3, "id": 2, "caption": "red one"},
            {"image_id": 7, "id": 3, "caption": "blue one"},
            {"image_id": 3, "id": 4, "caption": "red two"},
            *({"image_id": 5, "id": 10 + k, "caption": f"green {k}"} for k in range(6)),
        ],
    }
    (root / "coco_test_karpathy.json").write_text(json.dumps(coco))
    (root / "flickr30k_test_karpathy.txt").write_text(
        "image,caption\n1001.jpg,a green, bright picture\n1000.jpg,red\n1001.jpg,green again\n\n"
        "1002.jpg,blue\n"
    )
    return coco


def test_retrieval_reads_clip_benchmarks_own_annotation_files(tmp_path):
    from src.evaluation.run import evaluate_retrieval
    from src.evaluation.specs import load_retrieval_data

    _clip_benchmark_annotations(tmp_path)
    # COCO: images by id (3, 5, 7), each with every caption in the file's order (CocoCaptions).
    coco = load_retrieval_data(f"coco={tmp_path / 'coco_test_karpathy.json'}")
    assert [p.name for p in coco.images] == [f"COCO_val2014_{i:012d}.jpg" for i in range(3)]
    assert coco.captions == ["red one", "red two", "green one", *(f"green {k}" for k in range(6)), "blue one"]
    assert coco.caption_image == [0, 0, *[1] * 7, 2]
    # Flickr: images in order of first appearance, the text after ".jpg," whole.
    flickr = load_retrieval_data(f"flickr={tmp_path / 'flickr30k_test_karpathy.txt'}")
    assert [p.name for p in flickr.images] == ["1001.jpg", "1000.jpg", "1002.jpg"]
    assert flickr.captions == ["a green, bright picture", "green again", "red", "blue"]
    assert flickr.caption_image == [0, 0, 1, 2]
    # Its --dataset_root: the annotation file in it is read under the clip_benchmark protocol.
    (tmp_path / "coco").mkdir()
    (tmp_path / "coco" / "coco_test_karpathy.json").write_text(
        (tmp_path / "coco_test_karpathy.json").read_text()
    )
    shutil.copytree(tmp_path / "val2014", tmp_path / "coco" / "val2014")
    folder = load_retrieval_data(f"coco={tmp_path / 'coco'}", protocol="clip_benchmark")
    assert folder.captions == coco.captions and [p.name for p in folder.images] == [
        p.name for p in coco.images
    ]
    result = evaluate_retrieval(
        layouts.micro_model(), f"coco={tmp_path / 'coco'}", 32, "cpu", protocol="clip_benchmark"
    )
    assert (result["num_images"], result["num_captions"]) == (3, 10) and "clip_benchmark_metrics" in result
    bad = tmp_path / "bad.txt"
    bad.write_text("image,caption\n1000.png,red\n")
    with pytest.raises(EvalDataError, match=r"bad.txt, line 2: expected IMAGE.jpg,caption"):
        load_retrieval_data(f"bad={bad}")


def test_flowers_says_when_clip_benchmark_would_shift_its_labels(tmp_path):
    from scipy.io import savemat

    layouts.write_flowers(tmp_path)  # test ids 4, 2, 6; image 4 of class 77: no shift
    model = layouts.micro_model()
    plain = evaluate_classification(model, f"flowers={tmp_path}", 32, "cpu", protocol="clip_benchmark")
    assert "notices" not in plain
    savemat(
        tmp_path / "flowers-102" / "imagelabels.mat",
        {"labels": np.array([[5, 102, 1, 2, 1, 40]], dtype=np.uint8)},
    )  # image 4 now of class 2: label 1
    shifted = evaluate_classification(model, f"flowers={tmp_path}", 32, "cpu", protocol="clip_benchmark")
    assert shifted["notices"] and "subtracts one from every label" in shifted["notices"][0]
    data, _ = load_classification_data(f"flowers={tmp_path}", "clip_benchmark")
    assert data.labels == [1, 101, 39]  # ours: the file's labels minus one, never shifted again


def test_clip_benchmark_eval_skips_an_unreadable_image_inside_its_loader(tmp_path):
    # CLIP_benchmark's datasets (torchvision's classes) cannot be imported here (no torchvision), so a
    # dataset that opens its images as they do (PIL, inside the DataLoader's worker processes) stands in.
    import torch
    from PIL import Image

    from src.evaluation.clip_bench import ClipBenchmarkError, skipped_items, skipping_unreadable

    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.jpg")
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(paths[-1])
    paths[2].write_bytes(paths[2].read_bytes()[:200])  # truncated

    class Folder:  # torchvision's ImageFolder in miniature: samples, PIL in __getitem__
        classes = ["dark", "light"]

        def __init__(self, samples):
            self.samples = samples

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, label = self.samples[i]
            image = Image.open(path).convert("RGB")
            return torch.from_numpy(np.asarray(image).copy()).float().mean(), label

    cli = type(
        "cli",
        (),
        {
            "build_dataset": staticmethod(lambda **kw: Folder([(p, i % 2) for i, p in enumerate(paths)])),
            "get_dataset_collate_fn": staticmethod(lambda name: torch.utils.data.default_collate),
        },
    )
    original = cli.build_dataset
    with skipping_unreadable(cli) as notes:
        dataset = cli.build_dataset(dataset_name="x")
        assert dataset.classes == ["dark", "light"] and len(dataset) == 5  # its attributes pass through
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=2, num_workers=2, collate_fn=cli.get_dataset_collate_fn("x")
        )
        labels = [int(t) for _, target in loader for t in target]
        assert labels == [0, 1, 1, 0]  # item 2 left out
        assert skipped_items(notes) == [{"image": str(paths[2]), "error": skipped_items(notes)[0]["error"]}]
        assert "truncated" in skipped_items(notes)[0]["error"].lower()  # PIL: "OSError: Truncated File Read"
        with pytest.raises(ClipBenchmarkError, match="none of the 1 images of a batch could be read"):
            cli.get_dataset_collate_fn("x")([None])
    assert cli.build_dataset is original and not notes.exists()  # put back, notes removed
