"""The DALI loader (real CPU pipelines) and the PyTorch fallback, on small shards written here."""


import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from dataloaders.base import CorruptRecordError, select_captions, shard_range
from dataloaders.imagenet import build_loader
from dataloaders.shards import ShardError, load_shards, resolve_shards
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from tests._loader_helpers import caption_index, record_colour, record_id, write_shard

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
        (lambda d: d, "holds no .rec files"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.idx").unlink(), d)[-1], "no index a.idx"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.rec").unlink(), d)[-1], "without a matching .rec"),
        (lambda d: str(d / "zz*"), "matches no .rec files"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.idx").write_text(""), d)[-1], "lists no records"),
        (lambda d: (write_shard(d / "a", range(3)), (d / "a.rec").write_bytes(b"junk" * 9), d)[-1],
         "not a RecordIO file"),
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


def test_combined_index_is_cached_and_follows_the_files(tmp_path):
    write_shard(tmp_path / "d" / "a", range(5))
    write_shard(tmp_path / "d" / "b", range(10, 13))
    first = load_shards(tmp_path / "d", cache_dir=tmp_path / "c")
    assert first.total_records == 8
    lines = first.index_path.read_text().splitlines()
    a_size = (tmp_path / "d" / "a.rec").stat().st_size
    offsets = [int(ln.split("\t")[1]) for ln in lines]
    # b's records are offset by a's size: the index spans the concatenation.
    assert offsets[5] == a_size and offsets == sorted(offsets)
    again = load_shards(tmp_path / "d", cache_dir=tmp_path / "c")
    assert again.index_path == first.index_path
    assert sorted(p.name.split(".", 1)[1] for p in (tmp_path / "c").iterdir()) == [
        "counts.npy", "idx", "keys.npy", "offsets.npy"]
    assert isinstance(again.keys, np.memmap) and list(again.keys) == [0, 1, 2, 3, 4, 10, 11, 12]
    write_shard(tmp_path / "d" / "b", range(10, 14))  # rewritten shard: a new cache entry
    os.utime(tmp_path / "d" / "b.rec", ns=(1, 1))
    changed = load_shards(tmp_path / "d", cache_dir=tmp_path / "c")
    assert changed.total_records == 9 and changed.index_path != first.index_path
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


def test_corrupt_record_is_named(tmp_path, cache):
    write_shard(tmp_path / "good", range(10))
    write_shard(tmp_path / "bad", range(50, 60), corrupt={55})
    # In training order too: the shuffled position of the bad record is found by replaying the reader.
    for backend, train in (("dali", False), ("dali", True), ("torch", True)):
        loader = make([tmp_path / "good", tmp_path / "bad"], cache, train=train, batch_size=4, backend=backend,
                      num_threads=1, seed=5)
        with pytest.raises(CorruptRecordError) as err:
            list(loader)
        text = str(err.value)
        assert "bad.rec" in text and "record key 55" in text and "\n" not in text, (backend, train, text)


# -- exact resume ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend, drop_checkpoint", [("dali", False), ("dali", True), ("torch", False)])
def test_mid_epoch_resume_gives_the_same_batches(shards, cache, backend, drop_checkpoint):
    reference = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    reference.set_epoch(2)
    expected = list(reference)
    first = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    first.set_epoch(2)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    assert (state["epoch"], state["batch"]) == (2, 3)
    if drop_checkpoint:  # no DALI checkpoint: the loader replays the consumed batches
        state["dali_checkpoint"] = None
    resumed = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert len(head) + len(tail) == len(expected)
    for (ia, ta), (ib, tb) in zip(head + tail, expected):
        assert torch.equal(ia, ib) and torch.equal(ta, tb)
    assert resumed.state_dict()["epoch"] == 3  # the finished epoch moved the loader on
    head_only = make(shards, cache, train=True, backend=backend, seed=7, num_threads=1)
    head_only.load_state_dict({**state, "batch": len(head_only) - 1, "dali_checkpoint": None})
    assert len(list(head_only)) == 1 and head_only.state_dict()["batch"] == 0
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


def test_construction_is_cheap_and_lazy(shards, cache):
    loader = make(shards, cache, train=True)
    # Nothing runs before the first iteration.
    assert loader._pipe is None and loader._iter is None
    with pytest.raises(ShardError, match="no full batch"):
        make(shards, cache, train=True, batch_size=64)
    with pytest.raises(ValueError, match="backend"):
        make(shards, cache, backend="tf")
    np.testing.assert_equal(loader.shardset.counts, [20, 13, 7])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (DALI 'mixed' decoding)")
def test_gpu_pipeline_gives_the_cpu_layout_on_the_gpu(shards, cache):
    # Runs only where there is a GPU; the CPU suite covers the same code with device='cpu'.
    gpu = list(make(shards, cache, train=False, device="cuda", batch_size=6, all_captions=True))
    cpu = list(make(shards, cache, train=False, device="cpu", batch_size=6, all_captions=True))
    assert len(gpu) == len(cpu) == 7
    for (ig, tg), (ic, tc) in zip(gpu, cpu):
        assert ig.is_cuda and tg.is_cuda and ig.shape == ic.shape and ig.dtype == ic.dtype
        assert torch.equal(tg.cpu(), tc)
        assert float((ig.cpu() - ic).abs().mean()) < 0.1  # nvJPEG vs libjpeg-turbo rounding
    train = make(shards, cache, train=True, device="cuda")
    images, tokens = next(iter(train))
    assert images.is_cuda and tokens.is_cuda and tokens.shape == (4, 77)
