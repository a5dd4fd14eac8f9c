"""The evaluation CLIs' protocol features on a micro model: the paper's table and the original's CSV
line, --list-datasets, classifying a folder against --labels, retrieval on ALBEF/BLIP JSON with
the original's caption prefix, and the refusals (no weights, an unwritable output folder, an
unknown WKV implementation), each one line before any evaluation runs."""

import csv
import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import retrieval as retrieval_cli
import zero_shot as zero_shot_cli
from src.evaluation.model_loader import load_model as load_eval_model
from src.evaluation.run import evaluate_retrieval
from src.open_alip.model import get_model_config
from src.open_alip.tokenizer import tokenize
from src.open_alip.zero_shot import retrieval_metrics
from tests import _eval_layouts as layouts
from tests._repo import REPO

PAPER_COLUMNS = [
    "Model",
    "CIFAR10",
    "CIFAR100",
    "Food101",
    "Pets",
    "Flowers",
    "SUN397",
    "Cars",
    "DTD",
    "Caltech101",
    "Aircraft",
    "ImageNet",
    "Average",
]


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("micro")
    config = root / "micro.json"
    config.write_text(json.dumps(get_model_config("RWKV_CLIP_tiny", **layouts.MICRO)))
    torch.manual_seed(0)
    weights = root / "micro.pt"
    torch.save(layouts.micro_model().state_dict(), weights)
    data = root / "data"
    layouts.write_cifar(data, "cifar10", [3, 0, 9, 3])
    layouts.write_pets(data)
    layouts.write_flowers(data)
    return {"root": root, "config": config, "weights": weights, "data": data}


def _main(module, args: list[str], capsys) -> tuple[int, str, str]:
    rc = module.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _common(micro, *extra: str) -> list[str]:
    return [
        "--model-name",
        str(micro["config"]),
        "--device",
        "cpu",
        "--workers",
        "0",
        "--no-progress",
        "--wkv-impl",
        "reference",
        *extra,
    ]


def test_paper_table_and_the_originals_csv_line(micro, tmp_path, capsys):
    out, csv = tmp_path / "results", tmp_path / "eval" / "zero_shot_imagenet.txt"
    args = _common(
        micro,
        "--model-weight",
        str(micro["weights"]),
        "--protocol",
        "original",
        "--output-dir",
        str(out),
        "--datasets",
        f"cifar10={micro['data']},pets={micro['data']}",
        f"flowers={micro['data']}",
        "--csv",
        str(csv),
    )
    rc, stdout, stderr = _main(zero_shot_cli, args, capsys)
    assert rc == 0, stderr
    saved = {
        n: json.loads((out / f"classification_{n}.json").read_text()) for n in ("cifar10", "pets", "flowers")
    }
    assert saved["pets"]["metric"] == "mean_per_class_recall" and saved["cifar10"]["metric"] == "top1"
    assert all(r["protocol"] == "original" for r in saved.values())
    assert all(r["preprocessing"].startswith("PIL: bicubic") for r in saved.values())
    header, row = [line for line in stdout.splitlines() if " | " in line]
    assert [c.strip() for c in header.split("|")] == PAPER_COLUMNS
    cells = [c.strip() for c in row.split("|")]
    assert cells[1] == f"{saved['cifar10']['score']:.1f}" and cells[4] == f"{saved['pets']['score']:.1f}"
    assert cells[2] == "-" and cells[-1] == "-"  # not every dataset ran: no average
    line = ",".join(repr(saved[n]["score"]) for n in ("cifar10", "pets", "flowers"))
    assert csv.read_text() == line + "\n"
    assert _main(zero_shot_cli, args, capsys)[0] == 0
    assert csv.read_text() == (line + "\n") * 2  # appended, as the original does


