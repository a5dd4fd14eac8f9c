"""Tests of src/recordio.py: round trips, the multi-part rule, corrupt input, and
agreement with the real tools (MXNet 1.9.1 as the format oracle, DALI's reader)."""

import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.oracles import mxnet_python, reference_encode, run_oracle
from src import recordio
from src.recordio import (
    IRHeader,
    MXIndexedRecordIO,
    MXRecordIO,
    RecordIOError,
    iter_records,
    pack,
    read_index,
    read_record_at,
    unpack,
    write_index,
)
from tests._recordio_helpers import (
    MAGIC,
    ORACLE_CODE,
    dump_specs,
    random_payloads,
    record_specs,
)

# Payloads that exercise every branch of the multi-part rule.
EDGE_PAYLOADS = [
    b"",
    b"a",
    b"abc",
    b"abcd",
    MAGIC,  # a record that is only the magic word: two empty parts
    MAGIC * 3,
    b"abcd" + MAGIC + b"ab",  # aligned magic in the middle
    b"ab" + MAGIC + b"cd",  # unaligned: no split
    b"x" + MAGIC + b"yyy" + MAGIC,  # one unaligned, one aligned at the end
    b"abc" + MAGIC,  # magic ending at len, unaligned
    MAGIC + b"tail",  # aligned magic at offset 0
    b"\x0a\x23\xd7",  # a prefix of the magic only
    bytes(range(256)) * 40 + MAGIC + b"z" * 5,
]


def write_records(idx_path, rec_path, records, keys=None):
    keys = list(range(len(records))) if keys is None else keys
    with MXIndexedRecordIO(idx_path, rec_path, "w") as w:
        for key, rec in zip(keys, records):
            w.write_idx(key, rec)
    return keys


def parts_of(rec_path):
    """(cflag, length) of every part in a .rec file, walked independently of the reader."""
    data = open(rec_path, "rb").read()
    pos, parts = 0, []
    while pos < len(data):
        magic, lrec = struct.unpack_from("<II", data, pos)
        assert magic == recordio.MAGIC
        length = lrec & ((1 << 29) - 1)
        parts.append((lrec >> 29, length))
        pos += 8 + ((length + 3) & ~3)
    assert pos == len(data)
    return parts


# ---------------------------------------------------------------- round trips


def test_indexed_round_trip_edge_payloads(tmp_path):
    idx, rec = tmp_path / "a.idx", tmp_path / "a.rec"
    keys = write_records(idx, rec, EDGE_PAYLOADS, keys=[k * 7 + 3 for k in range(len(EDGE_PAYLOADS))])
    r = MXIndexedRecordIO(idx, rec, "r")
    assert r.keys == keys
    for key, payload in reversed(list(zip(keys, EDGE_PAYLOADS))):
        assert r.read_idx(key) == payload
    r.reset()
    assert [r.read() for _ in EDGE_PAYLOADS] == EDGE_PAYLOADS
    assert r.read() is None
    r.close()
    assert [rec_ for _, rec_ in iter_records(rec)] == EDGE_PAYLOADS
    assert [k for k, _ in read_index(idx)] == keys


def test_split_points_follow_the_aligned_magic_rule(tmp_path):
    rec = tmp_path / "a.rec"
    with MXRecordIO(rec, "w") as w:
        w.write(b"abcd" + MAGIC + b"ab")  # split at 4
        w.write(b"ab" + MAGIC + b"cd")  # unaligned: whole
        w.write(MAGIC)  # empty first and last part
        w.write(b"abcd" + MAGIC + b"efgh" + MAGIC + b"i")  # first, middle, last
    assert parts_of(rec) == [(1, 4), (3, 2), (0, 8), (1, 0), (3, 0), (1, 4), (2, 4), (3, 1)]


def test_writer_tell_matches_offsets(tmp_path):
    idx, rec = tmp_path / "a.idx", tmp_path / "a.rec"
    write_records(idx, rec, EDGE_PAYLOADS)
    offsets = [off for _, off in read_index(idx)]
    assert offsets == [off for off, _ in iter_records(rec)]
    assert os.path.getsize(rec) % 4 == 0


