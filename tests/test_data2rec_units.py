"""data2rec building blocks: image gate, caption tokens, and each input reader on its own."""


import io
import json
import os
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from src.convert.captions import CaptionRejected, check_tokens, tokenize_captions
from src.convert.images import VALIDATE_LEVELS, ImageOptions, ImageRejected, prepare_image, sniff
from src.convert.sources import InputError, SourceOptions, detect_kind, make_source
from src.convert.sources.folder import caption_candidates
from src.open_alip import tokenize_np
from tests._data2rec_helpers import (
    bad_images,
    jpeg,
    odd_images,
    png16,
    png_alpha,
    tokens_for,
    write_hub_parquet,
    write_tar,
)


def _open(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


# ---------------------------------------------------------------- images


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
    from src.convert.images import jpeg_info

    assert jpeg_info(jpeg(40, 30, 1)) == (40, 30, 3, 8, 0xC0)
    assert jpeg_info(jpeg(64, 48, 4, progressive=True)) == (64, 48, 3, 8, 0xC2)
    assert jpeg_info(jpeg(40, 30, 2, mode="L"))[2] == 1
    assert jpeg_info(jpeg(40, 30, 3, mode="CMYK"))[2] == 4
    assert jpeg_info(b"\xff\xd8\xff\xe0\x00\x10JFIF") is None  # cut before the frame header


def test_pack_record_matches_recordio_pack():
    from src.convert.writer import pack_record
    from src.recordio import IRHeader, pack

    tokens = tokens_for(3, 1)
    assert pack_record(tokens, 2**40 + 5, 17, b"payload") == pack(IRHeader(0, tokens, 2**40 + 5, 17), b"payload")


# ---------------------------------------------------------------- captions


def test_captions_are_clip_tokens_and_empty_ones_are_rejected():
    caps = ["a photo of Zürich at night 東京 🐱", "second caption"]
    tokens = tokenize_captions(caps)
    assert tokens.dtype == np.float32 and tokens.shape == (154,)
    np.testing.assert_array_equal(tokens.reshape(2, 77), tokenize_np(caps).astype(np.float32))
    for bad, reason in [([], "empty_caption"), (["ok", "  "], "empty_caption"), (["\x00\x01\x02"], "caption_tokenizes_to_nothing")]:
        with pytest.raises(CaptionRejected) as info:
            tokenize_captions(bad)
        assert info.value.reason == reason


def test_dataset_tokens_must_be_whole_blocks_of_ids():
    good = tokens_for(3, 0)
    np.testing.assert_array_equal(check_tokens(good), good)
    for bad in (good[:100], np.zeros(0), good + 0.5, np.full(77, 60000.0), np.full(77, np.nan)):
        with pytest.raises(CaptionRejected):
            check_tokens(bad)


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


def test_parquet_broken_rows_and_files_become_bad_items(tmp_path):
    rows = [(jpeg(), tokens_for(1, 0)), (None, tokens_for(1, 1)), (jpeg(), None)]
    write_hub_parquet(tmp_path / "a.parquet", rows)
    (tmp_path / "b.parquet").write_bytes(b"PAR1 not really parquet")
    items = _items(make_source([tmp_path / "a.parquet", tmp_path / "b.parquet"], "parquet"))
    assert [i.error for i in items] == [None, "broken_row", "broken_row", "broken_input"]


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
    lines = [json.dumps({"image": "sub/a.jpg", "captions": ["one", "two"]}), "{broken", ""]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    source = make_source([tmp_path / "m.jsonl"])
    assert source.count(source.units()[0]) == 2
    items = _items(source)
    assert items[0].captions == ["one", "two"] and items[1].error == "broken_row"
    with pytest.raises(InputError, match="--image-column"):
        _items(make_source([tmp_path / "m.tsv"], options=SourceOptions(image_column="nope")))


def test_webdataset_groups_members_by_key(tmp_path):
    write_tar(tmp_path / "00000.tar", [
        ("000.jpg", jpeg()), ("000.txt", b"first"), ("000.json", b"{}"),
        ("001.jpg", jpeg(seed=1)), ("001.json", json.dumps({"caption": "from json"}).encode()),
        ("002.txt", b"no image"),
        ("003.png", png_alpha()),
    ])
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
