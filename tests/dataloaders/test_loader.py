"""The DALI loader (real CPU pipelines) and the PyTorch fallback, on small shards written here."""

import gc
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from dataloaders.base import BadRecordLimitError, select_captions, shard_range
from dataloaders.imagenet import (
    DEVICE_MEMORY_PADDING,
    HOST_MEMORY_PADDING,
    HW_DECODER_LOAD,
    PREFETCH_DEPTH,
    DaliLoader,
    build_loader,
)
from dataloaders.read_ahead import ReaderDiedError
from dataloaders.shards import ShardError, load_shards, resolve_shards
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from src.open_alip.crops import crop_and_flip, crops_and_flips
from src.recordio import IRHeader, MXIndexedRecordIO, pack
from tests._loader_helpers import caption_index, caption_tokens, record_colour, record_id, write_shard
from tests._repo import REPO

S = 32  # input size: small keeps the CPU pipelines fast
ALL_IDS = [*range(0, 20), *range(100, 113), *range(200, 207)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Three shards, 40 records; the third holds one caption per record, the others three."""
    d = tmp_path_factory.mktemp("shards")
    write_shard(d / "part-0", range(0, 20))
    write_shard(d / "part-1", range(100, 113))
    write_shard(d / "part-2", range(200, 207), k=1)
    return d


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def make(data, cache, **kw):
    kw.setdefault("input_size", S)
    kw.setdefault("device", "cpu")
    kw.setdefault("num_threads", 2)
    return build_loader(data, kw.pop("batch_size", 4), cache_dir=cache, **kw)


def ids_of(batches) -> list[int]:
    return [record_id(t) for _, tokens in batches for t in tokens.numpy()]


# -- input resolution and the combined index ------------------------------------------------


def test_inputs_prefix_folder_glob_list_agree(shards):
    by_folder = resolve_shards(shards)
    assert [s.name for s in by_folder] == ["part-0.rec", "part-1.rec", "part-2.rec"]
    assert resolve_shards(str(shards / "part-*")) == by_folder
    assert resolve_shards(str(shards / "*.rec")) == by_folder
    assert resolve_shards([shards / "part-0", shards / "part-1.rec", str(shards / "part-2.idx")]) == by_folder


@pytest.mark.parametrize(
    "make_bad, fragment",
    [
        (lambda d: d / "nothing", "no such .rec file"),
        (lambda d: d, "holds no training .rec files"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.idx").unlink(), d / "a")[-1], "no index a.idx"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.idx").unlink(), d)[-1], "(a.rec: no a.idx"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.rec").unlink(), d)[-1], "(a.idx: no a.rec"),
        (lambda d: str(d / "zz*"), "matches no .rec files"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.idx").write_text(""), d)[-1], "lists no records"),
        (
            lambda d: (write_shard(d / "a", range(3)), (d / "a.rec").write_bytes(b"junk" * 9), d)[-1],
            "not a RecordIO file",
        ),
        (
            lambda d: (
                write_shard(d / "a", range(3)),
                (d / "a.idx").write_text("0\t0\n1\t1234\n2\t2468\n"),
                d,
            )[-1],
            "offset 1234 (key 1) is not the start of a record",
        ),
    ],
)
def test_bad_inputs_give_one_line_errors(tmp_path, make_bad, fragment):
    data = make_bad(tmp_path)
    with pytest.raises(ShardError) as err:
        load_shards(data, cache_dir=tmp_path / "cache")
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_empty_list_and_duplicate_shard_are_refused(shards):
    with pytest.raises(ShardError, match="no input given"):
        resolve_shards([])
    with pytest.raises(ShardError, match="given twice"):
        resolve_shards([shards / "part-0", shards / "part-0.rec"])


def test_record_index_is_cached_and_follows_the_files(tmp_path):
    write_shard(tmp_path / "d" / "a", range(5))
    write_shard(tmp_path / "d" / "b", range(10, 13))
    first = load_shards(tmp_path / "d", cache_dir=tmp_path / "c")
    assert first.total_records == 8
    a_size = (tmp_path / "d" / "a.rec").stat().st_size
    # A record runs to the next one in its shard, the last one to the end of its file.
    assert first.span(4) == (0, int(first.offsets[4]), a_size)
    assert first.span(5) == (1, 0, int(first.offsets[6]))
    again = load_shards(tmp_path / "d", cache_dir=tmp_path / "c")
    assert sorted(p.name.split(".", 1)[1] for p in (tmp_path / "c").iterdir()) == [
        "counts.npy",
        "keys.npy",
        "offsets.npy",
    ]
    assert isinstance(again.keys, np.memmap) and list(again.keys) == [0, 1, 2, 3, 4, 10, 11, 12]
    write_shard(tmp_path / "d" / "b", range(10, 14))  # rewritten shard: a new cache entry
    os.utime(tmp_path / "d" / "b.rec", ns=(1, 1))
    changed = load_shards(tmp_path / "d", cache_dir=tmp_path / "c")
    assert changed.total_records == 9 and len(list((tmp_path / "c").iterdir())) == 6
    assert changed.locate(8)[0].name == "b.rec" and changed.locate(8)[1] == 13


# -- DALI pipelines -------------------------------------------------------------------------


def test_eval_reads_every_record_once_in_order_with_clip_normalisation(shards, cache):
    loader = make(shards, cache, train=False, batch_size=6)
    assert (len(loader), loader.num_samples, loader.total_records) == (7, 40, 40)
    batches = list(loader)
    assert len(batches) == 7 and batches[-1][0].shape == (4, 3, S, S)  # partial last batch kept
    assert ids_of(batches) == ALL_IDS
    images, tokens = batches[0]
    assert images.dtype == torch.float32 and tokens.dtype == torch.int64 and tokens.shape == (6, 77)
    # De-normalise the centre pixel of record 0 and compare with the colour that was written.
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1) * 255
    std = torch.tensor(CLIP_STD).view(3, 1, 1) * 255
    rgb = (images[0] * std + mean)[:, S // 2, S // 2]
    assert torch.allclose(rgb, torch.tensor(record_colour(0), dtype=torch.float32), atol=6)


def test_train_epochs_shuffle_without_repeats_and_set_epoch_reproduces(shards, cache):
    loader = make(shards, cache, train=True, seed=3)
    assert (len(loader), loader.num_samples) == (10, 40)
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == 10 and all(im.shape == (4, 3, S, S) for im, _ in batches)
        epochs.append(batches)
    e0, e1 = ids_of(epochs[0]), ids_of(epochs[1])
    assert sorted(e0) == sorted(e1) == sorted(ALL_IDS)
    assert e0 != e1 and e0 != ALL_IDS
    assert loader.pipelines_built == 1  # one DALI pipeline for both epochs
    other = make(shards, cache, train=True, seed=3)
    other.set_epoch(1)
    replay = list(other)
    assert ids_of(replay) == e1
    assert all(torch.equal(a[0], b[0]) for a, b in zip(replay, epochs[1]))
    # Random crops and flips: the same record is not pixel-identical across epochs.
    first = {record_id(t): im for im, tok in epochs[0] for im, t in zip(im, tok.numpy())}
    second = {record_id(t): im for im, tok in epochs[1] for im, t in zip(im, tok.numpy())}
    assert any(not torch.equal(first[i], second[i]) for i in ALL_IDS)


@pytest.mark.parametrize("train", [False, True])
def test_two_ranks_split_the_data_without_overlap(shards, cache, train):
    loaders = [make(shards, cache, train=train, batch_size=3, rank=r, world_size=2) for r in range(2)]
    per_rank = [ids_of(list(ld)) for ld in loaders]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert all(len(set(p)) == len(p) for p in per_rank)
    if train:  # drop_last: equal batch counts (DDP needs them), 20 records -> 6 batches of 3
        assert len(loaders[0]) == len(loaders[1]) == 6 and [len(p) for p in per_rank] == [18, 18]
        # The next epoch each rank moves to the other half of the data.
        nxt = ids_of(list(loaders[0]))
        assert set(nxt) <= set(ALL_IDS[20:]) and set(per_rank[0]) <= set(ALL_IDS[:20])
    else:
        assert sorted(per_rank[0] + per_rank[1]) == sorted(ALL_IDS)
        assert [len(ld) for ld in loaders] == [7, 7] and [ld.num_samples for ld in loaders] == [20, 20]


def test_torchrun_environment_picks_rank(shards, cache, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = make(shards, cache, train=False)
    assert (loader.rank, loader.world_size) == (1, 3)
    lo, hi = shard_range(40, 1, 3)
    assert loader.num_samples == hi - lo == 13
    assert ids_of(list(loader)) == ALL_IDS[lo:hi]


def test_caption_choice_is_uniform_over_non_empty_captions(tmp_path, cache):
    # Records with an even id have caption 1 empty: they choose between 0 and 2 only.
    empty = {i: frozenset({1}) for i in range(0, 48, 2)}
    write_shard(tmp_path / "caps", range(48), k=3, empty=empty)
    loader = make(tmp_path / "caps", cache, train=True, batch_size=8, num_threads=1)
    odd, even = Counter(), Counter()
    for _ in range(6):
        for _, tokens in loader:
            for t in tokens.numpy():
                (even if record_id(t) % 2 == 0 else odd)[caption_index(t)] += 1
    assert even[1] == 0 and sum(even.values()) == sum(odd.values()) == 144
    # 144 draws: expected 72/72 and 48/48/48; these bounds are > 4 standard deviations wide.
    assert all(45 <= even[c] <= 99 for c in (0, 2))
    assert all(24 <= odd[c] <= 72 for c in (0, 1, 2))
    # all_captions keeps every caption block, empty ones included.
    full = make(tmp_path / "caps", cache, train=False, batch_size=8, all_captions=True)
    images, tokens = next(iter(full))
    assert tokens.shape == (8, 3, 77)
    assert [caption_index(t) for t in tokens[1].numpy()] == [0, 1, 2] and not tokens[0, 1].any()


def test_select_captions_never_picks_an_empty_caption():
    labels = torch.zeros(5, 3 * 77)
    labels[:, 2 * 77] = 49406  # only the third caption is present
    labels[4, 0] = 49406
    for seed in range(20):
        chosen = select_captions(labels, seed)
        assert chosen.shape == (5, 77) and (chosen[:4, 0] == 49406).all()
    with pytest.raises(ValueError, match="K\\*77"):
        select_captions(torch.zeros(2, 100), 0)


def test_mixed_caption_counts_in_one_shard_on_both_backends(tmp_path, cache):
    # Records hold 1, 2 or 3 captions side by side in one shard, as the hub's rows may.
    counts = {i: 1 + i % 3 for i in range(30)}
    write_shard(tmp_path / "mixed", range(30), k=counts)
    for backend in ("dali", "torch"):
        for train in (False, True):
            loader = make(tmp_path / "mixed", cache, train=train, batch_size=6, backend=backend, seed=2)
            seen = 0
            for _ in range(2):
                for _, tokens in loader:
                    for t in tokens.numpy():
                        # The caption is one of this record's own, never an empty padding block.
                        assert 0 <= caption_index(t) < counts[record_id(t)], (backend, train)
                        seen += 1
            assert seen == 60, (backend, train)
            full = make(
                tmp_path / "mixed", cache, train=False, batch_size=6, backend=backend, all_captions=True
            )
            _, tokens = next(iter(full))
            assert tokens.shape == (6, 3, 77)
            assert [int((block[:, 0] != 0).sum()) for block in tokens] == [1, 2, 3, 1, 2, 3]


def test_backends_deliver_the_same_records_crops_and_captions(tmp_path, cache):
    write_shard(tmp_path / "wide", range(24), size=(96, 40))  # elongated: some crops are the fallback
    runs = {
        b: list(make(tmp_path / "wide", cache, train=True, batch_size=8, backend=b, seed=1))
        for b in ("dali", "torch")
    }
    for (a, ta), (b, tb) in zip(runs["dali"], runs["torch"]):
        assert torch.equal(ta, tb)
        # Same crop box and flip per sample; only the decoders' and resamplers' rounding differs.
        assert float((a - b).abs().mean()) < 0.01


def _noise_shard(prefix: Path, sizes: list[tuple[int, int]], cut: dict[int, float] | None = None) -> Path:
    """One caption per record, images of pure noise: every pixel the resize reads shows.
    Records in `cut` keep only that share of their JPEG's bytes."""
    rng = np.random.default_rng(5)
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for rid, (w, h) in enumerate(sizes):
            jpg = cv2.imencode(".jpg", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))[1].tobytes()
            jpg = jpg[: int(len(jpg) * (cut or {}).get(rid, 1.0))]
            rec.write_idx(rid, pack(IRHeader(0, caption_tokens(rid, 1).ravel(), rid, 0), jpg))
    return Path(f"{prefix}.rec")


