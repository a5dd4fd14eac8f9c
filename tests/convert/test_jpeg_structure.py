"""data2rec's default image check, the JPEG structure walk (src/jpeg.py's jpeg_structure_fault),
against the decode it replaced as the default (PIL at 1/8 scale, still `--validate decode`).

The contract (issue 27): every truncated, marker-broken or non-JPEG payload the decode refused,
the walk refuses too. What it admits that a decode could refuse:
- entropy-coded data whose bits are wrong but whose markers are whole; in these corpora the decode
  admits those as well (libjpeg only warns on a bad Huffman code);
- a marker where none belongs inside the final scan of a sequential JPEG: data2rec's walk does not
  read that scan (reading it was most of the walk's time on a photo), the decode refuses such a
  file. Both are safe for training: a record that fails to decode is skipped and counted by both
  loaders (tests/dataloaders/test_loader.py::test_a_bad_record_is_skipped_once_and_a_resume_never_meets_it,
  whose "bogus_marker" record is one of these), and DALI's CPU decoder decodes the FF99 kind.
"""

import io

import cv2
import numpy as np
import pytest
from PIL import Image

import src.jpeg as jpeg_module
from src.convert import OutputError, convert
from src.convert.images import ImageOptions, ImageRejected, Validate, _decode_check, prepare_image
from src.jpeg import BROKEN, NO_TABLES, TRUNCATED, JpegFault, jpeg_structure_fault
from tests._data2rec_helpers import jpeg, picture
from tests.convert.test_data2rec import quiet