def test_list_datasets(capsys):
    rc, stdout, _ = _main(zero_shot_cli, ["--list-datasets"], capsys)
    assert rc == 0
    rows = {line.split()[0]: line.split() for line in stdout.splitlines()[2:]}
    assert list(rows) == [
        "cifar10",
        "cifar100",
        "food101",
        "pets",
        "flowers",
        "sun397",
        "stanford_car",
        "dtd",
        "caltech101",
        "aircraft",
        "imagenet",
    ]
    assert rows["caltech101"][1:5] == ["101", "34", "5,677", "mean_per_class"]
    assert rows["imagenet"][1:5] == ["1000", "80", "50,000", "top1"]
    assert "ROOT/fgvc-aircraft-2013b/data/" in stdout


def test_labels_classify_a_folder(micro, tmp_path, capsys):
    photos = tmp_path / "photos"
    names = (
        ("a.png", (250, 0, 0)),
        ("b.jpg", (0, 250, 0)),
        ("sub/c.png", (0, 0, 250)),
        ('tab\there "q".png', (9, 9, 9)),
        ("new\nline.png", (99, 9, 9)),
    )
    for name, colour in names:
        (photos / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 12), colour).save(photos / name)
    (tmp_path / "t.txt").write_text("a photo of a {}.\nan image of {}.\n")
    args = _common(
        micro,
        "--model-weight",
        str(micro["weights"]),
        "--images",
        str(photos),
        "--labels",
        "red, green,blue",
        "--label-templates",
        str(tmp_path / "t.txt"),
        "--output-dir",
        str(tmp_path / "o"),
    )
    rc, stdout, stderr = _main(zero_shot_cli, args, capsys)
    assert rc == 0, stderr
    # a tab, quote or newline in a file name stays inside its cell (labels.tsv is written by csv)
    lines = list(csv.reader(io.StringIO(stdout), delimiter="\t"))
    assert sorted(Path(cells[0]).name for cells in lines) == sorted(
        ["a.png", "b.jpg", "c.png", 'tab\there "q".png', "new\nline.png"]
    )
    assert all(cells[1] in ("red", "green", "blue") and 0 < float(cells[2]) <= 1 for cells in lines)
    with open(tmp_path / "o" / "labels.tsv", newline="") as f:
        assert list(csv.reader(f, delimiter="\t")) == [
            ["image", "label", "probability", "top-k, best first"],
            *lines,
        ]
    for cells in lines:  # every label, best first, the first the image's label
        ranked = [item.rsplit(" ", 1) for item in cells[3].split("; ")]
        assert sorted(label for label, _ in ranked) == ["blue", "green", "red"] and ranked[0][0] == cells[1]
        assert [float(p) for _, p in ranked] == sorted((float(p) for _, p in ranked), reverse=True)
        assert sum(float(p) for _, p in ranked) == pytest.approx(1, abs=2e-4)
    summary = json.loads((tmp_path / "o" / "labels.json").read_text())
    assert summary["templates"] == ["a photo of a {}.", "an image of {}."] and summary["images"] == 5
    assert sum(summary["per_label"].values()) == 5 and summary["labels"] == ["red", "green", "blue"]
    assert "[zero_shot] 2 template(s): the file " in stderr
    rc, _, stderr = _main(
        zero_shot_cli, _common(micro, "--random-init", "--images", str(photos), "--labels", "x,x"), capsys
    )
    assert rc == 2 and "distinct" in stderr


