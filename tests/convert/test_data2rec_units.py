"""data2rec building blocks: image gate, caption tokens, and each input reader on its own."""

import io
import json
import os
import tarfile
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from src.caption_record import InvalidCaptions, check_captions
from src.convert.captions import CaptionRejected, check_tokens, tokenize_captions
from src.convert.images import VALIDATE_LEVELS, ImageOptions, ImageRejected, Validate, prepare_image, sniff
from src.convert.sources import InputError, SourceOptions, detect_kind, make_source
from src.convert.sources.base import UnreadableUnit
from src.convert.sources.folder import caption_candidates
from src.open_alip import tokenize_np
from tests._data2rec_helpers import (
    bad_images,
    jpeg,
    odd_images,
    png16,
    png_alpha,
    read_records,
    tokens_for,
    write_hub_parquet,
    write_tar,
)


def _open(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


# ---------------------------------------------------------------- images


def test_validate_levels_are_one_enum_that_says_what_each_does(capsys):
    from data2rec import build_parser

    assert [str(v) for v in Validate] == list(VALIDATE_LEVELS) == ["off", "structure", "decode", "full"]
    assert Validate.parse("quick") is Validate.DECODE
    assert ImageOptions(validate="quick").validate is Validate.DECODE
    assert ImageOptions().validate is Validate.STRUCTURE and f"{Validate.FULL}" == "full" == Validate.FULL
    does = {v: (v.walks_structure, v.decodes, v.decodes_full_size, v.decodes_in_dali) for v in Validate}
    assert does == {
        Validate.OFF: (False, False, False, False),
        Validate.STRUCTURE: (True, False, False, False),
        Validate.DECODE: (True, True, False, False),
        Validate.FULL: (True, True, True, True),
    }
    assert build_parser().parse_args(["--validate", "quick", "x"]).validate is Validate.DECODE
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--validate", "fast", "x"])
    err = capsys.readouterr().err
    assert "--validate: 'fast' is not a level; use one of off, structure, decode, full" in err


@pytest.mark.parametrize("level", VALIDATE_LEVELS)
def test_every_odd_image_becomes_a_plain_jpeg(level):
    passthrough = {"rgb.jpg", "gray.jpg", "progressive.jpg"}
    for name, data in odd_images().items():
        out, converted = prepare_image(data, ImageOptions(validate=level))
        assert sniff(out) == "JPEG", name
        assert converted == (name not in passthrough), name
        if name in passthrough:
            assert out == data, name  # byte-for-byte: no decode-encode loss
        img = _open(out)
        assert img.mode in ("RGB", "L"), name
        assert img.size == _open(data).size, name


def test_alpha_is_composited_on_white_and_cmyk_colours_survive():
    img = np.asarray(_open(prepare_image(png_alpha(24, 20), ImageOptions())[0]).convert("RGB")).astype(int)
    assert abs(img[10, 3] - [200, 0, 0]).max() < 30  # opaque red stays red
    assert img[10, 20].min() > 225  # transparent becomes white, not black
    src = _open(jpeg(40, 30, 3))
    cmyk = np.asarray(_open(prepare_image(jpeg(40, 30, 3, mode="CMYK"), ImageOptions())[0])).astype(int)
    assert np.abs(cmyk - np.asarray(src).astype(int)).mean() < 20


def test_16_bit_png_is_scaled_not_clipped():
    out = np.asarray(_open(prepare_image(png16(16, 12), ImageOptions())[0]).convert("L")).astype(int)
    assert out.max() > 200 and out.min() < 20 and len(np.unique(out)) > 20


@pytest.mark.parametrize("level", VALIDATE_LEVELS)
@pytest.mark.parametrize("name", sorted(bad_images()))
def test_unusable_images_are_rejected_with_their_reason(name, level):
    data, reason = bad_images()[name]
    with pytest.raises(ImageRejected) as info:
        prepare_image(data, ImageOptions(validate=level))
    assert info.value.reason == reason


def test_corrupt_scan_data_is_caught_by_decoding_levels():
    data = bytearray(jpeg(64, 48, 9))
    sos = data.find(b"\xff\xda")
    data[sos + 2 : sos + 4] = b"\x00\x01"  # impossible scan-header length
    with pytest.raises(ImageRejected):
        prepare_image(bytes(data), ImageOptions(validate="quick"))
    out, _ = prepare_image(bytes(data), ImageOptions(validate="off"))  # off trusts the bytes
    assert out == bytes(data)


def bogus_marker_jpeg() -> bytes:
    """A JPEG with a marker that means nothing (FF 99) in the middle of its entropy-coded scan."""
    data = jpeg(64, 48, 9)
    sos = data.find(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    mid = scan + (len(data) - scan) // 2
    return data[:mid] + b"\xff\x99" + data[mid:]


def test_a_bogus_marker_in_the_scan_is_refused_by_a_decode_and_stored_by_the_structure_check():
    import cv2

    data = bogus_marker_jpeg()
    # OpenCV (libjpeg-turbo, as DALI's CPU decoder) only warns and returns an image; PIL refuses it.
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) is not None
    with pytest.raises(OSError):
        _open(data)
    for level in ("decode", "quick", "full"):
        with pytest.raises(ImageRejected) as info:
            prepare_image(data, ImageOptions(validate=level))
        assert info.value.reason == "undecodable_image" and "does not decode in PIL" in info.value.detail
    # The structure walk does not read a sequential JPEG's final scan: stored, and the PyTorch
    # loader skips and counts it (tests/dataloaders/test_loader.py, the "bogus_marker" record).
    for level in ("structure", "off"):
        assert prepare_image(data, ImageOptions(validate=level)) == (data, False)


def test_full_validation_runs_dalis_own_decoder():
    from src.convert.dali_check import DaliDecodeCheck, dali_available
    from src.convert.items import Item
    from src.convert.worker import WorkerConfig, init_worker, process_chunk

    if not dali_available():
        pytest.skip("DALI is not installed")
    # PIL is stricter than DALI on every real fault we know, so the decoder is shown one PIL never
    # sees: bytes that are no JPEG, among good ones, in a batch and one by one.
    good = [jpeg(16, 16, i) for i in range(3)]
    check = DaliDecodeCheck(batch_size=2)
    assert check.failures(good) == {}
    bad = check.failures([good[0], good[1], b"\xff\xd8\xff\xe0 no image here \xff\xd9", good[2]])
    assert list(bad) == [2] and bad[2]
    init_worker(WorkerConfig(ImageOptions(validate="full")))
    results = process_chunk(
        [Item(i, f"row {i}", image=g, tokens=tokens_for(1, i)) for i, g in enumerate(good)]
    )
    assert [r.reason for r in results] == [None, None, None]
    init_worker(WorkerConfig())


def test_resize_short_only_shrinks_and_quality_reencodes():
    data = jpeg(64, 48, 1)
    out, converted = prepare_image(data, ImageOptions(resize_short=24))
    assert converted and _open(out).size == (32, 24)
    assert prepare_image(data, ImageOptions(resize_short=100)) == (data, False)
    tall, _ = prepare_image(jpeg(30, 90, 2), ImageOptions(resize_short=10))
    assert _open(tall).size == (10, 30)
    gray, _ = prepare_image(jpeg(400, 300, 3, mode="L"), ImageOptions(resize_short=30))
    assert _open(gray).size == (40, 30) and _open(gray).mode == "RGB"
    cmyk, _ = prepare_image(jpeg(400, 300, 3, mode="CMYK"), ImageOptions(resize_short=30))
    assert _open(cmyk).size == (40, 30) and _open(cmyk).mode == "RGB"
    low, converted = prepare_image(data, ImageOptions(quality=20))
    assert converted and len(low) < len(data) and _open(low).size == (64, 48)


def test_max_pixels_limit_is_configurable():
    data = jpeg(64, 48, 1)
    with pytest.raises(ImageRejected) as info:
        prepare_image(data, ImageOptions(max_pixels=1000))
    assert info.value.reason == "image_too_large"
    assert prepare_image(data, ImageOptions(max_pixels=0)) == (data, False)


def test_jpeg_frame_header_is_read_without_decoding():
    from src.jpeg import jpeg_info

    assert jpeg_info(jpeg(40, 30, 1)) == (40, 30, 3, 8, 0xC0)
    assert jpeg_info(jpeg(64, 48, 4, progressive=True)) == (64, 48, 3, 8, 0xC2)
    assert jpeg_info(jpeg(40, 30, 2, mode="L"))[2] == 1
    assert jpeg_info(jpeg(40, 30, 3, mode="CMYK"))[2] == 4
    assert jpeg_info(b"\xff\xd8\xff\xe0\x00\x10JFIF") is None  # cut before the frame header


# ---------------------------------------------------------------- captions


def test_captions_are_clip_tokens_and_only_empty_rows_are_rejected():
    caps = ["a photo of Zürich at night 東京 🐱", "second caption"]
    tokens = tokenize_captions(caps)
    assert tokens.dtype == np.float32 and tokens.shape == (154,)
    np.testing.assert_array_equal(tokens.reshape(2, 77), tokenize_np(caps).astype(np.float32))
    # An empty caption, or one that cleans to nothing, costs that caption, not the row.
    kept = tokenize_captions(["", "ok", "  ", "\x00\x01\x02"])
    np.testing.assert_array_equal(kept, tokenize_np(["ok"]).astype(np.float32).reshape(-1))
    for bad, reason in [
        ([], "empty_caption"),
        (["", "  "], "empty_caption"),
        (["\x00\x01\x02"], "caption_tokenizes_to_nothing"),
    ]:
        with pytest.raises(CaptionRejected) as info:
            tokenize_captions(bad)
        assert info.value.reason == reason


def test_dataset_tokens_pass_the_loaders_rule_or_are_rejected_with_its_reason():
    good = tokens_for(3, 0)
    np.testing.assert_array_equal(check_tokens(good), good)
    with_empty_block = np.concatenate([good, np.zeros(77, np.float32)])  # kept as it came
    np.testing.assert_array_equal(check_tokens(with_empty_block), with_empty_block)
    no_start = good.copy()
    no_start[77] = 0  # the second caption lost its start token
    # tests/test_caption_record.py holds the rule's cases; here: the converter applies it, reason and all.
    for bad in (
        good[:100],
        np.zeros(0),
        good + 0.5,
        np.full(77, 60000.0),
        np.full(77, np.nan),
        np.zeros(154),
        no_start,
    ):
        with pytest.raises(CaptionRejected) as info:
            check_tokens(bad)
        with pytest.raises(InvalidCaptions) as rule:
            check_captions(bad)
        assert (info.value.reason, info.value.detail) == ("bad_tokens", str(rule.value))


# ---------------------------------------------------------------- sources


def _items(source, start=0):
    return [item for unit in source.units() for item in source.items(unit, start)]


def test_kind_is_detected_from_the_paths(tmp_path):
    (tmp_path / "pq").mkdir()
    write_hub_parquet(tmp_path / "pq" / "train-00000.parquet", [(jpeg(), tokens_for(1, 0))])
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(jpeg())
    (tmp_path / "m.tsv").write_text("image\tcaption\n")
    write_tar(tmp_path / "s.tar", [])
    assert detect_kind([tmp_path / "pq"]) == "parquet"
    assert detect_kind([tmp_path / "imgs"]) == "folder"
    assert detect_kind([tmp_path / "m.tsv"]) == "manifest"
    assert detect_kind([tmp_path / "s.tar"]) == "webdataset"
    with pytest.raises(InputError, match="different kinds"):
        detect_kind([tmp_path / "m.tsv", tmp_path / "s.tar"])
    with pytest.raises(InputError, match="no such file"):
        make_source([tmp_path / "missing"])


def test_parquet_streams_from_any_position_across_row_groups(tmp_path):
    rows = [(jpeg(8, 8, i), tokens_for(2, i)) for i in range(11)]
    write_hub_parquet(tmp_path / "a.parquet", rows, row_group_size=3)
    source = make_source([tmp_path / "a.parquet"])
    unit = source.units()[0]
    assert source.count(unit) == 11
    items = list(source.items(unit, start=4))
    assert [i.pos for i in items] == list(range(4, 11))
    for item in items:
        assert item.image == rows[item.pos][0] and item.row == item.pos
        np.testing.assert_array_equal(item.tokens, rows[item.pos][1])


def test_parquet_plain_binary_and_string_caption_columns(tmp_path):
    write_hub_parquet(tmp_path / "b.parquet", [(jpeg(), tokens_for(1, 1))], struct_images=False)
    (item,) = _items(make_source([tmp_path / "b.parquet"]))
    assert item.image == jpeg() and item.tokens.shape == (77,)
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"jpg": [jpeg()], "caption": ["a red square"]}), tmp_path / "c.parquet")
    (item,) = _items(make_source([tmp_path / "c.parquet"]))
    assert item.captions == ["a red square"] and item.tokens is None


