"""Records with different numbers of captions, end to end: every input kind data2rec reads ->
data2rec -> both loader backends. Each sample's caption must be one of its own record's.

Every caption in these inputs is unique, so a caption names its record: a batch row is
checked against the captions of the record it came from, and no record comes twice.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from dataloaders.imagenet import build_loader
from src.convert import ConvertOptions, SourceOptions, convert
from src.open_alip.tokenizer import tokenize_np
from tests._data2rec_helpers import jpeg, tokens_for, write_hub_parquet

COUNTS = [1, 2, 3, 1, 3, 2, 1, 2, 3, 1, 2, 3]  # captions per sample


def _rows(tokens: np.ndarray) -> set[tuple[int, ...]]:
    """The non-empty 77-token captions of a label, as hashable rows."""
    blocks = np.asarray(tokens, dtype=np.int64).reshape(-1, 77)
    return {tuple(b) for b in blocks if b[0]}


def _parquet(root):
    labels = [tokens_for(k, seed=i) for i, k in enumerate(COUNTS)]
    write_hub_parquet(root / "data.parquet", [(jpeg(24, 20, seed=i), t) for i, t in enumerate(labels)])
    return root / "data.parquet", [_rows(t) for t in labels]


def _texts(i: int, k: int) -> list[str]:
    return [f"sample {i} caption {j} of {k}" for j in range(k)]


def _folder(root):
    (root / "img").mkdir()
    (root / "captions").mkdir()
    for i, k in enumerate(COUNTS):
        (root / "img" / f"{i:02d}.jpg").write_bytes(jpeg(24, 20, seed=i))
        for j, text in enumerate(_texts(i, k)):  # a.txt, a.1.txt, a.2.txt ...
            (root / "captions" / (f"{i:02d}.txt" if j == 0 else f"{i:02d}.{j}.txt")).write_text(text)
    return root, [_rows(tokenize_np(_texts(i, k))) for i, k in enumerate(COUNTS)]


def _manifest(root):
    with open(root / "pairs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filepath", "caption_a", "caption_b", "caption_c"])
        for i, k in enumerate(COUNTS):
            (root / f"{i}.jpg").write_bytes(jpeg(24, 20, seed=i))
            texts = _texts(i, k)
            # the empty cells sit anywhere among the caption columns
            cells = texts + [""] * (3 - k) if i % 2 else [""] * (3 - k) + texts
            writer.writerow([f"{i}.jpg", *cells])
    return root / "pairs.csv", [_rows(tokenize_np(_texts(i, k))) for i, k in enumerate(COUNTS)]


@pytest.mark.parametrize("make", [_parquet, _folder, _manifest], ids=["parquet", "folder", "manifest"])
def test_every_caption_count_reaches_both_loaders(tmp_path, make):
    source = tmp_path / "in"
    source.mkdir()
    path, captions = make(source)
    columns = {"caption_columns": ("caption_a", "caption_b", "caption_c")} if make is _manifest else {}
    report = convert(
        [path],
        tmp_path / "rec" / "mixed",
        ConvertOptions(progress=False, workers=1, source=SourceOptions(**columns)),
    )
    assert report["records_by_caption_count"] == {"1": 4, "2": 4, "3": 4}
    owner = {row: i for i, rows in enumerate(captions) for row in rows}
    for backend in ("dali", "torch"):
        loader = build_loader(
            tmp_path / "rec" / "mixed",
            4,
            input_size=16,
            backend=backend,
            device="cpu",
            num_threads=1,
            cache_dir=tmp_path / "cache",
            seed=3,
        )
        seen = []
        for epoch in range(2):  # two epochs draw other captions of the same records
            loader.set_epoch(epoch)
            for images, tokens in loader:
                assert images.shape == (4, 3, 16, 16) and tokens.shape == (4, 77)
                for row in tokens.numpy():
                    record = owner.get(tuple(row))
                    assert record is not None, f"{backend}: a caption that belongs to no record"
                    seen.append((epoch, record))
        for epoch in range(2):
            records = [r for e, r in seen if e == epoch]
            assert len(records) == len(set(records)) == len(COUNTS), f"{backend}: each record once per epoch"