def test_pack_unpack_scalar_and_array_labels():
    h, s = unpack(pack(IRHeader(9, 3.5, 7, 8), b"payload"))
    assert h == IRHeader(0, 3.5, 7, 8) and s == b"payload"
    label = np.arange(231, dtype=np.float32) * 1000.0 + 49406
    packed = pack(IRHeader(0, label, 1, 2), b"img")
    assert len(packed) == 24 + 231 * 4 + 3
    h, s = unpack(packed)
    assert h.flag == 231 and h.id == 1 and h.id2 == 2 and s == b"img"
    np.testing.assert_array_equal(h.label, label)
    h, _ = unpack(pack((0, [1, 2], 0, 0), b""))
    assert h.flag == 2 and h.label.dtype == np.float32


def test_pack_img_unpack_img_png_is_lossless():
    img = np.random.default_rng(0).integers(0, 256, (17, 23, 3), dtype=np.uint8)
    h, out = recordio.unpack_img(recordio.pack_img(IRHeader(0, 1.0, 5, 0), img, quality=3, img_fmt=".png"))
    assert h.id == 5
    np.testing.assert_array_equal(out, img)
    _, jpg = recordio.unpack_img(recordio.pack_img((0, 0.0, 0, 0), img, quality=95), iscolor=0)
    assert jpg.shape == (17, 23)


def test_pickled_reader_reopens_and_writer_refuses(tmp_path):
    idx, rec = tmp_path / "a.idx", tmp_path / "a.rec"
    write_records(idx, rec, [b"one", b"two"])
    r = MXIndexedRecordIO(idx, rec, "r")
    r2 = pickle.loads(pickle.dumps(r))
    assert r2.read_idx(1) == b"two" and r2.keys == [0, 1]
    with MXRecordIO(tmp_path / "b.rec", "w") as w, pytest.raises(TypeError, match="truncate"):
        pickle.dumps(w)


# Runs in a fresh interpreter: forking the pytest process, where other tests may have
# started DALI's threads, could deadlock the child. Exit status 0 = all checks held.
FORK_SCRIPT = r"""
import os, sys
from src.recordio import MXIndexedRecordIO, MXRecordIO
assert "cv2" not in sys.modules  # OpenCV is imported only by pack_img/unpack_img
d = sys.argv[1]

def in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if fn() else 3)
        except BaseException:
            os._exit(4)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0

with MXIndexedRecordIO(d + "/a.idx", d + "/a.rec", "w") as w:
    for n, rec in enumerate([b"zero", b"one", b"two"]):
        w.write_idx(n, rec)
r = MXIndexedRecordIO(d + "/a.idx", d + "/a.rec", "r")
assert r.read() == b"zero"
# The child reopens and starts over, instead of sharing the parent's file offset...
assert in_child(lambda: [r.read(), r.read_idx(2)] == [b"zero", b"two"])
# ...so the parent's position is untouched.
assert r.read() == b"one"

w = MXRecordIO(d + "/b.rec", "w")
w.write(b"parent")

def child_write():
    try:
        w.write(b"child")
    except RuntimeError:
        return True
    return False

assert in_child(child_write)
w.close()
r = MXRecordIO(d + "/b.rec", "r")
assert [r.read(), r.read()] == [b"parent", None]
"""


def test_forked_children_reopen_readers_and_refuse_writers(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(tmp_path)],
        cwd=Path(__file__).resolve().parent.parent,  # `-c` puts the working directory on the path
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_missing_index_file_is_a_clear_error(tmp_path):
    write_records(tmp_path / "a.idx", tmp_path / "a.rec", [b"x"])
    with pytest.raises(FileNotFoundError, match="nope.idx"):
        MXIndexedRecordIO(tmp_path / "nope.idx", tmp_path / "a.rec", "r")
    with pytest.raises(FileNotFoundError, match="nope.rec"):
        MXRecordIO(tmp_path / "nope.rec", "r")


