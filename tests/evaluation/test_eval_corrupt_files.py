"""Paper-dataset files that are crafted or broken: the CIFAR pickles are read by a restricted
unpickler (src/evaluation/safe_pickle.py) that builds only containers and numpy arrays, and every
broken file gives one line naming it, through zero_shot.py as well."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest

import zero_shot
from src.evaluation.datasets import EvalDataError
from src.evaluation.paper_datasets import find_paper_dataset, read_paper_dataset
from src.evaluation.safe_pickle import ForbiddenGlobal, restricted_load
from tests import _eval_layouts as layouts


class _RunsACommand:
    """Pickles as a call of os.system, the attack plain pickle.load would carry out."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _read_cifar10(root):
    return read_paper_dataset(find_paper_dataset("cifar10"), root)


def test_restricted_load_reads_numpy_arrays_of_every_protocol():
    data = {b"data": np.arange(12, dtype=np.uint8).reshape(2, 6), b"labels": [1, 0], b"names": [b"a", "b"]}
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        loaded = restricted_load(io.BytesIO(pickle.dumps(data, protocol=protocol)))
        assert np.array_equal(loaded[b"data"], data[b"data"]) and loaded[b"labels"] == [1, 0]
    # the CIFAR files themselves were written with numpy 1.x, which names numpy.core
    old = pickle.dumps(data, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in old and np.array_equal(
        restricted_load(io.BytesIO(old))[b"data"], data[b"data"]
    )


def test_a_crafted_batches_meta_is_refused_and_runs_nothing(tmp_path):
    layouts.write_cifar(tmp_path, "cifar10", [1, 2])
    marker = tmp_path / "ran"
    meta = tmp_path / "cifar-10-batches-py" / "batches.meta"
    meta.write_bytes(pickle.dumps({b"label_names": _RunsACommand(marker)}, protocol=2))
    with pytest.raises(ForbiddenGlobal, match=r"asks for posix\.system"):
        restricted_load(io.BytesIO(meta.read_bytes()))
    with pytest.raises(EvalDataError) as info:
        _read_cifar10(tmp_path)
    message = str(info.value)
    assert message.startswith(f"CIFAR file {meta}: refusing to load it: it asks for posix.system")
    assert "\n" not in message and not marker.exists()


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda b: b[: len(b) // 2], "is truncated or not a CIFAR pickle"),
        (lambda b: b"not a pickle at all", "is truncated or not a CIFAR pickle"),
        (lambda b: pickle.dumps([1, 2, 3]), "is not a CIFAR pickle (no data, labels)"),
        (
            lambda b: pickle.dumps({b"data": np.zeros(7, np.uint8), b"labels": [0]}),
            "malformed data or labels",
        ),
    ],
)
def test_a_broken_cifar_batch_is_one_line_naming_it(tmp_path, damage, needle):
    layouts.write_cifar(tmp_path, "cifar10", [1, 2])
    batch = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(damage(batch.read_bytes()))
    with pytest.raises(EvalDataError) as info:
        _read_cifar10(tmp_path)
    message = str(info.value)
    assert message.startswith(f"CIFAR file {batch}") and needle in message and "\n" not in message


@pytest.mark.parametrize(
    "content,needle",
    [
        (b'{"apple_pie": ["apple_pie/1"', "is not valid JSON"),
        (b'["apple_pie/1"]', "is not a {class: [image id"),
        (b"\xff\xfe\x00", "is not valid JSON"),
    ],
)
def test_a_broken_food101_split_file_is_one_line_naming_it(tmp_path, content, needle):
    layouts.write_food101(tmp_path)
    split_file = tmp_path / "food-101" / "meta" / "test.json"
    split_file.write_bytes(content)
    with pytest.raises(EvalDataError) as info:
        read_paper_dataset(find_paper_dataset("food101"), tmp_path)
    message = str(info.value)
    assert str(split_file) in message and needle in message and "\n" not in message


def test_zero_shot_cli_reports_a_truncated_cifar_file_in_one_line(tmp_path, capsys):
    layouts.write_cifar(tmp_path, "cifar100", [1, 2])
    meta = tmp_path / "cifar-100-python" / "meta"
    meta.write_bytes(meta.read_bytes()[:10])
    rc = zero_shot.main(
        [
            "--random-init",
            "--model-name",
            "RWKV_CLIP_tiny",
            "--datasets",
            f"cifar100={tmp_path}",
            "--output-dir",
            str(tmp_path / "out"),
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith(f"zero_shot.py: error: CIFAR file {meta} is truncated or not a CIFAR pickle")


def test_a_binary_split_file_is_one_line_naming_it(tmp_path):
    layouts.write_dtd(tmp_path)
    split_file = tmp_path / "dtd" / "dtd" / "labels" / "test1.txt"
    split_file.write_bytes(b"\x89PNG\r\n\x1a\n\xff\x00")
    with pytest.raises(EvalDataError) as info:
        read_paper_dataset(find_paper_dataset("dtd"), tmp_path)
    message = str(info.value)
    assert message.startswith(f"dtd: {split_file} is not a text file") and "\n" not in message
