"""The model library's own errors: problems a user can fix, each with a one-line message.

The library imports nothing else of the project, so it cannot raise the toolkit's
`src.errors.UserError`; the CLIs catch `OpenAlipError` where they call the library and
re-raise it as their own UserError, so the user sees the same one line.
"""

from __future__ import annotations


class OpenAlipError(Exception):
    """Something the caller can fix (a model name, a weights file, hub access); the message
    is one line naming the input and what to do."""


class ModelConfigError(OpenAlipError, ValueError):
    """The model name or config JSON is unknown or malformed. `key`: the config key whose value is
    wrong, where one is (a caller can then name its own flag for it)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class PretrainedError(OpenAlipError):
    """The `pretrained` weights cannot be found, fetched, read or loaded."""


class WeightsNotFoundError(PretrainedError):
    """A local weights file, or a file in a hub repo, that does not exist."""


class WeightsMismatchError(PretrainedError):
    """Weights made for another architecture (missing, unexpected or mis-shaped tensors).

    `detail` says what differs (a few tensor names; `summary` only counts them); `fits` names the
    config the weights do fit, if one is known (the one they record, else the one shipped config of
    their shapes), and `recorded` whether they hold their own config: a command line turns these
    into advice about its own flags."""

    def __init__(
        self,
        message: str,
        detail: str = "",
        fits: str | None = None,
        recorded: bool = False,
        summary: str = "",
    ) -> None:
        super().__init__(message)
        self.detail, self.fits, self.recorded, self.summary = detail, fits, recorded, summary or detail


class HubError(PretrainedError):
    """The hub refused or could not answer (401/403, 404, unreachable)."""


class ChecksumError(HubError):
    """A downloaded file whose content differs from the hub's sha256 (or git blob id)."""