def test_write_index_is_read_back(tmp_path):
    entries = [(5, 0), (2, 40), (900, 1 << 40), (-3, 48)]
    write_index(tmp_path / "x.idx", entries)
    assert read_index(tmp_path / "x.idx") == entries
    keys, offsets = recordio.read_index_arrays(tmp_path / "x.idx")
    assert keys.dtype == offsets.dtype == np.int64
    assert list(zip(keys.tolist(), offsets.tolist())) == entries
    assert os.listdir(tmp_path) == ["x.idx"]
    write_index(tmp_path / "empty.idx", [])
    assert read_index(tmp_path / "empty.idx") == []
    assert recordio.read_index_arrays(tmp_path / "empty.idx")[0].shape == (0,)


# ---------------------------------------------------------------- misuse and corruption


def test_invalid_flag_and_wrong_direction(tmp_path):
    with pytest.raises(ValueError, match="Invalid flag"):
        MXRecordIO(tmp_path / "a.rec", "a")
    with MXRecordIO(tmp_path / "a.rec", "w") as w:
        with pytest.raises(ValueError, match="open for writing"):
            w.read()
        for bad in ("text", 5):
            with pytest.raises(TypeError, match="takes bytes"):
                w.write(bad)
        w.write(bytearray(b"ok"))
        w.write(memoryview(b"fine"))
    with MXRecordIO(tmp_path / "a.rec", "r") as r:
        with pytest.raises(ValueError, match="open for reading"):
            r.write(b"x")
        assert [r.read(), r.read(), r.read()] == [b"ok", b"fine", None]
    with pytest.raises(ValueError, match="closed"):
        r.read()


def _valid_file(tmp_path):
    idx, rec = tmp_path / "a.idx", tmp_path / "a.rec"
    write_records(idx, rec, [b"first-record", b"abcd" + MAGIC + b"efgh", b"third"])
    return idx, rec


@pytest.mark.parametrize("cut", [3, 8, 12, 27, 30, -1])
def test_truncated_rec_names_file_and_offset(tmp_path, cut):
    idx, rec = _valid_file(tmp_path)
    data = rec.read_bytes()
    rec.write_bytes(data[:cut])
    with pytest.raises(RecordIOError, match=r"a\.rec: truncated .* byte offset \d+"):
        list(iter_records(rec))


def test_bad_magic_and_bad_cflag(tmp_path):
    idx, rec = _valid_file(tmp_path)
    data = bytearray(rec.read_bytes())
    second = read_index(idx)[1][1]
    bad = bytearray(data)
    bad[second] ^= 0xFF
    rec.write_bytes(bytes(bad))
    with pytest.raises(RecordIOError, match=rf"bad magic .* byte offset {second}\b"):
        list(iter_records(rec))
    # A middle part where a record should start (e.g. an index offset into a record).
    bad = bytearray(data)
    struct.pack_into("<I", bad, 4, (2 << 29) | 12)
    rec.write_bytes(bytes(bad))
    with pytest.raises(RecordIOError, match="offset 0 has cflag 2"):
        MXRecordIO(rec, "r").read()
    # A new record starting inside a multi-part one.
    bad = bytearray(data)
    first_part_len = struct.unpack_from("<I", bad, second + 4)[0] & ((1 << 29) - 1)
    struct.pack_into("<I", bad, second + 8 + first_part_len + 4, (0 << 29) | 4)
    rec.write_bytes(bytes(bad))
    with pytest.raises(RecordIOError, match="inside the multi-part record"):
        list(iter_records(rec))


def test_index_offset_past_end_or_into_a_record(tmp_path):
    idx, rec = _valid_file(tmp_path)
    size = os.path.getsize(rec)
    idx.write_text(f"0\t0\n1\t{size}\n2\t4\n")
    r = MXIndexedRecordIO(idx, rec, "r")
    assert r.read_idx(0) == b"first-record"
    with pytest.raises(RecordIOError, match=rf"key 1 at byte offset {size}"):
        r.read_idx(1)
    with pytest.raises(RecordIOError, match="byte offset 4"):
        r.read_idx(2)
    with pytest.raises(KeyError):
        r.read_idx(99)


