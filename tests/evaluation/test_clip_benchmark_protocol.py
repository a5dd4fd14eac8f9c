"""`--protocol clip_benchmark` on miniature copies of the paper's datasets: CLIP_benchmark 1.6.2's
definitions (SUN397 and Caltech101 whole, Caltech101's background class, its class names), the
original's templates and splits elsewhere, top-1 as the headline and its result form."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert read_paper_dataset(find_paper_dataset("cifar100"), tmp_path)[0].classnames == load_metadata("cifar100")[0]

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
    assert CLIP_BENCHMARK_NAMES["stanford_car"] == "cars" and CLIP_BENCHMARK_NAMES["aircraft"] == "fgvc_aircraft"


def test_evaluation_reports_top1_and_clip_benchmarks_form(tmp_path):
    layouts.write_pets(tmp_path, every_breed=True)
    model = layouts.micro_model()
    spec = f"pets={tmp_path}"
    result = evaluate_classification(model, spec, 32, "cpu", batch_size=16, protocol="clip_benchmark")
    assert result["protocol"] == "clip_benchmark" and result["num_classes"] == 37 and result["num_images"] == 37
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
    rc = zero_shot_cli.main(["--model-name", str(config), "--random-init", "--device", "cpu", "--workers", "0",
                             "--no-progress", "--wkv-impl", "reference", "--protocol", "clip_benchmark",
                             "--datasets", f"sun397={tmp_path / 'data'}", "--output-dir", str(tmp_path / "out")])
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