def test_every_path_resizes_the_crop_box_alone_the_cpu_one_within_a_grey_level_of_the_fallback(
    tmp_path, cache
):
    # Noise crops scaled up (a 20-pixel side to 32) and down (up to 9x): a box one pixel off, or a
    # resize that reads pixels around the box, would change every border pixel.
    sizes = [(20 + 37 * i % 290, 16 + 53 * i % 250) for i in range(24)]
    _noise_shard(tmp_path / "noise", sizes)
    window = make(tmp_path / "noise", cache, train=True, batch_size=8, seed=3)
    full = make(tmp_path / "noise", cache, train=True, batch_size=8, seed=3)
    full.roi_decode = False  # the `mixed` pipeline's way: whole decode, the box sliced out, DALI's resize
    fallback = make(tmp_path / "noise", cache, train=True, batch_size=8, seed=3, backend="torch")
    assert window.roi_decode and window.resizes_in_torch and not full.resizes_in_torch
    level = 1 / 255 / min(CLIP_STD)  # one grey level after normalisation
    for (a, ta), (b, tb), (c, tc) in zip(window, full, fallback):
        assert torch.equal(ta, tb) and torch.equal(ta, tc)
        # The CPU loader (DALI's window decode, torch's resize) against PIL's crop and resize.
        diff = (a - c).abs()
        assert float(diff.max()) <= 1.001 * level and float((diff > level / 2).float().mean()) < 0.05
        # The `mixed` way: the same box inside (DALI's resize only rounds once, PIL between its
        # passes); at the crop's edge DALI repeats the edge pixels where PIL narrows its filter,
        # which on noise is up to 11 levels in the outer two pixels (measured; 3 on photo-like images).
        diff = (b - c).abs()
        assert float(diff[..., 2:-2, 2:-2].max()) <= 1.001 * level and float(diff.mean()) < 0.5 * level


