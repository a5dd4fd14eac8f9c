"""data2rec end to end: every input kind to shards, read back by our reader, DALI and real MXNet;
bad inputs reported, multi-machine splits, kill-and-resume of a real subprocess, verify, CLI errors."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.oracles import mxnet_python, run_oracle
from dataloaders.records import RecordReader
from dataloaders.shards import load_shards
from src.convert import MAX_CAPTIONS, ConvertOptions, TooManySkipped, convert, find_shards, verify
from src.open_alip import tokenize_np
from tests._data2rec_helpers import (
    bad_images,
    jpeg,
    odd_images,
    png_alpha,
    read_records,
    tokens_for,
    write_hub_parquet,
    write_tar,
)
from tests._processes import alive, descendants, wait_for
from tests._repo import REPO

CLI = [sys.executable, str(REPO / "data2rec.py")]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def quiet(**kw) -> ConvertOptions:
    """In-process, no progress bar, and no mass-skip exit: these inputs hold bad rows on purpose
    (test_mass_skips_* check that exit)."""
    kw.setdefault("workers", 1)
    kw.setdefault("max_skip_fraction", None)
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
    assert report["records_by_caption_count"] == {"3": 12}
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


def test_hub_jpegs_at_the_default_level_are_checked_in_process_with_any_worker_count(tmp_path, monkeypatch):
    # Shipping a 64 KB image to a worker process costs more than its structure check: with every
    # image a JPEG (tokens given), no worker pool is started, and the files are those of one worker.
    import src.convert.distributor as distributor

    shard = tmp_path / "in" / "train-00000.parquet"
    shard.parent.mkdir()
    write_hub_parquet(shard, [(jpeg(24, 16, r), tokens_for(2, r)) for r in range(10)])
    convert([shard], tmp_path / "one", quiet(workers=1))

    def no_pool(*args):
        raise AssertionError("a worker pool was started for light chunks")

    monkeypatch.setattr(distributor, "_start_pool", no_pool)
    convert([shard], tmp_path / "two", quiet(workers=2, chunk=3))
    assert (tmp_path / "one.rec").read_bytes() == (tmp_path / "two.rec").read_bytes()
    # A PNG among them is re-encoded in a worker, the pool started for its chunk only.
    write_hub_parquet(shard, [(jpeg(24, 16, 0), tokens_for(2, 0)), (png_alpha(), tokens_for(2, 1))])
    with pytest.raises(AssertionError, match="worker pool was started"):
        convert([shard], tmp_path / "three", quiet(workers=2, chunk=1))


def test_multi_machine_split_is_disjoint_and_complete(hub, tmp_path):
    d, files, good = hub
    more = tmp_path / "more.parquet"
    write_hub_parquet(more, [(jpeg(16, 16, 50 + r), tokens_for(3, 50 + r)) for r in range(4)])
    inputs = [*files, more]
    whole = {
        i: (p, lab.tobytes())
        for i, _, lab, p in read_records(
            find_shards(Path(convert(inputs, tmp_path / "all", quiet())["output"]))
        )
    }
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
    idle = run_cli(
        *map(str, inputs),
        "--output",
        str(tmp_path / "idle"),
        "--num-machines",
        "4",
        "--machine-id",
        "3",
        "--no-progress",
    )
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
    assert report["written"] == len(expected) and report["records_by_caption_count"] == {"1": len(expected)}
    records = read_records(find_shards(tmp_path / "out" / "f"))
    stems = sorted(expected)  # the listing order: img/... then side.jpg
    assert len(records) == len(stems)
    for (_, _, label, _), stem in zip(records, stems):
        np.testing.assert_array_equal(label, caption_tokens(expected[stem]))
    dali_decode_all(tmp_path / "out" / "f.rec", [r[2] for r in records])


def test_manifest_caption_columns_keep_the_non_empty_captions(tmp_path):
    (tmp_path / "images").mkdir()
    cells = [  # caption, synthetic, generated: empty cells cost that caption only
        ("a dog", "a brown dog", "a dog on grass"),
        ("a cat", "", "a cat asleep"),
        ("", "", "only the third"),
        ("", " ", ""),  # nothing left: skipped
        ("a boat", "a red boat", "a boat at sea"),
    ]
    lines = ["path\tcaption\tsynthetic\tgenerated"]
    for i, row in enumerate(cells):
        (tmp_path / "images" / f"{i}.jpg").write_bytes(jpeg(seed=i))
        lines.append("\t".join([f"images/{i}.jpg", *row]))
    lines.append("images/missing.jpg\tgone\tgone\tgone")
    (tmp_path / "m.tsv").write_text("\n".join(lines) + "\n")
    code = run_cli(
        str(tmp_path / "m.tsv"),
        "--output",
        str(tmp_path / "cc"),
        "--caption-columns",
        "caption,synthetic,generated",
        "--no-progress",
        "--workers",
        "1",
        "--max-skip-fraction",
        "0.4",
    )
    assert code.returncode == 0, code.stderr
    assert "missing_image: 1" in code.stdout and "empty_caption: 1" in code.stdout
    assert "1 caption: 1 record, 2 captions: 1 record, 3 captions: 2 records" in code.stdout
    records = read_records([tmp_path / "cc.rec"])
    assert [r[0] for r in records] == [0, 1, 2, 4]
    for i, _, label, payload in records:
        assert payload == jpeg(seed=i)
        np.testing.assert_array_equal(label, caption_tokens(*(c for c in cells[i] if c.strip())))
    ok = run_cli("--verify", str(tmp_path / "cc"), "--no-progress")
    assert ok.returncode == 0, ok.stderr
    assert "4 records (1 caption(s): 1, 2 caption(s): 1, 3 caption(s): 2): OK" in ok.stdout


def test_folder_with_several_caption_files_per_image(tmp_path):
    root = tmp_path / "data"
    (root / "img").mkdir(parents=True)
    (root / "captions").mkdir()
    captions = {  # file name -> text; STEM.txt, STEM.1.txt, ... are one image's captions
        "0.txt": "zero",
        "0.1.txt": "zero again",
        "0.2.txt": "zero thrice",
        "1.txt": "one",
        "2.txt": "  ",
        "2.1.txt": "two, the first file is empty",
        "3.1.txt": "three, numbered only",
        "3.3.txt": "after a gap: not read",
    }
    for name, text in captions.items():
        (root / "captions" / name).write_text(text)
    for i in range(4):
        (root / "img" / f"{i}.jpg").write_bytes(jpeg(seed=i))
    # b.1.jpg is an image of its own, so b.1.txt is its caption, not b's second.
    for stem, text in (("b", "bee"), ("b.1", "bee one")):
        (root / f"{stem}.jpg").write_bytes(jpeg(seed=len(stem)))
        (root / f"{stem}.txt").write_text(text)
    (root / ".hfd" / "incomplete").mkdir(parents=True)  # hidden: never an input
    (root / ".hfd" / "incomplete" / "x.jpg").write_bytes(b"partial")
    report = convert([root], tmp_path / "f", quiet())
    assert report["skipped"] == 0
    assert report["records_by_caption_count"] == {"1": 5, "3": 1}
    want = [
        ["bee one"],
        ["bee"],
        ["zero", "zero again", "zero thrice"],
        ["one"],
        ["two, the first file is empty"],
        ["three, numbered only"],
    ]  # sorted: b.1.jpg, b.jpg, img/...
    records = read_records([tmp_path / "f.rec"])
    assert len(records) == len(want)
    for (_, _, label, _), texts in zip(records, want):
        np.testing.assert_array_equal(label, caption_tokens(*texts))
    assert verify(tmp_path / "f")["records_by_caption_count"] == {"1": 5, "3": 1}


def test_webdataset_tars(tmp_path):
    for t in range(2):
        members = []
        for k in range(3):
            key = f"{t:05d}{k:04d}"
            members += [
                (f"{key}.jpg", jpeg(seed=t * 10 + k)),
                (f"{key}.txt", f"tar {t} item {k}".encode()),
                (f"{key}.json", b'{"status": "success"}'),
            ]
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
        data, label = fn.readers.mxnet(
            path=[str(rec)], index_path=[str(rec.with_suffix(".idx"))], random_shuffle=False
        )
        return fn.decoders.image(data, device="cpu", output_type=types.RGB), label

    p = pipe()
    p.build()
    images, got = p.run()
    for i, label in enumerate(labels):
        img = np.array(images[i])
        assert img.ndim == 3 and img.shape[2] == 3 and img.size > 0
        np.testing.assert_array_equal(np.array(got[i]), label)


def _large_photos(n: int) -> list[bytes]:
    """Noise JPEGs of ~38 KB: the writer gathers images of 16 KB and more for one writev. The
    first holds the RecordIO magic word at a 4-byte-aligned place of its record (in a comment
    segment), so that its record is split into parts where the word is."""
    import io

    from PIL import Image

    from src.recordio import MAGIC_BYTES

    rng = np.random.default_rng(9)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (160, 200, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        out.append(buf.getvalue())
    # SOI, then FF FE + length + 2 bytes: the word starts at byte 8 of the image, and a record's
    # head (header + float32 label) is a multiple of 4 bytes long.
    out[0] = out[0][:2] + b"\xff\xfe\x00\x08xx" + MAGIC_BYTES + out[0][2:]
    return out


def test_mxnet_reads_every_record(hub, tmp_path):
    d, _, good = hub
    large = tmp_path / "large.parquet"
    photos = _large_photos(4)
    write_hub_parquet(large, [(p, tokens_for(3, 500 + i)) for i, p in enumerate(photos)], row_group_size=4)
    convert([d, large], tmp_path / "mx", quiet(shard_size=7))
    shards = find_shards(tmp_path / "mx")
    ours = read_records(shards)
    assert [payload for *_, payload in ours[-4:]] == photos
    code = r"""
