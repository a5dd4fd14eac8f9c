"""Files in and out: writing so that a reader never sees half of a file, and reading input
trees and files so that no entry hangs the reader, eats its memory, or is left out unseen.

Writing: everything is written under a temporary name in the target's own folder (so the final
rename is atomic on POSIX) and renamed over the target only when complete; on any
error the temporary file is removed. A kill between the two leaves the old file or
none, plus at most a stray `*.tmp` that `remove_stale_temp_files` can clear.

Reading: `read_regular_file` reads a regular file only (a FIFO named `x.jpg` would block a
reader forever, `/dev/zero` never ends), up to a size cap. `walk_files` lists a tree
following its symbolic links, each real folder once, so a link cycle ends and a folder
linked twice is not read twice. `printable` / `json_safe` keep file names that are not
UTF-8 (Python holds their bytes as lone surrogates) writable to text and JSON files; every text
file written here (`atomic_open`, `atomic_write_text`, `atomic_write_json`) follows that rule, so
no writer of file names can fail on one.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """The temporary name beside `path`: hidden, and unique per process so that two
    writers never share one."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename inside `folder` durable (the directory entry itself is data)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` when the block succeeds.

    With `durable`, the new file and the rename are fsynced: a power cut after the
    block leaves the complete new file (checkpoints, resume state).
    """
    path = Path(path)
    tmp = temp_path_for(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if durable:
        fsync_dir(path.parent)


@contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", *, durable: bool = False, **kwargs: Any
) -> Iterator[IO]:
    """`open(path, mode)` for writing, through `atomic_path`."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes whole files; mode {mode!r} must start with 'w'")
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
        kwargs.setdefault("errors", PRINTABLE)  # a file name that is not UTF-8: its odd bytes as \xNN
    with atomic_path(path, durable=durable) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def atomic_write_text(path: str | os.PathLike[str], text: str, *, durable: bool = False) -> Path:
    with atomic_open(path, "w", durable=durable) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(
    path: str | os.PathLike[str], data: Any, *, durable: bool = False, **dumps: Any
) -> Path:
    """JSON with a trailing newline; `dumps` go to json.dumps (default indent=2). With
    ensure_ascii=False the strings go through `json_safe` (a lone surrogate is no JSON text); with
    ASCII escapes they stay exact (\\udcff), for files only this toolkit reads back."""
    dumps.setdefault("indent", 2)
    if dumps.get("ensure_ascii") is False:
        data = json_safe(data)
    return atomic_write_text(path, json.dumps(data, **dumps) + "\n", durable=durable)


def remove_stale_temp_files(folder: str | os.PathLike[str], name_glob: str = "*") -> list[Path]:
    """Delete temporaries that `atomic_path` left for `name_glob` targets in `folder` when
    their writer was killed (their process is gone); returns what was removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for tmp in folder.glob(f".{name_glob}.*{TMP_SUFFIX}"):
        pid = tmp.name[: -len(TMP_SUFFIX)].rsplit(".", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


# --- reading ---------------------------------------------------------------------------------

# Larger than any photo a dataset holds (a 100-megapixel JPEG is ~30 MB), small enough that a
# few workers each holding one cannot exhaust a machine's memory.
DEFAULT_MAX_FILE_BYTES = 64 << 20


class NotARegularFile(OSError):
    """A FIFO, socket or device where a file's contents were expected."""


