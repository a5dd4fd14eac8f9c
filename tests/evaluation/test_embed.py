"""embed.py: embeddings of an image folder, an image manifest and a text file, equal to the model's
own normalised embeddings; unreadable images skipped and counted; one-line errors; whole outputs only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import embed as embed_cli
from src.open_alip import get_tokenizer

TINY = "RWKV_CLIP_tiny"


@pytest.fixture
def tiny(tiny_weights):
    """(model, preprocess_val, weights file)"""
    return tiny_weights.model, tiny_weights.preprocess_val, tiny_weights.path


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    (root / "trip" / "day2").mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((40, 60, 3)) * 255).astype(np.uint8)).save(root / "b.png")
    Image.fromarray((rng.random((50, 30)) * 255).astype(np.uint8), "L").save(root / "trip" / "a.jpg")
    Image.fromarray((rng.random((33, 33, 4)) * 255).astype(np.uint8), "RGBA").save(
        root / "trip" / "day2" / "c.webp"
    )
    (root / "trip" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a whole JPEG")
    (root / ".hidden.jpg").write_bytes(b"editor junk")  # hidden files are not inputs
    (root / "notes.txt").write_text("not an image")
    return root


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = embed_cli.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@torch.no_grad()
def _image_embeddings(model, preprocess_val, paths: list[Path]) -> np.ndarray:
    batch = torch.stack([preprocess_val(Image.open(p)) for p in paths])
    return F.normalize(model.encode_image(batch), dim=-1).numpy()


def test_image_folder(tiny, photos, tmp_path, capsys):
    model, preprocess_val, weights = tiny
    out = tmp_path / "out" / "photos.npy"
    rc, stdout, _ = _run(
        [
            "--model-name",
            TINY,
            "--model-weight",
            str(weights),
            "--images",
            str(photos),
            "--output",
            str(out),
            "--device",
            "cpu",
            "--workers",
            "1",
            "--batch-size",
            "2",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0
    assert "3 images x 64" in stdout and "skipped 1 unreadable image(s), e.g. trip/broken.jpg" in stdout
    emb = np.load(out)
    index = json.loads((tmp_path / "out" / "photos.index.json").read_text())
    assert index["items"] == ["b.png", "trip/a.jpg", "trip/day2/c.webp"]
    assert index["count"] == 3 and index["dim"] == 64 and index["kind"] == "images"
    assert index["root"] == str(photos.resolve()) and index["weights"] == str(weights)
    assert [s["item"] for s in index["skipped"]] == ["trip/broken.jpg"] and "cannot" in index["skipped"][0][
        "error"
    ]
    assert emb.shape == (3, 64) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    expected = _image_embeddings(model, preprocess_val, [photos / i for i in index["items"]])
    np.testing.assert_allclose(emb, expected, atol=1e-5)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "photos.index.json",
        "photos.npy",
    ]  # no temporaries


def test_image_manifest_and_texts(tiny, photos, tmp_path, capsys):
    model, preprocess_val, weights = tiny
    manifest = photos / "list.csv"
    manifest.write_text(f"filepath,caption\ntrip/a.jpg,x\nmissing.png,y\n{photos / 'b.png'},z\n")
    out = tmp_path / "m.npy"
    rc, stdout, _ = _run(
        [
            "--model-name",
            TINY,
            "--model-weight",
            str(weights),
            "--images",
            str(manifest),
            "--output",
            str(out),
            "--device",
            "cpu",
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0 and "skipped 1 unreadable image(s), e.g. missing.png: does not exist" in stdout
    index = json.loads(out.with_name("m.index.json").read_text())
    assert index["items"] == ["trip/a.jpg", str(photos / "b.png")]
    np.testing.assert_allclose(
        np.load(out),
        _image_embeddings(model, preprocess_val, [photos / "trip/a.jpg", photos / "b.png"]),
        atol=1e-5,
    )

    texts = tmp_path / "captions.txt"
    texts.write_text("a photo of a cat\n\n  a red car  \nüñí©ødé text\n", encoding="utf-8")
    out = tmp_path / "texts.npy"
    out.write_bytes(b"old")  # an earlier result is replaced whole
    rc, stdout, _ = _run(
        [
            "--model-name",
            TINY,
            "--model-weight",
            str(weights),
            "--texts",
            str(texts),
            "--output",
            str(out),
            "--device",
            "cpu",
            "--batch-size",
            "2",
        ],
        capsys,
    )
    assert rc == 0 and "3 texts x 64" in stdout and "skipped 1 blank line(s)" in stdout
    index = json.loads(out.with_name("texts.index.json").read_text(encoding="utf-8"))
    assert index["items"] == ["a photo of a cat", "a red car", "üñí©ødé text"] and index["kind"] == "texts"
    with torch.no_grad():
        expected = F.normalize(model.encode_text(get_tokenizer(TINY)(index["items"])), dim=-1).numpy()
    np.testing.assert_allclose(np.load(out), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no --model-weight given; pass the weights"),
        (["--model-weight", "nope.pt"], "weights nope.pt does not exist"),
        (["--random-init", "--output", "x.json"], "name it *.npy"),
        (["--random-init", "--images", "does/not/exist"], "--images does/not/exist does not exist"),
        (["--random-init", "--model-name", "RWKV_CLIP_B99"], "neither a shipped model"),
        (["--random-init", "--wkv-impl", "magic"], "unknown wkv implementation 'magic'"),
        (["--random-init", "--device", "tpu"], "--device tpu: unknown device"),
    ],
)
def test_errors_are_one_line_and_leave_no_output(extra, message, photos, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--model-name", TINY, "--images", str(photos), "--output", "e.npy", "--workers", "0", *extra]
    # later occurrences win in argparse, so the parametrised options replace the defaults above
    rc, stdout, stderr = _run(args, capsys)
    assert rc == 2
    assert (
        stderr.startswith("embed.py: error: ") and message in stderr and len(stderr.strip().splitlines()) == 1
    )
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".npy", ".json", ".tmp")]


def test_nothing_readable_writes_nothing(tmp_path, capsys):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "x.jpg").write_bytes(b"nope")
    (tmp_path / "imgs" / "y.png").write_bytes(b"")
    out = tmp_path / "o.npy"
    rc, _, stderr = _run(
        [
            "--model-name",
            TINY,
            "--random-init",
            "--images",
            str(tmp_path / "imgs"),
            "--output",
            str(out),
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 2 and "none of the 2 images could be read (e.g. " in stderr and "nothing written" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]


def test_odd_file_names_and_a_fifo(tmp_path, capsys):
    # A non-UTF-8 name once crashed writing index.json (after the embeddings were computed); a FIFO
    # named *.jpg once blocked the run forever. Now: the name is kept with its byte as \xNN, the FIFO
    # is never read and listed as skipped.
    import os

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.new("RGB", (20, 20), (1, 2, 3)).save(imgs / "a.jpg")
    Image.new("RGB", (20, 20), (9, 2, 3)).save(os.fsdecode(bytes(imgs) + b"/b\xff.jpg"))
    os.mkfifo(imgs / "pipe.jpg")
    out = tmp_path / "o.npy"
    rc, _, stderr = _run(
        [
            "--model-name",
            TINY,
            "--random-init",
            "--images",
            str(imgs),
            "--output",
            str(out),
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, stderr
    index = json.loads((tmp_path / "o.index.json").read_text(encoding="utf-8"))
    assert index["items"] == ["a.jpg", "b\\xff.jpg"] and index["count"] == 2
    assert index["skipped"] == [{"item": "pipe.jpg", "error": "is not a regular file (a FIFO)"}]
    assert np.load(out).shape[0] == 2


def test_every_special_input_is_embedded_or_listed_as_skipped(tmp_path, capsys):
    # Once a FIFO, a link to /dev/zero, a folder named x.jpg and a broken link appeared in neither
    # `items` nor `skipped`.
    import os

    imgs = tmp_path / "imgs"
    (imgs / "x.jpg").mkdir(parents=True)
    Image.new("RGB", (20, 20), (1, 2, 3)).save(imgs / "a.jpg")
    Image.new("RGB", (20, 20), (4, 5, 6)).save(imgs / "x.jpg" / "inside.png")
    os.mkfifo(imgs / "pipe.jpg")
    (imgs / "zero.jpg").symlink_to("/dev/zero")
    (imgs / "broken.png").symlink_to(imgs / "gone.png")
    out = tmp_path / "o.npy"
    rc, stdout, stderr = _run(
        [
            "--model-name",
            TINY,
            "--random-init",
            "--images",
            str(imgs),
            "--output",
            str(out),
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, stderr
    index = json.loads((tmp_path / "o.index.json").read_text(encoding="utf-8"))
    assert index["items"] == ["a.jpg", "x.jpg/inside.png"]
    assert index["skipped"] == [
        {"item": "broken.png", "error": f"is a broken link (to {imgs / 'gone.png'})"},
        {"item": "pipe.jpg", "error": "is not a regular file (a FIFO)"},
        {"item": "x.jpg", "error": "is a folder, not an image file (the images in it are read)"},
        {"item": "zero.jpg", "error": "is not a regular file (a character device)"},
    ]
    assert "skipped 4" in stdout
    # The same paths named in a list: each listed with what it is.
    # (A link leaving the list's folder, as zero.jpg does, is refused there: paths must stay inside.)
    (tmp_path / "list.txt").write_text(
        "imgs/a.jpg\nimgs/pipe.jpg\nimgs/x.jpg\nimgs/broken.png\nimgs/no.jpg\n"
    )
    rc, _, stderr = _run(
        [
            "--model-name",
            TINY,
            "--random-init",
            "--images",
            str(tmp_path / "list.txt"),
            "--output",
            str(out),
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, stderr
    index = json.loads((tmp_path / "o.index.json").read_text(encoding="utf-8"))
    assert index["items"] == ["imgs/a.jpg"]
    assert [(s["item"], s["error"].split(" (")[0]) for s in index["skipped"]] == [
        ("imgs/pipe.jpg", "is not a regular file"),
        ("imgs/x.jpg", "is a folder, not an image file"),
        ("imgs/broken.png", "is a broken link"),
        ("imgs/no.jpg", "does not exist"),
    ]
    # Given as --images itself, a FIFO is said to be one, not to be missing.
    rc, _, stderr = _run(
        [
            "--model-name",
            TINY,
            "--random-init",
            "--images",
            str(imgs / "pipe.jpg"),
            "--output",
            str(out),
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 2 and f"--images {imgs / 'pipe.jpg'} is not a regular file (a FIFO)" in stderr
