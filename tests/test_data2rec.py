"""data2rec end to end: every input kind to shards, read back by our reader, DALI and real MXNet;
bad inputs reported, multi-machine splits, kill-and-resume of a real subprocess, verify, CLI errors."""


import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.oracles import mxnet_python, run_oracle
from src.convert import ConvertOptions, SourceOptions, convert, find_shards, verify
from src.open_alip import tokenize_np
from tests._data2rec_helpers import (
    bad_images,
    jpeg,
    odd_images,
    read_records,
    tokens_for,
    write_hub_parquet,
    write_tar,
)

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, str(REPO / "data2rec.py")]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def quiet(**kw) -> ConvertOptions:
    kw.setdefault("workers", 1)
    return ConvertOptions(progress=False, **kw)


def caption_tokens(*captions: str) -> np.ndarray:
    return tokenize_np(list(captions)).astype(np.float32).reshape(-1)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Two hub-format parquet shards (K=3 token blocks) with broken rows mixed in."""
    d = tmp_path_factory.mktemp("hub")
    good = {}
    files = []
    for f in range(2):
        rows = []
        for r in range(9):
            rows.append((jpeg(24, 16, seed=f * 100 + r), tokens_for(3, f * 100 + r)))
        rows[2] = (None, tokens_for(3, 1))  # null image
        rows[5] = (bad_images()["truncated.jpg"][0], tokens_for(3, 2))
        rows[7] = (jpeg(24, 16, 3), tokens_for(3, 3)[:100])  # not whole 77-blocks
        for r, (img, tok) in enumerate(rows):
            if r not in (2, 5, 7):
                good[(f, r)] = (img, tok)
        path = d / f"train-{f:05d}-of-00002.parquet"
        write_hub_parquet(path, rows, row_group_size=4)
        files.append(path)
    return d, files, good


def test_parquet_passes_bytes_and_tokens_through(hub, tmp_path):
    d, files, good = hub
    report = convert([d], tmp_path / "yfcc", quiet(shard_size=5))
    assert [s["rec"] for s in report["shards"]] == [f"yfcc-0000{i}.rec" for i in range(3)]
    assert report["captions_per_record"] == 3
    assert report["skipped_by_reason"] == {"bad_tokens": 2, "broken_row": 2, "truncated_image": 2}
    assert report["written"] == 12 and report["seen"] == 18 and report["converted"] == 0
    records = read_records(find_shards(tmp_path / "yfcc"))
    # ids are positions in the whole input (file 1 starts at 9), id2 the row in its file.
    assert [(i, i2) for i, i2, _, _ in records] == [(f * 9 + r, r) for f, r in sorted(good)]
    for i, _, label, payload in records:
        img, tok = good[divmod(i, 9)]
        assert payload == img
        np.testing.assert_array_equal(label, tok)
    saved = json.loads((tmp_path / "yfcc.report.json").read_text())
    assert saved["skipped_by_reason"] == report["skipped_by_reason"]
    assert saved["examples"]["truncated_image"][0]["input"].endswith("train-00000-of-00002.parquet:row 5")
    assert verify(tmp_path / "yfcc", decode=True)["ok"]


def test_parquet_workers_give_identical_files(hub, tmp_path):
    d, _, _ = hub
    convert([d], tmp_path / "one", quiet(shard_size=4))
    convert([d], tmp_path / "two", quiet(shard_size=4, workers=2, chunk=3))
    one, two = find_shards(tmp_path / "one"), find_shards(tmp_path / "two")
    assert len(one) == 3
    for a, b in zip(one, two):
        assert a.read_bytes() == b.read_bytes()
        assert a.with_suffix(".idx").read_bytes() == b.with_suffix(".idx").read_bytes()


def test_multi_machine_split_is_disjoint_and_complete(hub, tmp_path):
    d, files, good = hub
    more = tmp_path / "more.parquet"
    write_hub_parquet(more, [(jpeg(16, 16, 50 + r), tokens_for(3, 50 + r)) for r in range(4)])
    inputs = [*files, more]
    whole = {i: (p, lab.tobytes()) for i, _, lab, p in read_records(
        find_shards(Path(convert(inputs, tmp_path / "all", quiet())["output"])))}
    parts = []
    for m in range(2):
        rep = convert(inputs, tmp_path / "split", quiet(num_machines=2, machine_id=m, shard_size=3))
        assert rep["output"].endswith(f"split-m{m:03d}")
        parts.append({i: (p, lab.tobytes()) for i, _, lab, p in read_records(find_shards(rep["output"]))})
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert {**parts[0], **parts[1]} == whole
    assert len(whole) == len(good) + 4
    # Both machines' shards sit side by side and verify together.
    assert verify(tmp_path / "split-m000")["ok"] and verify(tmp_path / "split-m001")["ok"]
    # More machines than input files: the spare machine has nothing to do, and says so.
    idle = run_cli(*map(str, inputs), "--output", str(tmp_path / "idle"), "--num-machines", "4",
                   "--machine-id", "3", "--no-progress")
    assert idle.returncode == 0 and "has no input" in idle.stdout


def test_folder_with_odd_and_bad_images(tmp_path):
    root = tmp_path / "data"
    (root / "img").mkdir(parents=True)
    (root / "captions").mkdir()
    expected = {}
    for n, (name, data) in enumerate(sorted(odd_images().items())):
        stem = f"{n:03d}_{name.replace('.', '_')}"
        (root / "img" / f"{stem}{Path(name).suffix}").write_bytes(data)
        caption = f"photo {n} of a {name} — Zürich 東京 🐱"
        (root / "captions" / f"{stem}.txt").write_text(caption, encoding="utf-8")
        expected[stem] = caption
    for name, (data, _) in bad_images().items():
        (root / "img" / f"bad_{name}").write_bytes(data)
        (root / "captions" / f"bad_{Path(name).stem}.txt").write_text("a caption")
    (root / "img" / "nocap.jpg").write_bytes(jpeg())
    (root / "img" / "emptycap.jpg").write_bytes(jpeg())
    (root / "captions" / "emptycap.txt").write_text("  \n")
    (root / "side.jpg").write_bytes(jpeg(seed=9))
    (root / "side.txt").write_text("beside the image\n")
    expected["side"] = "beside the image"
    report = convert([root], tmp_path / "out" / "f", quiet())
    reasons = {reason: 1 for reason in {r for _, r in bad_images().values()}}
    assert report["skipped_by_reason"] == {**reasons, "missing_caption": 1, "empty_caption": 1}
    assert report["written"] == len(expected) and report["captions_per_record"] == 1
    records = read_records(find_shards(tmp_path / "out" / "f"))
    stems = sorted(expected)  # the listing order: img/... then side.jpg
    assert len(records) == len(stems)
    for (_, _, label, _), stem in zip(records, stems):
        np.testing.assert_array_equal(label, caption_tokens(expected[stem]))
    dali_decode_all(tmp_path / "out" / "f.rec", [r[2] for r in records])


def test_manifest_with_two_caption_columns(tmp_path):
    (tmp_path / "images").mkdir()
    lines = ["path\tcaption\tsynthetic"]
    for i in range(5):
        (tmp_path / "images" / f"{i}.jpg").write_bytes(jpeg(seed=i))
        lines.append(f"images/{i}.jpg\tcaption {i}\tsynthetic caption {i}")
    lines.append("images/missing.jpg\tgone\tgone")
    lines.append("images/3.jpg\t\tno first caption")
    (tmp_path / "m.tsv").write_text("\n".join(lines) + "\n")
    code = run_cli(str(tmp_path / "m.tsv"), "--output", str(tmp_path / "cc"), "--caption-columns",
                   "caption,synthetic", "--no-progress", "--workers", "1")
    assert code.returncode == 0, code.stderr
    assert "missing_image: 1" in code.stdout and "empty_caption: 1" in code.stdout
    records = read_records([tmp_path / "cc.rec"])
    assert [r[0] for r in records] == list(range(5))
    for i, _, label, payload in records:
        assert payload == jpeg(seed=i)
        np.testing.assert_array_equal(label, caption_tokens(f"caption {i}", f"synthetic caption {i}"))


def test_webdataset_tars(tmp_path):
    for t in range(2):
        members = []
        for k in range(3):
            key = f"{t:05d}{k:04d}"
            members += [(f"{key}.jpg", jpeg(seed=t * 10 + k)), (f"{key}.txt", f"tar {t} item {k}".encode()),
                        (f"{key}.json", b'{"status": "success"}')]
        write_tar(tmp_path / f"{t:05d}.tar", members)
    report = convert([tmp_path], tmp_path / "wds", quiet(id_offset=1000))
    assert report["written"] == 6 and not report["skipped"]
    records = read_records([tmp_path / "wds.rec"])
    assert [r[0] for r in records] == [1000, 1001, 1002, 1003, 1004, 1005]
    for n, (_, _, label, payload) in enumerate(records):
        t, k = divmod(n, 3)
        assert payload == jpeg(seed=t * 10 + k)
        np.testing.assert_array_equal(label, caption_tokens(f"tar {t} item {k}"))


def dali_decode_all(rec: Path, labels: list[np.ndarray]) -> None:
    """Every record through DALI's CPU mxnet reader and image decoder; labels must match."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=len(labels), num_threads=1, device_id=None)
    def pipe():
        data, label = fn.readers.mxnet(path=[str(rec)], index_path=[str(rec.with_suffix(".idx"))],
                                       random_shuffle=False)
        return fn.decoders.image(data, device="cpu", output_type=types.RGB), label

    p = pipe()
    p.build()
    images, got = p.run()
    for i, label in enumerate(labels):
        img = np.array(images[i])
        assert img.ndim == 3 and img.shape[2] == 3 and img.size > 0
        np.testing.assert_array_equal(np.array(got[i]), label)