def test_cpu_window_decode_stops_above_the_rows_it_does_not_need(tmp_path, cache, caplog):
    # 64 x 400: no drawn crop fits, so every seed gets the centred fallback, rows 160-240 (plus the
    # margin). Record 3 is cut after 75% of its bytes, well below those rows: a whole decode fails
    # on it, the window decode never reads that far.
    _noise_shard(tmp_path / "tall", [(64, 400)] * 8, cut={3: 0.75})
    caplog.set_level(logging.WARNING, logger="dataloaders")
    window = make(tmp_path / "tall", cache, train=True, batch_size=4, seed=2, max_bad_records=1)
    assert sorted(ids_of(list(window))) == list(range(8)) and window.bad_records == 0
    full = make(tmp_path / "tall", cache, train=True, batch_size=4, seed=2, max_bad_records=1)
    full.roi_decode = False
    assert 3 not in ids_of(list(full)) and full.bad_records == 1 and len(_skips(caplog)) == 1


def test_batch_crops_are_each_samples_own_draws_with_the_crop_semantics():
    rng = np.random.default_rng(0)
    n = 3000
    widths, heights = rng.integers(8, 900, n), rng.integers(8, 900, n)
    seeds = rng.integers(0, 2**63 - 1, n)
    boxes, mirror = crops_and_flips(widths, heights, seeds)
    # The PyTorch fallback draws one sample at a time (crop_and_flip): the same bits.
    assert all(
        (*boxes[i].tolist(), bool(mirror[i])) == crop_and_flip(int(widths[i]), int(heights[i]), int(seeds[i]))
        for i in range(n)
    )
    # A sample's draws do not depend on its batch: reordered and cut, the same boxes.
    order = rng.permutation(n)[:500]
    again, flips = crops_and_flips(widths[order], heights[order], seeds[order])
    assert np.array_equal(again, boxes[order]) and np.array_equal(flips, mirror[order])
    left, top, right, bottom = boxes.T
    w, h = right - left, bottom - top
    assert (left >= 0).all() and (top >= 0).all() and (right <= widths).all() and (bottom <= heights).all()
    assert (w > 0).all() and (h > 0).all()
    # An attempt that fits keeps 70-100% of the area at aspect 0.8-1.25 (up to the rounding of w
    # and h); only the centred fallback, for images too elongated for any attempt, keeps less.
    share, aspect = w * h / (widths * heights), w / h
    fallback = (left == (widths - w) // 2) & (top == (heights - h) // 2) & ((w == widths) | (h == heights))
    drawn = ~fallback
    assert (share[drawn] >= 0.7 * (1 - 4 / np.minimum(w, h)[drawn])).all() and (share <= 1).all()
    assert (np.abs(np.log(aspect[drawn])) <= np.log(1.25) + 2 / np.minimum(w, h)[drawn]).all()
    assert 0.45 < mirror.mean() < 0.55
    # 100 attempts, as the original's DALI crop: a 4:3 photo practically never falls back to the
    # centred crop (10 attempts gave it to 180 of 3000 seeds).
    boxes, _ = crops_and_flips(np.full(3000, 500), np.full(3000, 375), np.arange(3000))
    assert not (boxes == (15, 0, 484, 375)).all(axis=1).any()


# -- records that cannot be read or decoded -----------------------------------------------


def _bad_shards(tmp_path, kind: str) -> list[Path]:
    write_shard(tmp_path / "good", range(12))
    write_shard(tmp_path / "bad", range(50, 62), corrupt={55: kind})
    return [tmp_path / "good", tmp_path / "bad"]


def _skips(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]


@pytest.mark.parametrize(
    "backend, kind, workers",
    [
        ("dali", "truncated", 0),
        ("dali", "truncated", 1),  # read in a thread / in a reader process
        ("torch", "truncated", None),
        ("torch", "bogus_marker", None),
    ],
)
def test_a_bad_record_is_skipped_once_and_a_resume_never_meets_it(
    tmp_path, cache, caplog, backend, kind, workers
):
    data = _bad_shards(tmp_path, kind)
    caplog.set_level(logging.WARNING, logger="dataloaders")
    kw = dict(train=True, backend=backend, seed=11, num_threads=1)
    if workers is not None:
        kw["reader_workers"] = workers
    first = make(data, cache, **kw)
    first.set_epoch(1)
    batches, states = [], [first.state_dict()]
    for batch in first:
        batches.append(batch)
        states.append(first.state_dict())
    # Training continued: every batch full (DDP ranks stay in step), the bad record never in one.
    assert len(batches) == len(first) == 6 and all(im.shape[0] == 4 for im, _ in batches)
    assert 55 not in ids_of(batches) and len(set(ids_of(batches))) == 23
    skips = _skips(caplog)
    assert len(skips) == 1 and "bad.rec record key 55 at byte" in skips[0] and "\n" not in skips[0]
    record = first.shardset.keys.tolist().index(55, 12)
    assert first.bad_records == 1 and first.skipped_records == [record]
    # The skip happened at the batch that held the record; take states after and before it.
    at = next(i for i, st in enumerate(states) if st["bad_records"])
    assert 1 < at < len(states) - 1, "pick a seed that puts the bad record mid-epoch"
    after, before = states[at], states[at - 2]
    assert (after["epoch"], after["batch"], after["skipped_records"]) == (1, at, [record])
    caplog.clear()
    resumed = make(data, cache, **kw)
    resumed.load_state_dict(after)
    tail = list(resumed)
    assert len(tail) == len(batches) - at
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(tail, batches[at:]))
    list(resumed)  # the next epoch, too, leaves it out without meeting it
    assert not _skips(caplog) and resumed.bad_records == 1
    # From a state taken before the skip, the resumed run meets it at the same place: same batches.
    again = make(data, cache, **kw)
    again.load_state_dict(before)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(list(again), batches[at - 2 :]))
    assert len(_skips(caplog)) == 1


