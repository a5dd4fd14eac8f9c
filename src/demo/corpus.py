"""Write the demo's data: a training corpus in the hub's parquet format and held-out eval sets.

Training rows follow docs/formats.md §2 (the YFCC15M release): ``images`` is a struct
``{bytes: JPEG, path}``, ``texts`` is ``list<float32>`` of K*77 CLIP token ids (K captions, here
different phrasings of the same scene). The held-out sets use formats the evaluation CLIs read
from disk: an ImageFolder tree (class sub-folders) for classification and a Karpathy-split JSON
for retrieval, so the demo exercises the same readers a user's data goes through.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from src.demo.scenes import CAPTION_FORMS, DEMO_TEMPLATES, classnames, draw_scene, random_scene
from src.fsutil import atomic_path, atomic_write_json
from src.open_alip.constants import CONTEXT_LENGTH

# Seeds of the held-out streams differ from training so no eval image is a training image.
EVAL_SEED_OFFSET = 1_000_003


def _jpeg(img, quality: int = 92) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_hub_corpus(
    repo_dir: Path | str,
    num_samples: int,
    seed: int = 0,
    image_size: int = 64,
    num_shards: int = 2,
    captions_per_row: int = 2,
    progress: bool = True,
) -> list[Path]:
    """Write ``repo_dir/data/train-0000i-of-0000N.parquet`` (+ a dataset card); returns the shards."""
    from src.open_alip.tokenizer import tokenize_np

    repo_dir = Path(repo_dir)
    (repo_dir / "data").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    scenes = [random_scene(rng) for _ in range(num_samples)]
    per_shard = -(-num_samples // num_shards)
    paths = []
    bar = tqdm(total=num_samples, desc="generating scenes", unit="img", disable=not progress)
    for shard in range(num_shards):
        chunk = scenes[shard * per_shard : (shard + 1) * per_shard]
        images, texts = [], []
        for i, scene in enumerate(chunk):
            index = shard * per_shard + i
            captions = [scene.caption(index + k) for k in range(captions_per_row)]
            tokens = tokenize_np(captions, CONTEXT_LENGTH).astype(np.float32).reshape(-1)
            images.append({"bytes": _jpeg(draw_scene(scene, image_size)), "path": f"{index:08d}.jpg"})
            texts.append(tokens.tolist())
            bar.update(1)
        table = pa.table(
            {
                "images": pa.array(images, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                "texts": pa.array(texts, type=pa.list_(pa.float32())),
            }
        )
        path = repo_dir / "data" / f"train-{shard:05d}-of-{num_shards:05d}.parquet"
        _atomic_write_table(table, path)
        paths.append(path)
    bar.close()
    (repo_dir / "README.md").write_text(
        "---\nlicense: cc0-1.0\n---\n# Synthetic scenes\n\nGenerated shapes with captions that describe them "
        f"({num_samples} rows, seed {seed}, {image_size}px JPEG, {captions_per_row} tokenised captions per "
        "row).\n"
    )
    return paths


def write_classification_set(
    out_dir: Path | str, per_class: int, seed: int = 0, image_size: int = 64
) -> Path:
    """ImageFolder tree ``out_dir/<colour>_<shape>/NNNN.jpg`` of single-shape scenes, plus the demo
    prompt templates as ``templates.json`` beside the tree; returns the tree's folder."""
    out_dir = Path(out_dir)
    tree = out_dir / "images"
    rng = random.Random(seed + EVAL_SEED_OFFSET)
    for classname in classnames():
        colour, shape = classname.split()
        folder = tree / f"{colour}_{shape}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            scene = random_scene(rng, count=1)
            scene = type(scene)(colour, shape, 1, scene.region, scene.seed)
            draw_scene(scene, image_size).save(folder / f"{i:04d}.jpg", quality=92)
    (out_dir / "templates.json").write_text(json.dumps(list(DEMO_TEMPLATES), indent=1) + "\n")
    return tree


def write_retrieval_set(out_dir: Path | str, num_images: int, seed: int = 0, image_size: int = 64) -> Path:
    """Karpathy-style ``dataset_scenes.json`` (split "test", five captions per image) + images/."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 2 * EVAL_SEED_OFFSET)
    entries = []
    for i in range(num_images):
        scene = random_scene(rng)
        name = f"{i:05d}.jpg"
        draw_scene(scene, image_size).save(out_dir / "images" / name, quality=92)
        sentences = [{"raw": scene.caption(form)} for form in range(len(CAPTION_FORMS))]
        entries.append(
            {"filename": name, "filepath": "images", "imgid": i, "split": "test", "sentences": sentences}
        )
    return atomic_write_json(
        out_dir / "dataset_scenes.json", {"dataset": "scenes", "images": entries}, indent=None
    )
