"""Evaluation dataset readers on small generated fixtures in each on-disk format, and the eval
preprocessing (shorter-side bicubic resize, centre crop, CLIP normalisation)."""

import csv
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.evaluation.datasets import (
    EvalDataError,
    preprocess_batch,
    read_caption_json,
    read_cifar,
    read_image_folder,
    read_imagenet_val,
    read_karpathy,
    read_manifest_classification,
    read_manifest_retrieval,
)
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from src.open_alip.transform import preprocess_pil, preprocess_tensor


def _save(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def _folder_tree(root: Path) -> dict[str, list[Path]]:
    tree = {"b_dog": [], "a_cat": [], "c_red_fox": []}
    for i, cls in enumerate(sorted(tree)):
        for j in range(2):
            tree[cls].append(_save(root / cls / f"{j}.png", (80 * i, 10 * j, 0)))
    (root / "a_cat" / "notes.txt").write_text("not an image")
    return tree


def test_image_folder_uses_sorted_folders_and_pretty_names(tmp_path):
    _folder_tree(tmp_path)
    data = read_image_folder(tmp_path)
    assert data.classnames == ["a cat", "b dog", "c red fox"]
    assert data.labels == [0, 0, 1, 1, 2, 2]
    assert [p.parent.name for p in data.images] == [
        "a_cat",
        "a_cat",
        "b_dog",
        "b_dog",
        "c_red_fox",
        "c_red_fox",
    ]


def test_image_folder_class_name_files(tmp_path):
    root = tmp_path / "tree"
    _folder_tree(root)
    ordered = tmp_path / "names.txt"
    ordered.write_text("cat\ndog\nfox\n")
    assert read_image_folder(root, ordered).classnames == ["cat", "dog", "fox"]
    keyed = tmp_path / "mapping.txt"  # LOC_synset_mapping.txt shape: folder, space, name
    keyed.write_text("c_red_fox red fox, Vulpes vulpes\nb_dog dog\na_cat tabby cat\n")
    assert read_image_folder(root, keyed).classnames == ["tabby cat", "dog", "red fox, Vulpes vulpes"]
    as_json = tmp_path / "names.json"
    as_json.write_text(json.dumps({"a_cat": "kitty", "b_dog": "puppy", "c_red_fox": "fox"}))
    assert read_image_folder(root, as_json).classnames == ["kitty", "puppy", "fox"]
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("only\ntwo\n")
    with pytest.raises(EvalDataError, match="2 names for 3 class folders"):
        read_image_folder(root, wrong)


def test_image_folder_missing_or_empty(tmp_path):
    with pytest.raises(EvalDataError, match="does not exist"):
        read_image_folder(tmp_path / "nope")
    with pytest.raises(EvalDataError, match="no class sub-folders"):
        read_image_folder(tmp_path)


def test_imagenet_val_synset_folders(tmp_path):
    for i, syn in enumerate(["n02", "n01", "n03"]):
        _save(tmp_path / syn / f"ILSVRC2012_val_{i}.JPEG", (i, i, i))
    data = read_imagenet_val(tmp_path, ["first", "second", "third"])
    assert data.classnames == ["first", "second", "third"]
    assert [(p.parent.name, label) for p, label in zip(data.images, data.labels)] == [
        ("n01", 0),
        ("n02", 1),
        ("n03", 2),
    ]
    with pytest.raises(EvalDataError, match="3 synset folders, expected 2"):
        read_imagenet_val(tmp_path, ["a", "b"])


def test_imagenet_val_flat_with_solution_csv(tmp_path):
    val = tmp_path / "val"
    rows = [
        ("ILSVRC2012_val_00000002", "n09 1 2 3 4"),
        ("ILSVRC2012_val_00000001", "n01 5 6 7 8 n01 1 1 1 1"),
    ]
    for image_id, _ in rows:
        _save(val / f"{image_id}.JPEG", (1, 2, 3))
    with open(tmp_path / "LOC_val_solution.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["ImageId", "PredictionString"])
        writer.writerows(rows)
    data = read_imagenet_val(val, ["tench", "goldfish"])
    assert [p.stem for p in data.images] == ["ILSVRC2012_val_00000001", "ILSVRC2012_val_00000002"]
    assert data.labels == [0, 1]


def _write_cifar(root: Path, variant: str, n: int = 4) -> np.ndarray:
    """Write CIFAR pickles the way the official archives store them (bytes keys, CHW planes)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    if variant == "cifar10":
        meta = {b"label_names": [b"airplane", b"automobile", b"bird"], b"num_cases_per_batch": n}
        batch = {b"data": data, b"labels": [2, 0, 1, 2][:n], b"batch_label": b"testing batch 1 of 1"}
        files = {"batches.meta": meta, "test_batch": batch}
    else:
        meta = {b"fine_label_names": [b"apple", b"aquarium_fish"], b"coarse_label_names": [b"fruit", b"fish"]}
        batch = {b"data": data, b"fine_labels": [1, 0, 1, 1][:n], b"coarse_labels": [0] * n}
        files = {"meta": meta, "test": batch}
    for name, obj in files.items():
        with open(root / name, "wb") as f:
            pickle.dump(obj, f, protocol=2)
    return data


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_cifar_pickles(tmp_path, variant):
    raw = _write_cifar(tmp_path / variant, variant)
    data = read_cifar(tmp_path / variant, variant)
    if variant == "cifar10":
        assert data.classnames == ["airplane", "automobile", "bird"]
        assert data.labels == [2, 0, 1, 2]
    else:
        assert data.classnames == ["apple", "aquarium fish"]
        assert data.labels == [1, 0, 1, 1]
    img = data.images[1]
    assert img.shape == (32, 32, 3)
    # pixel (row 3, col 5): planes are R, G, B of 1024 row-major values each
    assert tuple(img[3, 5]) == (raw[1, 3 * 32 + 5], raw[1, 1024 + 3 * 32 + 5], raw[1, 2048 + 3 * 32 + 5])


def _karpathy(tmp_path: Path, coco: bool) -> Path:
    images = []
    for i, split in enumerate(["test", "train", "test"]):
        name = f"img{i}.jpg"
        if coco:
            _save(tmp_path / "val2014" / name, (i * 50, 0, 0))
        else:
            _save(tmp_path / "flickr30k-images" / name, (i * 50, 0, 0))
        entry = {
            "filename": name,
            "imgid": i,
            "split": split,
            "sentences": [{"raw": f" caption {i}.{c} ", "tokens": []} for c in range(6 if i == 0 else 5)],
        }
        if coco:
            entry["filepath"] = "val2014"
        images.append(entry)
    path = tmp_path / ("dataset_coco.json" if coco else "dataset_flickr30k.json")
    path.write_text(json.dumps({"images": images, "dataset": "coco" if coco else "flickr30k"}))
    return path


@pytest.mark.parametrize("coco", [True, False])
def test_karpathy_split(tmp_path, coco):
    path = _karpathy(tmp_path, coco)
    data = read_karpathy(tmp_path)  # the folder holding dataset_*.json
    assert data.name == ("coco" if coco else "flickr30k")
    assert [p.name for p in data.images] == ["img0.jpg", "img2.jpg"]
    assert len(data.captions) == 10  # the sixth caption of img0 is dropped (5 per image protocol)
    assert data.captions[:2] == ["caption 0.0", "caption 0.1"]
    assert data.caption_image == [0] * 5 + [1] * 5
    assert read_karpathy(path, captions_per_image=None).captions.count("caption 0.5") == 1


def test_karpathy_refuses_escaping_names(tmp_path):
    _save(tmp_path / "outside.jpg", (0, 0, 0))
    root = tmp_path / "root"
    root.mkdir()
    entry = {"filename": "../outside.jpg", "split": "test", "sentences": [{"raw": "x"}]}
    (root / "dataset_coco.json").write_text(json.dumps({"images": [entry]}))
    with pytest.raises(EvalDataError, match="escapes"):
        read_karpathy(root / "dataset_coco.json")


def test_manifest_classification_names_and_indices(tmp_path):
    for i in range(3):
        _save(tmp_path / "imgs" / f"{i}.png", (i, 0, 0))
    named = tmp_path / "named.csv"
    named.write_text("filepath,label\nimgs/0.png,dog\nimgs/1.png,cat\nimgs/2.png,dog\n")
    data = read_manifest_classification(named)
    assert data.classnames == ["cat", "dog"] and data.labels == [1, 0, 1]
    indexed = tmp_path / "indexed.tsv"
    indexed.write_text("image\tclass\nimgs/0.png\t2\nimgs/1.png\t0\n")
    data = read_manifest_classification(indexed, classnames=["a", "b", "c"])
    assert data.labels == [2, 0] and data.images[0] == (tmp_path / "imgs" / "0.png").resolve()
    bad = tmp_path / "bad.csv"
    bad.write_text("filepath,label\n../escape.png,dog\n")
    with pytest.raises(EvalDataError, match="escapes"):
        read_manifest_classification(bad)


def test_manifest_retrieval_jsonl_and_csv(tmp_path):
    for i in range(2):
        _save(tmp_path / f"{i}.jpg", (i, 0, 0))
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(
        json.dumps({"image": "0.jpg", "captions": ["a", "b"]})
        + "\n"
        + json.dumps({"image": "1.jpg", "captions": ["c"]})
        + "\n"
    )
    data = read_manifest_retrieval(jsonl)
    assert data.captions == ["a", "b", "c"] and data.caption_image == [0, 0, 1]
    table = tmp_path / "pairs.csv"
    table.write_text("path,caption_1,caption_2\n0.jpg,x,y\n1.jpg,z,\n")
    data = read_manifest_retrieval(table)
    assert data.captions == ["x", "y", "z"] and data.caption_image == [0, 0, 1]
    with pytest.raises(EvalDataError, match="no column 'nope'"):
        read_manifest_retrieval(table, image_column="nope")


def _halves(width: int, height: int) -> Image.Image:
    """Left half red, right half blue, with a green stripe in the middle third of the rows."""
    arr = np.zeros((height, width, 3), dtype=np.uint8)
    arr[:, : width // 2, 0] = 255
    arr[:, width // 2 :, 2] = 255
    arr[height // 3 : 2 * height // 3, :, 1] = 200
    return Image.fromarray(arr)


@pytest.mark.parametrize("size", [(300, 120), (90, 200), (64, 64), (17, 23)])
def test_preprocess_shape_normalisation_and_crop(size):
    img = _halves(*size)
    out = preprocess_pil(img, 32)
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    pixels = out * torch.tensor(CLIP_STD).view(3, 1, 1) + torch.tensor(CLIP_MEAN).view(3, 1, 1)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5
    # the crop is centred: red on the left edge, blue on the right edge of the middle row
    assert pixels[0, 16, 0] > 0.9 and pixels[2, 16, 0] < 0.1
    assert pixels[2, 16, 31] > 0.9 and pixels[0, 16, 31] < 0.1


def test_preprocess_on_square_input_of_target_size_is_exact():
    img = _halves(32, 32)
    out = preprocess_pil(img, 32)
    expected = torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255
    expected = (expected - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("size", [(300, 120), (90, 200), (47, 61)])
def test_device_path_matches_pil_path(size):
    # The device path (torch antialiased bicubic) is what runs on a GPU; here it runs on CPU.
    rng = np.random.default_rng(1)
    smooth = rng.integers(0, 256, size=(size[1] // 8 + 1, size[0] // 8 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(smooth).resize(size, Image.BILINEAR)
    ref = preprocess_pil(img, 24)
    raw = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
    got = preprocess_tensor(raw, 24)
    # both quantise to uint8; PIL's and torch's bicubic filters differ by at most a few levels
    step = 1 / 255 / min(CLIP_STD)
    assert (got - ref).abs().max() <= 4 * step
    assert (got - ref).abs().mean() <= 0.5 * step


def test_loader_batches_cpu(tmp_path):
    paths = [_save(tmp_path / f"{i}.png", (i * 40, 0, 0), size=(50 + i, 40)) for i in range(5)]
    from src.evaluation.images import skipping_loader

    batches = list(skipping_loader(paths, [0, 1, 2, 3, 4], input_size=16, batch_size=2))
    assert [b.images.shape[0] for b in batches] == [2, 2, 1] and batches[2].positions == [4]
    images = preprocess_batch(batches[0].images, "cpu")
    assert images.shape == (2, 3, 16, 16)
    assert batches[2].labels.tolist() == [4] and not any(b.failed for b in batches)


def test_the_device_does_not_change_the_pixels(tmp_path, recwarn):
    # On CUDA the loader once switched to a torch resize, which differs from PIL's by a few grey
    # levels and changed top-1 predictions. Asking for "cuda" must now give the very same batches:
    # only pinning differs (a no-op without a GPU, so this runs on CPU).
    rng = np.random.default_rng(3)
    paths = []
    for i, size in enumerate([(300, 120), (90, 200), (47, 61)]):
        noise = Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8))
        paths.append(tmp_path / f"{i}.png")
        noise.save(paths[-1])
    from src.evaluation.images import PIL_PREPROCESSING, skipping_loader

    cpu = [b.images for b in skipping_loader(paths, None, input_size=24, batch_size=2, device="cpu")]
    cuda = [b.images for b in skipping_loader(paths, None, input_size=24, batch_size=2, device="cuda")]
    assert len(cpu) == len(cuda) == 2
    for a, b in zip(cpu, cuda):
        assert torch.equal(a, b)
    assert torch.equal(cpu[0][0], preprocess_pil(Image.open(paths[0]).convert("RGB"), 24))
    assert PIL_PREPROCESSING.startswith("PIL")


def test_image_folder_numeric_class_folders_sort_numerically(tmp_path):
    for i in (10, 2, 1):
        _save(tmp_path / str(i) / "x.png", (i, 0, 0))
    data = read_image_folder(tmp_path)
    assert data.classnames == ["1", "2", "10"] and data.labels == [0, 1, 2]


def test_a_class_folder_without_images_is_refused(tmp_path):
    _save(tmp_path / "cat" / "1.png", (1, 2, 3))
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "notes.txt").write_text("no images here")
    with pytest.raises(EvalDataError, match="class folder 'dog' holds no images; add its images or remove"):
        read_image_folder(tmp_path)


@pytest.mark.parametrize("caption", [None, ["fine", None], 7, {"text": "x"}])
def test_a_caption_that_is_not_text_is_refused(tmp_path, caption):
    # json null once became the caption "None"
    _save(tmp_path / "a.png", (1, 2, 3))
    (tmp_path / "test.json").write_text(json.dumps([{"image": "a.png", "caption": caption}]))
    with pytest.raises(EvalDataError, match="image a.png: caption .* is not text or a list of texts"):
        read_caption_json(tmp_path / "test.json")