@pytest.mark.parametrize("backend, bad", [("dali", np.nan), ("torch", np.nan), ("torch", np.inf)])
def test_a_nan_token_is_a_bad_record_skipped_and_counted(tmp_path, cache, caplog, backend, bad):
    # NaN passed the old range test (its comparisons are false) and crashed training in F.embedding.
    label = caption_tokens(55, 3).ravel()
    label[80] = bad
    write_shard(tmp_path / "good", range(12))
    write_shard(tmp_path / "bad", range(50, 62), labels={55: label})
    caplog.set_level(logging.WARNING, logger="dataloaders")
    loader = make(
        [tmp_path / "good", tmp_path / "bad"], cache, train=True, backend=backend, seed=11, num_threads=1
    )
    batches = list(loader)
    assert len(batches) == 6 and 55 not in ids_of(batches) and len(set(ids_of(batches))) == 23
    assert loader.bad_records == 1 and loader.skipped_records == [loader.shardset.keys.tolist().index(55, 12)]
    skips = _skips(caplog)
    word = "NaN" if np.isnan(bad) else "infinite"
    assert (
        len(skips) == 1 and "bad.rec record key 55 at byte" in skips[0] and f"hold {word} values" in skips[0]
    )


def test_dali_cpu_decodes_what_pil_refuses_and_skips_nothing(tmp_path, cache, caplog):
    # libjpeg-turbo, DALI's CPU decoder, only warns about a bogus marker inside the scan.
    loader = make(_bad_shards(tmp_path, "bogus_marker"), cache, train=True, seed=11, num_threads=1)
    assert 55 in ids_of(list(loader)) and loader.bad_records == 0 and not _skips(caplog)


