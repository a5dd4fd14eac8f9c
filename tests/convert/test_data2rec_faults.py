"""data2rec on hostile inputs and outputs (issue 26): linked folders, shards missing or cut short,
indexes in any order, captions that are not UTF-8, flags the input ignores, FIFOs and devices
among the inputs, file names that are not UTF-8, an output name taken by a folder."""

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from dataloaders.shards import load_shards
from src.convert import InputError, OutputError, SourceOptions, convert, verify
from src.recordio import read_index, write_index
from tests._data2rec_helpers import jpeg, read_records, tokens_for, write_hub_parquet, write_tar
from tests.convert.test_data2rec import CLI, quiet, run_cli


def _pairs(folder: Path, names: list[str], seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (folder / f"{name}.jpg").write_bytes(jpeg(16, 16, seed=seed + i))
        (folder / f"{name}.txt").write_text(f"photo {name}")


# --- item 2: linked folders ---------------------------------------------------------------------


def test_linked_subfolders_are_read_once_and_link_cycles_end(tmp_path):
    elsewhere = tmp_path / "disk2" / "photos"  # outside the input: followed, as users link data in
    _pairs(elsewhere, [f"p{i}" for i in range(5)], seed=10)
    data = tmp_path / "data"
    _pairs(data, ["top"])
    (data / "linked").symlink_to(elsewhere)
    (data / "linked_too").symlink_to(elsewhere)  # the same folder twice: read once, at its first place
    (data / "sub").mkdir()
    (data / "sub" / "up").symlink_to(data)  # a cycle
    (data / "root").symlink_to("/")  # a folder above the input: never walked
    report = convert([data], tmp_path / "out", quiet())
    assert report["written"] == 6 and report["skipped"] == 0  # before: 1 (the linked folder was skipped)
    notes = "\n".join(report["notes"])
    assert f"{data}/linked_too: the same folder as {data}/linked, which is listed already" in notes
    assert "sub/up: a link to" in notes and "(a cycle)" in notes and "data/root" in notes
    assert json.loads((tmp_path / "out.report.json").read_text())["notes"] == report["notes"]
    assert verify(tmp_path / "out")["ok"]


def test_parquet_in_a_linked_folder_is_found(tmp_path):
    shards = tmp_path / "big_disk" / "data"
    shards.mkdir(parents=True)
    write_hub_parquet(
        shards / "train-00000.parquet", [(jpeg(16, 16, seed=i), tokens_for(1, i)) for i in range(3)]
    )
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "data").symlink_to(shards)
    (tmp_path / "hub" / "README.md").write_text("a hub download whose data/ was moved to another disk")
    report = convert([tmp_path / "hub"], tmp_path / "out", quiet(kind="parquet"))
    assert report["written"] == 3  # before: "folder holds no .parquet files"


# --- item 3 and 12: --verify against the run's own record; an .idx in any order ---------------


@pytest.fixture
def sharded(tmp_path):
    _pairs(tmp_path / "in", [f"{i:02d}" for i in range(20)])
    convert([tmp_path / "in"], tmp_path / "o", quiet(shard_size=6))
    assert verify(tmp_path / "o")["ok"]
    return tmp_path / "o"


def test_verify_fails_a_missing_shard(sharded):
    for ext in (".rec", ".idx"):
        sharded.with_name("o-00002" + ext).unlink()
    result = verify(sharded)
    assert not result["ok"]  # before: "3 shards, 14 records: OK"
    assert any(
        "o-00002.rec: listed as finished in o.state.json (6 records) but missing" in e
        for e in result["errors"]
    )
    sharded.with_name("o.state.json").unlink()  # the report lists the shards too
    assert any("listed as finished in o.report.json" in e for e in verify(sharded)["errors"])


def test_verify_fails_a_shard_cut_at_a_record_boundary_with_its_index(sharded):
    rec, idx = sharded.with_name("o-00001.rec"), sharded.with_name("o-00001.idx")
    entries = read_index(idx)
    with open(rec, "r+b") as f:
        f.truncate(entries[4][1])  # records 0..3 stay whole
    write_index(idx, entries[:4])  # and the index agrees: the shard is self-consistent
    result = verify(sharded)
    assert not result["ok"]  # before: OK
    assert f"{rec}: 4 records, but the run wrote 6" in result["errors"]
    # A shard the run did not write, lying among its shards, is named too.
    for ext in (".rec", ".idx"):
        sharded.with_name("o-00009" + ext).write_bytes(sharded.with_name("o-00000" + ext).read_bytes())
    assert any("o-00009.rec: not a shard of the run" in e for e in verify(sharded)["errors"])


def test_verify_without_the_runs_record_checks_each_shard_and_says_so(sharded):
    for name in ("o.state.json", "o.report.json"):
        sharded.with_name(name).unlink()
    result = verify(sharded)
    assert result["ok"] and "a missing shard cannot be told" in result["notes"][0]


