"""What a JPEG's own header says about it, read without decoding.

Walking the marker segments to the frame header costs microseconds, where opening the image
with PIL parses every table too. data2rec uses it to sort JPEGs it may pass through from ones
it must re-encode; the loaders use it to size crops before decoding.

`jpeg_structure_fault` walks the whole file the same way, through every scan to the end-of-image
marker: data2rec's default check that a JPEG is whole and well-formed, with no entropy decoding.
data2rec asks it not to read a sequential JPEG's final scan (most of its bytes), which it then takes
to run to the end-of-image marker; the evaluation's DALI path has every scan read.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

# SOFn markers carry the frame size; C4 (DHT), C8 (reserved) and CC (DAC) share the range.
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_info(data: bytes | memoryview) -> tuple[int, int, int, int, int] | None:
    """(width, height, components, bits, SOF marker) from a JPEG's frame header, or None when
    `data` is not a JPEG or ends before its frame header."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        if marker in SOF_MARKERS:
            if i + 10 > n:
                return None
            bits, comps = data[i + 4], data[i + 9]
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            return width, height, comps, bits, marker
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


# --- structure ---------------------------------------------------------------------------------

# Where an entropy-coded scan ends: 0xFF followed by a byte that is no stuffing (00), no restart
# marker (D0-D7) and no fill byte (FF). One C-level search per scan. (A numpy pass over the whole
# file measured faster alone but slower inside data2rec, where its large temporaries cost more.)
_SCAN_END = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")
_APP_COM = frozenset(range(0xE0, 0xF0)) | {0xFE}
_ARITHMETIC_SOF = frozenset((0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_PROGRESSIVE_SOF = frozenset((0xC2, 0xC6, 0xCA, 0xCE))
_PARSED = SOF_MARKERS | {0xC4, 0xDA, 0xDB}  # segments whose contents the walk checks
_KNOWN = SOF_MARKERS | _APP_COM | {0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD}  # markers with a length
MAX_DIMENSION = 65500  # libjpeg's JPEG_MAX_DIMENSION: larger frames do not decode anywhere
_MAX_BLOCKS_IN_MCU = 10  # libjpeg's limit for an interleaved scan (sum of H*V over its components)

TRUNCATED, BROKEN, NO_TABLES = "truncated", "broken", "no_tables"


class JpegFault(NamedTuple):
    """Why a JPEG's structure is unsound. `kind`: TRUNCATED (the data ends early), BROKEN (a
    marker or segment that no decoder accepts), or NO_TABLES (a scan uses a Huffman table that
    is never defined: libjpeg falls back to the standard tables, as for Motion-JPEG frames, but
    other decoders need not; such a file decodes, so it is re-encoded rather than dropped)."""

    kind: str
    text: str


def jpeg_structure_fault(
    data: bytes | memoryview, trailer: int = 4096, read_final_scan: bool = True
) -> JpegFault | None:
    """None when `data` is a structurally sound JPEG, else what is wrong with it.

    Sound: SOI first; then marker segments, each a known marker with a length that fits;
    one frame header (SOFn) of sane size and components; table segments (DQT, DHT) that parse;
    one or more scans (SOS) whose components, Huffman and quantisation tables are defined before
    it, each scan's entropy-coded data running to a marker; every frame component in some scan;
    and EOI, followed by at most `trailer` bytes (some writers pad). The entropy-coded data itself
    is not decoded: a scan whose bits are corrupt but whose markers are in place passes (decoders
    then warn and fill, or fail; the loaders skip and count such a record).

    `read_final_scan=False` does not look for markers inside the entropy-coded data of a
    sequential frame's final scan (the one that completes the frame's components): that scan is
    taken to run to the last end-of-image marker, which must lie within `trailer` bytes of the
    end. It saves reading the whole image (most of the walk's time on a photo), and admits one
    more kind of damage that decoders meet only then: a marker where none belongs inside that
    scan (libjpeg ends the scan early and warns, or fails the image).
    """
    if not read_final_scan:
        final = _known_final_scan(data)
        if final is not None:
            return _final_scan_fault(data, final, trailer)
    walked = _walk(data, trailer, read_final_scan)
    return _final_scan_fault(data, walked, trailer) if isinstance(walked, _FinalScan) else walked


class _FinalScan(NamedTuple):
    """Where the walk stopped: at the header (byte `at`) of a sequential frame's final scan, whose
    entropy-coded data begins at byte `start`."""

    at: int
    start: int


def _final_scan_fault(data: bytes | memoryview, final: _FinalScan, trailer: int) -> JpegFault | None:
    """The final scan of a sequential frame, not read: sound when an end-of-image marker lies in
    its last `trailer` (+ 2) bytes."""
    tail = max(final.start, len(data) - trailer - 2)
    if bytes(data[tail:]).rfind(b"\xff\xd9") < 0:
        return JpegFault(
            TRUNCATED, f"the scan at byte {final.at} is cut off (no end-of-image marker after it)"
        )
    return None


# Headers are looked up in this many leading bytes: a photo's tables and frame header take under
# a kilobyte; one carrying large metadata is walked in full.
_HEAD_WINDOW = 4096


def _known_final_scan(data: bytes | memoryview) -> _FinalScan | None:
    """Where a sequential JPEG's final scan starts, when everything before it is a header seen
    before, else None. A corpus's images come from a few encoders, so most share their table
    segments and their frame size: the walk runs once per distinct header, not once per image."""
    head = bytes(data[:_HEAD_WINDOW])
    sos = head.find(b"\xff\xda")  # the first scan header, or bytes that look like one
    if sos < 0 or sos + 4 > len(head):
        return None
    end = sos + 2 + ((head[sos + 2] << 8) | head[sos + 3])  # the scan header's end: its length counts itself
    return _header_final_scan(head[:end]) if end <= len(head) else None


@functools.lru_cache(maxsize=1024)
def _header_final_scan(header: bytes) -> _FinalScan | None:
    """The walk of `header` alone, when it ends exactly where a sequential frame's final scan
    begins; else None. The walk reads only the bytes before that point, and a cut that is not
    there (the FF DA found was inside a segment, or begins an earlier scan) makes it fail on
    `header` alone, so a walk of the whole image would reach the same place."""
    walked = _walk(header, 0, read_final_scan=False)
    return walked if isinstance(walked, _FinalScan) and walked.start == len(header) else None


def _walk(data: bytes | memoryview, trailer: int, read_final_scan: bool) -> JpegFault | _FinalScan | None:
    """jpeg_structure_fault's walk, stopping at a sequential frame's final scan when it is not
    to be read."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return JpegFault(BROKEN, "no start-of-image marker")
    frame: dict[int, tuple[int, int, int]] | None = None  # component id -> (H, V, quant table)
    huffman = arithmetic = progressive = False
    tables: set[tuple[int, int]] = set()  # (class 0 DC / 1 AC, id) Huffman tables defined
    quant: set[int] = set()
    covered: set[int] = set()
    i = 2
    while True:
        if i >= n:
            return JpegFault(TRUNCATED, f"ends at byte {n} before its end-of-image marker")
        if data[i] != 0xFF:
            return JpegFault(BROKEN, f"byte {i} is 0x{data[i]:02x} where a marker should start")
        while i < n and data[i] == 0xFF:  # fill bytes before a marker
            i += 1
        if i >= n:
            return JpegFault(TRUNCATED, f"ends at byte {n} before its end-of-image marker")
        marker, at = data[i], i - 1
        i += 1
        if marker == 0xD9:
            if frame is None or not covered:
                return JpegFault(BROKEN, f"end-of-image at byte {at} before any scan")
            missing = set(frame) - covered
            if missing:
                return JpegFault(BROKEN, f"frame component(s) {sorted(missing)} are in no scan")
            if n - i > trailer:
                return JpegFault(BROKEN, f"{n - i} bytes follow the end-of-image marker at byte {at}")
            return None
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, stray restart: no length, decoders skip them
            continue
        if marker not in _KNOWN:
            return JpegFault(BROKEN, f"marker FF{marker:02X} at byte {at} is no marker a decoder accepts")
        if i + 2 > n:
            return JpegFault(TRUNCATED, f"ends inside the marker FF{marker:02X} at byte {at}")
        length = (data[i] << 8) | data[i + 1]
        end = i + length
        if length < 2:
            return JpegFault(BROKEN, f"marker FF{marker:02X} at byte {at} has length {length}")
        if end > n:
            return JpegFault(
                TRUNCATED, f"the marker FF{marker:02X} at byte {at} runs {end - n} bytes past the end"
            )
        # bytes, also when `data` is a view: the table parsers cache by segment, and a cached view
        # would keep the whole buffer it points into alive.
        seg = bytes(data[i + 2 : end]) if marker in _PARSED else b""
        i = end
        if marker in SOF_MARKERS:
            if frame is not None:
                return JpegFault(BROKEN, f"marker FF{marker:02X} at byte {at} is a second frame header")
            problem, frame = _frame(seg)
            if problem:
                return JpegFault(BROKEN, f"frame header at byte {at}: {problem}")
            arithmetic, progressive = marker in _ARITHMETIC_SOF, marker in _PROGRESSIVE_SOF
            huffman = not arithmetic
        elif marker == 0xC4:
            problem, ids = _dht_tables(seg)
            if problem:
                return JpegFault(BROKEN, f"Huffman table at byte {at}: {problem}")
            tables |= ids
        elif marker == 0xDB:
            problem, ids = _dqt_tables(seg)
            if problem:
                return JpegFault(BROKEN, f"quantisation table at byte {at}: {problem}")
            quant |= ids
        elif marker == 0xDD and length != 4:
            return JpegFault(BROKEN, f"restart interval at byte {at} has length {length}, not 4")
        elif marker == 0xDA:
            if frame is None:
                return JpegFault(BROKEN, f"scan at byte {at} before any frame header")
            fault = _scan_fault(seg, at, frame, huffman, progressive, tables, quant, covered)
            if fault:
                return fault
            if not read_final_scan and not progressive and covered == set(frame):
                return _FinalScan(at, i)
            m = _SCAN_END.search(data, i)
            if m is None:
                return JpegFault(TRUNCATED, f"the scan at byte {at} is cut off (no marker after it)")
            i = m.start()


@functools.lru_cache(maxsize=1024)
def _frame(seg: bytes) -> tuple[str | None, dict[int, tuple[int, int, int]]]:
    """(problem or None, component id -> (H, V, quantisation table)) of a frame header; the dict
    is shared by every image with this header (the cache's), so it is only read."""
    problem = _frame_problem(seg)
    if problem:
        return problem, {}
    return None, {
        seg[6 + 3 * c]: (seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15, seg[8 + 3 * c]) for c in range(seg[5])
    }


def _frame_problem(seg: bytes) -> str | None:
    if len(seg) < 6:
        return "too short"
    bits, height, width, comps = seg[0], (seg[1] << 8) | seg[2], (seg[3] << 8) | seg[4], seg[5]
    if bits not in (8, 12, 16):
        return f"{bits} bits per sample"
    if not 1 <= comps <= 4 or len(seg) != 6 + 3 * comps:
        return f"{comps} components in {len(seg) + 2} bytes"
    if not (0 < width <= MAX_DIMENSION and 0 < height <= MAX_DIMENSION):
        return f"size {width}x{height}"
    ids = set()
    for c in range(comps):
        cid, hv, tq = seg[6 + 3 * c], seg[7 + 3 * c], seg[8 + 3 * c]
        if cid in ids or not (1 <= hv >> 4 <= 4 and 1 <= hv & 15 <= 4) or tq > 3:
            return f"component {c} (id {cid}, sampling 0x{hv:02x}, table {tq})"
        ids.add(cid)
    return None


# A dataset's images mostly come from a few encoders, so their table segments repeat byte for
# byte: each distinct one is parsed once.
@functools.lru_cache(maxsize=1024)
def _dht_tables(seg: bytes) -> tuple[str | None, frozenset[tuple[int, int]]]:
    """(problem or None, the (class, id) of each Huffman table a DHT segment defines)."""
    tables = set()
    j = 0
    while j < len(seg):
        if j + 17 > len(seg):
            return "cut short", frozenset()
        cls, tid = seg[j] >> 4, seg[j] & 15
        counts = seg[j + 1 : j + 17]
        total = sum(counts)
        if cls > 1 or tid > 3 or total > 256 or j + 17 + total > len(seg):
            return f"class {cls}, id {tid}, {total} codes in {len(seg) - j} bytes", frozenset()
        # libjpeg refuses code lengths that overflow (the all-ones code of a length is reserved)
        # and DC symbols over 15, when the table is first used.
        code = 0
        for length, count in enumerate(counts, 1):
            code += count
            if code >= 1 << length:
                return f"class {cls}, id {tid}: more codes of {length} bits or fewer than fit", frozenset()
            code <<= 1
        if cls == 0 and max(seg[j + 17 : j + 17 + total], default=0) > 15:
            return f"DC table {tid} has a symbol over 15", frozenset()
        tables.add((cls, tid))
        j += 17 + total
    return (None, frozenset(tables)) if seg else ("empty", frozenset())


@functools.lru_cache(maxsize=1024)
def _dqt_tables(seg: bytes) -> tuple[str | None, frozenset[int]]:
    """(problem or None, the id of each quantisation table a DQT segment defines)."""
    ids = set()
    j = 0
    while j < len(seg):
        precision, tid = seg[j] >> 4, seg[j] & 15
        size = 64 * (precision + 1)
        if precision > 1 or tid > 3 or j + 1 + size > len(seg):
            return f"precision {precision}, id {tid} in {len(seg) - j} bytes", frozenset()
        ids.add(tid)
        j += 1 + size
    return (None, frozenset(ids)) if seg else ("empty", frozenset())


def _scan_fault(
    seg: bytes,
    at: int,
    frame: dict[int, tuple[int, int, int]],
    huffman: bool,
    progressive: bool,
    tables: set[tuple[int, int]],
    quant: set[int],
    covered: set[int],
) -> JpegFault | None:
    ns = seg[0] if seg else 0
    if not 1 <= ns <= 4 or len(seg) != 4 + 2 * ns:
        return JpegFault(BROKEN, f"scan header at byte {at}: {ns} components in {len(seg) + 2} bytes")
    ss, se, ah, al = seg[1 + 2 * ns], seg[2 + 2 * ns], seg[3 + 2 * ns] >> 4, seg[3 + 2 * ns] & 15
    # The progression parameters libjpeg refuses (a DC scan is DC only, an AC scan one component,
    # a refinement one bit below the previous pass).
    if progressive and (
        ss > se
        or se > 63
        or (ss == 0) != (se == 0)
        or (ss > 0 and ns != 1)
        or (ah != 0 and al != ah - 1)
        or al > 13
    ):
        return JpegFault(
            BROKEN,
            f"scan header at byte {at}: spectral range {ss}..{se}, bits {ah}/{al} for {ns} component(s)",
        )
    blocks = 0
    for c in range(ns):
        cid, sel = seg[1 + 2 * c], seg[2 + 2 * c]
        if cid not in frame:
            return JpegFault(BROKEN, f"scan at byte {at} names component {cid}, which the frame lacks")
        h, v, tq = frame[cid]
        blocks += h * v
        if tq not in quant:
            return JpegFault(BROKEN, f"scan at byte {at}: quantisation table {tq} is never defined")
        if huffman:
            # Progressive: a DC first pass needs a DC table, an AC pass an AC one, a DC refinement none.
            need_dc = not progressive or (ss == 0 and ah == 0)
            need_ac = not progressive or ss > 0
            if (need_dc and (0, sel >> 4) not in tables) or (need_ac and (1, sel & 15) not in tables):
                return JpegFault(NO_TABLES, f"scan at byte {at} uses a Huffman table that is never defined")
        covered.add(cid)
    if ns > 1 and blocks > _MAX_BLOCKS_IN_MCU:
        return JpegFault(
            BROKEN, f"scan at byte {at}: {blocks} blocks per MCU, more than {_MAX_BLOCKS_IN_MCU}"
        )
    return None