class FileTooLarge(OSError):
    """A file over the size cap of `read_regular_file`."""


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_regular_file(path: str | os.PathLike[str], max_bytes: int | None = DEFAULT_MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them (None or 0: no cap).

    Raises NotARegularFile for a FIFO, device or socket (checked on the open descriptor, so a
    file swapped in between cannot slip through), IsADirectoryError for a folder, FileTooLarge
    past the cap (also when the file grows while read), and the usual OSErrors.
    """
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; on a
    # regular file it changes nothing.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", os.fspath(path))
        limit = max_bytes or None
        if limit is not None and st.st_size > limit:
            raise FileTooLarge(
                errno.EFBIG, f"{st.st_size} bytes, more than the limit of {limit}", os.fspath(path)
            )
        chunks, size = [], 0
        want = (limit + 1) if limit is not None else None
        while want is None or size < want:
            chunk = f.read((want - size) if want is not None else max(st.st_size - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if limit is not None and size > limit:
            raise FileTooLarge(
                errno.EFBIG, f"grew past the limit of {limit} bytes while read", os.fspath(path)
            )
        return b"".join(chunks)


def _raise(exc: OSError) -> None:
    raise exc


def walk_files(
    root: str | os.PathLike[str],
    suffixes: tuple[str, ...] | None = None,
    *,
    skip_hidden: bool = True,
    folders_named_like: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(files, notes): the relative POSIX paths of the files under `root` whose lower-cased name
    ends with one of `suffixes` (None: all), sorted; and one line per linked folder not read.
    `folders_named_like`, when given, receives the relative paths of the folders whose names end
    so (a folder `x.jpg`: walked as any folder, but the user may have meant a file).

    Symbolic links are followed, also where they point outside `root`: a dataset folder is often
    assembled from links to where the data lies. Each real folder is read once, at its first
    place in the walk (sorted), so a link back to a parent (a cycle) or a second link to a folder
    already listed is not followed; `notes` names each such link. Hidden folders and files
    (a leading dot) are left out with `skip_hidden`. A folder that cannot be read raises its
    OSError: a listing that silently lacks a folder would look complete.
    """
    top = os.fspath(root)
    st = os.stat(top)
    seen: dict[tuple[int, int], str] = {(st.st_dev, st.st_ino): top}
    real_top = os.path.realpath(top)
    files: list[str] = []
    notes: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True, onerror=_raise):
        rel = os.path.relpath(dirpath, top)
        kept = []
        for name in sorted(dirnames):
            if skip_hidden and name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            st = os.stat(full)
            target = os.path.realpath(full)
            if real_top == target or real_top.startswith(target.rstrip(os.sep) + os.sep):
                # A link to `root` or above it: following it would list `root` again (and, for /,
                # the whole machine).
                where = "the folder itself" if target == real_top else f"a folder above {top}"
                notes.append(f"{full}: a link to {target}, {where} (a cycle); not followed")
                continue
            first = seen.setdefault((st.st_dev, st.st_ino), full)
            if folders_named_like is not None and suffixes and name.lower().endswith(suffixes):
                folders_named_like.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
            if first == full:
                kept.append(name)
            elif first == top or full.startswith(first + os.sep):
                notes.append(f"{full}: a link back to {first}, which holds it (a cycle); not followed")
            else:
                notes.append(f"{full}: the same folder as {first}, which is listed already; not read twice")
        dirnames[:] = kept
        for name in filenames:
            if (skip_hidden and name.startswith(".")) or (suffixes and not name.lower().endswith(suffixes)):
                continue
            files.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    files.sort()
    if folders_named_like is not None:
        folders_named_like.sort()
    return files, notes


def printable(text: str) -> str:
    """`text` as valid UTF-8 text: a byte that a non-UTF-8 file name held (a lone surrogate, as
    os.fsdecode gives it) is shown as `\\xNN`, so reports name such files readably."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    return "".join(_printable_char(ch) for ch in text)


def _printable_char(ch: str) -> str:
    if not "\ud800" <= ch <= "\udfff":
        return ch
    if "\udc80" <= ch <= "\udcff":  # os.fsdecode's stand-in for the byte ord(ch) - 0xDC00
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return f"\\u{ord(ch):04x}"  # any other lone surrogate (a JSON "\\udXXX" escape, say)


def _encode_printable(exc: UnicodeError) -> tuple[str, int]:
    """The codec error handler PRINTABLE: what `printable` writes for a lone surrogate, the
    backslashreplace form for any other character the encoding lacks."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    return "".join(
        _printable_char(c) if "\ud800" <= c <= "\udfff" else c.encode("ascii", "backslashreplace").decode()
        for c in bad
    ), exc.end


# `open(..., errors=PRINTABLE)`: a text stream that writes strings as `printable` shows them.
PRINTABLE = "rwkv_clip.printable"
codecs.register_error(PRINTABLE, _encode_printable)


def json_safe(value: Any) -> Any:
    """`value` with every string (keys too) passed through `printable`: what json.dump can write
    as UTF-8 and any JSON reader accepts (a lone surrogate is neither)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