def test_an_index_in_any_order_is_valid(sharded, tmp_path):
    idx = sharded.with_name("o-00000.idx")
    entries = read_index(idx)
    write_index(idx, list(reversed(entries)))  # a key -> offset map, as MXNet reads it
    assert verify(sharded)["ok"]  # before: "index entries do not match the records' offsets"
    shard = load_shards(idx.with_suffix(".rec"), cache_dir=tmp_path / "cache")
    assert sorted(zip(shard.keys.tolist(), shard.offsets.tolist())) == sorted(entries)
    # Out of order is fine; a key at the wrong record is not.
    (k0, o0), (k1, o1) = entries[0], entries[1]
    write_index(idx, [(k0, o1), (k1, o0), *entries[2:]])
    assert any("keys differ from their record's id" in e for e in verify(sharded)["errors"])


# --- item 5: captions that are not UTF-8; flags the input kind ignores --------------------------


def test_captions_that_are_not_utf8_are_counted_skips_naming_the_file(tmp_path):
    data = tmp_path / "data"
    _pairs(data, ["good", "latin"])
    (data / "latin.txt").write_bytes("un caf\xe9".encode("latin-1"))
    report = convert([data], tmp_path / "f", quiet())
    assert report["written"] == 1 and report["skipped_by_reason"] == {"undecodable_caption": 1}
    example = report["examples"]["undecodable_caption"][0]
    assert f"{data / 'latin.txt'}: not UTF-8 text (byte 0xe9 at offset 6)" == example["detail"]

    write_tar(
        tmp_path / "t.tar",
        [("a.jpg", jpeg(seed=1)), ("a.txt", b"ok"), ("b.jpg", jpeg(seed=2)), ("b.txt", b"\xff\xfe bad")],
    )
    report = convert([tmp_path / "t.tar"], tmp_path / "w", quiet())
    assert report["written"] == 1 and report["skipped_by_reason"] == {"undecodable_caption": 1}
    assert "t.tar:b.txt: not UTF-8" in report["examples"]["undecodable_caption"][0]["detail"]

    (tmp_path / "m.csv").write_bytes(b"image,caption\ndata/good.jpg,fine\ndata/latin.jpg,caf\xe9\n")
    report = convert([tmp_path / "m.csv"], tmp_path / "m", quiet())
    assert report["written"] == 1 and report["skipped_by_reason"] == {"undecodable_caption": 1}
    assert "caf\\xe9" in report["examples"]["undecodable_caption"][0]["detail"]


def test_flags_the_input_would_ignore_are_refused(tmp_path):
    data = tmp_path / "data"
    _pairs(data, ["a"])
    (tmp_path / "m.csv").write_text("image,caption\ndata/a.jpg,a\n")

    def refused(inputs, **source) -> str:
        with pytest.raises(InputError) as exc:
            convert(inputs, tmp_path / "x", quiet(source=SourceOptions(**source)))
        assert not list(tmp_path.glob("x*"))
        return str(exc.value)

    assert "--caption-dir /nonexistent: no such folder" in refused([data], caption_dir="/nonexistent")
    assert "--image-column path does not apply to folder input" in refused([data], image_column="path")
    assert "--caption-columns a,b does not apply to folder input" in refused(
        [data], caption_columns=("a", "b")
    )
    assert "--caption-dir" in refused([tmp_path / "m.csv"], caption_dir=str(data))
    assert "--image-root /nonexistent: no such folder" in refused(
        [tmp_path / "m.csv"], image_root="/nonexistent"
    )
    proc = run_cli(str(data), "--output", str(tmp_path / "x"), "--image-column", "path")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "does not apply" in proc.stderr


# --- item 7: only regular files are read, up to a size cap --------------------------------------