def test_labels_with_a_file_name_that_is_not_utf8(micro, tmp_path, capsys):
    # Once: every image classified, then a UnicodeEncodeError traceback writing labels.tsv, nothing written.
    import os

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (20, 12), (250, 0, 0)).save(photos / "a.png")
    Image.new("RGB", (20, 12), (0, 250, 0)).save(os.fsdecode(bytes(photos) + b"/b\xff.png"))
    args = _common(
        micro,
        "--model-weight",
        str(micro["weights"]),
        "--images",
        str(photos),
        "--labels",
        "red,green",
        "--output-dir",
        str(tmp_path / "o"),
    )
    rc, stdout, stderr = _main(zero_shot_cli, args, capsys)
    assert rc == 0, stderr
    # The odd byte is written as \xNN, the rule every report and index follows (src/fsutil.py printable).
    rows = list(
        csv.reader(io.StringIO((tmp_path / "o" / "labels.tsv").read_text(encoding="utf-8")), delimiter="\t")
    )
    assert sorted(Path(r[0]).name for r in rows[1:]) == ["a.png", "b\\xff.png"]
    assert sorted(Path(line.split("\t")[0]).name for line in stdout.splitlines()) == ["a.png", "b\\xff.png"]


def test_labels_list_every_special_input_as_skipped(micro, tmp_path, capsys):
    # Once a FIFO, a link to /dev/zero, a folder named x.jpg and a broken link were left out unsaid.
    import os

    photos = tmp_path / "photos"
    (photos / "x.jpg").mkdir(parents=True)
    Image.new("RGB", (20, 12), (250, 0, 0)).save(photos / "a.png")
    os.mkfifo(photos / "pipe.jpg")
    (photos / "zero.jpg").symlink_to("/dev/zero")
    (photos / "broken.png").symlink_to(photos / "gone.png")
    os.mkfifo(tmp_path / "given.jpg")  # a path given on the command line, not found by a walk
    args = _common(
        micro,
        "--model-weight",
        str(micro["weights"]),
        "--images",
        str(photos),
        str(tmp_path / "given.jpg"),
        "--labels",
        "red,green",
        "--output-dir",
        str(tmp_path / "o"),
    )
    rc, stdout, stderr = _main(zero_shot_cli, args, capsys)
    assert rc == 0, stderr
    assert [Path(line.split("\t")[0]).name for line in stdout.splitlines()] == ["a.png"]
    assert "[zero_shot] skipped 5 unreadable image(s):" in stderr and "(5 skipped)" in stderr
    for name, why in [
        ("broken.png", "is a broken link"),
        ("pipe.jpg", "is not a regular file (a FIFO)"),
        ("x.jpg", "is a folder, not an image file"),
        ("zero.jpg", "a character device"),
        ("given.jpg", "is not a regular file (a FIFO)"),
    ]:
        assert any(line.split(": ", 1)[0].endswith(name) and why in line for line in stderr.splitlines()), (
            name,
            stderr,
        )


def test_labels_need_two_or_more_and_may_come_from_a_file(micro, tmp_path, capsys):
    # Once: `--labels cat`, or a path given to --labels, labelled every image "cat" with probability 1.0.
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (20, 12), (250, 0, 0)).save(photos / "a.png")
    (tmp_path / "labels.txt").write_text("# colours\nred\n\ngreen\nblue\n")
    base = _common(
        micro,
        "--model-weight",
        str(micro["weights"]),
        "--images",
        str(photos),
        "--output-dir",
        str(tmp_path / "o"),
    )
    for labels, needle in [
        ("cat", "--labels 'cat' gives 1 label; give two or more, comma-separated"),
        (
            str(tmp_path / "labels.txt"),
            f"(to read labels from the file {tmp_path / 'labels.txt'}, pass --labels "
            f"@{tmp_path / 'labels.txt'})",
        ),
        (f"@{tmp_path / 'none.txt'}", "cannot read the label file"),
    ]:
        rc, stdout, stderr = _main(zero_shot_cli, [*base, "--labels", labels], capsys)
        assert rc == 2 and stdout == "" and needle in stderr and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "o" / "labels.tsv").exists()
    rc, stdout, stderr = _main(zero_shot_cli, [*base, "--labels", f"@{tmp_path / 'labels.txt'}"], capsys)
    assert rc == 0, stderr
    assert stdout.split("\t")[1] in ("red", "green", "blue") and float(stdout.split("\t")[2]) < 1


