"""Small real inputs for the data2rec tests: images of every odd kind, hub parquet, tars, readers."""

import io
import struct
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from src.recordio import iter_records, unpack


def picture(w: int, h: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB picture (JPEG-compressible like a photo, unlike white noise)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(1, h // 8), max(1, w // 8), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR))


def jpeg(w: int = 40, h: int = 30, seed: int = 0, quality: int = 90, mode: str = "RGB", **save) -> bytes:
    img = Image.fromarray(picture(w, h, seed))
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **save)
    return buf.getvalue()


def encode(img: Image.Image, fmt: str, **save) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def png_alpha(w: int = 24, h: int = 20) -> bytes:
    rgba = np.zeros((h, w, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:, : w // 2, 3] = 255  # left half opaque red, right half fully transparent
    return encode(Image.fromarray(rgba), "PNG")


def png16(w: int = 16, h: int = 12) -> bytes:
    arr = (np.arange(w * h, dtype=np.uint16).reshape(h, w) * 300).astype(np.uint16)
    return encode(Image.fromarray(arr), "PNG")


def huge_header_jpeg(w: int = 40000, h: int = 40000) -> bytes:
    """A small JPEG whose frame header claims huge dimensions (a decompression bomb stand-in)."""
    data = bytearray(jpeg(16, 16))
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, h, w)
    return bytes(data)


def odd_images() -> dict[str, bytes]:
    """Inputs that must all be stored (converted where needed) and decode in DALI."""
    gif = Image.fromarray(picture(20, 16, 3)).convert("P")
    return {
        "rgb.jpg": jpeg(40, 30, 1),
        "gray.jpg": jpeg(40, 30, 2, mode="L"),
        "cmyk.jpg": jpeg(40, 30, 3, mode="CMYK"),
        "progressive.jpg": jpeg(64, 48, 4, progressive=True),
        "alpha.png": png_alpha(),
        "deep16.png": png16(),
        "photo.webp": encode(Image.fromarray(picture(30, 20, 5)), "WEBP"),
        "anim.gif": encode(gif, "GIF"),
        "palette.bmp": encode(Image.fromarray(picture(12, 10, 6)), "BMP"),
    }


def bad_images() -> dict[str, tuple[bytes, str]]:
    """Inputs that must be skipped, with the reason the report must give."""
    full = jpeg(64, 48, 7)
    return {
        "truncated.jpg": (full[: len(full) // 2], "truncated_image"),
        "empty.jpg": (b"", "empty_image"),
        "text.jpg": (b"this is not an image, just text\n" * 4, "not_an_image"),
        "huge.jpg": (huge_header_jpeg(), "image_too_large"),
        "badheader.png": (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "undecodable_image"),
    }


def tokens_for(k: int, seed: int) -> np.ndarray:
    """K blocks of plausible CLIP token ids, as float32 the way the hub stores them."""
    rng = np.random.default_rng(seed)
    out = np.zeros((k, 77), np.float32)
    for i in range(k):
        n = int(rng.integers(3, 20))
        out[i, 0], out[i, n + 1] = 49406, 49407
        out[i, 1 : n + 1] = rng.integers(1, 49000, n)
    return out.reshape(-1)


def write_hub_parquet(
    path: Path,
    rows: list[tuple[bytes | None, np.ndarray | None]],
    row_group_size: int = 4,
    struct_images: bool = True,
) -> None:
    """A parquet shard shaped like the hub's YFCC15M: images {bytes, path}, texts list<float32>."""
    images = [None if b is None else {"bytes": b, "path": None} for b, _ in rows]
    texts = [None if t is None else [float(v) for v in t] for _, t in rows]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())]) if struct_images else pa.binary()
    if not struct_images:
        images = [None if i is None else i["bytes"] for i in images]
    table = pa.table(
        {"images": pa.array(images, image_type), "texts": pa.array(texts, pa.list_(pa.float32()))}
    )
    pq.write_table(table, path, row_group_size=row_group_size)


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def read_records(rec_paths: list[Path]) -> list[tuple[int, int, np.ndarray, bytes]]:
    """(id, id2, label, payload) of every record, in file order."""
    out = []
    for rec in rec_paths:
        for _, record in iter_records(rec):
            header, payload = unpack(record)
            out.append((int(header.id), int(header.id2), np.array(header.label), payload))
    return out