def _pil(arr: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", **save)
    return buf.getvalue()


def _cv2(arr: np.ndarray, *params: int) -> bytes:
    return cv2.imencode(".jpg", arr, list(params))[1].tobytes()


def sound_jpegs() -> dict[str, bytes]:
    arr = picture(96, 64, 1)
    gray = np.asarray(Image.fromarray(arr).convert("L"))
    return {
        "baseline": _pil(arr, quality=90),
        "progressive": _pil(arr, quality=90, progressive=True),
        "optimized": _pil(arr, quality=90, optimize=True),
        "4:4:4": _pil(arr, quality=75, subsampling=0),
        "4:2:2": _pil(arr, quality=75, subsampling=1),
        "gray": _pil(gray),
        "cmyk": jpeg(96, 64, 1, mode="CMYK"),
        "opencv": _cv2(arr, cv2.IMWRITE_JPEG_QUALITY, 90),
        "restart intervals": _cv2(arr, cv2.IMWRITE_JPEG_RST_INTERVAL, 2),
        "opencv progressive": _cv2(arr, cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
        "padded after EOI": _pil(arr) + bytes(100),
    }


def test_sound_jpegs_pass_and_are_stored_byte_for_byte():
    for name, data in sound_jpegs().items():
        assert jpeg_structure_fault(data) is None, name
        if name != "cmyk":  # CMYK is re-encoded whatever the level
            assert prepare_image(data, ImageOptions()) == (data, False), name


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, marker, length) of the segments up to the first scan header."""
    out, i = [], 2
    while True:
        marker, length = data[i + 1], int.from_bytes(data[i + 2 : i + 4], "big")
        out.append((i, marker, length))
        if marker == 0xDA:
            return out
        i += 2 + length


def _patched(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def damaged(data: bytes) -> dict[str, list[bytes]]:
    """Families of damage to one JPEG: cut short, a marker or segment length broken, a marker
    where none belongs inside the scan, and the scan's bits changed with its markers whole."""
    n = len(data)
    first_scan = data.find(b"\xff\xda")
    scan = first_scan + 2 + int.from_bytes(data[first_scan + 2 : first_scan + 4], "big")
    inside = [scan + (n - scan) * k // 4 for k in (1, 2, 3)]
    inside = [p + 1 if data[p - 1] == 0xFF else p for p in inside]  # not inside a 2-byte code
    marker_broken = []
    for at, marker, length in _segments(data):
        marker_broken += [
            _patched(data, at + 1, b"\x99"),  # no such marker
            _patched(data, at, b"\x00"),  # the 0xFF lost
            _patched(data, at + 2, b"\x00\x01"),  # impossible length
            _patched(data, at + 2, b"\xff\xf0"),  # runs past the end
            _patched(data, at + 2, (length + 5).to_bytes(2, "big")),
            _patched(data, at + 2, (length - 3).to_bytes(2, "big")),
        ]
        if marker in (0xC0, 0xC2, 0xDB):  # the frame header or a quantisation table left out
            marker_broken.append(data[:at] + data[at + 2 + length :])
    flipped = []
    for p in inside:
        b = bytearray(data)
        b[p] ^= 0x5A if b[p] ^ 0x5A != 0xFF else 0x33
        flipped.append(bytes(b))
    return {
        "truncated": [data[: n * k // 20] for k in range(1, 20)] + [data[:-1], data[:-2]],
        "marker_broken": marker_broken,
        "marker_in_scan": [
            data[:p] + m + data[p:]
            for p in inside
            for m in (b"\xff\x99", b"\xff\xc0", b"\xff\xd8", b"\xff\xdb")
        ],
        "scan_bits": flipped,
    }


NON_JPEG = [
    b"",
    b"hello world " * 10,
    b"<html><body>404</body></html>",
    bytes(2000),
    b"\xff\xd8\xff\xd9",
    b"\xff\xd8\xff" + bytes(500) + b"\xff\xd9",
    b"\x89PNG\r\n\x1a\n" + bytes(40),
]


def _old_default(data: bytes) -> bool:
    """True when the decode that was the default (byte checks + PIL at 1/8 scale) stores `data`."""
    try:
        _, converted = prepare_image(data, ImageOptions(validate="off"))
        if not converted:
            _decode_check(data, Validate.DECODE)
        return True
    except ImageRejected:
        return False


def _stored(data: bytes, level: str = "structure") -> bool:
    try:
        prepare_image(data, ImageOptions(validate=level))
        return True
    except ImageRejected:
        return False


@pytest.mark.parametrize("name", ["baseline", "progressive", "gray", "restart intervals"])
def test_what_the_decode_refused_the_structure_check_refuses(name):
    families = damaged(sound_jpegs()[name])
    for family in ("truncated", "marker_broken"):
        refused_before = [d for d in families[family] if not _old_default(d)]
        assert refused_before, family  # the corpus holds what the decode refused
        admitted = [i for i, d in enumerate(refused_before) if _stored(d)]
        assert admitted == [], family
    for data in families["truncated"]:
        assert jpeg_structure_fault(data).kind == TRUNCATED
    for data in NON_JPEG:
        assert not _old_default(data) and not _stored(data)


@pytest.mark.parametrize("name", ["baseline", "progressive", "gray", "restart intervals"])
def test_a_marker_inside_the_final_scan_is_admitted_only_where_the_walk_skips_that_scan(name):
    inserted = damaged(sound_jpegs()[name])["marker_in_scan"]
    refused_before = [d for d in inserted if not _old_default(d)]
    assert len(refused_before) >= len(inserted) // 2  # the decode refused most of them
    # Every scan read (the default, as the evaluation's DALI path uses it): each one is seen.
    assert all(jpeg_structure_fault(d) is not None for d in inserted)
    admitted = [d for d in refused_before if _stored(d)]
    if name == "progressive":  # its scans are all read: the next one's header lies behind each
        assert admitted == []
    else:  # one scan completes the frame: taken to run to the end-of-image marker, unread
        assert admitted == refused_before
        assert all(prepare_image(d, ImageOptions()) == (d, False) for d in admitted)
        assert not any(_stored(d, "decode") for d in admitted)  # --validate decode still refuses them


@pytest.mark.parametrize("name", ["baseline", "progressive", "gray", "restart intervals"])
def test_changed_scan_bits_with_whole_markers_are_admitted_as_the_decode_admitted_them(name):
    # What the walk cannot see: the entropy-coded bits themselves. libjpeg warns and fills, so the
    # 1/8-scale decode stored these too; a record that fails to decode in a loader is skipped there.
    for data in damaged(sound_jpegs()[name])["scan_bits"]:
        assert _stored(data) and _old_default(data)


def test_random_damage_to_progressive_headers_is_refused_like_the_decode():
    # Bytes changed anywhere after the first scan header of a progressive JPEG, where its later
    # Huffman tables and scan headers lie: progression parameters, code lengths that overflow.
    data = sound_jpegs()["progressive"]
    rng = np.random.default_rng(0)
    start = data.find(b"\xff\xda") + 10
    refused = 0
    for _ in range(300):
        b = bytearray(data)
        at = int(rng.integers(start, len(data) - 2))
        for k in range(at, min(at + int(rng.choice([1, 4, 16])), len(data) - 2)):
            if b[k] != 0xFF and b[k - 1] != 0xFF:
                b[k] = int(rng.integers(0, 255))
        if not _old_default(bytes(b)):
            refused += 1
            assert not _stored(bytes(b)), at
    assert refused > 10


def test_faults_name_what_is_wrong():
    base = sound_jpegs()["baseline"]
    sos = base.find(b"\xff\xda")
    assert jpeg_structure_fault(base[:-300]) == (
        TRUNCATED,
        f"the scan at byte {sos} is cut off (no marker after it)",
    )
    assert jpeg_structure_fault(base + b"x" * 5000).text.startswith(
        "5000 bytes follow the end-of-image marker"
    )
    fault = jpeg_structure_fault(_patched(base, base.find(b"\xff\xc0") + 1, b"\x99"))
    assert fault.kind == BROKEN and "marker FF99" in fault.text
    frame = base.find(b"\xff\xc0")
    zero_width = _patched(base, frame + 7, b"\x00\x00")
    assert jpeg_structure_fault(zero_width) == (BROKEN, f"frame header at byte {frame}: size 0x64")


def test_a_jpeg_without_huffman_tables_is_re_encoded_not_dropped():
    # Motion-JPEG frames leave out their Huffman tables: libjpeg (PIL) uses the standard ones,
    # other decoders need not. Stored re-encoded, with tables.
    base = _cv2(picture(64, 48, 2), cv2.IMWRITE_JPEG_QUALITY, 90)
    cut = base
    while (at := cut.find(b"\xff\xc4")) >= 0:
        cut = cut[:at] + cut[at + 2 + int.from_bytes(cut[at + 2 : at + 4], "big") :]
    assert jpeg_structure_fault(cut).kind == NO_TABLES
    out, converted = prepare_image(cut, ImageOptions())
    assert converted and jpeg_structure_fault(out) is None


def test_a_run_begun_under_the_old_name_or_default_resumes_or_says_which_level(tmp_path):
    assert ImageOptions().validate == "structure" and ImageOptions(validate="quick").validate == "decode"
    images = tmp_path / "in"
    images.mkdir()
    for i in range(3):
        (images / f"{i}.jpg").write_bytes(jpeg(16, 16, seed=i))
        (images / f"{i}.txt").write_text(f"photo {i}")
    convert([images], tmp_path / "o", quiet(image=ImageOptions(validate="decode")))
    state = tmp_path / "o.state.json"
    state.write_text(state.read_text().replace('"validate": "decode"', '"validate": "quick"'))  # as before
    assert '"quick"' in state.read_text()
    again = convert([images], tmp_path / "o", quiet(image=ImageOptions(validate="quick")))
    assert again["resumed"] == "already complete"
    # The default changed from the decode to the structure walk: the same command names the level.
    with pytest.raises(OutputError, match=r"same arguments \(it was started with --validate decode\)"):
        convert([images], tmp_path / "o", quiet())


def _walked_in_full(monkeypatch, data: bytes) -> JpegFault | None:
    """The walk with data2rec's settings, without its cache of headers seen before."""
    with monkeypatch.context() as m:
        m.setattr(jpeg_module, "_known_final_scan", lambda data: None)
        return jpeg_structure_fault(data, 4096, read_final_scan=False)


def _with_segment(data: bytes, marker: int, content: bytes) -> bytes:
    """`data` with a marker segment inserted right after its start-of-image marker."""
    return data[:2] + bytes([0xFF, marker]) + (len(content) + 2).to_bytes(2, "big") + content + data[2:]


def test_the_header_cache_answers_as_the_walk_does(monkeypatch):
    # data2rec walks each distinct header once (src/jpeg.py's _header_final_scan): an image whose
    # header was seen before is checked at its tail only. Every sound and damaged JPEG gets the
    # answer of a full walk, also when a sound image with the same header came first, when bytes
    # that look like a scan header sit inside an earlier segment, or the header outgrows the window.
    sound = sound_jpegs()
    base = sound["baseline"]
    sos_look_alike = b"\xff\xda\x00\x0c\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00"
    cases = list(sound.values()) + [
        _with_segment(base, 0xFE, sos_look_alike),  # a comment holding a scan header's bytes
        _with_segment(base, 0xE1, bytes(5000)),  # metadata longer than the window searched
        _with_segment(base, 0xE1, bytes(4000)),  # the scan header just past the window
        _with_segment(base, 0xE1, bytes(3990)),  # the scan header across the window's end
    ]
    for name in ("baseline", "progressive", "gray", "restart intervals", "opencv"):
        for family in damaged(sound[name]).values():
            cases += family
    cases += NON_JPEG
    for warm in (False, True):  # the cache empty, then holding every header met
        if not warm:
            jpeg_module._header_final_scan.cache_clear()
        for i, data in enumerate(cases):
            assert jpeg_structure_fault(data, 4096, read_final_scan=False) == _walked_in_full(
                monkeypatch, data
            ), i
    assert jpeg_module._header_final_scan.cache_info().hits > len(cases) // 2  # the cache was used