@pytest.mark.parametrize("backend", ["dali", "torch"])
def test_too_many_bad_records_stop_with_one_line(tmp_path, cache, backend):
    write_shard(tmp_path / "rotten", range(16), corrupt={2, 7, 11})
    loader = make(tmp_path / "rotten", cache, train=False, backend=backend, max_bad_records=1, num_threads=1)
    with pytest.raises(BadRecordLimitError) as err:
        list(loader)
    text = str(err.value)
    assert "\n" not in text and text.startswith("rank 0: 2 unreadable or undecodable record(s)"), text
    assert "max_bad_records=1" in text and "rotten.rec record key 7" in text and "--max-bad-records" in text
    assert loader.bad_records == 2


def test_all_ranks_bad_records_are_left_out_on_resume(shards, cache):
    def rank0():
        return make(shards, cache, train=True, rank=0, world_size=2, batch_size=3)

    states = [
        make(shards, cache, train=True, rank=r, world_size=2, batch_size=3).state_dict() for r in range(2)
    ]
    states[1]["skipped_records"] = [25]  # rank 1 met record 25 in epoch 0; rank 0 reads it in epoch 1
    resumed = rank0()
    resumed.load_state_dict(states)
    assert resumed.skipped_records == [25] and resumed.state_dict()["bad_records"] == 1
    plain, stream = rank0().epoch_stream(1)[0].tolist(), resumed.epoch_stream(1)[0].tolist()
    at = plain.index(25)
    assert stream[:at] == plain[:at] and stream[at : len(plain) - 1] == plain[at + 1 :]
    with pytest.raises(ShardError, match="2 ranks but this run has 1"):
        make(shards, cache, train=True).load_state_dict(states)


