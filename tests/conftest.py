"""Fixtures shared across the test packages."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

# The suite runs on xdist workers sharing the cores (one more than the cores, see
# pytest_xdist_auto_num_workers below): one intra-op thread in each test process and in every
# process it starts, or the workers' thread pools contend for the same cores (about 40 CPU-s of
# the whole run, measured). Set before torch is first imported; a user's value stays.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from safetensors.torch import save_file

from src.open_alip import create_model_and_transforms

TINY = "RWKV_CLIP_tiny"


@dataclass(frozen=True)
class TinyWeights:
    """A tiny RWKV-CLIP with random weights, its transforms, and those weights saved as safetensors."""

    model: torch.nn.Module
    preprocess_train: object
    preprocess_val: object
    path: Path

    @property
    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()


def save_safetensors(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker more than the usable cores. Many tests spend part of their time waiting
    (local servers, retry pauses, child processes starting), and the extra worker fills those
    pauses: on 2 cores, 3 workers finish the suite 20 s sooner than 2 (5:04 against 5:25)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores + 1


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> TinyWeights:
    """Built once per test process; tests must not change the model in place."""
    torch.manual_seed(9)
    model, preprocess_train, preprocess_val = create_model_and_transforms(TINY)
    model.eval()
    path = save_safetensors(model, tmp_path_factory.mktemp("tiny_weights") / "tiny.safetensors")
    return TinyWeights(model, preprocess_train, preprocess_val, path)


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """A clean huggingface_hub environment: no HF_* settings or token, its cache under tmp_path,
    online. Returns the hub cache folder."""
    for name in list(os.environ):
        if name.startswith(("HF_", "HUGGING_FACE")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return tmp_path / "hf_home" / "hub"


# -- order: the longest files first ------------------------------------------------------------
# xdist hands whole files (--dist loadfile) to the workers in collection order. A long file that
# starts last keeps one worker busy while the others have finished; started first, the short
# files fill in around it. Each file's time is kept in pytest's cache after a full run; where the
# cache has none (a fresh clone, CI), tests/file_seconds.json has the times of a full run here
# (copied from the cache); a file in neither goes first if it has a `slow` test.
_FILE_SECONDS = "rwkv_clip/file_seconds"
_SEED_SECONDS = Path(__file__).with_name("file_seconds.json")


def _test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items) -> None:
    known = json.loads(_SEED_SECONDS.read_text()) if _SEED_SECONDS.is_file() else {}
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    known.update(cache.get(_FILE_SECONDS, {}) if cache is not None else {})
    weight: dict[str, float] = {}
    for item in items:
        name = _test_file(item.nodeid)
        slow = 1e6 if item.get_closest_marker("slow") else 0.0
        weight[name] = max(weight.get(name, 0.0), known.get(name, slow))
    # A stable sort: files of equal weight, and the tests within a file, keep their order.
    items.sort(key=lambda item: -weight[_test_file(item.nodeid)])


_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    _seconds[_test_file(report.nodeid)] = _seconds.get(_test_file(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus) -> None:
    # Only the process that sees every file's reports (xdist's controller, or a run without xdist)
    # writes, only for a run of the whole suite (a run of one file is timed under other conditions),
    # and over the old times: a run with -k leaves the files it did not run as they were.
    config = session.config
    cache = getattr(config, "cache", None)
    if cache is None or hasattr(config, "workerinput") or config.args != config.getini("testpaths"):
        return
    if _seconds:
        times = {**cache.get(_FILE_SECONDS, {}), **{name: round(s, 1) for name, s in _seconds.items()}}
        cache.set(_FILE_SECONDS, dict(sorted(times.items())))
