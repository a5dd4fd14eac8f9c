"""The demo: scene generator, hub-format corpus, figures, step failures, and `demo.py --quick`
end to end (every real stage: local hub + hfd.sh, data2rec, DALI, torchrun train.py, eval CLIs)."""

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from src import figures
from src.demo.corpus import write_classification_set, write_hub_corpus, write_retrieval_set
from src.demo.pipeline import Demo, DemoError, DemoSettings, run_command
from src.demo.scenes import COLOURS, SHAPES, Scene, all_descriptions, classnames, draw_scene, random_scene
from tests._repo import REPO


def test_scenes_are_deterministic_and_captions_say_what_is_drawn():
    a = random_scene(random.Random(5))
    b = random_scene(random.Random(5))
    assert a == b
    assert np.array_equal(np.asarray(draw_scene(a)), np.asarray(draw_scene(b)))
    scene = Scene("blue", "square", 2, "at the top", seed=1)
    assert scene.caption(0) == "two blue squares at the top"
    assert (
        Scene("red", "circle", 1, "in the middle", 2).caption(1) == "a picture of a red circle in the middle"
    )
    img = np.asarray(draw_scene(Scene("red", "square", 1, "at the top", 3), size=64)).astype(int)
    red = (img[..., 0] > 150) & (img[..., 1] < 90) & (img[..., 2] < 90)
    rows = np.nonzero(red.any(axis=1))[0]
    assert red.sum() > 200 and rows.mean() < 32  # a red blob, in the upper half
    assert len(classnames()) == len(COLOURS) * len(SHAPES)
    assert len(set(all_descriptions())) == len(all_descriptions()) == 3 * len(classnames()) * 3


def test_hub_corpus_follows_the_parquet_format(tmp_path):
    from src.open_alip.tokenizer import decode

    shards = write_hub_corpus(
        tmp_path / "repo", num_samples=10, seed=1, image_size=48, num_shards=2, progress=False
    )
    assert [p.name for p in shards] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    table = pq.read_table(shards[0])
    assert str(table.schema.field("images").type) == "struct<bytes: binary, path: string>"
    texts_type = table.schema.field("texts").type
    assert pa.types.is_list(texts_type) and texts_type.value_type == pa.float32()
    assert table.num_rows == 5
    row = table.slice(0, 1).to_pylist()[0]
    img = Image.open(io.BytesIO(row["images"]["bytes"]))
    assert img.format == "JPEG" and img.size == (48, 48)
    tokens = np.asarray(row["texts"], dtype=np.float32)
    assert tokens.shape == (2 * 77,)
    captions = [decode(tokens[i * 77 : (i + 1) * 77].astype(np.int64)).strip() for i in range(2)]
    rng = random.Random(1)
    first = random_scene(rng)
    assert captions == [first.caption(0), first.caption(1)]


def test_eval_sets_are_readable_by_the_eval_readers(tmp_path):
    from src.evaluation.specs import load_classification_data, load_retrieval_data

    tree = write_classification_set(tmp_path / "cls", per_class=2, seed=0, image_size=32)
    data, _ = load_classification_data(f"scenes={tree}")
    assert sorted(data.classnames) == sorted(classnames()) and len(data.images) == 24
    karpathy = write_retrieval_set(tmp_path / "ret", num_images=3, seed=0, image_size=32)
    ret = load_retrieval_data(f"scenes={karpathy}")
    assert len(ret.images) == 3 and ret.caption_image == [0] * 5 + [1] * 5 + [2] * 5


def test_figures(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"kind": "train", "step": 2, "loss": 3.0}\n{"kind": "eval", "step": 2, "x": 1}\n'
        '{"kind": "train", "step": 1, "loss": 4.0}\n{"kind": "tra'
    )
    points = figures.read_loss_points(metrics)
    assert points == [(1, 4.0), (2, 3.0)]
    curve = figures.plot_loss_curve(points, tmp_path / "loss.png", reference=4.1, reference_label="chance")
    assert Image.open(curve).size == (720, 420)
    tiles = [draw_scene(Scene("red", "circle", 1, "at the top", i)) for i in range(5)]
    grid = figures.caption_grid(
        tiles, [[("a", figures.GOOD), ("b", figures.BAD)]] * 5, tmp_path / "g.png", columns=3
    )
    with Image.open(grid) as g:
        assert g.width == 3 * (128 + 80) and g.height == 2 * (128 + 8 + 2 * 15 + 10)
    with pytest.raises(ValueError):
        figures.plot_loss_curve([], tmp_path / "empty.png")


def test_failures_name_the_step(tmp_path):
    log = tmp_path / "logs" / "x.log"
    with pytest.raises(DemoError, match=r"step 'convert' failed \(python\S* exited with 3\): boom error"):
        run_command(
            "convert", [sys.executable, "-c", "import sys; print('boom error'); sys.exit(3)"], log, {}
        )
    assert "boom error" in log.read_text()
    demo = Demo(DemoSettings(output=tmp_path))

    def broken() -> str:
        raise FileNotFoundError("no such shard")

    with pytest.raises(DemoError, match="step 'train' failed: FileNotFoundError: no such shard"):
        demo._step(5, 7, "train", "training", broken)


def test_demo_cli_rejects_bad_sizes():
    proc = subprocess.run(
        [sys.executable, "demo.py", "--epochs", "0"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.strip() == "demo.py: error: --epochs must be at least 1"


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "demo.py", "--quick", "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for i, name in enumerate(["corpus", "download", "convert", "loader", "train", "evaluate", "report"], 1):
        assert f"[demo {i}/7] {name}: done" in proc.stdout
    assert "zero-shot classification top-1" in proc.stdout and "chance" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    cls, ret = summary["classification"], summary["retrieval"]
    assert cls["num_classes"] == 12 and cls["chance_top1"] == pytest.approx(100 / 12)
    assert 0 <= cls["top1"] <= cls["top5"] <= 100
    assert ret["num_captions"] == 5 * ret["num_images"]
    assert ret["text_to_image_R@1"] <= ret["text_to_image_R@5"] <= ret["text_to_image_R@10"]
    assert Path(summary["checkpoint"]).is_file()
    for png in ("loss_curve.png", "predictions.png", "loader_batch.png"):
        with Image.open(out / png) as img:
            assert img.format == "PNG" and img.width > 100
    # the download really went through the local hub: hfd.sh's files equal the generated ones
    served = sorted((out / "hub_repo" / "data").glob("*.parquet"))
    fetched = sorted((out / "download" / "data").glob("*.parquet"))
    assert [p.read_bytes() for p in served] == [p.read_bytes() for p in fetched]
    assert sorted(p.name for p in (out / "eval_results").glob("*.json")) == [
        "classification_scenes.json",
        "retrieval_scenes.json",
    ]