import hashlib, json, sys
from mxnet import recordio
out = []
for rec in sys.argv[1:]:
    r = recordio.MXIndexedRecordIO(rec[:-4] + ".idx", rec, "r")
    for key in r.keys:
        h, payload = recordio.unpack(r.read_idx(key))
        digest = hashlib.sha256(payload).hexdigest()
        out.append([key, int(h.id), int(h.id2), [float(v) for v in h.label], digest])
print(json.dumps(out))
"""
    got = json.loads(run_oracle(mxnet_python(), code, *map(str, shards)).stdout)
    assert len(got) == len(ours) == len(good) + len(photos)
    for (key, i, i2, label, digest), (oi, oi2, olabel, payload) in zip(got, ours):
        assert key == i == oi and i2 == oi2
        assert label == olabel.tolist()
        assert digest == hashlib.sha256(payload).hexdigest()


def _blocked_run(tmp_path: Path, n: int = 80, blocked: int = 70) -> tuple[Path, Path, list[str]]:
    """A reference input and a copy of it whose image `blocked` a run started by
    `_start_until_mid_shard` cannot read (opening it hangs), so that the run can be caught
    mid-shard. Returns (ref dir, run dir, CLI args after the input)."""
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    for d in (ref_dir, run_dir):
        (d / "img").mkdir(parents=True)
        rows = ["image,caption"] + [f"img/{i}.jpg,picture number {i}" for i in range(n)]
        (d / "list.csv").write_text("\n".join(rows) + "\n")
        for i in range(n):
            (d / "img" / f"{i}.jpg").write_bytes(jpeg(seed=i) if i % 9 else b"broken")
    # 9 of 80 images are broken (11%): accepted here, the mass-skip tests check the limit.
    return (
        ref_dir,
        run_dir,
        ["--shard-size", "5", "--workers", "2", "--no-progress", "--max-skip-fraction", "0.2"],
    )


def _start_until_mid_shard(cmd: list[str], out: Path, shards: int, hung: Path) -> subprocess.Popen:
    """Start `cmd`, in which opening the file `hung` never returns (tests/_hung_open), and wait
    until `shards` shards are final and the next one is being written."""
    path = [str(REPO / "tests" / "_hung_open"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "RWKV_CLIP_TEST_HUNG_FILE": str(hung.resolve())}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    state, tmp = out / "x.state.json", out / f"x-{shards:05d}.rec.tmp"

    def caught() -> bool:
        return proc.poll() is not None or (
            state.exists() and len(json.loads(state.read_text())["shards"]) >= shards and tmp.exists()
        )

    wait_for(caught, limit=120)
    assert proc.poll() is None, proc.communicate()[1]
    assert len(json.loads(state.read_text())["shards"]) == shards and tmp.exists()
    return proc


def test_second_writer_refused_kill_9_leaves_nothing_and_resume_takes_the_lock_over(tmp_path):
    """Two real runs into one --output; SIGKILL of the main process only (as the OOM killer does)."""
    ref_dir, run_dir, args = _blocked_run(tmp_path)
    ref = run_cli(str(ref_dir / "list.csv"), "--output", str(ref_dir / "out" / "x"), *args)
    assert ref.returncode == 0, ref.stderr
    cmd = [*CLI, str(run_dir / "list.csv"), "--output", str(run_dir / "out" / "x"), *args]
    # 56 good images before the blocked chunk (items 64..) fill 11 shards of 5 and start the 12th.
    proc = _start_until_mid_shard(cmd, run_dir / "out", 11, run_dir / "img" / "70.jpg")
    try:
        other = run_cli(str(ref_dir / "list.csv"), "--output", str(run_dir / "out" / "x"), *args)
        _one_line_error(other, f"pid {proc.pid} on host {socket.gethostname()}", "being written", "--output")
        busy = run_cli("--verify", str(run_dir / "out" / "x"), "--no-progress")
        assert busy.returncode == 1 and f"still being written by data2rec run pid {proc.pid}" in busy.stderr
        helpers = descendants(proc.pid)  # forkserver, 2 workers, resource tracker
        assert len(helpers) >= 3, helpers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert wait_for(lambda: not alive(helpers), limit=30), f"left running: {alive(helpers)}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever the test failed to stop
        proc.communicate()
    assert (run_dir / "out" / "x.lock").exists()  # the killed run's, stale now

    resumed = run_cli(*cmd[2:])
    assert resumed.returncode == 0, resumed.stderr
    assert f"pid {proc.pid}" in resumed.stderr and "taking it over" in resumed.stderr
    ref_files = sorted(p.name for p in (ref_dir / "out").iterdir() if p.suffix in (".rec", ".idx"))
    run_files = sorted(p.name for p in (run_dir / "out").iterdir() if p.suffix in (".rec", ".idx"))
    assert run_files == ref_files and len(ref_files) == 2 * 15  # 71 good images -> 15 shards
    for name in ref_files:
        assert (run_dir / "out" / name).read_bytes() == (ref_dir / "out" / name).read_bytes(), name
    assert not list((run_dir / "out").glob("*.tmp")) and not (run_dir / "out" / "x.lock").exists()
    rep = [json.loads((d / "out" / "x.report.json").read_text()) for d in (ref_dir, run_dir)]
    assert rep[0]["skipped_by_reason"] == rep[1]["skipped_by_reason"] == {"not_an_image": 9}
    # A second rerun finds the run complete and changes nothing.
    again = run_cli(*cmd[2:])
    assert again.returncode == 0 and "already complete" in again.stdout


def test_sigterm_stops_cleanly_verify_says_unfinished_and_resume_finishes(tmp_path):
    ref_dir, run_dir, args = _blocked_run(tmp_path)
    cmd = [*CLI, str(run_dir / "list.csv"), "--output", str(run_dir / "out" / "x"), *args]
    proc = _start_until_mid_shard(cmd, run_dir / "out", 11, run_dir / "img" / "70.jpg")
    try:
        helpers = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as a scheduler's time limit does
        _, err = proc.communicate(timeout=60)
        assert wait_for(lambda: not alive(helpers), limit=30), f"left running: {alive(helpers)}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err and "Exception ignored" not in err
    out = run_dir / "out"
    assert not list(out.glob("*.tmp")) and not (out / "x.lock").exists()
    assert len(find_shards(out / "x")) == 11

    pending = run_cli("--verify", str(out / "x"), "--no-progress")
    assert pending.returncode == 1 and "UNFINISHED" in pending.stdout
    assert "conversion unfinished" in pending.stderr and "11 finished shard(s)" in pending.stderr
    assert "rerun the same data2rec command" in pending.stderr

    resumed = run_cli(*cmd[2:])
    assert resumed.returncode == 0, resumed.stderr
    assert "taking it over" not in resumed.stderr  # a clean stop leaves no lock behind
    done = run_cli("--verify", str(out / "x"), "--no-progress")
    assert done.returncode == 0 and "15 shards, 71 records" in done.stdout and ": OK" in done.stdout


@pytest.mark.parametrize("stage", ["opening", "between_renames"])
def test_a_stop_while_a_shard_opens_or_commits_leaves_no_partial_file(hub, tmp_path, monkeypatch, stage):
    # SIGTERM raises wherever the main thread is; the test above lands in these windows only by
    # chance. The stop is raised there directly: after the shard's files are created and before its
    # writer exists, and after the index's rename and before the data file's.
    from src.convert import writer as writer_module

    d, _, _ = hub
    if stage == "opening":

        class Stopped(writer_module._IndexStreamer):
            def __init__(self, *args):
                super().__init__(*args)
                if self.uri.endswith("-00001.rec.tmp"):
                    raise KeyboardInterrupt

        monkeypatch.setattr(writer_module, "_IndexStreamer", Stopped)
    else:
        real_replace = os.replace

        def replace(src, dst):
            real_replace(src, dst)
            if str(dst).endswith("-00001.idx"):
                raise KeyboardInterrupt

        monkeypatch.setattr(writer_module.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        convert([d], tmp_path / "v", quiet(shard_size=6))
    left = sorted(p.name for p in tmp_path.glob("v*") if not p.name.endswith((".json", ".lock")))
    assert left == ["v-00000.idx", "v-00000.rec"]
    monkeypatch.undo()
    convert([d], tmp_path / "v", quiet(shard_size=6))  # the same command resumes
    ok = run_cli("--verify", str(tmp_path / "v"), "--no-progress")
    assert ok.returncode == 0 and "2 shards, 12 records" in ok.stdout


def test_verify_catches_damaged_shards(hub, tmp_path):
    d, _, _ = hub
    convert([d], tmp_path / "v", quiet(shard_size=6))
    ok = run_cli("--verify", str(tmp_path / "v"), "--decode", "--no-progress")
    assert ok.returncode == 0 and "2 shards, 12 records (3 caption(s): 12): OK" in ok.stdout
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
    accept = ("--no-progress", "--max-skip-fraction", "1")  # the hub fixture's bad rows are on purpose
    _one_line_error(run_cli("--output", str(tmp_path / "x"), cwd=tmp_path), "no INPUT", "./YFCC15M")
    _one_line_error(
        run_cli(str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "x")), "missing.parquet"
    )
    (tmp_path / "afile").write_text("")
    _one_line_error(run_cli(str(files[0]), "--output", str(tmp_path / "afile" / "x")), "not writable")
    _one_line_error(
        run_cli(str(files[0]), "--output", str(tmp_path / "x"), "--machine-id", "3", "--num-machines", "2"),
        "--machine-id",
    )
    _one_line_error(
        run_cli(str(files[0]), "--output", str(tmp_path / "x"), "--workers", "1000"),
        "--workers 1000",
        "per usable core",
    )
    # ids are uint64: the largest offset is refused once it cannot hold every row's id
    _one_line_error(
        run_cli(str(files[0]), "--output", str(tmp_path / "x"), "--id-offset", str(2**64 - 1)),
        "--id-offset",
        "2^64-1",
        f"at most {2**64 - 9}",
    )
    _one_line_error(
        run_cli(str(files[0]), "--output", str(tmp_path / "x"), "--id-offset", str(2**64)),
        "--id-offset",
        "2^64-1",
    )
    first = run_cli(str(files[0]), "--output", str(tmp_path / "x"), *accept)
    assert first.returncode == 0, first.stderr
    _one_line_error(run_cli(str(files[1]), "--output", str(tmp_path / "x"), *accept), "--overwrite")
    over = run_cli(str(files[1]), "--output", str(tmp_path / "x"), "--overwrite", *accept)
    assert over.returncode == 0 and read_records([tmp_path / "x.rec"])[0][0] == 0
    (tmp_path / "x.state.json").unlink()
    _one_line_error(run_cli(str(files[1]), "--output", str(tmp_path / "x")), "already exists")
    # the same input twice, or a folder and a file in it, would convert the same rows twice
    _one_line_error(run_cli(str(files[0]), str(files[0]), "--output", str(tmp_path / "y")), "given twice")
    _one_line_error(run_cli(str(d), str(files[1]), "--output", str(tmp_path / "y")), "is inside", "only one")
    assert not list(tmp_path.glob("y*"))


def test_help_documents_the_exit_statuses_and_the_decoders():
    text = " ".join(run_cli("--help").stdout.split())
    for needle in (
        "Exit status",
        "4 more than --max-skip-fraction",
        "143",
        "--max-captions",
        "structure (default): + every JPEG's markers",
        "decode (old name: quick): + a decode by PIL",
        "DALI's CPU decoder itself",
    ):
        assert needle in text, needle


def test_all_bad_input_writes_nothing_and_fails(tmp_path):
    write_hub_parquet(tmp_path / "bad.parquet", [(b"", tokens_for(1, 0)), (b"<html>", tokens_for(1, 1))])
    proc = run_cli(str(tmp_path / "bad.parquet"), "--output", str(tmp_path / "o"), "--no-progress")
    assert proc.returncode == 4 and "2 of 2 rows (100%) skipped" in proc.stderr
    assert "empty_image: 1" in proc.stdout and "not_an_image: 1" in proc.stdout
    assert not find_shards(tmp_path / "o")
    accepted = run_cli(
        str(tmp_path / "bad.parquet"),
        "--output",
        str(tmp_path / "o"),
        "--no-progress",
        "--max-skip-fraction",
        "1",
    )
    assert accepted.returncode == 1 and "no record was written" in accepted.stderr


def _mass_skip_parquet(path: Path, good: int, bad: int) -> None:
    junk = [b"", b"<html>403</html>", bad_images()["truncated.jpg"][0]]
    rows = [(jpeg(16, 16, seed=i), tokens_for(1, i)) for i in range(good)]
    rows += [(junk[i % 3], tokens_for(1, i)) for i in range(bad)]
    write_hub_parquet(path, rows)


def test_mass_skips_exit_4_after_writing_every_valid_row(tmp_path):
    _mass_skip_parquet(tmp_path / "a.parquet", good=4, bad=6)
    proc = run_cli(str(tmp_path / "a.parquet"), "--output", str(tmp_path / "o"), "--no-progress")
    assert proc.returncode == 4, proc.stderr
    last = proc.stderr.strip().splitlines()
    assert "6 of 10 rows (60%) skipped, more than --max-skip-fraction 0.05 (5%) allows" in last[0]
    assert "Traceback" not in proc.stderr
    reasons = [line for line in last if "(e.g. " in line]
    assert len(reasons) == 3 and all("a.parquet:row" in line for line in reasons)
    assert "--max-skip-fraction 0.60" in last[-1] and "o.report.json" in last[-1]
    assert len(read_records([tmp_path / "o.rec"])) == 4
    assert json.loads((tmp_path / "o.report.json").read_text())["skipped"] == 6
    # Accepting the skips needs no new conversion: the finished run is judged again.
    ok = run_cli(
        str(tmp_path / "a.parquet"),
        "--output",
        str(tmp_path / "o"),
        "--no-progress",
        "--max-skip-fraction",
        "0.60",
    )
    assert ok.returncode == 0 and "already complete" in ok.stdout, ok.stderr


def test_a_parquet_shard_cut_in_half_fails_the_run_instead_of_counting_as_one_row(tmp_path):
    # 5 shards of 60 rows, one cut in half (its footer, and so its row count, gone): not "1 skipped of 241".
    (tmp_path / "in").mkdir()
    for i in range(5):
        write_hub_parquet(
            tmp_path / "in" / f"train-{i:05d}.parquet",
            [(jpeg(8, 8, seed=60 * i + r), tokens_for(1, 60 * i + r)) for r in range(60)],
            row_group_size=20,
        )
    cut = tmp_path / "in" / "train-00002.parquet"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    for _attempt in range(2):  # a rerun must not report the run complete either
        proc = run_cli(
            str(tmp_path / "in"), "--output", str(tmp_path / "o"), "--no-progress", "--workers", "1"
        )
        assert proc.returncode == 4, proc.stderr
        error = proc.stderr.strip().splitlines()
        assert len(error) == 1 and "Traceback" not in proc.stderr
        assert (
            error[0].startswith("data2rec: error: 1 input file(s) could not be read at all")
            and str(cut) in error[0]
        )
        assert "240 written (0 re-encoded), 0 skipped of 240" in proc.stdout
    report = json.loads((tmp_path / "o.report.json").read_text())
    assert [u["input"] for u in report["unreadable_inputs"]] == [str(cut)]
    assert "cannot open parquet" in report["unreadable_inputs"][0]["detail"]
    assert sorted(i for i, *_ in read_records([tmp_path / "o.rec"])) == list(
        range(240)
    )  # the cut one has none
    checked = run_cli("--verify", str(tmp_path / "o"))
    assert (
        checked.returncode == 1
        and f"could not be read at all and none of their rows is converted: {cut}" in checked.stderr
    ), checked.stderr


def test_a_readable_parquet_file_without_the_columns_counts_as_all_of_its_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_hub_parquet(tmp_path / "a.parquet", [(jpeg(8, 8, seed=r), tokens_for(1, r)) for r in range(20)])
    pq.write_table(pa.table({"other": list(range(20))}), tmp_path / "b.parquet")
    with pytest.raises(TooManySkipped, match="20 of 40 rows \\(50%\\) skipped") as info:
        convert(
            [tmp_path / "a.parquet", tmp_path / "b.parquet"],
            tmp_path / "o",
            ConvertOptions(workers=1, progress=False),
        )
    assert info.value.report["skipped_by_reason"] == {"broken_input": 20}


def test_mass_skips_are_judged_per_machine_part(tmp_path):
    _mass_skip_parquet(tmp_path / "0.parquet", good=20, bad=0)
    _mass_skip_parquet(tmp_path / "1.parquet", good=18, bad=2)  # 10% of this part; 5% of the whole
    inputs = [tmp_path / "0.parquet", tmp_path / "1.parquet"]
    opts = {"workers": 1, "progress": False, "num_machines": 2}
    assert convert(inputs, tmp_path / "o", ConvertOptions(machine_id=0, **opts))["written"] == 20
    with pytest.raises(TooManySkipped, match="2 of 20 rows \\(10%\\) skipped") as info:
        convert(inputs, tmp_path / "o", ConvertOptions(machine_id=1, **opts))
    assert info.value.exit_code == 4 and info.value.report["written"] == 18
    assert len(read_records(find_shards(tmp_path / "o-m001"))) == 18


def test_parquet_rows_keep_every_caption_count(tmp_path):
    counts = [1, 2, 3, 1, 5, 3, MAX_CAPTIONS + 1]
    rows = [(jpeg(16, 16, seed=i), tokens_for(k, i)) for i, k in enumerate(counts)]
    write_hub_parquet(tmp_path / "k.parquet", rows, row_group_size=3)
    report = convert([tmp_path / "k.parquet"], tmp_path / "k", quiet(shard_size=4))
    assert report["records_by_caption_count"] == {"1": 2, "2": 1, "3": 2, "5": 1}
    assert report["skipped_by_reason"] == {"too_many_captions": 1}
    assert f"more than --max-captions {MAX_CAPTIONS}" in report["examples"]["too_many_captions"][0]["detail"]
    records = read_records(find_shards(tmp_path / "k"))
    assert [r[0] for r in records] == list(range(6))
    for i, _, label, payload in records:
        assert payload == rows[i][0]
        np.testing.assert_array_equal(label, rows[i][1])  # every block, exactly as it came
    checked = verify(tmp_path / "k", decode=True)
    assert checked["ok"] and checked["records_by_caption_count"] == report["records_by_caption_count"]


def _without_start_tokens(tokens: np.ndarray) -> np.ndarray:
    """The blocks a tokenizer run without the start token writes: ids, end token, zeros."""
    blocks = tokens.reshape(-1, 77)
    return np.concatenate([blocks[:, 1:], np.zeros((len(blocks), 1), np.float32)], axis=1).reshape(-1)


def test_tokens_without_start_tokens_are_refused_at_conversion_with_the_reason(tmp_path):
    # Such blocks used to convert and pass --verify, and then every loader refused the records.
    rows = [(jpeg(16, 16, seed=i), tokens_for(2, i)) for i in range(6)]
    for i in (1, 4):
        rows[i] = (rows[i][0], _without_start_tokens(rows[i][1]))
    write_hub_parquet(tmp_path / "mixed.parquet", rows)
    report = convert([tmp_path / "mixed.parquet"], tmp_path / "m", quiet())
    assert report["written"] == 4 and report["skipped_by_reason"] == {"bad_tokens": 2}
    examples = report["examples"]["bad_tokens"]
    assert [e["input"].rsplit(":", 1)[1] for e in examples] == ["row 1", "row 4"]
    assert all(
        "caption block 1 of 2 begins with" in e["detail"] and "not the start token 49406" in e["detail"]
        for e in examples
    ), examples
    # What was written loads: the loaders' reader takes every record.
    assert verify(tmp_path / "m", decode=True)["ok"]
    shardset = load_shards(tmp_path / "m", cache_dir=tmp_path / "cache")
    reader = RecordReader(shardset)
    assert [reader.read(i)[0].size for i in range(shardset.total_records)] == [154] * 4
    # A whole dataset tokenised that way stops the CLI with the reason, and writes nothing.
    rows = [(img, _without_start_tokens(tok)) for img, tok in rows]
    write_hub_parquet(tmp_path / "nostart.parquet", rows)
    proc = run_cli(str(tmp_path / "nostart.parquet"), "--output", str(tmp_path / "n"), "--no-progress")
    assert proc.returncode == 4 and "6 of 6 rows (100%) skipped" in proc.stderr, proc.stderr
    assert "bad_tokens: 6" in proc.stderr and "not the start token 49406" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not find_shards(tmp_path / "n")


def test_the_context_length_is_the_models(tmp_path):
    write_hub_parquet(tmp_path / "a.parquet", [(jpeg(seed=0), tokens_for(1, 0))])
    proc = run_cli(str(tmp_path / "a.parquet"), "--output", str(tmp_path / "o"), "--context-length", "32")
    assert proc.returncode == 2 and "unrecognized arguments: --context-length 32" in proc.stderr
    assert not list(tmp_path.glob("o*"))


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


def test_no_arguments_convert_yfcc15m_inside_it_as_the_guide_says(tmp_path):
    missing = run_cli(cwd=tmp_path)
    _one_line_error(missing, "no INPUT given", "./YFCC15M", "download_YFCC15M.sh")
    data = tmp_path / "YFCC15M" / "data"
    data.mkdir(parents=True)
    write_hub_parquet(
        data / "train-00000-of-00001.parquet", [(jpeg(16, 16, i), tokens_for(2, i)) for i in range(5)]
    )
    partial = tmp_path / "YFCC15M" / ".hfd" / "incomplete" / "data"  # hfd.sh's unfinished download
    partial.mkdir(parents=True)
    (partial / "train-00001-of-00001.parquet").write_bytes(b"PAR1 half a file")
    first = run_cli("--no-progress", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("no input given: converting ./YFCC15M -> YFCC15M/datarec.rec")
    out = tmp_path / "YFCC15M"
    assert (out / "datarec.rec").is_file() and (out / "datarec.idx").is_file()
    assert len(read_records([out / "datarec.rec"])) == 5
    # Its own .rec/.idx/report/state inside the input folder are never read back as input.
    again = run_cli("--no-progress", cwd=tmp_path)
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr


def test_no_arguments_with_the_guides_img_and_captions_layout(tmp_path):
    root = tmp_path / "YFCC15M"
    (root / "img").mkdir(parents=True)
    (root / "captions").mkdir()
    for i in range(3):
        (root / "img" / f"00000000{i}.jpg").write_bytes(jpeg(seed=i))
        (root / "captions" / f"00000000{i}.txt").write_text(f"guide picture {i}")
    proc = run_cli("--no-progress", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = read_records([root / "datarec.rec"])
    for i, (_, _, label, _) in enumerate(records):
        np.testing.assert_array_equal(label, caption_tokens(f"guide picture {i}"))
    assert len(records) == 3


def _limit_file_size(limit: int):
    def apply() -> None:  # in the child: writes past `limit` bytes fail as on a full disk
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_is_one_clean_line_and_resumes(tmp_path):
    # The first shard's images are small, the later ones' big: the disk "fills up" in shard 1.
    rows = [(jpeg(16, 16, i) if i < 20 else jpeg(64, 64, i), tokens_for(1, i)) for i in range(60)]
    write_hub_parquet(tmp_path / "a.parquet", rows)
    args = [
        *CLI,
        str(tmp_path / "a.parquet"),
        "--output",
        str(tmp_path / "o"),
        "--no-progress",
        "--workers",
        "1",
        "--shard-size",
        "20",
    ]
    full = subprocess.run(
        args, capture_output=True, text=True, preexec_fn=_limit_file_size(30_000), timeout=300
    )
    assert full.returncode == 2, full.stderr
    _one_line_error(full, f"writing {tmp_path}", "rerun the same command to resume")
    assert "Exception ignored" not in full.stderr
    assert not list(tmp_path.glob("o*.tmp")), "the unfinished shard must not keep the disk full"
    assert len(find_shards(tmp_path / "o")) >= 1  # the shards finished before the disk filled up stay
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(read_records(find_shards(tmp_path / "o"))) == 60
    # A summary that cannot be written (stdout on the full disk) costs a warning, not a traceback.
    with open("/dev/full", "w") as devfull:
        quietly = subprocess.run(args, stdout=devfull, stderr=subprocess.PIPE, text=True, timeout=300)
    assert quietly.returncode == 0 and "Traceback" not in quietly.stderr
    assert "Exception ignored" not in quietly.stderr and "cannot write to standard output" in quietly.stderr


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_float_flag_that_is_not_finite_is_refused_when_parsed(tmp_path, value):
    proc = run_cli(str(tmp_path), "--output", str(tmp_path / "o"), f"--max-skip-fraction={value}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1]
        == f"data2rec.py: error: argument --max-skip-fraction: expected a finite number, got '{value}'"
    )


def test_a_rerun_removes_the_temporary_files_a_killed_runs_report_left(tmp_path):
    write_hub_parquet(tmp_path / "a.parquet", [(jpeg(8, 8, seed=r), tokens_for(1, r)) for r in range(4)])
    opts = quiet()
    convert([tmp_path / "a.parquet"], tmp_path / "o", opts)
    dead = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    stale = [tmp_path / f".o.report.json.{dead}.tmp", tmp_path / f".o.state.json.{dead}.tmp"]
    for p in stale:
        p.write_text("{")  # a kill while the report or the state was written
    assert convert([tmp_path / "a.parquet"], tmp_path / "o", opts)["resumed"] == "already complete"
    assert not any(p.exists() for p in stale)
