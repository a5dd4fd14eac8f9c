"""The launch scripts: torchrun's rendezvous from environment variables, the original's
recipe as --recipe, the flags read with train.py's own parser, DATA_ROOT's shards (and what
is left out), the GPU count, and clear one-line errors (DRY_RUN prints the command instead
of running it); a node without a GPU refused, and a rank's one-line error printed last when the
run is real."""

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.corpora import write_colour_records
from src import install
from src.training import launch
from src.training.config import RECIPES, TrainConfig
from src.training.params import parse_config
from tests._repo import REPO

SCRIPTS = {
    "B32": REPO / "shell" / "train_RWKV_CLIP_B32_YFCC15M.sh",
    "B16": REPO / "shell" / "train_RWKV_CLIP_B16_YFCC15M.sh",
}
ARCHITECTURE_FLAGS = (
    "--input-size",
    "--image-depth",
    "--image-embed-dims",
    "--image-patch-size",
    "--drop-path-rate",
    "--ctx-len",
    "--vocab-size",
    "--head-size",
    "--n-embd",
    "--n-layer",
    "--text-initialization",
)


def _script(name: str, cwd: Path, *args: str, path_prefix: Path | None = None, **env: str):
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "NNODES",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NPROC_PER_NODE",
            "DATA_ROOT",
            "CUDA_VISIBLE_DEVICES",
        )
    }
    # The scripts' own python (this venv's), so a test machine's PATH does not matter.
    clean["PYTHON"] = sys.executable
    if path_prefix is not None:
        clean["PATH"] = f"{path_prefix}{os.pathsep}{clean['PATH']}"
    return subprocess.run(
        ["bash", str(SCRIPTS[name]), *args],
        cwd=cwd,
        env={**clean, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def launcher(monkeypatch, capsys):
    """src/training/launch.py, which the scripts exec, run in this process (a script run imports
    torch afresh, seconds each) as the B/32 script calls it; returns (exit code, stdout, stderr)."""

    def run(cwd: Path, *args: str, path_prefix: Path | None = None, **env: str):
        monkeypatch.chdir(cwd)
        if path_prefix is not None:
            monkeypatch.setenv("PATH", f"{path_prefix}{os.pathsep}{os.environ['PATH']}")
        argv = ["--recipe", "rwkv_clip_b32_yfcc15m", "--output", "out", *args]
        try:
            code = launch.main(argv, {"DRY_RUN": "1", "TRAIN_SCRIPT_NAME": SCRIPTS["B32"].name, **env})
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return run


def _flag(cmd: list[str], name: str) -> str:
    """The value of the *last* occurrence of a flag (argparse keeps the last one)."""
    return cmd[len(cmd) - 1 - cmd[::-1].index(name) + 1]


def _shard(folder: Path, name: str, records: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.rec").write_bytes(b"")
    (folder / f"{name}.idx").write_text("".join(f"{i}\t{8 * i}\n" for i in range(records)))
    return folder / f"{name}.rec"


def _train_data(cmd: list[str]) -> list[str]:
    start = cmd.index("--train-data") + 1
    end = next(i for i in range(start, len(cmd)) if cmd[i].startswith("--"))
    return cmd[start:end]


def _train_config(cmd: list[str]) -> TrainConfig:
    """What train.py will run with: the command's train.py arguments through its own parser."""
    return parse_config(cmd[cmd.index(str(REPO / "train.py")) + 1 :])


@pytest.fixture
def data_root(tmp_path) -> Path:
    root = tmp_path / "YFCC15M"
    _shard(root, "datarec", 7)  # where `python data2rec.py` puts it
    return root


def test_b32_script_passes_the_recipe(data_root):
    # DATA_ROOT defaults to ./YFCC15M, relative to where the script is run.
    proc = _script("B32", data_root.parent, NPROC_PER_NODE="8")
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    cmd = [w for w in cmd if not w.split("=", 1)[0].endswith("_CACHE_DIR")]  # the env prefix
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nnodes"]
    assert [_flag(cmd, f) for f in ("--nnodes", "--node_rank", "--nproc_per_node", "--master_port")] == [
        "1",
        "0",
        "8",
        "23760",
    ]
    assert _train_data(cmd) == ["YFCC15M/datarec.rec"]
    assert {k: _flag(cmd, k) for k in ("--recipe", "--resume", "--output")} == {
        "--recipe": "rwkv_clip_b32_yfcc15m",
        "--resume": "latest",
        "--output": "./output/RWKV_CLIP_B32_YFCC15M",
    }
    cfg = _train_config(cmd)
    assert {k: getattr(cfg, k) for k in RECIPES["rwkv_clip_b32_yfcc15m"].values} == RECIPES[
        "rwkv_clip_b32_yfcc15m"
    ].values
    assert not [f for f in ARCHITECTURE_FLAGS if f in cmd]  # the architecture is the JSON's alone
    assert Path(cmd[cmd.index("--master_port") + 2]) == REPO / "train.py"
    assert "training on 1 shard(s), 7 records" in proc.stderr and "NOTICE" not in proc.stderr


def test_b16_multi_node_from_environment_and_pass_through_flags(data_root, tmp_path):
    # --global-batch-size given as --flag=value: the launcher reads it with train.py's parser.
    proc = _script(
        "B16",
        tmp_path,
        "--batch-size",
        "128",
        "--global-batch-size=1024",
        DATA_ROOT=str(data_root),
        NNODES="4",
        NODE_RANK="3",
        MASTER_ADDR="10.1.2.3",
        MASTER_PORT="29400",
        NPROC_PER_NODE="8",
    )
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    got = {
        f: _flag(cmd, f)
        for f in ("--nnodes", "--node_rank", "--master_addr", "--master_port", "--recipe", "--output")
    }
    assert got == {
        "--nnodes": "4",
        "--node_rank": "3",
        "--master_addr": "10.1.2.3",
        "--master_port": "29400",
        "--recipe": "rwkv_clip_b16_yfcc15m",
        "--output": "./output/RWKV_CLIP_B16_YFCC15M",
    }
    cfg = _train_config(cmd)
    assert (cfg.config, cfg.batch_size, cfg.global_batch_size, cfg.lr) == ("RWKV_CLIP_B16", 128, 1024, 1e-3)
    # Another global batch is announced (by the launcher, computed in Python); another micro-batch
    # is not: it changes speed and memory, not what is trained.
    notices = [line for line in proc.stderr.splitlines() if "NOTICE" in line]
    assert notices == [
        "train_RWKV_CLIP_B16_YFCC15M.sh: NOTICE: --global-batch-size 1024 replaces the recipe's 4096 "
        "(512 per GPU x 8 GPUs in the paper's run); the contrastive batch, and so the results, will "
        "differ"
    ]


def test_the_launcher_reads_the_flags_with_train_py_parser(data_root, tmp_path):
    elsewhere = _shard(tmp_path / "other", "part", 3)
    config, scan = launch.resolve_train_args(
        [
            "--recipe",
            "rwkv_clip_b32_yfcc15m",
            "--output=runs/x",
            "--device=cpu",
            "--data-backend=torch",
            "--lr=2e-3",
            "--gradient-acc",
            "2",
        ],
        str(data_root),
    )
    assert (config.output, config.device, config.data_backend, config.lr, config.accum_freq) == (
        Path("runs/x"),
        "cpu",
        "torch",
        2e-3,
        2,
    )
    assert config.train_data == (str(data_root / "datarec.rec"),) and scan.records == 7
    # --train-data given (here as --flag=value) replaces DATA_ROOT, which is then not read at all.
    config, scan = launch.resolve_train_args([f"--train-data={elsewhere}", "--output", "o"], "/nonexistent")
    assert config.train_data == (str(elsewhere),) and scan is None


def test_a_given_train_data_replaces_data_root(tmp_path, launcher):
    elsewhere = _shard(tmp_path / "other", "part", 3)
    proc = launcher(tmp_path, "--train-data", str(elsewhere), DATA_ROOT="/nonexistent", NPROC_PER_NODE="1")
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    assert cmd.count("--train-data") == 1 and _train_config(cmd).train_data == (str(elsewhere),)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--batch-size", "0"], 2, "train_RWKV_CLIP_B32_YFCC15M.sh: --batch-size 0: must be at least 1\n"),
        (["--config=RWKV_CLIP_B64"], 2, "train_RWKV_CLIP_B32_YFCC15M.sh: --config RWKV_CLIP_B64: "),
        (["--lr-scheduler", "step"], 2, "train.py: error: argument --lr-scheduler: invalid choice: 'step'"),
        (["--recipe", "b32"], 2, "train.py: error: argument --recipe: invalid choice: 'b32'"),
    ],
)
def test_a_bad_flag_fails_before_torchrun_starts(data_root, launcher, args, code, message):
    proc = launcher(data_root.parent, *args, NPROC_PER_NODE="1")
    assert proc.returncode == code and proc.stdout == "", proc.stdout
    assert message in proc.stderr


def test_data_root_takes_the_shards_in_its_folders_and_says_what_it_leaves_out(tmp_path, launcher):
    root = tmp_path / "YFCC15M"
    shards = [_shard(root, "part-2", 3), _shard(root, "part-10", 5)]  # in the order a person numbers them
    _shard(root, "val", 50)  # an evaluation shard beside the training ones
    (root / "stray.rec").write_bytes(b"")  # a copy cut short: no .idx
    (root / "train-00000.parquet").write_bytes(b"")
    _shard(root / "data" / "deeper", "elsewhere", 9)  # not scanned: no deep search
    extra = _shard(tmp_path / "more", "extra", 4)
    data_root = f"{root}:{extra.with_suffix('')}"  # a folder and a shard prefix
    proc = launcher(tmp_path, DATA_ROOT=data_root, NPROC_PER_NODE="1")
    assert proc.returncode == 0, proc.stderr
    assert _train_data(shlex.split(proc.stdout)) == [str(p) for p in [*shards, extra]]
    err = proc.stderr
    assert "training on 3 shard(s), 12 records:" in err
    assert f"{shards[1]}  5 records" in err and f"{extra}  4 records" in err
    assert f"ignored {root}: 1 parquet file(s)" in err
    assert f"ignored {root / 'val.rec'}: named like an evaluation shard" in err
    assert f"ignored {root / 'stray.rec'}: no stray.idx beside it" in err
    assert "elsewhere" not in err


def test_a_folder_whose_shards_sit_one_level_down_gets_a_hint(tmp_path, launcher):
    _shard(tmp_path / "YFCC15M" / "rec", "datarec", 2)
    proc = launcher(tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("train_RWKV_CLIP_B32_YFCC15M.sh: DATA_ROOT=YFCC15M holds no training")
    assert "put that folder in DATA_ROOT" in proc.stderr and "YFCC15M/rec" in proc.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DATA_ROOT": "/nonexistent/yfcc"}, "DATA_ROOT entry /nonexistent/yfcc is neither a folder nor"),
        ({"NNODES": "two"}, "NNODES=two is not a whole number"),
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2 must be below NNODES=2"),
        (
            {"NNODES": "2"},
            "MASTER_ADDR=127.0.0.1 is a loopback address, so with NNODES=2 every node would wait",
        ),
        ({"NNODES": "3", "MASTER_ADDR": "localhost"}, "MASTER_ADDR=localhost is a loopback address"),
        ({"NNODES": "2", "MASTER_ADDR": "::1"}, "MASTER_ADDR=::1 is a loopback address"),
        ({"NNODES": "2", "MASTER_ADDR": "0.0.0.0"}, "MASTER_ADDR=0.0.0.0 is the unspecified address"),
    ],
)
def test_bad_environment_is_one_clear_line(data_root, launcher, env, message):
    proc = launcher(data_root.parent, **{"DATA_ROOT": str(data_root), **env})
    assert proc.returncode == 2
    assert proc.stderr.startswith("train_RWKV_CLIP_B32_YFCC15M.sh: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_gpu_node_with_a_cpu_only_torch_fails_with_the_fix(data_root, tmp_path, launcher):
    # A stub nvidia-smi lists 8 GPUs; this venv's torch is the CPU build.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "nvidia-smi"
    stub.write_text(
        '#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done\n'
    )
    stub.chmod(0o755)
    proc = launcher(data_root.parent, path_prefix=bin_dir)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "this node has 8 GPU(s) (nvidia-smi -L) but" in proc.stderr and "a CPU-only build" in proc.stderr
    assert f"replace torch with a CUDA build: `{sys.executable} -m pip uninstall -y torch && " in proc.stderr
    assert "install torch --index-url https://download.pytorch.org/whl/cu130`" in proc.stderr
    assert "then run `make`" in proc.stderr and "adds the DALI for its CUDA version" in proc.stderr
    # Training on the CPU on purpose is still possible (also written --device=cpu).
    assert launcher(data_root.parent, "--device", "cpu", path_prefix=bin_dir).returncode == 0
    assert launcher(data_root.parent, "--device=cpu", path_prefix=bin_dir).returncode == 0


def _fake_cuda_torch(monkeypatch, visible: int, listed: int, dali: list[str], cuda: str = "12.4"):
    # No GPU can run here: torch is made to look like a CUDA build that sees `visible` GPUs, and the
    # installed DALI distributions are the ones named.
    import torch

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(launch, "nvidia_smi_gpus", lambda: listed)
    monkeypatch.setattr(install, "installed_dali", lambda: dali)


def _config(*flags: str) -> TrainConfig:
    return parse_config(["--train-data", "d", "--output", "o", *flags])


def test_gpus_are_counted_by_torch_so_cuda_visible_devices_holds(monkeypatch):
    _fake_cuda_torch(monkeypatch, visible=4, listed=8, dali=["nvidia-dali-cuda120"])
    assert launch.count_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, _config()) == 4
    assert launch.count_gpus({}, _config("--device=cpu")) == 0
    _fake_cuda_torch(monkeypatch, visible=8, listed=8, dali=["nvidia-dali-cuda120"], cuda="13.0")
    py = sys.executable
    with pytest.raises(launch.LaunchError) as wrong:
        launch.count_gpus({}, _config())
    assert str(wrong.value) == (
        "torch is built for CUDA 13.0 but the installed DALI is nvidia-dali-cuda120; replace it with "
        f"`{py} -m pip uninstall -y nvidia-dali-cuda120 && {py} -m pip install "
        "'nvidia-dali-cuda130>=2.4.0'`, or use --data-backend torch"
    )
    assert launch.count_gpus({}, _config("--data-backend", "torch")) == 8
    # Both variants share nvidia/dali: the advice removes both, then installs the one for torch.
    _fake_cuda_torch(
        monkeypatch, visible=8, listed=8, dali=["nvidia-dali-cuda120", "nvidia-dali-cuda130"], cuda="13.0"
    )
    with pytest.raises(launch.LaunchError) as both:
        launch.count_gpus({}, _config())
    assert str(both.value).startswith("nvidia-dali-cuda120 and nvidia-dali-cuda130 are installed together")
    assert f"`{py} -m pip uninstall -y nvidia-dali-cuda120 nvidia-dali-cuda130`" in str(both.value)
    assert f"install nvidia-dali-cuda130 with `{py} -m pip install 'nvidia-dali-cuda130>=2.4.0'`" in str(
        both.value
    )
    _fake_cuda_torch(monkeypatch, visible=8, listed=8, dali=[], cuda="11.8")
    with pytest.raises(
        launch.LaunchError, match="built for CUDA 11.8, and DALI has wheels for CUDA 12 and 13 only"
    ):
        launch.count_gpus({}, _config())
    _fake_cuda_torch(monkeypatch, visible=0, listed=8, dali=["nvidia-dali-cuda120"])
    with pytest.raises(launch.LaunchError, match="sees none of the 8 GPU"):
        launch.count_gpus({}, _config())
    assert launch.count_gpus({"CUDA_VISIBLE_DEVICES": ""}, _config()) == 0  # hidden on purpose