def test_mxnet_reads_every_record(hub, tmp_path):
    d, _, good = hub
    convert([d], tmp_path / "mx", quiet(shard_size=7))
    shards = find_shards(tmp_path / "mx")
    ours = read_records(shards)
    code = r"""
import hashlib, json, sys
from mxnet import recordio
out = []
for rec in sys.argv[1:]:
    r = recordio.MXIndexedRecordIO(rec[:-4] + ".idx", rec, "r")
    for key in r.keys:
        h, payload = recordio.unpack(r.read_idx(key))
        out.append([key, int(h.id), int(h.id2), [float(v) for v in h.label], hashlib.sha256(payload).hexdigest()])
print(json.dumps(out))
"""
    got = json.loads(run_oracle(mxnet_python(), code, *map(str, shards)).stdout)
    assert len(got) == len(ours) == len(good)
    for (key, i, i2, label, digest), (oi, oi2, olabel, payload) in zip(got, ours):
        assert key == i == oi and i2 == oi2
        assert label == olabel.tolist()
        assert digest == hashlib.sha256(payload).hexdigest()


def test_kill_and_resume_gives_the_uninterrupted_result(tmp_path):
    """SIGKILL a real run mid-shard (a FIFO image makes a worker block at a known item), resume it."""
    n, blocked = 80, 70
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    for d in (ref_dir, run_dir):
        (d / "img").mkdir(parents=True)
        rows = ["image,caption"] + [f"img/{i}.jpg,picture number {i}" for i in range(n)]
        (d / "list.csv").write_text("\n".join(rows) + "\n")
        for i in range(n):
            if d is run_dir and i == blocked:
                os.mkfifo(d / "img" / f"{i}.jpg")
            else:
                (d / "img" / f"{i}.jpg").write_bytes(jpeg(seed=i) if i % 9 else b"broken")
    # Shards of 5: the 56 good images before the blocked chunk (items 64..) fill 11 shards and
    # leave one record in the 12th, so the kill lands mid-shard.
    args = ["--shard-size", "5", "--workers", "2", "--no-progress"]
    ref = run_cli(str(ref_dir / "list.csv"), "--output", str(ref_dir / "out" / "x"), *args)
    assert ref.returncode == 0, ref.stderr

    cmd = [*CLI, str(run_dir / "list.csv"), "--output", str(run_dir / "out" / "x"), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    state = run_dir / "out" / "x.state.json"
    try:
        deadline = time.monotonic() + 120  # a bound on waiting, not a timing assertion
        while time.monotonic() < deadline and proc.poll() is None:
            tmp = run_dir / "out" / "x-00011.rec.tmp"
            if state.exists() and len(json.loads(state.read_text())["shards"]) >= 11 and tmp.exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert len(json.loads(state.read_text())["shards"]) == 11
        assert (run_dir / "out" / "x-00011.rec.tmp").exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (run_dir / "img" / f"{blocked}.jpg").unlink()
    (run_dir / "img" / f"{blocked}.jpg").write_bytes(jpeg(seed=blocked))

    resumed = run_cli(*cmd[2:])
    assert resumed.returncode == 0, resumed.stderr
    ref_files = sorted(p.name for p in (ref_dir / "out").iterdir() if p.suffix in (".rec", ".idx"))
    run_files = sorted(p.name for p in (run_dir / "out").iterdir() if p.suffix in (".rec", ".idx"))
    assert run_files == ref_files and len(ref_files) == 2 * 15  # 71 good images -> 15 shards
    for name in ref_files:
        assert (run_dir / "out" / name).read_bytes() == (ref_dir / "out" / name).read_bytes(), name
    assert not list((run_dir / "out").glob("*.tmp"))
    rep = [json.loads((d / "out" / "x.report.json").read_text()) for d in (ref_dir, run_dir)]
    assert rep[0]["skipped_by_reason"] == rep[1]["skipped_by_reason"] == {"not_an_image": 9}
    # A second rerun finds the run complete and changes nothing.
    again = run_cli(*cmd[2:])
    assert again.returncode == 0 and "already complete" in again.stdout


def test_verify_catches_damaged_shards(hub, tmp_path):
    d, _, _ = hub
    convert([d], tmp_path / "v", quiet(shard_size=6))
    ok = run_cli("--verify", str(tmp_path / "v"), "--decode", "--no-progress")
    assert ok.returncode == 0 and "2 shards, 12 records: OK" in ok.stdout
    rec = tmp_path / "v-00001.rec"
    data = bytearray(rec.read_bytes())
    rec.write_bytes(bytes(data[: len(data) - 50]))
    bad = run_cli("--verify", str(tmp_path / "v"), "--no-progress")
    assert bad.returncode == 1 and "FAILED" in bad.stdout and "truncated" in bad.stderr
    missing = run_cli("--verify", str(tmp_path / "nothing"), "--no-progress")
    assert missing.returncode == 1 and "no .rec shards" in missing.stderr


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_cli_fatal_errors_are_one_line(hub, tmp_path):
    d, files, _ = hub
    _one_line_error(run_cli("--output", str(tmp_path / "x")), "no INPUT")
    _one_line_error(run_cli(str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "x")), "missing.parquet")
    (tmp_path / "afile").write_text("")
    _one_line_error(run_cli(str(files[0]), "--output", str(tmp_path / "afile" / "x")), "not writable")
    _one_line_error(run_cli(str(files[0]), "--output", str(tmp_path / "x"), "--machine-id", "3",
                            "--num-machines", "2"), "--machine-id")
    first = run_cli(str(files[0]), "--output", str(tmp_path / "x"), "--no-progress")
    assert first.returncode == 0, first.stderr
    _one_line_error(run_cli(str(files[1]), "--output", str(tmp_path / "x"), "--no-progress"), "--overwrite")
    over = run_cli(str(files[1]), "--output", str(tmp_path / "x"), "--no-progress", "--overwrite")
    assert over.returncode == 0 and read_records([tmp_path / "x.rec"])[0][0] == 0
    (tmp_path / "x.state.json").unlink()
    _one_line_error(run_cli(str(files[1]), "--output", str(tmp_path / "x")), "already exists")


