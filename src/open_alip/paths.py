"""What a path is when a file was expected: the one wording for "does not exist", "is a folder",
"is not a regular file (a FIFO)" and "is a broken link", used by the library and by the toolkit's
CLIs alike, so that /dev/zero is never said not to exist."""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_file(path: str | os.PathLike, wanted: str = "a file") -> str | None:
    """None when `path` is a regular file (or a link to one); else why it is not one, worded to
    follow the path in a message: "does not exist", "is a folder, not WANTED", "is not a regular
    file (a character device)", "is a broken link (to TARGET)"."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a broken link (to {os.readlink(path)})"
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of the path is a file)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"is a folder, not {wanted}"
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
    return f"is not a regular file ({kind})"