# -- exact resume ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["dali", "torch"])
def test_mid_epoch_resume_gives_the_same_batches(shards, cache, backend):
    reference = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    reference.set_epoch(2)
    expected = list(reference)
    first = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    first.set_epoch(2)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    assert (state["epoch"], state["batch"], state["bad_records"]) == (2, 3, 0)
    resumed = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert len(head) + len(tail) == len(expected)
    for (ia, ta), (ib, tb) in zip(head + tail, expected):
        assert torch.equal(ia, ib) and torch.equal(ta, tb)
    assert resumed.state_dict()["epoch"] == 3  # the finished epoch moved the loader on
    head_only = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    head_only.load_state_dict({**state, "batch": len(head_only) - 1})
    assert len(list(head_only)) == 1 and head_only.state_dict()["batch"] == 0
    # A jump in the middle of an epoch (the trainer's --train-num-samples does this) keeps the pipeline.
    first.set_epoch(2)
    assert [torch.equal(a[1], b[1]) for a, b in zip(first, expected)] == [True] * len(expected)
    if backend == "dali":
        assert first.pipelines_built == 1
    with pytest.raises(ShardError, match="world_size"):
        make(shards, cache, train=True, backend=backend, seed=7, rank=0, world_size=2).load_state_dict(state)


# -- the PyTorch fallback -------------------------------------------------------------------