def _limited_memory() -> None:
    # Reading /dev/zero without a bound would take all of the machine's memory; 2 GiB ends it.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _convert_cli(inputs: list[Path], out: Path, *flags: str) -> dict:
    proc = subprocess.run(
        [
            *CLI,
            *map(str, inputs),
            "--output",
            str(out),
            "--no-progress",
            "--workers",
            "1",
            "--max-skip-fraction",
            "1",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited_memory,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.with_name(out.name + ".report.json").read_text())


def test_fifos_and_devices_are_skipped_never_read(tmp_path):
    data = tmp_path / "data"
    _pairs(data, ["a"])
    os.mkfifo(data / "pipe.jpg")  # before: data2rec waited for a writer forever
    (data / "pipe.txt").write_text("a pipe")
    (tmp_path / "m.csv").write_text(f"image,caption\n/dev/zero,zeros\n{data / 'a.jpg'},fine\n")
    folder = _convert_cli([data], tmp_path / "f")
    assert folder["written"] == 1 and folder["skipped_by_reason"] == {"not_a_regular_file": 1}
    assert "pipe.jpg: not a regular file (a FIFO)" in folder["examples"]["not_a_regular_file"][0]["detail"]
    manifest = _convert_cli([tmp_path / "m.csv"], tmp_path / "m")  # before: MemoryError (processing_error)
    assert manifest["written"] == 1 and manifest["skipped_by_reason"] == {"not_a_regular_file": 1}
    assert "character device" in manifest["examples"]["not_a_regular_file"][0]["detail"]
    with pytest.raises(InputError, match="pipe.jpg: not a regular file or folder"):
        convert([data / "pipe.jpg"], tmp_path / "x", quiet(kind="folder"))  # given as an input itself


def test_files_over_the_size_cap_are_skipped(tmp_path):
    data = tmp_path / "data"
    _pairs(data, ["a", "big"])
    (data / "big.jpg").write_bytes(jpeg(400, 300, seed=5))
    report = _convert_cli([data], tmp_path / "f", "--max-file-bytes", str(len(jpeg(16, 16, seed=0)) + 1))
    assert report["written"] == 1 and report["skipped_by_reason"] == {"file_too_large": 1}
    assert "--max-file-bytes" in report["examples"]["file_too_large"][0]["detail"]
    bad = run_cli(str(data), "--output", str(tmp_path / "x"), "--max-file-bytes", "-1")
    assert bad.returncode == 2 and "--max-file-bytes -1 must be >= 0" in bad.stderr


def test_the_size_cap_is_part_of_a_resumable_runs_options(tmp_path):
    _pairs(tmp_path / "in", ["a"])
    convert([tmp_path / "in"], tmp_path / "o", quiet(max_file_bytes=10_000))
    with pytest.raises(OutputError, match="other inputs or options"):
        convert([tmp_path / "in"], tmp_path / "o", quiet(max_file_bytes=20_000))


# --- item 10: file names that are not UTF-8 -----------------------------------------------------


def test_file_names_that_are_not_utf8_are_kept_and_reported(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    raw = os.fsencode(data)
    with open(raw + b"/caf\xe9.jpg", "wb") as f:
        f.write(jpeg(seed=1))
    with open(raw + b"/caf\xe9.txt", "wb") as f:
        f.write(b"a coffee")
    with open(raw + b"/na\xefve.jpg", "wb") as f:  # no caption: an example in the report
        f.write(jpeg(seed=2))
    report = convert([data], tmp_path / "o", quiet())  # before: UnicodeEncodeError writing the state
    assert report["written"] == 1 and report["skipped_by_reason"] == {"missing_caption": 1}
    assert read_records([tmp_path / "o.rec"])[0][3] == jpeg(seed=1)
    text = (tmp_path / "o.report.json").read_bytes().decode("utf-8")  # strict: valid UTF-8
    assert json.loads(text)["examples"]["missing_caption"][0]["input"] == f"{data}/na\\xefve.jpg"
    again = convert([data], tmp_path / "o", quiet())  # the state reads back exactly: nothing to redo
    assert again["resumed"] == "already complete"
    proc = run_cli(str(data), "--output", str(tmp_path / "cli"), "--no-progress", "--max-skip-fraction", "1")
    assert proc.returncode == 0 and "na\\xefve.jpg" in proc.stdout, proc.stderr


# --- item 12: an output name taken by a folder ------------------------------------------------


@pytest.mark.parametrize("taken, shard_size", [("o.rec", 0), ("o.idx", 0), ("o-00000.rec", 5)])
def test_an_output_name_taken_by_a_folder_is_refused_before_anything_is_written(tmp_path, taken, shard_size):
    _pairs(tmp_path / "in", ["a", "b"])
    out = tmp_path / "out"
    (out / taken).mkdir(parents=True)
    with pytest.raises(OutputError, match=f"{out / taken} is a folder, but data2rec writes a file"):
        convert([tmp_path / "in"], out / "o", quiet(shard_size=shard_size))
    assert sorted(p.name for p in out.iterdir()) == [taken]  # before: an orphan .idx beside it


def test_fifos_and_broken_links_among_input_files_are_named_in_the_notes(tmp_path):
    data = tmp_path / "hub"
    data.mkdir()
    write_hub_parquet(data / "a.parquet", [(jpeg(seed=1), tokens_for(1, 0))])
    os.mkfifo(data / "b.parquet")  # before: left out without a word
    (data / "c.parquet").symlink_to(tmp_path / "gone.parquet")
    report = convert([data], tmp_path / "o", quiet())
    assert report["written"] == 1
    assert report["notes"] == [
        f"{data / 'b.parquet'}: not a regular file (a FIFO, socket or device); not read",
        f"{data / 'c.parquet'}: a broken link; not read",
    ]
