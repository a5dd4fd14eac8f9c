"""Evaluation of a checkpoint trained here: class-embedding construction, the zero_shot.py and
retrieval.py CLIs end to end (their JSON must match the library's numbers), their one-line
errors, dataset-spec resolution and the train.py epoch hook."""

import csv
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import retrieval as retrieval_cli
import zero_shot as zero_shot_cli
from src.demo.corpus import write_classification_set, write_retrieval_set
from src.demo.scenes import DEMO_TEMPLATES, draw_scene, random_scene
from src.evaluation.datasets import EvalDataError
from src.evaluation.hook import zero_shot_epoch_hook
from src.evaluation.model_loader import load_model as load_eval_model
from src.evaluation.run import evaluate_classification, evaluate_retrieval
from src.evaluation.specs import load_classification_data
from src.open_alip.model import create_model
from src.open_alip.tokenizer import tokenize
from src.open_alip.zero_shot import build_class_embeddings, load_metadata
from src.training.batching import BatchPlan
from src.training.config import TrainConfig
from src.training.distributed import DistEnv
from tests._repo import REPO

CONFIG = REPO / "src" / "open_alip" / "model_configs" / "RWKV_CLIP_demo.json"
SIZE = json.loads(CONFIG.read_text())["input_size"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A demo-sized model trained for a few CLIP steps on generated scenes, saved as a checkpoint,
    plus held-out classification (ImageFolder) and retrieval (Karpathy JSON) sets."""
    root = tmp_path_factory.mktemp("trained")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only spin, badly so on a busy machine
    try:
        return _train_and_write(root)
    finally:
        torch.set_num_threads(threads)


def _train_and_write(root: Path) -> dict:
    from src.evaluation.datasets import preprocess_pil
    from src.open_alip import ClipLoss

    torch.manual_seed(0)
    model = create_model(str(CONFIG))
    rng = random.Random(0)
    scenes = [random_scene(rng) for _ in range(128)]
    images = torch.stack([preprocess_pil(draw_scene(s, 64), SIZE) for s in scenes])
    tokens = tokenize([s.caption(i) for i, s in enumerate(scenes)])
    loss_fn = ClipLoss(rank=0, world_size=1)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for step in range(6):
        idx = torch.arange(step * 32, step * 32 + 32) % len(scenes)
        img, txt, scale = model(images[idx], tokens[idx])
        loss = loss_fn(F.normalize(img, dim=-1), F.normalize(txt, dim=-1), scale)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    checkpoint = root / "ckpt.pt"
    torch.save({"state_dict": model.state_dict(), "step": 6}, checkpoint)
    tree = write_classification_set(root / "cls", per_class=2, seed=1, image_size=48)
    karpathy = write_retrieval_set(root / "ret", num_images=8, seed=1, image_size=48)
    return {
        "root": root,
        "checkpoint": checkpoint,
        "tree": tree,
        "templates": root / "cls" / "templates.json",
        "karpathy": karpathy,
        "losses": losses,
    }


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def _main(script: str, args: list[str], capsys) -> tuple[int, str, str]:
    """Run a CLI's main() in this process (the demo test runs them as real subprocesses)."""
    module = zero_shot_cli if script == "zero_shot.py" else retrieval_cli
    rc = module.main(args)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_training_moved_the_loss(trained):
    assert all(np.isfinite(trained["losses"]))
    assert trained["losses"][-1] != trained["losses"][0]


def test_class_embeddings_are_normalised_template_means(trained):
    model = load_eval_model(CONFIG, trained["checkpoint"], torch.device("cpu"))
    names = ["red circle", "blue square", "green triangle"]
    templates = list(DEMO_TEMPLATES)
    weights = build_class_embeddings(model, names, templates, "cpu", batch_size=5)
    assert weights.shape == (model.config["n_embd"], 3)
    torch.testing.assert_close(weights.norm(dim=0), torch.ones(3))
    with torch.no_grad():
        for c, name in enumerate(names):
            per_template = F.normalize(
                model.encode_text(tokenize([t.format(name) for t in templates])), dim=-1
            )
            expected = F.normalize(per_template.mean(dim=0), dim=0)
            torch.testing.assert_close(weights[:, c], expected, atol=1e-5, rtol=1e-5)
    # one template: the class embedding is that prompt's normalised embedding
    single = build_class_embeddings(model, names, ["a {}."], "cpu")
    with torch.no_grad():
        direct = F.normalize(model.encode_text(tokenize([f"a {n}." for n in names])), dim=-1).t()
    torch.testing.assert_close(single, direct, atol=1e-5, rtol=1e-5)


def test_zero_shot_cli_matches_library(trained, tmp_path, capsys):
    out = tmp_path / "results"
    rc, stdout, stderr = _main(
        "zero_shot.py",
        [
            "--model-name",
            str(CONFIG),
            "--model-weight",
            str(trained["checkpoint"]),
            "--datasets",
            f"scenes={trained['tree']}",
            "--templates",
            f"scenes={trained['templates']}",
            "--output-dir",
            str(out),
            "--device",
            "cpu",
            "--workers",
            "0",
            "--batch-size",
            "7",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, stderr
    saved = json.loads((out / "classification_scenes.json").read_text())
    assert saved["dataset"] == "scenes" and saved["task"] == "classification"
    assert saved["model"] == str(CONFIG) and saved["checkpoint"] == str(trained["checkpoint"])
    assert saved["num_images"] == 24 and saved["num_classes"] == 12
    assert saved["chance_top1"] == pytest.approx(100 / 12)
    assert set(saved["metrics"]) == {"top1", "top5", "mean_per_class_recall"}
    model = load_eval_model(CONFIG, trained["checkpoint"], torch.device("cpu"))
    spec = load_classification_data(f"scenes={trained['tree']}")[0]
    assert spec.classnames[0] == "blue circle"  # folder names blue_circle, ... sorted
    from src.evaluation.specs import DatasetSpec

    mine = evaluate_classification(
        model,
        DatasetSpec("scenes", trained["tree"], templates=trained["templates"]),
        SIZE,
        "cpu",
        batch_size=5,
    )
    for key, value in mine["metrics"].items():
        assert saved["metrics"][key] == pytest.approx(value, abs=1e-4)
    assert "scenes" in stdout and "top1" in stdout  # the printed table

    # What explains the numbers: templates, per-class accuracy, every image's predictions, the
    # confusion matrix and its picture, all agreeing with each other and with the metrics.
    templates = json.loads(trained["templates"].read_text())
    assert saved["templates"] == (templates["templates"] if isinstance(templates, dict) else templates)
    assert saved["num_templates"] == len(saved["templates"])
    assert saved["templates_from"] == f"the file {trained['templates']} (--templates)"
    per_class = {c["class"]: c for c in saved["per_class"]}
    assert list(per_class) == spec.classnames and sum(c["images"] for c in per_class.values()) == 24
    with open(out / "classification_scenes.predictions.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 24 and all(len(r["top-k, best first"].split("; ")) == 5 for r in rows)
    assert all(r["top-k, best first"].split("; ")[0] == r["predicted"] for r in rows)
    assert sum(int(r["correct"]) for r in rows) / 24 * 100 == pytest.approx(saved["metrics"]["top1"])
    for name, c in per_class.items():
        mine_rows = [r for r in rows if r["true class"] == name]
        assert c["top1"] == pytest.approx(100 * sum(int(r["correct"]) for r in mine_rows) / len(mine_rows))
    with open(out / "classification_scenes.confusion.csv", newline="") as f:
        matrix = list(csv.reader(f))
    assert matrix[0][1:] == spec.classnames and [row[0] for row in matrix[1:]] == spec.classnames
    for i, name in enumerate(spec.classnames):
        assert int(matrix[1 + i][1 + i]) == sum(int(r["correct"]) for r in rows if r["true class"] == name)
    assert sum(int(v) for row in matrix[1:] for v in row[1:]) == 24
    assert saved["files"]["confusion_png"] == str(out / "classification_scenes.confusion.png")
    assert (out / "classification_scenes.confusion.png").read_bytes()[:4] == b"\x89PNG"
    assert "scenes: the 10 lowest of 12 classes by top-1: " in stdout and "template(s), the file" in stdout


def test_retrieval_cli_matches_library(trained, tmp_path, capsys):
    out = tmp_path / "results"
    rc, stdout, stderr = _main(
        "retrieval.py",
        [
            "--config",
            str(CONFIG),
            "--pretrained",
            str(trained["checkpoint"]),
            "--datasets",
            f"scenes={trained['karpathy']}",
            "--output-dir",
            str(out),
            "--device",
            "cpu",
            "--workers",
            "0",
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, stderr
    saved = json.loads((out / "retrieval_scenes.json").read_text())
    assert saved["task"] == "retrieval" and saved["num_images"] == 8 and saved["num_captions"] == 40
    expected_keys = {f"{d}_R@{k}" for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)} | {
        "mean_recall"
    }
    assert set(saved["metrics"]) == expected_keys
    # 8 images: every caption finds its image within the top 10
    assert saved["metrics"]["text_to_image_R@10"] == 100.0
    model = load_eval_model(CONFIG, trained["checkpoint"], torch.device("cpu"))
    mine = evaluate_retrieval(model, f"scenes={trained['karpathy']}", SIZE, "cpu", batch_size=3)
    for key, value in mine["metrics"].items():
        assert saved["metrics"][key] == pytest.approx(value, abs=1e-4)


@pytest.mark.parametrize(
    "script,args,needle",
    [
        ("zero_shot.py", ["--datasets", "x=/no/such/folder"], "/no/such/folder does not exist"),
        (
            "zero_shot.py",
            ["--datasets", "{tree}", "--model-weight", "/no/ckpt.pt"],
            "weights /no/ckpt.pt does not exist",
        ),
        ("zero_shot.py", ["--datasets", "{tree}", "--templates", "scenes"], "expected NAME=FILE"),
        ("retrieval.py", ["--datasets", "x={tree}", "--random-init"], "dataset_*.json"),
        ("retrieval.py", ["--datasets", "{tree}", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_cli_errors_are_one_line(trained, script, args, needle, capsys):
    args = [a.replace("{tree}", str(trained["tree"])) for a in args]
    rc, _, stderr = _main(script, ["--config", str(CONFIG), "--device", "cpu", *args], capsys)
    assert rc == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error:") and needle in lines[0], stderr


def test_cli_error_in_a_real_process():
    proc = _run("zero_shot.py", "--config", str(CONFIG), "--datasets", "x=/no/such/folder")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        == "zero_shot.py: error: dataset x: /no/such/folder does not exist; give NAME=PATH"
    )


def test_cli_help_explains_dataset_forms():
    for script in ("zero_shot.py", "retrieval.py"):
        proc = _run(script, "--help")
        assert proc.returncode == 0
        assert "NAME=PATH" in proc.stdout and "--model-weight" in proc.stdout


def test_cifar_spec_uses_bundled_names_and_templates(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    names = [
        n.encode()
        for n in ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    ]
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names}, f)
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 9, 3]}, f)
    data, templates = load_classification_data(f"cifar10={root}")
    bundled_names, bundled_templates = load_metadata("cifar10")
    assert data.classnames == bundled_names and templates == bundled_templates and len(templates) == 18
    assert data.labels == [0, 9, 3]
    with pytest.raises(EvalDataError, match="has no cifar-100-python/test"):
        load_classification_data(f"cifar100={root}")  # a CIFAR-10 folder


def test_epoch_hook(trained):
    model = create_model(str(CONFIG))
    load = zero_shot_epoch_hook(f"scenes={trained['tree']}", frequency=2)
    env = DistEnv(0, 0, 1, torch.device("cpu"), None)
    # workers=0 reads in this process (train.py's --workers asks for at least 1 loader thread).
    config, plan = TrainConfig(train_data=("d",), output=Path("o"), workers=0), BatchPlan(8, 1, 1, None)
    assert load(model, 1, config, plan, env) == {}
    model.train()
    metrics = load(model, 2, config, plan, env)
    assert set(metrics) == {"zeroshot_top1", "zeroshot_top5", "zeroshot_mean_per_class_recall"}
    assert 0.0 <= metrics["zeroshot_top1"] <= 100.0
    assert model.training  # evaluation restored the training mode
    with pytest.raises(EvalDataError):
        zero_shot_epoch_hook(f"scenes={trained['root'] / 'missing'}")


def test_image_folder_spec_trusts_bundled_names_only_for_index_folders(tmp_path):
    from PIL import Image

    for i in range(10):  # CIFAR-10 exported as an ImageFolder tree with folders 0..9
        (tmp_path / "idx" / str(i)).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "idx" / str(i) / "a.png")
    data, _ = load_classification_data(f"cifar10={tmp_path / 'idx'}")
    assert data.classnames == load_metadata("cifar10")[0]
    assert [p.parent.name for p in data.images] == [str(i) for i in range(10)]  # numeric, not "0, 1, 10.."
    for name in ("tabby", "airliner"):  # named folders keep their names, whatever the dataset name
        (tmp_path / "named" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "named" / name / "a.png")
    data, templates = load_classification_data(f"cifar10={tmp_path / 'named'}")
    assert data.classnames == ["airliner", "tabby"] and templates == load_metadata("cifar10")[1]