def test_fallback_matches_dali_shapes_and_captions(shards, cache):
    for train in (False, True):
        dali = list(make(shards, cache, train=train, batch_size=6))
        fallback = list(make(shards, cache, train=train, batch_size=6, backend="torch"))
        assert [(im.shape, t.shape, im.dtype, t.dtype) for im, t in dali] == [
            (im.shape, t.shape, im.dtype, t.dtype) for im, t in fallback
        ]
        if not train:  # same order without shuffling: same records, same chosen captions
            assert all(torch.equal(a[1], b[1]) for a, b in zip(dali, fallback))
            diff = torch.cat([(a[0] - b[0]).abs().flatten() for a, b in zip(dali, fallback)])
            assert float(diff.mean()) < 0.1  # same transforms; decoders/resamplers differ slightly
        else:
            for ids in (ids_of(dali), ids_of(fallback)):  # drop_last: 6 batches of 6 out of 40
                assert len(ids) == len(set(ids)) == 36 and set(ids) <= set(ALL_IDS)


def test_fallback_same_augmentation_with_any_worker_count(shards, cache):
    runs = [list(make(shards, cache, train=True, backend="torch", seed=1, num_threads=n)) for n in (0, 2)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*runs))


def test_a_forked_child_can_drop_a_dali_pipeline(shards, cache):
    # DataLoader workers are forked children; freeing a DALI pipeline there (the garbage collector
    # does, for one that was garbage at fork time) must not wait for threads the fork did not copy.
    loader = make(shards, cache, train=True)
    next(iter(loader))
    pid = os.fork()
    if pid == 0:  # the child: drop the loader and its pipeline, then leave at once
        del loader
        gc.collect()
        os._exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung freeing the DALI pipeline")
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(next(iter(loader))[0]) == 4  # the parent's pipeline still works


def test_construction_is_cheap_and_lazy(shards, cache):
    loader = make(shards, cache, train=True)
    # Nothing runs before the first iteration.
    assert loader._pipe is None and loader._iter is None
    with pytest.raises(ShardError, match="no full batch"):
        make(shards, cache, train=True, batch_size=64)
    with pytest.raises(ValueError, match="backend"):
        make(shards, cache, backend="tf")
    np.testing.assert_equal(loader.shardset.counts, [20, 13, 7])


def test_gpu_settings_follow_the_resolved_device(shards, cache):
    # No GPU here: this checks what a GPU loader would hand DALI, without starting a pipeline.
    loader = DaliLoader(
        load_shards(shards, cache_dir=cache), 4, S, True, torch.device("cuda", 3), 2, 0, 1, 0, False, True
    )
    args = loader._decoder_args()
    assert loader._device_id() == 3 and args["device"] == "mixed" and args["adjust_orientation"] is False
    assert (args["device_memory_padding"], args["host_memory_padding"]) == (
        DEVICE_MEMORY_PADDING,
        HOST_MEMORY_PADDING,
    )
    assert args["hw_decoder_load"] == HW_DECODER_LOAD > 0 and PREFETCH_DEPTH == 3
    assert make(shards, cache)._decoder_args()["device"] == "cpu"
    # The hardware decoder takes whole images: only the CPU pipeline decodes crop windows.
    assert not loader.roi_decode and make(shards, cache).roi_decode


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (DALI 'mixed' decoding)")
def test_gpu_pipeline_gives_the_cpu_layout_on_the_gpu(tmp_path, shards, cache, caplog):
    # Runs only where there is a GPU; the CPU suite covers the same code with device='cpu'.
    gpu = list(make(shards, cache, train=False, device="cuda", batch_size=6, all_captions=True))
    cpu = list(make(shards, cache, train=False, device="cpu", batch_size=6, all_captions=True))
    assert len(gpu) == len(cpu) == 7
    for (ig, tg), (ic, tc) in zip(gpu, cpu):
        assert ig.is_cuda and tg.is_cuda and ig.shape == ic.shape and ig.dtype == ic.dtype
        assert torch.equal(tg.cpu(), tc)
        assert float((ig.cpu() - ic).abs().mean()) < 0.1  # nvJPEG vs libjpeg-turbo rounding
    train = make(shards, cache, train=True, device="cuda", seed=4)
    gpu_epochs = [list(train) for _ in range(2)]
    cpu_train = make(shards, cache, train=True, device="cpu", seed=4)
    for gpu_batches, cpu_batches in zip(gpu_epochs, [list(cpu_train) for _ in range(2)]):
        for (ig, tg), (ic, tc) in zip(gpu_batches, cpu_batches):
            assert ig.device == torch.device("cuda", torch.cuda.current_device()) and torch.equal(
                tg.cpu(), tc
            )
            assert float((ig.cpu() - ic).abs().mean()) < 0.1  # same crops, other decoder
    assert train.pipelines_built == 1
    # An undecodable image on the GPU is found and skipped as on the CPU.
    caplog.set_level(logging.WARNING, logger="dataloaders")
    bad = make(_bad_shards(tmp_path, "truncated"), cache, train=True, device="cuda", seed=11)
    assert 55 not in ids_of(list(bad)) and bad.bad_records == 1 and len(_skips(caplog)) == 1