def test_all_bad_input_writes_nothing_and_fails(tmp_path):
    write_hub_parquet(tmp_path / "bad.parquet", [(b"", tokens_for(1, 0)), (b"<html>", tokens_for(1, 1))])
    proc = run_cli(str(tmp_path / "bad.parquet"), "--output", str(tmp_path / "o"), "--no-progress")
    assert proc.returncode == 1 and "no record was written" in proc.stderr
    assert "empty_image: 1" in proc.stdout and "not_an_image: 1" in proc.stdout
    assert not find_shards(tmp_path / "o")


def test_mixed_caption_counts_keep_the_first(tmp_path):
    rows = [(jpeg(seed=i), tokens_for(1 if i != 2 else 2, i)) for i in range(4)]
    write_hub_parquet(tmp_path / "k.parquet", rows)
    report = convert([tmp_path / "k.parquet"], tmp_path / "k", quiet(source=SourceOptions()))
    assert report["captions_per_record"] == 1
    assert report["skipped_by_reason"] == {"caption_count_mismatch": 1}


def test_resume_refuses_changed_inputs_and_missing_shards(tmp_path):
    from src.convert import OutputError

    path = tmp_path / "a.parquet"
    write_hub_parquet(path, [(jpeg(seed=i), tokens_for(1, i)) for i in range(4)])
    convert([path], tmp_path / "o", quiet(shard_size=2))
    assert convert([path], tmp_path / "o", quiet(shard_size=2))["resumed"] == "already complete"
    write_hub_parquet(path, [(jpeg(seed=i), tokens_for(1, i)) for i in range(5)])  # the input changed
    with pytest.raises(OutputError, match="other inputs or options"):
        convert([path], tmp_path / "o", quiet(shard_size=2))
    report = convert([path], tmp_path / "o", quiet(shard_size=2, overwrite=True))
    assert report["written"] == 5 and len(find_shards(tmp_path / "o")) == 3
    (tmp_path / "o-00001.rec").unlink()
    with pytest.raises(OutputError, match="is gone"):
        convert([path], tmp_path / "o", quiet(shard_size=2))