def test_read_record_at_offsets_in_any_order(tmp_path):
    idx, rec = _valid_file(tmp_path)
    size = os.path.getsize(rec)
    with open(rec, "rb") as f:
        # Reads seek for themselves: the file position left by the previous one does not matter.
        for offset, payload in reversed(list(iter_records(rec))):
            assert read_record_at(f, offset, str(rec)) == payload
        with pytest.raises(RecordIOError, match=rf"a\.rec: no record at byte offset {size} "):
            read_record_at(f, size, str(rec))
        with pytest.raises(RecordIOError, match="byte offset 4"):
            read_record_at(f, 4, str(rec))


@pytest.mark.parametrize(
    "text, line",
    [("0\t0\n1\n", 2), ("0\t0\nx\t8\n", 2), ("0\t-8\n", 1), ("0\t0\t0\n", 1), ("0\t1.5\n", 1)],
)
def test_corrupt_index_names_file_and_line(tmp_path, text, line):
    idx = tmp_path / "bad.idx"
    idx.write_text(text)
    with pytest.raises(RecordIOError, match=rf"bad\.idx: line {line}\b"):
        read_index(idx)
    with pytest.raises(RecordIOError, match=rf"bad\.idx: line {line}\b"):
        recordio.read_index_arrays(idx)
    (tmp_path / "bad.rec").write_bytes(b"")
    with pytest.raises(RecordIOError, match=rf"bad\.idx: line {line}\b"):
        MXIndexedRecordIO(idx, tmp_path / "bad.rec", "r")


def test_binary_index_and_blank_lines(tmp_path):
    idx = tmp_path / "b.idx"
    idx.write_bytes(b"0\t0\n\xff\xfe\x00\n")
    with pytest.raises(RecordIOError, match=r"b\.idx: not a text index"):
        read_index(idx)
    idx.write_text("0\t0\n\n3 16\n")  # blank line and a space: the lenient path
    assert read_index(idx) == [(0, 0), (3, 16)]
    assert [a.tolist() for a in recordio.read_index_arrays(idx)] == [[0, 3], [0, 16]]


def test_unpack_short_records():
    with pytest.raises(RecordIOError, match="shorter than the 24-byte IRHeader"):
        unpack(b"\0" * 10)
    with pytest.raises(RecordIOError, match="231 float32 labels"):
        unpack(pack((0, np.zeros(231), 0, 0), b"")[:100])


# ---------------------------------------------------------------- property tests

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Payloads assembled from random bytes and magic words, so aligned and unaligned
# magic words, runs of them, and magic at either end all come up often.
payload_pieces = st.lists(st.one_of(st.binary(max_size=13), st.just(MAGIC)), max_size=8)
payloads = payload_pieces.map(b"".join)


@PROPERTY_SETTINGS
@given(
    flag=st.integers(0, 2**32 - 1),
    label=st.one_of(
        st.floats(width=32, allow_nan=False),
        st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=300),
    ),
    id_=st.integers(0, 2**64 - 1),
    id2=st.integers(0, 2**64 - 1),
    payload=st.binary(max_size=64),
)
def test_property_pack_unpack_round_trip(flag, label, id_, id2, payload):
    header, out = unpack(pack(IRHeader(flag, label, id_, id2), payload))
    assert out == payload and header.id == id_ and header.id2 == id2
    if isinstance(label, list):
        assert header.flag == len(label)
        np.testing.assert_array_equal(header.label, np.asarray(label, dtype=np.float32))
    else:
        assert header.flag == 0 and header.label == label


@PROPERTY_SETTINGS
@given(records=st.lists(payloads, max_size=12), numpy_scan_min=st.sampled_from([0, 8, 1 << 30]))
def test_property_writer_matches_spec_and_reader_inverts_it(records, numpy_scan_min):
    # Both magic-word scanners (numpy for long records, bytes.find for short) are exercised.
    saved = recordio._NUMPY_SCAN_MIN
    recordio._NUMPY_SCAN_MIN = numpy_scan_min
    try:
        with tempfile.TemporaryDirectory() as d:
            _check_writer_against_spec(d, records)
    finally:
        recordio._NUMPY_SCAN_MIN = saved