def test_parquet_iteration_memory_stays_flat(tmp_path):
    rng = np.random.default_rng(0)
    blob = [b"\xff\xd8\xff" + rng.bytes(100_000) for _ in range(160)]  # ~16 MB of "images"
    write_hub_parquet(tmp_path / "big.parquet", [(b, tokens_for(1, 0)) for b in blob], row_group_size=8)
    source = make_source([tmp_path / "big.parquet"])
    unit = source.units()[0]
    tracemalloc.start()
    arrow_peak, n = 0, 0
    for item in source.items(unit):
        n += len(item.image)
        arrow_peak = max(arrow_peak, pa.total_allocated_bytes())
    _, python_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == sum(map(len, blob))
    assert python_peak + arrow_peak < os.path.getsize(tmp_path / "big.parquet") / 3


def test_a_conversion_holds_few_batches_of_the_parquet_it_writes_from(tmp_path, monkeypatch):
    # Images pass from parquet to the shards as views of Arrow's buffers: each pins its batch until
    # it is written (and a shard's last megabyte until the shard is closed). The whole run must hold
    # a few batches, not the file.
    from src.convert import ConvertOptions, convert
    from src.convert import writer as writer_module

    rng = np.random.default_rng(1)
    photos = []
    for _ in range(400):  # noise compresses badly: ~38 KB each, ~15 MB in all
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (160, 200, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        photos.append(buf.getvalue())
    big = tmp_path / "big.parquet"
    write_hub_parquet(big, [(p, tokens_for(1, i)) for i, p in enumerate(photos)], row_group_size=8)
    held = []
    real_write = writer_module.ShardWriter.write

    def write(self, *args, **kwargs):
        held.append(pa.total_allocated_bytes())
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(writer_module.ShardWriter, "write", write)
    before = pa.total_allocated_bytes()  # what earlier tests in this process may still hold
    convert([big], tmp_path / "out", ConvertOptions(workers=1, shard_size=30, chunk=4, progress=False))
    assert len(held) == 400 and max(held) - before < big.stat().st_size / 4
    stored = [payload for _, _, _, payload in read_records(sorted(tmp_path.glob("out-*.rec")))]
    assert stored == photos


def test_parquet_broken_rows_and_files_become_bad_items(tmp_path):
    rows = [(jpeg(), tokens_for(1, 0)), (None, tokens_for(1, 1)), (jpeg(), None)]
    write_hub_parquet(tmp_path / "a.parquet", rows)
    (tmp_path / "b.parquet").write_bytes(b"PAR1 not really parquet")
    source = make_source([tmp_path / "a.parquet", tmp_path / "b.parquet"], "parquet")
    a, b = source.units()
    assert [i.error for i in source.items(a)] == [None, "broken_row", "broken_row"]
    # A file that cannot be opened holds an unknown number of rows: no count, so not one bad row.
    with pytest.raises(UnreadableUnit, match="cannot open parquet"):
        source.count(b)


def test_folder_finds_captions_beside_or_in_a_parallel_tree(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "captions").mkdir()
    (tmp_path / "img" / "000000001.jpg").write_bytes(jpeg())
    (tmp_path / "captions" / "000000001.txt").write_text("seed layout")
    (tmp_path / "a.png").write_bytes(png_alpha())
    (tmp_path / "a.txt").write_text("same folder")
    source = make_source([tmp_path])
    items = _items(source)
    assert [os.path.basename(i.image_path) for i in items] == ["a.png", "000000001.jpg"]
    cands = items[1].extra["caption_files"]
    assert str(tmp_path / "captions" / "000000001.txt") in cands
    # Pointing at img/ itself still finds the sibling captions/ folder.
    assert str(tmp_path / "captions" / "x.txt") in caption_candidates(tmp_path / "img", "x.jpg", None)


def test_folder_units_slice_the_listing(tmp_path):
    for i in range(7):
        (tmp_path / f"{i}.jpg").write_bytes(b"")
    source = make_source([tmp_path], options=SourceOptions(folder_chunk=3))
    units = source.units()
    assert [source.count(u) for u in units] == [3, 3, 1]
    assert [i.row for i in source.items(units[1], 1)] == [4, 5]


def test_manifests_csv_tsv_jsonl(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "m.csv").write_text(
        'filepath,caption,alt\nsub/a.jpg,"a cat, sitting",alt one\n'
        "../escape.jpg,x,y\nhttp://x/y.jpg,x,y\n/abs/b.jpg,b,c\nonly_one_field\n"
    )
    opts = SourceOptions(image_column="filepath", caption_columns=("caption", "alt"))
    items = _items(make_source([tmp_path / "m.csv"], options=opts))
    assert items[0].captions == ["a cat, sitting", "alt one"]
    assert items[0].image_path == str(tmp_path / "sub" / "a.jpg")
    assert [i.error for i in items] == [None, "unsafe_path", "missing_image", None, "broken_row"]
    assert items[3].image_path == "/abs/b.jpg"
    (tmp_path / "m.tsv").write_text("image\ttext\nsub/a.jpg\tcat\n")
    (item,) = _items(make_source([tmp_path / "m.tsv"]))
    assert item.captions == ["cat"]
    # A Hugging Face image folder's metadata.csv names its images file_name.
    (tmp_path / "metadata.csv").write_text("file_name,text\nsub/a.jpg,a cat\n")
    (item,) = _items(make_source([tmp_path / "metadata.csv"]))
    assert (item.image_path, item.captions) == (str(tmp_path / "sub" / "a.jpg"), ["a cat"])
    lines = [json.dumps({"image": "sub/a.jpg", "captions": ["one", "two"]}), "{broken", ""]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    source = make_source([tmp_path / "m.jsonl"])
    assert source.count(source.units()[0]) == 2
    items = _items(source)
    assert items[0].captions == ["one", "two"] and items[1].error == "broken_row"
    with pytest.raises(InputError, match="--image-column"):
        _items(make_source([tmp_path / "m.tsv"], options=SourceOptions(image_column="nope")))


def test_webdataset_groups_members_by_key(tmp_path):
    write_tar(
        tmp_path / "00000.tar",
        [
            ("000.jpg", jpeg()),
            ("000.txt", b"first"),
            ("000.json", b"{}"),
            ("001.jpg", jpeg(seed=1)),
            ("001.json", json.dumps({"caption": "from json"}).encode()),
            ("002.txt", b"no image"),
            ("003.png", png_alpha()),
        ],
    )
    source = make_source([tmp_path / "00000.tar"])
    assert source.count(source.units()[0]) == 4
    items = _items(source)
    assert [i.captions for i in items[:2]] == [["first"], ["from json"]]
    assert [i.error for i in items] == [None, None, "missing_image", "missing_caption"]
    assert [i.pos for i in source.items(source.units()[0], 2)] == [2, 3]
    data = (tmp_path / "00000.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: 512 * 3 + 100])  # ends inside a member
    items = _items(make_source([tmp_path / "cut.tar"]))
    assert items[-1].error == "broken_input"


def test_an_unexpected_exception_skips_only_that_item():
    from src.convert.items import Item
    from src.convert.worker import WorkerConfig, init_worker, process_chunk

    init_worker(WorkerConfig())
    good = Item(0, "good", image=jpeg(), tokens=tokens_for(1, 0))
    odd = Item(1, "odd", image=jpeg(), captions=[123])  # a source bug: not a str
    results = process_chunk([good, odd])
    assert results[0].reason is None and results[0].captions == 1
    assert results[1].reason == "processing_error" and "AttributeError" in results[1].detail


def test_a_tar_is_read_to_its_last_complete_member(tmp_path):
    members = []
    for k in range(5):
        members += [(f"{k:03d}.jpg", jpeg(8, 8, k)), (f"{k:03d}.txt", f"sample {k}".encode())]
    write_tar(tmp_path / "whole.tar", members)
    data = (tmp_path / "whole.tar").read_bytes()
    with tarfile.open(tmp_path / "whole.tar") as tar:
        last = tar.getmembers()[-1]
        end = last.offset_data + -(-last.size // 512) * 512  # the last member's padded end
        cut_header = last.offset + 100  # inside the header of 004.txt
    # A writer stopped before the end-of-archive blocks: every sample is there, nothing is broken.
    (tmp_path / "noeof.tar").write_bytes(data[:end])
    items = _items(make_source([tmp_path / "noeof.tar"]))
    assert [i.captions for i in items] == [[f"sample {k}"] for k in range(5)]
    assert [i.error for i in items] == [None] * 5
    # Cut inside the header of sample 4's caption: samples 0-3 whole, 4 without caption, then the cut.
    (tmp_path / "cut.tar").write_bytes(data[:cut_header])
    source = make_source([tmp_path / "cut.tar"])
    items = _items(source)
    assert [i.error for i in items] == [None] * 4 + ["missing_caption", "broken_input"]
    assert source.count(source.units()[0]) == len(items)


def test_inputs_given_twice_or_nested_are_refused(tmp_path):
    (tmp_path / "d").mkdir()
    write_hub_parquet(tmp_path / "d" / "a.parquet", [(jpeg(), tokens_for(1, 0))])
    with pytest.raises(InputError, match="given twice"):
        make_source([tmp_path / "d" / "a.parquet", tmp_path / "d" / ".." / "d" / "a.parquet"])
    with pytest.raises(InputError, match="is inside"):
        make_source([tmp_path / "d", tmp_path / "d" / "a.parquet"])
    with pytest.raises(InputError, match="is inside"):
        make_source([tmp_path / "d" / "a.parquet", tmp_path / "d"])


def test_a_runs_own_output_files_are_never_inputs(tmp_path):
    from src.convert import is_output_file

    lines = [json.dumps({"image": "a.jpg", "caption": "x"})]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    for name in ("out.report.json", "out.state.json", "out-m001.state.json"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "other.json").write_text(lines[0] + "\n")  # a manifest, whatever its name
    assert is_output_file(tmp_path / "out.report.json", out) and is_output_file(
        tmp_path / "out-00003.rec", out
    )
    assert not is_output_file(tmp_path / "other.json", out) and not is_output_file(
        tmp_path / "outer.json", out
    )
    source = make_source([tmp_path], "manifest", exclude=lambda p: is_output_file(p, out))
    assert [os.path.basename(u.path) for u in source.units()] == ["m.jsonl", "other.json"]
    with pytest.raises(InputError, match="output file of this run"):
        make_source([tmp_path / "out.report.json"], "manifest", exclude=lambda p: is_output_file(p, out))


def test_manifest_saved_by_excel_with_a_byte_order_mark(tmp_path):
    text = "image,caption,alt\r\na.jpg,first,\r\nb.jpg,,\r\n"
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    opts = SourceOptions(caption_columns=("caption", "alt"))
    items = _items(make_source([tmp_path / "excel.csv"], options=opts))
    assert [i.image_path for i in items] == [str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")]
    assert items[0].captions == ["first", ""]  # the worker keeps the non-empty ones
    lines = [
        json.dumps({"image": "a.jpg", "caption": None, "alt": "second only"}),
        json.dumps({"image": "a.jpg"}),
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    items = _items(make_source([tmp_path / "m.jsonl"], options=opts))
    assert items[0].captions == ["second only"] and items[1].error == "missing_caption"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_shard_aborted_on_a_full_disk_leaves_no_file_and_no_noise(tmp_path):
    import errno
    import gc
    import sys

    from src.convert.writer import ShardWriter

    rec, idx = tmp_path / "s.rec", tmp_path / "s.idx"
    for tmp in (tmp_path / "s.rec.tmp", tmp_path / "s.idx.tmp"):
        tmp.symlink_to("/dev/full")  # a real device whose writes fail with ENOSPC, as on a full disk
    writer = ShardWriter(rec, idx)
    unraisable = []
    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append  # "Exception ignored in ..."
    try:
        with pytest.raises(OSError) as info:
            for i in range(4000):
                writer.write(i, bytes(24), bytes(1000))
        assert info.value.errno == errno.ENOSPC
        writer.abort()  # must neither raise again nor keep a half-closed file for exit time
        del writer
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert not unraisable, unraisable
    assert not list(tmp_path.iterdir())


def test_a_chunks_tokens_checked_at_once_give_what_each_row_checked_alone_gives():
    from src.convert.captions import check_tokens
    from src.convert.items import Item
    from src.convert.worker import WorkerConfig, init_worker, process_chunk

    init_worker(WorkerConfig(ImageOptions(validate="off")))
    image = jpeg(16, 16, 1)
    good = [tokens_for(k, seed) for seed, k in enumerate([1, 3, 2, 1])]
    empty_row = np.zeros(2 * 77, np.float32)  # blocks of zeros only: no caption
    nan_row = tokens_for(1, 9)
    nan_row[5] = np.nan
    for rows, reasons in [
        (good, [None] * 4),
        ([*good[:2], nan_row, *good[2:]], [None, None, "bad_tokens", None, None]),
        ([*good[:2], empty_row, *good[2:]], [None, None, "bad_tokens", None, None]),
        ([*good[:1], tokens_for(1, 5)[:70], *good[1:]], [None, "bad_tokens", None, None, None]),
    ]:
        items = [Item(i, f"row {i}", image=image, tokens=t) for i, t in enumerate(rows)]
        results = process_chunk(items)
        assert [r.reason for r in results] == reasons
        for t, r in zip(rows, results):
            if r.reason is None:
                assert np.array_equal(r.tokens, check_tokens(t)) and r.tokens.dtype == np.float32
            else:
                with pytest.raises(CaptionRejected) as exc:
                    check_tokens(t)
                assert r.detail == exc.value.detail  # the row's own problem, named as a lone check names it
    init_worker(WorkerConfig())


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_a_shard_handed_to_the_disk_while_written_is_the_same_shard(tmp_path, monkeypatch):
    # ShardWriter starts the disk's write-out every WRITEBACK_BYTES (posix_fadvise, on a thread): the files
    # are those written without it, byte for byte. The advice itself is the kernel's real call,
    # watched on its way.
    from src.convert import writer as writer_module

    advised = []
    real_advise = os.posix_fadvise

    def advise(fd, offset, length, advice):
        advised.append((offset, length))
        return real_advise(fd, offset, length, advice)

    rng = np.random.default_rng(0)
    records = [
        (i, bytes(24), rng.integers(0, 256, int(rng.integers(100, 9000)), dtype=np.uint8).tobytes())
        for i in range(300)
    ]
    shards = {}
    for every in (0, 64 << 10):
        monkeypatch.setattr(writer_module, "WRITEBACK_BYTES", every)
        monkeypatch.setattr(writer_module.os, "posix_fadvise", advise)
        rec, idx = tmp_path / f"s{every}.rec", tmp_path / f"s{every}.idx"
        writer = writer_module.ShardWriter(rec, idx)
        for key, head, payload in records:
            writer.write(key, head, payload)
        writer.commit()
        shards[every] = (rec.read_bytes(), idx.read_text())
    assert shards[0] == shards[64 << 10]
    # Every range once, in order, each reaching the bytes written when it was given.
    assert advised and advised[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in zip(advised, advised[1:]))
    assert all(length >= 64 << 10 for _, length in advised)