def test_class_names_that_repeat_are_warned_about(micro, tmp_path, capsys):
    # Once: CIFAR-10 with ten identical class names scored in silence.
    names = tmp_path / "names.txt"
    names.write_text("cat\n" * 10)
    args = _common(
        micro,
        "--model-weight",
        str(micro["weights"]),
        "--output-dir",
        str(tmp_path / "o"),
        "--datasets",
        f"cifar10={micro['data']}",
        "--classnames",
        f"cifar10={names}",
    )
    rc, _, stderr = _main(zero_shot_cli, args, capsys)
    assert rc == 0, stderr
    warning = (
        "[zero_shot] cifar10: warning: class names repeat ('cat' x10): classes of one name get the same text"
    )
    assert warning in stderr
    result = json.loads((tmp_path / "o" / "classification_cifar10.json").read_text())
    assert result["warnings"][0].startswith("class names repeat ('cat' x10)")


@pytest.mark.parametrize(
    "extra,needle",
    [
        ([], "no --model-weight given; pass the weights"),
        (
            ["--random-init", "--wkv-impl", "bogus"],
            "--wkv-impl bogus: unknown wkv implementation 'bogus'; choose one of auto",
        ),
        (
            ["--random-init", "--wkv-impl", "fla_chunk"],
            "--wkv-impl fla_chunk: wkv implementation 'fla_chunk' cannot run on cpu",
        ),
        (
            ["--random-init", "--output-dir", "{file}/results"],
            "--output-dir {file}/results: cannot write there",
        ),
        (["--random-init", "--csv", "{file}/x.txt"], "cannot write there"),
    ],
)
def test_refusals_come_before_any_evaluation(micro, tmp_path, capsys, extra, needle):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    extra = [e.replace("{file}", str(blocker)) for e in extra]
    args = [
        "--model-name",
        str(micro["config"]),
        "--device",
        "cpu",
        "--datasets",
        f"cifar10={micro['data']}",
        *extra,
    ]
    rc, stdout, stderr = _main(zero_shot_cli, args, capsys)
    assert rc == 2 and "cifar10:" not in stdout  # nothing was evaluated
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zero_shot.py: error:")
    assert needle.replace("{file}", str(blocker)) in lines[0], lines[0]


def test_random_init_is_explicit(micro, tmp_path, capsys):
    rc, stdout, stderr = _main(
        zero_shot_cli,
        _common(
            micro, "--random-init", "--output-dir", str(tmp_path), "--datasets", f"cifar10={micro['data']}"
        ),
        capsys,
    )
    assert rc == 0, stderr
    assert json.loads((tmp_path / "classification_cifar10.json").read_text())["checkpoint"] is None


def _albef_set(root: Path) -> Path:
    """An ALBEF/BLIP-style test file; image 1 has six captions, two captions repeat a text."""
    entries = []
    for i, colour in enumerate([(250, 0, 0), (0, 250, 0), (0, 0, 250), (250, 250, 0)]):
        Image.new("RGB", (24, 16), colour).save(
            (root / "val2014").mkdir(parents=True, exist_ok=True) or root / "val2014" / f"COCO_{i}.jpg"
        )
        captions = [f"picture {i} number {j}" for j in range(6 if i == 1 else 5)]
        captions[0] = "the same words"
        entries.append({"image": f"val2014/COCO_{i}.jpg", "caption": captions})
    path = root / "coco_test.json"
    path.write_text(json.dumps(entries))
    return path


