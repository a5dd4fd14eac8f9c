"""What stops a training run with a message for the user instead of a traceback."""

from __future__ import annotations

from src.errors import UserError


class TrainingError(UserError):
    """A problem the user can fix; its message is one sentence naming the input."""


class NonFiniteLossError(UserError):
    """The loss became NaN or infinite; nothing was updated or saved for that step."""

    exit_code = 3