# -- the reader processes of the DALI backend -----------------------------------------------


def _gone(pids: list[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_reader_processes_give_the_in_thread_readers_batches_and_stop_with_the_loader(shards, cache):
    runs = {}
    for workers in (0, 2):
        loader = make(shards, cache, train=True, seed=3, reader_workers=workers)
        runs[workers] = [(im.clone(), tok.clone()) for _ in range(2) for im, tok in loader]  # two epochs
        pids = loader.reader.pids()
        assert len(pids) == workers and all(Path(f"/proc/{pid}").exists() for pid in pids)
        del loader
        gc.collect()
        assert _gone(pids), f"reader processes {pids} outlived their loader"
    assert len(runs[0]) == len(runs[2]) == 20
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(runs[0], runs[2]))


def test_a_killed_reader_process_stops_the_loader_with_one_line(shards, cache):
    loader = make(shards, cache, train=True, reader_workers=1)
    it = iter(loader)
    next(it)
    (pid,) = loader.reader.pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ReaderDiedError, match=r"ended unexpectedly \(exit code -9; killed.*--resume latest"):
        for _ in range(len(loader)):
            next(it)
    assert loader.reader.pids() == []


def test_a_full_shared_memory_buffer_stops_the_loader_with_the_fix(shards, cache, tmp_path):
    # A file-size limit makes the kernel refuse the worker's write with EFBIG, as a full /dev/shm
    # refuses it with ENOSPC (works without root); the limit is set in a child process only.
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))\n"
        "from dataloaders.imagenet import build_loader\n"
        "from dataloaders.read_ahead import ReaderDiedError\n"
        f"loader = build_loader({str(shards)!r}, 4, input_size=32, device='cpu', num_threads=1, "
        f"cache_dir={str(cache)!r}, reader_workers=1)\n"
        "try:\n"
        "    next(iter(loader))\n"
        "except ReaderDiedError as e:\n"
        "    print(e)\n"
        "    sys.exit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    line = proc.stdout.strip()
    assert "\n" not in line and "could not be written to its buffer (File too large)" in line
    assert "--shm-size" in line and "--reader-workers 0" in line


def test_ctrl_c_stops_the_run_with_one_interrupt_and_no_reader_left(shards, cache):
    # Ctrl-C signals the terminal's whole process group, the reader processes too: they must leave
    # the interrupt to the training process (no "reader ended" error, no traceback of their own)
    # and be gone when it exits.
    # A Python started from a terminal raises KeyboardInterrupt on SIGINT. A test suite started
    # with SIGINT ignored (a script's `make test &`, nohup) passes that on to every child, and
    # Python keeps an inherited SIG_IGN: the run would rightly ignore Ctrl-C, as under nohup.
    script = (
        "import signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from dataloaders.imagenet import build_loader\n"
        f"loader = build_loader({str(shards)!r}, 4, input_size=32, device='cpu', num_threads=1, "
        f"cache_dir={str(cache)!r}, reader_workers=2)\n"
        "it = iter(loader)\n"
        "next(it)\n"
        "print(*loader.reader.pids(), flush=True)\n"
        "while True:\n"
        "    for batch in loader:\n"
        "        pass\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()[-2000:]
        time.sleep(0.5)  # inside the loop, batches being read
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    assert "ReaderDiedError" not in err
    assert _gone(pids), f"reader processes {pids} outlived the interrupted run"
