"""The one base class of errors a user can fix.

A `UserError` is bad input, a missing file, a flag out of range, a folder that is not
writable: its message is one line that names the input and says what to do. The CLIs
catch this class alone, print `PROG: error: MESSAGE` and exit with `exit_code`; any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import math


class UserError(Exception):
    """Something the user can fix; the message names the input and the fix."""

    exit_code = 2


def flag_of(name: str) -> str:
    """The command-line flag of a setting, as every CLI spells it: `batch_size` -> `--batch-size`."""
    return "--" + name.replace("_", "-")


def report(prog: str, error: UserError) -> int:
    """Print `error` the way every CLI does and return its exit status."""
    import sys

    print(f"{prog}: error: {error}", file=sys.stderr)
    return error.exit_code


def finite_float(text: str) -> float:
    """The argparse type of every float flag: `inf` and `nan` are numbers to float() but no
    setting's value (an lr of inf trains weights to non-finite values, and `nan` passes every
    range check as false), so they are refused with the flag's name when the command line is parsed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
