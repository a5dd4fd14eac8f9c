"""Image validation and transformation: make every stored payload something the loaders decode.

DALI's CPU decoder aborts the whole pipeline on one truncated JPEG, an empty payload
or non-image bytes, and PIL (the PyTorch loader's decoder) refuses JPEGs that OpenCV
and DALI only warn about (a bogus marker inside the scan), so this is the gate.
Levels (`Validate`, data2rec's --validate), and what each one guarantees about a stored image:

* ``off``:       free byte checks only: non-empty, a known image signature, a JPEG ends
                 with its EOI marker, and the header parses (size, colour mode).
* ``structure``: ``off`` + a walk of every JPEG's markers (src/jpeg.py's
                 jpeg_structure_fault): segments in order and of sane sizes, frame,
                 Huffman and quantisation tables defined before each scan, every scan
                 running to a marker, EOI at the end. No decode, and the final scan of a
                 sequential JPEG is not read (it is most of the bytes): what it cannot see
                 is entropy-coded data whose bits are wrong, or a stray marker inside that
                 final scan; both loaders skip and count a record they cannot decode, so
                 such an image costs one sample, not a run. The default: close to the
                 speed of a copy.
* ``decode``:    ``structure`` + a PIL decode at 1/8 scale (the DCT-domain shortcut; the
                 entropy-coded data is still read in full), so PIL, the PyTorch loader's
                 decoder, decodes every stored JPEG; DALI's CPU decoder (libjpeg-turbo) is
                 more lenient than PIL on every fault we know. ``quick`` is its old name.
* ``full``:      ``structure`` + a full PIL decode + a decode by DALI's CPU decoder itself
                 (when DALI is installed; see dali_check.py).

JPEGs in RGB or grayscale pass through byte for byte unless a resize or quality is
asked for; everything else (PNG, WebP, GIF, BMP, TIFF, CMYK, 16-bit, alpha) is
decoded by PIL and re-encoded as a plain RGB JPEG, alpha composited on white.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from enum import Enum

import numpy as np
from PIL import Image

from src.jpeg import NO_TABLES, jpeg_info, jpeg_structure_fault
from src.jpeg import TRUNCATED as JPEG_TRUNCATED

from .items import EMPTY_IMAGE, NOT_AN_IMAGE, TOO_LARGE, TRUNCATED, UNDECODABLE

# The decompression-bomb guard is ours (`max_pixels`, checked from the header), not PIL's
# warning-then-error at a fixed size.
Image.MAX_IMAGE_PIXELS = None


class Validate(str, Enum):
    """The validation levels, weakest first; the module docstring says what each one guarantees.
    A member is its name as a string (`Validate.OFF == "off"`), so options and resume states
    that hold the name compare equal; the properties say what a level does, so no caller spells
    a level to decide it."""

    OFF = "off"
    STRUCTURE = "structure"
    DECODE = "decode"
    FULL = "full"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: str) -> Validate:
        """The level `name` means (an old name too); ValueError names the levels."""
        try:
            return cls(VALIDATE_ALIASES.get(name, name))
        except ValueError:
            raise ValueError(f"{name!r} is not a level; use one of {', '.join(VALIDATE_LEVELS)}") from None

    @property
    def walks_structure(self) -> bool:
        """Every JPEG's markers are walked (src/jpeg.py)."""
        return self is not Validate.OFF

    @property
    def decodes(self) -> bool:
        """PIL decodes every JPEG that passes through: the chunk needs a worker's time."""
        return self in (Validate.DECODE, Validate.FULL)

    @property
    def decodes_full_size(self) -> bool:
        """PIL decodes at full size (else at 1/8 scale, the DCT-domain shortcut)."""
        return self is Validate.FULL

    @property
    def decodes_in_dali(self) -> bool:
        """DALI's CPU decoder decodes every stored image too (where DALI is installed)."""
        return self is Validate.FULL


VALIDATE_LEVELS = tuple(level.value for level in Validate)
DEFAULT_VALIDATE = Validate.STRUCTURE
# Names a level had before; runs and scripts that use them keep working.
VALIDATE_ALIASES = {"quick": Validate.DECODE.value}
DEFAULT_MAX_PIXELS = 100_000_000  # larger images are skipped as decompression bombs (0: no limit)
CONVERT_QUALITY = 95  # JPEG quality for images we must re-encode when the user named none
_EOI_WINDOW = 4096  # trailing bytes searched for the EOI marker (some writers append padding)