def test_albef_json_with_the_caption_prefix(micro, tmp_path, capsys):
    path = _albef_set(tmp_path)
    model = load_eval_model(micro["config"], micro["weights"], torch.device("cpu"), "reference")
    original = evaluate_retrieval(model, f"coco={path}", 32, "cpu", batch_size=3, protocol="original")
    assert original["num_images"] == 4 and original["num_captions"] == 21  # every caption kept
    entries = json.loads(path.read_text())
    captions = [c for e in entries for c in e["caption"]]
    owner = [i for i, e in enumerate(entries) for _ in e["caption"]]
    with torch.no_grad():
        texts = torch.nn.functional.normalize(
            model.encode_text(tokenize(["a photo of " + c for c in captions])), dim=1
        )
    from src.evaluation.images import skipping_loader

    sources = [tmp_path / "val2014" / f"COCO_{i}.jpg" for i in range(4)]
    images = torch.cat([b.images for b in skipping_loader(sources, None, 32, 4)])
    with torch.no_grad():
        images = torch.nn.functional.normalize(model.encode_image(images), dim=1)
    expected = retrieval_metrics(images, texts, owner)
    for key, value in expected.items():
        assert original["metrics"][key] == pytest.approx(value, abs=1e-4)
    standard = evaluate_retrieval(model, f"coco={path}", 32, "cpu", protocol="standard")
    assert standard["protocol"] == "standard" and standard["num_captions"] == 21
    # the original's image root holds the images themselves: the first folder of "image" is dropped
    rc, _, stderr = _main(
        retrieval_cli,
        _common(
            micro,
            "--model-weight",
            str(micro["weights"]),
            "--protocol",
            "original",
            "--image-root",
            str(tmp_path / "val2014"),
            "--datasets",
            f"coco={path}",
            "--output-dir",
            str(tmp_path / "r"),
        ),
        capsys,
    )
    assert rc == 0, stderr
    saved = json.loads((tmp_path / "r" / "retrieval_coco.json").read_text())
    assert saved["metrics"] == pytest.approx(original["metrics"], abs=1e-4)
    assert saved["preprocessing"].startswith("PIL: bicubic")
    (tmp_path / "val2014" / "COCO_2.jpg").unlink()
    rc, _, stderr = _main(
        retrieval_cli,
        _common(micro, "--random-init", "--datasets", f"coco={path}", "--output-dir", str(tmp_path / "r")),
        capsys,
    )
    assert (
        rc == 2 and "image val2014/COCO_2.jpg not found" in stderr and len(stderr.strip().splitlines()) == 1
    )


def test_classification_script_runs_the_datasets_found(micro, tmp_path):
    import os
    import subprocess
    import sys

    repo = REPO
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "MODEL_NAME": str(micro["config"]),
        "MODEL_WEIGHT": str(micro["weights"]),
        "DATA_ROOT": str(micro["data"]),
        "OUTPUT_DIR": str(tmp_path),
        "DEVICE": "cpu",
        "WORKERS": "0",
    }
    proc = subprocess.run(
        ["bash", "shell/test_zero_shot_classificaiton.sh", "--wkv-impl", "reference", "--no-progress"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "datasets: cifar10=" in proc.stdout and "pets=" in proc.stdout and "flowers=" in proc.stdout
    assert "food101=" not in proc.stdout  # not under DATA_ROOT: left out
    header = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("Model |"))
    assert [c.strip() for c in header.split("|")] == PAPER_COLUMNS
    scores = [
        json.loads((tmp_path / "eval" / f"classification_{n}.json").read_text())["score"]
        for n in ("cifar10", "pets", "flowers")
    ]
    assert (tmp_path / "eval" / "zero_shot_imagenet.txt").read_text() == ",".join(map(repr, scores)) + "\n"
    assert json.loads((tmp_path / "eval" / "classification_pets.json").read_text())["protocol"] == "original"


def test_bare_names_under_data_root(micro, tmp_path):
    from src.evaluation.specs import parse_dataset_list

    (tmp_path / "scenes").mkdir()
    specs = parse_dataset_list(["cifar10,pets"], micro["data"])
    assert [(s.name, s.path) for s in specs] == [("cifar10", micro["data"]), ("pets", micro["data"])]
    assert parse_dataset_list(["scenes"], tmp_path)[0].path == tmp_path / "scenes"
