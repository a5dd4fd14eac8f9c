"""WebDataset tars as img2dataset writes them: `KEY.jpg` + `KEY.txt` [+ `KEY.json`, ...].

Members of one sample are consecutive and share the key (the member name up to the
first dot of its base name). A caption missing from `.txt` is taken from the json's
"caption" field when present. A tar is read to its last complete member: one without
its end-of-archive blocks (a writer stopped before closing it) loses nothing, and one
cut inside a member or a header yields every sample before the cut and one
`broken_input` item for the rest.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

from ..captions import CaptionRejected, decode_caption
from ..items import BROKEN_INPUT, MISSING_CAPTION, MISSING_IMAGE, Item, Unit
from .base import IMAGE_EXTS, Source, UnreadableUnit, expand

TAR_EXTS = (".tar", ".tar.gz", ".tgz")


def _split(name: str) -> tuple[str, str]:
    head, _, base = name.rpartition("/")
    key, dot, ext = base.partition(".")
    return (f"{head}/{key}" if head else key), (dot + ext).lower()


def _plain_size(path: str) -> int | None:
    """Size of an uncompressed tar (member offsets are file offsets only then)."""
    return None if path.lower().endswith((".gz", ".tgz")) else Path(path).stat().st_size


def _groups(tar: tarfile.TarFile, size: int | None) -> Iterator[tuple[str, list[tarfile.TarInfo]]]:
    key, members = None, []
    for info in tar:
        if not info.isfile():
            continue
        k, _ = _split(info.name)
        if k != key and members:
            yield key, members  # type: ignore[misc]
            members = []
        key = k
        # tarfile reads a cut-off last member as short data without complaint. The samples
        # before it are whole; the one it belongs to is not, and is dropped with the cut.
        if size is not None and info.offset_data + info.size > size:
            raise tarfile.ReadError(f"member {info.name} is cut off at byte {size} (truncated tar)")
        members.append(info)
    # The last sample is as whole as its members are: yielded even if more was cut off after it.
    if members:
        yield key, members  # type: ignore[misc]
    # tarfile also ends quietly at a header cut short. What follows the last member must be
    # nothing (no end-of-archive blocks: every member is there) or zeros.
    if size is not None and size > tar.offset:
        with open(tar.name, "rb") as f:  # type: ignore[arg-type]
            f.seek(tar.offset)
            tail = f.read(2 * tarfile.BLOCKSIZE)
        if tail.strip(b"\0"):
            raise tarfile.ReadError(f"a member header is cut off after byte {tar.offset} (truncated tar)")


class WebDatasetSource(Source):
    kind = "webdataset"

    def units(self) -> list[Unit]:
        return [Unit(i, str(p)) for i, p in enumerate(expand(self.paths, TAR_EXTS, self.exclude, self.notes))]

    def count(self, unit: Unit) -> int:
        n = 0
        try:
            with tarfile.open(unit.path, "r:*") as tar:
                for _ in _groups(tar, _plain_size(unit.path)):
                    n += 1
        except (tarfile.TarError, OSError, EOFError) as exc:
            if n == 0:  # not one sample could be read: how many it holds is unknown
                raise UnreadableUnit(f"tar read failed: {exc}") from None
            n += 1  # the broken_input item: the samples before the cut are whole
        return n

    def items(self, unit: Unit, start: int = 0) -> Iterator[Item]:
        path = Path(unit.path)
        pos = 0
        try:
            with tarfile.open(path, "r:*") as tar:
                for key, members in _groups(tar, _plain_size(unit.path)):
                    if pos >= start:
                        yield self._item(tar, path, pos, key, members)
                    pos += 1
        except (tarfile.TarError, OSError, EOFError) as exc:
            if pos >= start:
                yield Item(
                    pos, f"{path}:{pos}", row=pos, error=BROKEN_INPUT, detail=f"tar read failed: {exc}"
                )

    @staticmethod
    def _item(tar: tarfile.TarFile, path: Path, pos: int, key: str, members: list[tarfile.TarInfo]) -> Item:
        ref = f"{path}:{key}"
        by_ext = {_split(m.name)[1]: m for m in members}
        image_member = next((by_ext[e] for e in by_ext if e in IMAGE_EXTS), None)
        if image_member is None:
            return Item(
                pos, ref, row=pos, error=MISSING_IMAGE, detail=f"members: {', '.join(sorted(by_ext))}"
            )
        f = tar.extractfile(image_member)
        image = f.read() if f else b""
        caption = None
        if ".txt" in by_ext:
            f = tar.extractfile(by_ext[".txt"])
            try:
                caption = decode_caption(f.read(), f"{path}:{by_ext['.txt'].name}") if f else None
            except CaptionRejected as exc:
                return Item(pos, ref, row=pos, error=exc.reason, detail=exc.detail)
        elif ".json" in by_ext:
            f = tar.extractfile(by_ext[".json"])
            try:
                meta = json.loads(f.read()) if f else {}
                caption = meta.get("caption") if isinstance(meta, dict) else None
            except ValueError:
                caption = None
        if caption is None:
            return Item(pos, ref, row=pos, error=MISSING_CAPTION, detail="no .txt (or json caption)")
        return Item(pos, ref, image=image, captions=[caption], row=pos)