JPEG_SIGNATURE = b"\xff\xd8\xff"
_SIGNATURES = (
    (JPEG_SIGNATURE, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


class ImageRejected(Exception):
    """The payload cannot be stored; `reason` is one of the skip reasons in items.py."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def validate_level(name: str) -> Validate:
    """The level `name` means (an old name mapped to its current one); ValueError names the levels."""
    return Validate.parse(name)


@dataclass(frozen=True)
class ImageOptions:
    validate: Validate = DEFAULT_VALIDATE  # a level's name is taken too
    resize_short: int = 0  # shrink so the short side is this many pixels (0: keep size)
    quality: int | None = None  # re-encode every image at this JPEG quality
    max_pixels: int = DEFAULT_MAX_PIXELS  # reject larger images (0: no limit)

    def __post_init__(self) -> None:
        object.__setattr__(self, "validate", Validate.parse(self.validate))


def sniff(data: bytes | memoryview) -> str | None:
    """The image format from the leading bytes, or None for anything else."""
    data = bytes(data[:12])
    for magic, fmt in _SIGNATURES:
        if data.startswith(magic):
            return fmt
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


# Huffman-coded baseline, extended and progressive frames: what every JPEG decoder (nvJPEG
# included) handles. Arithmetic-coded, lossless and hierarchical frames are re-encoded.
_PLAIN_SOF = frozenset((0xC0, 0xC1, 0xC2))


def _target_size(w: int, h: int, short: int) -> tuple[int, int] | None:
    if short <= 0 or min(w, h) <= short:
        return None
    if w <= h:
        return short, max(1, round(h * short / w))
    return max(1, round(w * short / h)), short


def _to_rgb(img: Image.Image) -> np.ndarray:
    """HxWx3 uint8 RGB from any PIL mode: 16-bit scaled down, alpha composited on white."""
    mode = img.mode
    if mode.startswith("I") or mode == "F":
        arr = np.asarray(img)
        if mode.startswith("I;16") or (mode == "I" and arr.size and arr.max() > 255):
            arr = arr.astype(np.float32) / 257.0
        gray = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
        rgba = np.asarray(img.convert("RGBA"), dtype=np.float32)
        alpha = rgba[:, :, 3:4] / 255.0
        rgb = rgba[:, :, :3] * alpha + 255.0 * (1.0 - alpha)
        return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
    return np.asarray(img.convert("RGB"))


def _encode_jpeg(rgb: np.ndarray, quality: int) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(rgb[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ImageRejected(UNDECODABLE, "JPEG encoding failed")
    return buf.tobytes()


def _decode_check(data: bytes, level: Validate) -> None:
    """Decode a JPEG that will pass through, with PIL as the PyTorch loader does; below full
    size, gray at 1/8 scale (the DCT-domain shortcut, same entropy decoding)."""
    eighth = not level.decodes_full_size
    try:
        with Image.open(io.BytesIO(data), formats=("JPEG",)) as img:
            if eighth:
                img.draft("L", (1, 1))  # the smallest scale libjpeg offers: 1/8
            img.load()
    except Exception as exc:  # PIL raises OSError, SyntaxError or ValueError for bad data
        text = str(exc)
        reason = TRUNCATED if "truncated" in text.lower() else UNDECODABLE
        raise ImageRejected(reason, f"JPEG does not decode in PIL ({level} check): {text}") from None


def prepare_image(data: bytes | memoryview, opts: ImageOptions) -> tuple[bytes | memoryview, bool]:
    """The bytes to store for this image and whether they were re-encoded: `data` itself when it
    passes as it is (a view stays a view: parquet images are views of the column, not copies).

    Raises ImageRejected with the skip reason when the image is unusable.
    """
    if not len(data):
        raise ImageRejected(EMPTY_IMAGE, "zero bytes")
    fmt = sniff(data)
    if fmt is None:
        raise ImageRejected(NOT_AN_IMAGE, f"unknown signature {bytes(data[:8])!r}")
    if fmt == "JPEG":
        if bytes(data[-_EOI_WINDOW:]).rfind(b"\xff\xd9") < 0:
            raise ImageRejected(TRUNCATED, "JPEG has no end-of-image marker")
        info = jpeg_info(data)
        if info is None:
            raise ImageRejected(UNDECODABLE, "JPEG has no frame header")
        w, h, comps, bits, sof = info
        if w <= 0 or h <= 0:
            raise ImageRejected(UNDECODABLE, f"JPEG size {w}x{h}")
        if opts.max_pixels and w * h > opts.max_pixels:
            raise ImageRejected(TOO_LARGE, f"{w}x{h} is over {opts.max_pixels} pixels")
        # The common case, decided without PIL: a plain 8-bit gray/colour JPEG that stays as it is.
        plain = sof in _PLAIN_SOF and comps in (1, 3) and bits == 8
        if plain and opts.quality is None and _target_size(w, h, opts.resize_short) is None:
            walk = opts.validate.walks_structure
            fault = jpeg_structure_fault(data, _EOI_WINDOW, read_final_scan=False) if walk else None
            if fault is None:
                if opts.validate.decodes:
                    _decode_check(data, opts.validate)
                return data, False
            if fault.kind != NO_TABLES:  # NO_TABLES decodes (libjpeg's standard tables): re-encoded below
                raise ImageRejected(
                    TRUNCATED if fault.kind == JPEG_TRUNCATED else UNDECODABLE, f"JPEG: {fault.text}"
                )
    data = bytes(data)  # re-encoded from here on
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
    except Exception as exc:
        raise ImageRejected(UNDECODABLE, f"{fmt} header: {exc}") from None
    if w <= 0 or h <= 0:
        raise ImageRejected(UNDECODABLE, f"size {w}x{h}")
    if opts.max_pixels and w * h > opts.max_pixels:
        raise ImageRejected(TOO_LARGE, f"{w}x{h} is over {opts.max_pixels} pixels")

    target = _target_size(w, h, opts.resize_short)
    try:
        if fmt == "JPEG" and target is not None:
            img.draft(img.mode, target)  # DCT-domain shrink first, to at least the target size
        img.load()
        rgb = _to_rgb(img)
    except ImageRejected:
        raise
    except Exception as exc:  # PIL raises OSError for truncated data, SyntaxError/ValueError for junk
        text = str(exc)
        reason = TRUNCATED if "truncated" in text.lower() else UNDECODABLE
        raise ImageRejected(reason, f"{fmt}: {text}") from None
    if target is not None:
        import cv2

        if (rgb.shape[1], rgb.shape[0]) != target:
            rgb = cv2.resize(rgb, target, interpolation=cv2.INTER_AREA)
    return _encode_jpeg(rgb, opts.quality or CONVERT_QUALITY), True
