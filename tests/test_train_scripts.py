"""The launch scripts: torchrun's rendezvous from environment variables, the original's
hyper-parameters, pass-through flags, and clear errors (DRY_RUN prints the command)."""


import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {"B32": REPO / "shell" / "train_RWKV_CLIP_B32_YFCC15M.sh",
           "B16": REPO / "shell" / "train_RWKV_CLIP_B16_YFCC15M.sh"}


def _script(name: str, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "DATA_ROOT")}
    return subprocess.run(["bash", str(SCRIPTS[name]), *args], cwd=cwd, env={**clean, "DRY_RUN": "1", **env},
                          capture_output=True, text=True, timeout=60)


def _flag(cmd: list[str], name: str) -> str:
    """The value of the *last* occurrence of a flag (argparse keeps the last one)."""
    return cmd[len(cmd) - 1 - cmd[::-1].index(name) + 1]


@pytest.fixture
def data_root(tmp_path) -> Path:
    root = tmp_path / "YFCC15M"
    for part in ("a", "b/c"):
        (root / part).mkdir(parents=True)
        (root / part / "shard-0.rec").write_bytes(b"")
        (root / part / "shard-0.idx").write_bytes(b"")
    return root


def test_b32_defaults_single_node(data_root):
    # DATA_ROOT defaults to ./YFCC15M, relative to where the script is run.
    proc = _script("B32", data_root.parent, NPROC_PER_NODE="8")
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nnodes"]
    assert [_flag(cmd, f) for f in ("--nnodes", "--node_rank", "--nproc_per_node", "--master_port")] == \
        ["1", "0", "8", "23760"]
    assert cmd[cmd.index("--train-data") + 1 : cmd.index("--train-data") + 3] == ["./YFCC15M/a", "./YFCC15M/b/c"]
    want = {"--config": "RWKV_CLIP_B32", "--image-patch-size": "32", "--batch-size": "512", "--lr": "1e-3",
            "--weight-decay": "0.2", "--epochs": "32", "--precision": "bf16", "--drop-path-rate": "0.3",
            "--resume": "latest", "--output": "./output/RWKV_CLIP_B32_YFCC15M"}
    assert {k: _flag(cmd, k) for k in want} == want
    assert Path(cmd[cmd.index("--master_port") + 2]) == REPO / "train.py"


def test_b16_multi_node_from_environment_and_pass_through_flags(data_root, tmp_path):
    proc = _script("B16", tmp_path, "--batch-size", "256", "--accum-freq", "2", DATA_ROOT=str(data_root),
                   NNODES="4", NODE_RANK="3", MASTER_ADDR="10.1.2.3", MASTER_PORT="29400", NPROC_PER_NODE="8")
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    got = {f: _flag(cmd, f) for f in ("--nnodes", "--node_rank", "--master_addr", "--master_port",
                                      "--config", "--image-patch-size", "--batch-size", "--accum-freq")}
    assert got == {"--nnodes": "4", "--node_rank": "3", "--master_addr": "10.1.2.3", "--master_port": "29400",
                   "--config": "RWKV_CLIP_B16", "--image-patch-size": "16", "--batch-size": "256",
                   "--accum-freq": "2"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DATA_ROOT": "/nonexistent/yfcc"}, "DATA_ROOT=/nonexistent/yfcc is not a folder"),
        ({"NNODES": "two"}, "NNODES=two is not a whole number"),
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2 must be below NNODES=2"),
    ],
)
def test_bad_environment_is_one_clear_line(data_root, env, message):
    proc = _script("B32", data_root.parent, **{"DATA_ROOT": str(data_root), **env})
    assert proc.returncode == 2
    assert proc.stderr.startswith("train_RWKV_CLIP_B32_YFCC15M.sh: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_folder_without_shards_is_refused(tmp_path):
    proc = _script("B16", tmp_path, DATA_ROOT=str(tmp_path))
    assert proc.returncode == 2 and "no .rec files under DATA_ROOT" in proc.stderr
    assert proc.stderr.startswith("train_RWKV_CLIP_B16_YFCC15M.sh: ")
