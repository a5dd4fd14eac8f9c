"""src/shard_names.py: the one owner of every shard and output file name. The converter writes by
it, data2rec --verify finds by it, and the launcher and the loader choose a folder's shards by it,
so they agree by construction: the tests hold them against each other on the same folders."""

from pathlib import Path

import pytest

from dataloaders.shards import ShardError, resolve_shards
from src.convert import ConvertOptions, convert, find_shards
from src.shard_names import (
    LOCK,
    REPORT,
    STATE,
    is_output_name,
    output_prefix,
    output_shards,
    pair,
    run_files,
    scan_folder,
    shard_paths,
    side_file,
)
from src.training import launch
from tests._data2rec_helpers import jpeg, tokens_for, write_hub_parquet
from tests._loader_helpers import write_shard


def test_output_names_of_a_run_and_of_a_split():
    out = Path("/d/yfcc")
    assert output_prefix("/d/yfcc.rec") == out == output_prefix(out, 1, 0)
    assert output_prefix(out, 4, 2) == Path("/d/yfcc-m002")
    assert shard_paths(out, 7) == (Path("/d/yfcc-00007.rec"), Path("/d/yfcc-00007.idx"))
    assert shard_paths(out, None) == (Path("/d/yfcc.rec"), Path("/d/yfcc.idx"))
    assert [side_file(out, s).name for s in (REPORT, STATE, LOCK)] == [
        "yfcc.report.json",
        "yfcc.state.json",
        "yfcc.lock",
    ]
    written = [
        "yfcc.rec",
        "yfcc-00003.idx",
        "yfcc-00003.rec.tmp",
        "yfcc.state.json",
        "yfcc.lock",
        "yfcc.probe.tmp",
        "yfcc-m001-00002.rec",
        "yfcc-m001.report.json",
    ]
    assert all(is_output_name(n, out) for n in written)
    others = ["yfccx.rec", "yfcc-3.rec", "yfcc.json", "yfcc-m1.rec", "yfcc.rec.bak", "other.rec"]
    assert not any(is_output_name(n, out) for n in others)
    assert not is_output_name("yfcc-m001-00002.rec", out, machines=False)
    assert pair("/d/a") == pair("/d/a.idx") == (Path("/d/a.rec"), Path("/d/a.idx"))
    assert pair("/d/a.v2") == (Path("/d/a.v2.rec"), Path("/d/a.v2.idx"))  # a dot in a prefix stays


def test_finished_shards_and_side_files_are_found_by_the_same_names(tmp_path):
    for name in (
        "o.rec",
        "o.idx",
        "o-00000.rec",
        "o-00001.rec",
        "o-00001.idx",
        "o-m002-00000.rec",
        "o-x.rec",
        "o-m002.state.json",
        "o.state.json",
        "o-00002.rec.tmp",
        "oo.rec",
        "o-m2.state.json",
    ):
        (tmp_path / name).write_bytes(b"")
    o = tmp_path / "o"
    assert [p.name for p in output_shards(o)] == ["o-00000.rec", "o-00001.rec", "o.rec"]
    assert [p.name for p in output_shards(o, machines=True)] == [
        "o-00000.rec",
        "o-00001.rec",
        "o-m002-00000.rec",
        "o.rec",
    ]
    assert [p.name for p in output_shards(o, numbered_only=True, suffixes=(".rec", ".idx"))] == [
        "o-00000.rec",
        "o-00001.idx",
        "o-00001.rec",
    ]
    assert [p.name for p in run_files(o, STATE)] == ["o-m002.state.json", "o.state.json"]


def _odd_folder(root: Path) -> None:
    """Training shards numbered like a person numbers them, with everything the rule leaves out."""
    write_shard(root / "part-10", range(10, 13))
    write_shard(root / "part-2", range(0, 4))
    write_shard(root / "val", range(50, 52))  # an evaluation shard beside the training ones
    write_shard(root / "stray", range(60, 61))
    (root / "stray.idx").unlink()  # a copy cut short: no .idx
    write_shard(root / "orphan", range(70, 71))
    (root / "orphan.rec").unlink()  # an index left without its .rec
    write_shard(root / ".hidden", range(80, 81))
    (root / "train-00000.parquet").write_bytes(b"")
    write_shard(root / "deeper" / "elsewhere", range(90, 92))  # a folder below is not searched


def test_the_launcher_and_the_loader_take_the_same_shards_of_a_folder(tmp_path, caplog):
    root = tmp_path / "data"
    _odd_folder(root)
    rule = scan_folder(root)
    assert [rec.name for rec, _ in rule.shards] == ["part-2.rec", "part-10.rec"]
    assert sorted(p.name for p, _ in rule.left_out) == ["orphan.idx", "stray.rec", "val.rec"]

    launched = launch.find_shards(str(root))
    with caplog.at_level("WARNING", logger="dataloaders"):
        loaded = resolve_shards(root)
    assert [rec for rec, _ in launched.shards] == [s.rec for s in loaded] == [rec for rec, _ in rule.shards]
    assert [n for _, n in launched.shards] == [4, 3]  # counted from each shard's index
    # Both say what they left out, and why, in the same words.
    assert set(rule.left_out) <= set(launched.ignored)
    for path, why in rule.left_out:
        assert f"left out {path}: {why}" in caplog.text
    # Named explicitly, an evaluation shard is taken by both.
    assert [s.rec.name for s in resolve_shards(root / "val")] == ["val.rec"]
    assert [rec.name for rec, _ in launch.find_shards(str(root / "val.rec")).shards] == ["val.rec"]


def test_a_folder_with_no_training_shard_fails_in_both_with_the_reason(tmp_path):
    write_shard(tmp_path / "val", range(3))
    with pytest.raises(ShardError, match=r"no training \.rec files \(val\.rec: named like an evaluation"):
        resolve_shards(tmp_path)
    with pytest.raises(launch.LaunchError, match=r"holds no training \.rec/\.idx shards"):
        launch.find_shards(str(tmp_path))


def test_what_data2rec_writes_is_what_verify_the_launcher_and_the_loader_read(tmp_path):
    parquet = tmp_path / "in" / "train-00000-of-00001.parquet"
    parquet.parent.mkdir()
    write_hub_parquet(parquet, [(jpeg(24, 16, seed=r), tokens_for(1, r)) for r in range(5)])
    out = tmp_path / "rec" / "datarec"
    report = convert([parquet.parent], out, ConvertOptions(shard_size=2, workers=1, progress=False))
    written = [out.parent / s["rec"] for s in report["shards"]]
    assert [p.name for p in written] == ["datarec-00000.rec", "datarec-00001.rec", "datarec-00002.rec"]
    # The side files beside the shards are no shards to anyone.
    assert side_file(out, REPORT).is_file() and side_file(out, STATE).is_file()
    assert find_shards(out) == written
    assert [rec for rec, _ in launch.find_shards(str(out.parent)).shards] == written
    assert [s.rec for s in resolve_shards(out.parent)] == [p.resolve() for p in written]