def test_record_counts_come_from_the_index(tmp_path):
    idx = tmp_path / "a.idx"
    idx.write_text("0\t0\n1\t8\n2\t16")  # no newline after the last line
    assert launch.count_records(idx) == 3
    idx.write_text("")
    assert launch.count_records(idx) == 0


def test_several_nodes_need_nproc_per_node(data_root, launcher):
    proc = launcher(data_root.parent, DATA_ROOT=str(data_root), NNODES="2", MASTER_ADDR="10.1.2.3")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "NNODES=2 needs NPROC_PER_NODE" in proc.stderr and "export NPROC_PER_NODE=" in proc.stderr


def test_compile_caches_go_to_node_local_disk_unless_set(data_root, launcher, tmp_path):
    proc = launcher(data_root.parent, DATA_ROOT=str(data_root), NPROC_PER_NODE="1", USER="ann")
    assert proc.returncode == 0, proc.stderr
    env = dict(w.split("=", 1) for w in shlex.split(proc.stdout) if w.split("=", 1)[0].endswith("CACHE_DIR"))
    assert Path(env["TRITON_CACHE_DIR"]).parent.name == "rwkv-clip-ann"
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == Path(env["TRITON_CACHE_DIR"]).parent
    mine = str(tmp_path / "my cache")
    proc = launcher(data_root.parent, DATA_ROOT=str(data_root), NPROC_PER_NODE="1", TRITON_CACHE_DIR=mine)
    assert "TRITON_CACHE_DIR" not in proc.stdout and "TORCHINDUCTOR_CACHE_DIR=" in proc.stdout