@PROPERTY_SETTINGS
@given(
    parts=st.lists(st.tuples(payloads, payloads), max_size=8), numpy_scan_min=st.sampled_from([0, 1 << 30])
)
def test_property_a_record_written_in_two_parts_is_the_record_written_whole(parts, numpy_scan_min):
    # data2rec writes header+label and the image without joining them; magic words may sit in either.
    records = [(head + b"\0" * (-len(head) % 4), payload) for head, payload in parts]
    saved = recordio._NUMPY_SCAN_MIN
    recordio._NUMPY_SCAN_MIN = numpy_scan_min
    try:
        with tempfile.TemporaryDirectory() as d:
            expected = [reference_encode(h + p) for h, p in records]
            with MXIndexedRecordIO(os.path.join(d, "p.idx"), os.path.join(d, "p.rec"), "w") as w:
                for (head, payload), end in zip(records, np.cumsum([len(e) for e in expected])):
                    w.write_parts(head, payload)
                    assert w.tell() == end  # where the index puts the next record
            with open(os.path.join(d, "p.rec"), "rb") as f:
                assert f.read() == b"".join(expected)
    finally:
        recordio._NUMPY_SCAN_MIN = saved


@pytest.mark.parametrize("gather_parts", [2, 512])
def test_large_two_part_records_are_gathered_and_land_in_order_among_whole_ones(
    tmp_path, monkeypatch, gather_parts
):
    # Payloads of 16 KB and more are held and written together by one writev (at most
    # _GATHER_PARTS parts at once); records written whole, or small, go through the file's buffer
    # in between. The file must be the one written record by record.
    monkeypatch.setattr(recordio, "_GATHER_PARTS", gather_parts)
    rng = np.random.default_rng(5)
    calls = []
    for i in range(40):
        size = int(rng.choice([100, 20_000, 70_001]))
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if i == 7:  # a magic word at an aligned place: written whole, split where it is
            payload = payload[:4000] + MAGIC + payload[4004:]
        head = rng.integers(0, 256, 4 * int(rng.integers(6, 60)), dtype=np.uint8).tobytes()
        calls.append(("whole" if i % 5 == 4 else "parts", head, memoryview(payload)))
    expected = [reference_encode(head + bytes(payload)) for _, head, payload in calls]
    idx, rec = tmp_path / "g.idx", tmp_path / "g.rec"
    with MXIndexedRecordIO(idx, rec, "w") as w:
        for (how, head, payload), end in zip(calls, np.cumsum([len(e) for e in expected])):
            if how == "whole":
                w.write(head + bytes(payload))
            else:
                w.write_parts(head, payload)
            assert w.tell() == end
    assert rec.read_bytes() == b"".join(expected)


def test_what_is_left_of_parts_after_a_short_write():
    assert recordio._rest([b"abc", b"defg", b"h"], 0) == [b"abc", b"defg", b"h"]
    assert [bytes(p) for p in recordio._rest([b"abc", b"defg", b"h"], 5)] == [b"fg", b"h"]
    assert [bytes(p) for p in recordio._rest([b"abc", b"defg", b"h"], 7)] == [b"h"]
    assert recordio._rest([b"abc"], 3) == []


def test_a_two_part_record_needs_an_aligned_head(tmp_path):
    with MXRecordIO(tmp_path / "p.rec", "w") as w, pytest.raises(ValueError, match="multiple of 4"):
        w.write_parts(b"abc", b"payload")


def _check_writer_against_spec(d, records):
    """Write `records`, compare the bytes with the spec-literal encoder, read them back."""
    idx, rec = os.path.join(d, "p.idx"), os.path.join(d, "p.rec")
    write_records(idx, rec, records)
    with open(rec, "rb") as f:
        assert f.read() == b"".join(reference_encode(r) for r in records)
    with MXRecordIO(rec, "r") as r:
        assert [r.read() for _ in records] == records
        assert r.read() is None
    reader = MXIndexedRecordIO(idx, rec, "r")
    for key in reversed(reader.keys):
        assert reader.read_idx(key) == records[key]
    reader.close()


# ---------------------------------------------------------------- MXNet 1.9.1 as the oracle


