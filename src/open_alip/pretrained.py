"""Weights from anywhere: a local .pt/.safetensors file, or a file of a hub model repo.

    load_pretrained(model, "RWKV-CLIP-B32-YFCC15M.pt")          # or .safetensors, or train.py's checkpoint
    load_pretrained(model, "hf-hub:ORG/REPO")                    # the repo's single weights file
    load_pretrained(model, "hf-hub:ORG/REPO/sub/model.safetensors")

Local files may hold a raw state dict, one saved from a DDP/compiled model (`module.` /
`_orig_mod.` prefixes) or a training checkpoint (the tensors under "state_dict");
`model.load_checkpoint` sorts that out. `.safetensors` files are read with safetensors,
anything else with `torch.load(weights_only=True)`.

Hub files come through huggingface_hub: HF_ENDPOINT selects the hub (a mirror, or
`python -m src.open_alip.hub_server --repo-type model` serving a folder), HF_TOKEN authenticates,
the hub cache (HF_HOME / HF_HUB_CACHE, or `cache_dir`) keeps files between runs, and
HF_HUB_OFFLINE=1 takes them from that cache without asking the hub. Every file is checked
against the hub's sha256 (LFS files) or git blob id (small files).

Problems raise `errors.PretrainedError` subclasses with one-line messages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import ChecksumError, HubError, PretrainedError, WeightsMismatchError, WeightsNotFoundError
from .hashes import file_sha256, git_blob_sha1
from .model import (
    CheckpointMismatchError,
    config_in_checkpoint,
    config_name,
    load_checkpoint,
    shipped_configs_that_fit,
)
from .paths import not_a_file
from .released import ReleasedWeights
from .urls import redact_urls

HF_HUB_PREFIX = "hf-hub:"
# The config file of a hub model repo, named as open_clip names it (its "model_cfg" holds the config).
HUB_CONFIG = "open_clip_config.json"
# What counts as a weights file when a repo is named without a file.
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's text on one line (torch and httpx messages span several), without the
    credentials of any URL in it (HF_ENDPOINT may carry them)."""
    text = redact_urls(" ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_hub_spec(pretrained: str | os.PathLike) -> bool:
    return str(pretrained).startswith(HF_HUB_PREFIX)


def parse_hub_spec(spec: str) -> tuple[str, str | None]:
    """`hf-hub:ORG/REPO[/FILE]` -> (ORG/REPO, FILE or None); FILE may contain folders."""
    parts = spec[len(HF_HUB_PREFIX) :].split("/")
    if len(parts) < 2 or any(p in ("", ".", "..") for p in parts):
        raise PretrainedError(f"{spec!r}: expected hf-hub:ORG/REPO or hf-hub:ORG/REPO/FILE")
    return "/".join(parts[:2]), "/".join(parts[2:]) or None


def pick_weights_file(spec: str, files: list[str]) -> str:
    """The single weights file among a repo's files (a lone .safetensors wins over other types)."""
    candidates = sorted(f for f in files if f.lower().endswith(WEIGHT_SUFFIXES))
    safetensors = [f for f in candidates if f.lower().endswith(".safetensors")]
    if len(candidates) == 1:
        return candidates[0]
    if len(safetensors) == 1:
        return safetensors[0]
    if not candidates:
        held = ", ".join(sorted(files)[:8]) or "nothing"
        raise WeightsNotFoundError(
            f"{spec}: the repo has no weights file ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}); it "
            f"holds: {held}"
        )
    shown = ", ".join(candidates[:6]) + (" ..." if len(candidates) > 6 else "")
    raise PretrainedError(f"{spec}: the repo has several weights files ({shown}); name one as {spec}/FILE")


# ---------------------------------------------------------------------------------------------
# hashes


def _content_id(path: Path, expected: str) -> str:
    """The file's sha256 or git blob id, whichever kind `expected` is."""
    return file_sha256(path) if _HEX64.fullmatch(expected) else git_blob_sha1(path)


def _expected_from_cache(path: Path) -> str | None:
    """The hub cache names each blob after its ETag (sha256 for LFS files, the git blob id
    otherwise); a snapshot file is a link to its blob. None where files are copies."""
    name = Path(os.path.realpath(path)).name
    return name if _HEX64.fullmatch(name) or _HEX40.fullmatch(name) else None


def _drop_from_cache(path: Path) -> None:
    blob = Path(os.path.realpath(path))
    for p in {path, blob}:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------------------------------
# the hub


def _hub_error(spec: str, endpoint: str, exc: Exception) -> PretrainedError:
    """A huggingface_hub exception as one line that says what to do."""
    from huggingface_hub import errors as hub_errors

    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    code = f"HTTP {status}" if status else type(exc).__name__
    refused = f"{spec}: {endpoint} refused access ({code}); set HF_TOKEN to a token that can read this repo"
    if isinstance(exc, hub_errors.GatedRepoError):
        return HubError(refused)
    if isinstance(exc, hub_errors.RevisionNotFoundError):
        return HubError(f"{spec}: revision not found at {endpoint} ({code})")
    if isinstance(exc, hub_errors.RepositoryNotFoundError):
        # huggingface.co answers 401 for a private repo and for a missing one alike
        return HubError(
            f"{spec}: no such model repo at {endpoint} ({code}); check ORG/REPO (and HF_ENDPOINT), "
            "or set HF_TOKEN if it is private"
        )
    if status in (401, 403):
        return HubError(refused)
    if isinstance(exc, hub_errors.LocalEntryNotFoundError):  # before EntryNotFoundError, its base
        return HubError(
            f"{spec}: cannot download from {endpoint} and the file is not in the hub cache; "
            "check HF_ENDPOINT and the network"
        )
    if isinstance(exc, hub_errors.EntryNotFoundError):
        return WeightsNotFoundError(f"{spec}: no such file in the repo at {endpoint} ({code})")
    if isinstance(exc, hub_errors.OfflineModeIsEnabled):
        return HubError(
            f"{spec}: HF_HUB_OFFLINE is set and the file is not in the hub cache; unset it to download"
        )
    if isinstance(exc, hub_errors.HfHubHTTPError):
        return HubError(f"{spec}: {endpoint} answered {code}: {_one_line(exc, 160)}")
    return HubError(
        f"{spec}: cannot reach {endpoint} ({type(exc).__name__}: {_one_line(exc, 160)}); check HF_ENDPOINT "
        "and the network, or set HF_HUB_OFFLINE=1 to use files already in the hub cache"
    )


def _hub_cache(cache_dir: str | os.PathLike | None) -> str | None:
    """`cache_dir`, else the cache HF_HUB_CACHE or HF_HOME name now (huggingface_hub reads them once,
    at import), else None: huggingface_hub's default."""
    if cache_dir is not None:
        return str(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _offline() -> bool:
    from huggingface_hub import constants

    # huggingface_hub reads the variable once, at import; read it again so that setting it later works too.
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {
        "1",
        "ON",
        "YES",
        "TRUE",
    }


def download_from_hub(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local (hub cache) path of the weights file `spec` = hf-hub:ORG/REPO[/FILE], downloaded if
    needed and checked against the hub's sha256 / git blob id."""
    repo_id, filename = parse_hub_spec(spec)
    try:
        import huggingface_hub as hub
    except ImportError:
        raise PretrainedError(
            f"{spec}: huggingface_hub is not installed; pip install huggingface_hub"
        ) from None
    # Submodules by name: the package loads its attributes lazily, so `hub.constants` exists only
    # once something has imported it, which made the default endpoint crash (issue 24).
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import errors as hub_errors

    # Read at call time (huggingface_hub reads HF_ENDPOINT once, at import).
    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None
    where = redact_urls(endpoint or hub_constants.ENDPOINT)  # what messages name
    cache = _hub_cache(cache_dir)
    try:
        if _offline():
            return _from_cache(spec, repo_id, filename, cache)
        info = hub.HfApi(endpoint=endpoint).model_info(repo_id, files_metadata=True)
        siblings = {s.rfilename: s for s in info.siblings or []}
        if filename is None:
            filename = pick_weights_file(spec, list(siblings))
        elif filename not in siblings:
            held = ", ".join(sorted(siblings)[:8]) or "nothing"
            raise WeightsNotFoundError(f"{spec}: the repo has no file {filename!r}; it holds: {held}")
        sibling = siblings[filename]
        expected = sibling.lfs.sha256 if sibling.lfs is not None else sibling.blob_id
        if not expected:
            raise HubError(f"{spec}: {where} gave no sha256 or blob id for {filename}; cannot verify it")

        def fetch(force: bool) -> Path:
            return Path(
                hub.hf_hub_download(
                    # by branch, not info.sha: the cache then records main -> commit, which is what
                    # an offline run (HF_HUB_OFFLINE=1) looks up; the hash check catches a moved branch
                    repo_id,
                    filename,
                    repo_type="model",
                    cache_dir=cache,
                    endpoint=endpoint,
                    force_download=force,
                )
            )

        path = fetch(False)
        if _content_id(path, expected) != expected:
            path = fetch(True)  # a damaged cached copy or a transfer error: one fresh download
            got = _content_id(path, expected)
            if got != expected:
                _drop_from_cache(path)
                raise ChecksumError(
                    f"{spec}: the downloaded {filename} has hash {got[:16]}..., the hub says "
                    f"{expected[:16]}...; removed it from the cache: retry, and check any proxy or mirror in "
                    "between"
                )
        return path
    except PretrainedError:
        raise
    except hub_errors.HFValidationError as exc:  # a repo id the hub cannot hold
        raise PretrainedError(f"{spec}: {_one_line(exc, 200)}") from None
    except (
        hub_errors.HfHubHTTPError,
        hub_errors.OfflineModeIsEnabled,
        hub_errors.LocalEntryNotFoundError,
    ) as exc:
        raise _hub_error(spec, where, exc) from None
    except Exception as exc:
        if _is_transport_error(exc):
            raise _hub_error(spec, where, exc) from None
        if isinstance(exc, OSError):  # the cache folder: permissions, a full disk
            raise PretrainedError(
                f"{spec}: cannot store the file in the hub cache ({_one_line(exc, 200)})"
            ) from None
        raise


def _is_transport_error(exc: Exception) -> bool:
    """A failure to talk to the hub at all. huggingface_hub's HTTP client (an httpx) raises its own
    connection errors, which are not OSErrors; match them by their package instead of importing it."""
    package = type(exc).__module__.split(".")[0]
    return isinstance(exc, (ConnectionError, TimeoutError)) or package.startswith(
        ("httpx", "httpcore", "h11", "requests", "urllib3")
    )


def _from_cache(spec: str, repo_id: str, filename: str | None, cache: str | None) -> Path:
    """Offline: the file from the hub cache, checked against the ETag its blob is named after."""
    import huggingface_hub as hub
    from huggingface_hub import errors as hub_errors

    try:
        if filename is None:
            folder = Path(
                hub.snapshot_download(repo_id, repo_type="model", cache_dir=cache, local_files_only=True)
            )
            files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
            filename = pick_weights_file(spec, files)
        path = Path(
            hub.hf_hub_download(repo_id, filename, repo_type="model", cache_dir=cache, local_files_only=True)
        )
    except (hub_errors.LocalEntryNotFoundError, FileNotFoundError):
        raise HubError(
            f"{spec}: HF_HUB_OFFLINE is set and the file is not in the hub cache; unset HF_HUB_OFFLINE to "
            "download it"
        ) from None
    expected = _expected_from_cache(path)
    if expected is not None and _content_id(path, expected) != expected:
        raise ChecksumError(
            f"{spec}: the cached {filename} does not match its hub hash; delete it from the hub cache "
            "and download it again (unset HF_HUB_OFFLINE)"
        )
    return path


# ---------------------------------------------------------------------------------------------
# reading and loading


def resolve_pretrained(pretrained: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local file behind `pretrained` (a path, or hf-hub:ORG/REPO[/FILE] fetched into the cache)."""
    if is_hub_spec(pretrained):
        return download_from_hub(str(pretrained), cache_dir)
    path = Path(pretrained).expanduser()
    what = not_a_file(path, "a weights file")
    if what is not None:
        raise WeightsNotFoundError(
            f"weights {pretrained} {what}; give a .pt or .safetensors file, hf-hub:ORG/REPO[/FILE], "
            "or a released tag with its model (list_pretrained())"
        )
    return path


def resolve_released(entry: ReleasedWeights, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local file of released weights, fetched from their hub repo; checked against the hub's
    sha256 and, where the record knows one, against the record's too."""
    path = download_from_hub(entry.hub_spec, cache_dir)
    if entry.sha256 is not None:
        got = file_sha256(path)
        if got != entry.sha256:
            raise ChecksumError(
                f"{entry.config}:{entry.tag} ({entry.hub_spec}): the hub's file has sha256 {got[:16]}..., "
                f"the released one {entry.sha256[:16]}...; the repo was changed: name the file you trust "
                "instead"
            )
    return path


def read_weights(path: Path, label: str | None = None) -> Mapping[str, Any]:
    """The raw contents of a weights file (a state dict, or a checkpoint dict holding one)."""
    label = label or str(path)
    if path.suffix.lower() == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise PretrainedError(
                f"weights {label}: reading .safetensors needs safetensors; pip install safetensors"
            ) from None
        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError and OSErrors
            raise PretrainedError(
                f"cannot read weights {label}: not a valid safetensors file ({_one_line(exc, 160)})"
            ) from None
    try:
        # mmap: a training checkpoint also holds optimizer state, which need not be read into memory
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        pass  # files in torch's legacy (non-zip) format cannot be mapped; read them whole
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt, truncated or unsafe files
        raise PretrainedError(
            f"cannot read weights {label} with torch.load(weights_only=True): {type(exc).__name__}: "
            f"{_one_line(exc, 200)}"
        ) from None


def load_weights(
    model: nn.Module, weights: Mapping[str, Any], label: str, model_name: str | None = None
) -> None:
    """Load what `read_weights` returned into `model`, strictly; weights made for another
    architecture raise WeightsMismatchError naming the offending keys."""
    try:
        load_checkpoint(model, weights, strict=True)
    except CheckpointMismatchError as exc:
        raise mismatch_error(exc, weights, label, model_name) from None


def mismatch_error(
    exc: CheckpointMismatchError, weights: Mapping[str, Any], label: str, model_name: str | None
) -> WeightsMismatchError:
    """The one line for weights that do not fit: what differs, and the config the weights record
    (train.py checkpoints hold theirs) or the shipped one they fit, or else that the right config
    must be passed."""
    target = f"model {model_name}" if model_name else "this model"
    detail = _one_line(exc, 300)
    stored = config_in_checkpoint(weights)
    if stored is None:
        fitting = shipped_configs_that_fit(weights)
        fits = fitting[0] if len(fitting) == 1 else None
        hint = (
            f"they fit {' and '.join(fitting)}: pass that config"
            if fitting
            else "pass the model config they were trained with"
        )
    else:
        run = weights.get("run")
        recorded = run.get("config") if isinstance(run, Mapping) else None
        fits = config_name(stored)
        name = fits or (f"{recorded!r} as the run recorded it" if isinstance(recorded, str) else None)
        hint = f"they hold their own config ({name or 'not a shipped one'}): pass no config to use it" + (
            f", or {name}" if name and not name.endswith("recorded it") else ""
        )
    summary = ""
    if exc.counts is not None:
        kinds = zip(exc.counts, ("missing", "unexpected", "of other shapes"))
        summary = ", ".join(f"{n} tensor{'s' if n > 1 else ''} {kind}" for n, kind in kinds if n)
    return WeightsMismatchError(
        f"weights {label} do not fit {target} ({detail}); {hint}",
        detail=detail,
        fits=fits,
        recorded=stored is not None,
        summary=summary,
    )


def load_pretrained(
    model: nn.Module,
    pretrained: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    model_name: str | None = None,
) -> Path:
    """Load `pretrained` (see the module doc) into `model`, strictly; returns the local file read."""
    path = resolve_pretrained(pretrained, cache_dir)
    load_weights(model, read_weights(path, str(pretrained)), str(pretrained), model_name)
    return path