def test_a_data_root_path_with_a_space(tmp_path, launcher):
    one = _shard(tmp_path / "my shards", "a", 3)
    two = _shard(tmp_path / "more shards", "b", 4)
    proc = launcher(tmp_path, DATA_ROOT=str(tmp_path / "my shards"), NPROC_PER_NODE="1")
    assert proc.returncode == 0, proc.stderr
    assert _train_data(shlex.split(proc.stdout)) == [str(one)]
    proc = launcher(
        tmp_path, DATA_ROOT=f"{tmp_path / 'my shards'}:{tmp_path / 'more shards'}", NPROC_PER_NODE="1"
    )
    assert proc.returncode == 0, proc.stderr
    assert _train_data(shlex.split(proc.stdout)) == [str(one), str(two)]


def test_a_node_without_a_gpu_is_refused_before_torchrun_starts(data_root, monkeypatch, capsys):
    # This machine has no GPU (its torch is the CPU build): the recipe's run is refused, not started.
    monkeypatch.chdir(data_root.parent)
    monkeypatch.setattr(launch, "run_torchrun", lambda *a: pytest.fail("torchrun started"))
    code = launch.main(
        ["--recipe", "rwkv_clip_b32_yfcc15m", "--output", "out"],
        {"TRAIN_SCRIPT_NAME": SCRIPTS["B32"].name, "NPROC_PER_NODE": "2"},
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("train_RWKV_CLIP_B32_YFCC15M.sh: this node has no GPU to train on (torch ")
    assert "pass --device cpu to train on the CPU on purpose" in err


def test_a_ranks_one_line_error_is_the_runs_last_line(tmp_path):
    # Two real ranks on the CPU, on purpose; 24 records make no batch of the recipe: each rank stops
    # on a UserError, and the launcher ends on that line instead of torchrun's traceback.
    write_colour_records(tmp_path / "data" / "part", 24)
    clean = {
        k: v for k, v in os.environ.items() if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "DATA_ROOT")
    }
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.run(
        ["bash", str(SCRIPTS["B32"]), "--device", "cpu", "--batch-size", "16"],
        cwd=tmp_path,
        env={
            **clean,
            "PYTHON": sys.executable,
            "DATA_ROOT": "data",
            "NPROC_PER_NODE": "2",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: ") and "make no full batch of 16" in last, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