def _expected(spec):
    flag, label, id_, id2 = spec["header"]
    flag = len(label) if isinstance(label, list) else 0
    return {"header": [flag, label, id_, id2], "payload": spec["payload"]}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """Write with ours and with MXNet from the same calls; let MXNet read ours (one MXNet run)."""
    python = mxnet_python()
    d = tmp_path_factory.mktemp("oracle")
    specs = record_specs(EDGE_PAYLOADS + random_payloads(seed=1, count=45), seed=2)
    dump_specs(d / "specs.json", specs)
    with MXIndexedRecordIO(d / "our.idx", d / "our.rec", "w") as w:
        for s in specs:
            w.write_idx(s["key"], pack(s["header"], bytes.fromhex(s["payload"])))
    img = np.random.default_rng(4).integers(0, 256, (19, 29, 3), dtype=np.uint8)
    np.save(d / "img.npy", img)
    (d / "our_img.rec").write_bytes(recordio.pack_img((0, 1.0, 10, 0), img, quality=3, img_fmt=".png"))
    result = json.loads(run_oracle(python, ORACLE_CODE, str(d / "specs.json"), str(d)).stdout)
    return d, specs, img, result


def test_mxnet_writes_byte_identical_files(oracle):
    d, specs, _, _ = oracle
    assert (d / "our.rec").read_bytes() == (d / "mx.rec").read_bytes()
    assert (d / "our.idx").read_bytes() == (d / "mx.idx").read_bytes()
    # The comparison covers split records: some records have several parts.
    cflags = [cflag for cflag, _ in parts_of(d / "mx.rec")]
    assert cflags.count(1) >= 5 and 2 in cflags


def test_mxnet_reads_our_files(oracle):
    _, specs, _, result = oracle
    assert result["keys"] == [s["key"] for s in specs]
    assert result["by_key"] == {str(s["key"]): _expected(s) for s in specs}
    assert result["sequential"] == [_expected(s) for s in specs]


def test_we_read_mxnet_files(oracle):
    d, specs, _, _ = oracle
    with MXIndexedRecordIO(d / "mx.idx", d / "mx.rec", "r") as r:
        assert r.keys == [s["key"] for s in specs]
        for s in reversed(specs):
            header, payload = unpack(r.read_idx(s["key"]))
            label = header.label.tolist() if header.flag else float(header.label)
            got = {"header": [header.flag, label, header.id, header.id2], "payload": payload.hex()}
            assert got == _expected(s)


def test_images_cross_between_mxnet_and_us(oracle):
    d, _, img, result = oracle
    assert result["our_img_ok"]  # MXNet's unpack_img decoded our pack_img exactly
    header, out = recordio.unpack_img((d / "mx_img.rec").read_bytes())
    assert header == IRHeader(0, 2.0, 11, 0)
    np.testing.assert_array_equal(out, img)


# ---------------------------------------------------------------- DALI's reader


def test_dali_reads_our_shards_through_one_combined_index(tmp_path):
    from nvidia.dali import fn, pipeline_def

    specs = record_specs(EDGE_PAYLOADS + random_payloads(seed=5, count=15), seed=6)
    shards = [specs[::2], specs[1::2]]
    combined, base = [], 0
    for n, shard in enumerate(shards):
        rec, idx = tmp_path / f"s{n}.rec", tmp_path / f"s{n}.idx"
        with MXIndexedRecordIO(idx, rec, "w") as w:
            for s in shard:
                w.write_idx(s["key"], pack(s["header"], bytes.fromhex(s["payload"])))
        combined += [(key, base + off) for key, off in read_index(idx)]
        base += os.path.getsize(rec)
    write_index(tmp_path / "all.idx", combined)
    ordered = shards[0] + shards[1]

    @pipeline_def(batch_size=len(ordered), num_threads=1, device_id=None)
    def reader():
        data, label = fn.readers.mxnet(
            path=[str(tmp_path / "s0.rec"), str(tmp_path / "s1.rec")],
            index_path=[str(tmp_path / "all.idx")],
            random_shuffle=False,
        )
        return data, label

    pipe = reader()
    pipe.build()
    data, labels = pipe.run()
    for i, s in enumerate(ordered):
        assert np.array(data[i]).tobytes() == bytes.fromhex(s["payload"])
        label = s["header"][1]
        np.testing.assert_array_equal(np.array(labels[i]), np.atleast_1d(np.asarray(label, dtype=np.float32)))
