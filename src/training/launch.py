"""What shell/_launch_train.sh does before it starts torchrun, in Python so it can be tested:
read the environment, resolve the train.py flags with train.py's own parser (so a bad flag or
value fails here, on one line, before any process starts), count this node's GPUs, find the
training shards under DATA_ROOT, and build the torchrun command; then run torchrun in this
process, so that a rank that stops on a user's mistake ends the run with its one line, last,
instead of torchrun's traceback.

    python -m src.training.launch [train.py flags...]     (the shell script runs this)

Environment: DATA_ROOT [./YFCC15M], NNODES [1], NODE_RANK [0], MASTER_ADDR [127.0.0.1],
MASTER_PORT [23760], NPROC_PER_NODE [the GPUs torch sees, else 1], DRY_RUN [print the
command instead of running it], TRAIN_SCRIPT_NAME [the name errors start with].

DATA_ROOT is one or more folders, `.rec` files or shard prefixes, separated by spaces or
colons. A path holding a space is given alone, or with the others separated by colons
(`DATA_ROOT="/data/my shards:/data/more"`): with a colon present, spaces are part of the paths.
A folder means the shards directly in it (no deeper), by the same rule as the loader's
(src/shard_names.py: evaluation shards named `val*` and a `.rec` or `.idx` without its partner
are left out); the launcher says what it leaves out, parquet files (data2rec.py's input) too.
A file or prefix named explicitly is taken as it is. A `--train-data` flag, if given,
replaces DATA_ROOT.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from src import install
from src.errors import UserError
from src.shard_names import DEFAULT_DATASET, IDX, REC, pair, scan_folder
from src.training.config import TrainConfig, recipe_notices
from src.training.params import build_parser, resolve

REPO = Path(__file__).resolve().parents[2]
_LISTED = 20  # shards listed one per line; more are summarised


class LaunchError(UserError):
    """A launch setting that cannot work (the message names the variable and the fix)."""


# Where each rank leaves the one line of the UserError it stopped on (train.py writes it), for
# the launcher to print last. Set by the launcher for the run it starts.
ERRORS_ENV = "RWKV_CLIP_LAUNCH_ERRORS"


def leave_error_for_launcher(line: str, environ: Mapping[str, str] | None = None) -> None:
    """Under this launcher, keep a rank's one-line error where the launcher reads it."""
    environ = os.environ if environ is None else environ
    folder = environ.get(ERRORS_ENV)
    if not folder:
        return
    try:
        (Path(folder) / f"rank{environ.get('RANK', '0')}.txt").write_text(line + "\n", encoding="utf-8")
    except OSError:
        pass  # the line is on the rank's stderr as well


# --- the environment ------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchEnv:
    data_root: str
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc_per_node: int | None  # None: count this node's GPUs


def _whole(environ: Mapping[str, str], name: str, default: str) -> int:
    value = environ.get(name) or default
    if not re.fullmatch(r"[0-9]+", value):
        raise LaunchError(f"{name}={value} is not a whole number; fix the environment variable")
    return int(value)


def unreachable_kind(address: str) -> str | None:
    """What `address` is when no other machine can reach it ('a loopback address'), else None."""
    if address.strip().lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return "a loopback address"
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None  # a host name: only the network knows
    return (
        "a loopback address" if ip.is_loopback else "the unspecified address" if ip.is_unspecified else None
    )


def read_env(environ: Mapping[str, str]) -> LaunchEnv:
    nnodes = _whole(environ, "NNODES", "1")
    node_rank = _whole(environ, "NODE_RANK", "0")
    port = _whole(environ, "MASTER_PORT", "23760")
    nproc = _whole(environ, "NPROC_PER_NODE", "0") if environ.get("NPROC_PER_NODE") else None
    if nnodes < 1:
        raise LaunchError(f"NNODES={nnodes} must be at least 1")
    if node_rank >= nnodes:
        raise LaunchError(f"NODE_RANK={node_rank} must be below NNODES={nnodes}")
    if nproc == 0:
        raise LaunchError("NPROC_PER_NODE=0 starts no process; leave it unset to use every GPU")
    addr = environ.get("MASTER_ADDR") or "127.0.0.1"
    kind = unreachable_kind(addr)
    if nnodes > 1 and kind:
        raise LaunchError(
            f"MASTER_ADDR={addr} is {kind}, so with NNODES={nnodes} every node would wait for "
            "itself; set MASTER_ADDR to node 0's address that the other nodes reach (its hostname or IP)"
        )
    if nnodes > 1 and nproc is None:
        # torchrun's static rendezvous needs the same process count on every node; counting
        # each node's GPUs would start a run that hangs when the counts differ.
        raise LaunchError(
            f"NNODES={nnodes} needs NPROC_PER_NODE (the processes per node, the same on every "
            "node); export NPROC_PER_NODE=<GPUs per node>"
        )
    return LaunchEnv(environ.get("DATA_ROOT") or f"./{DEFAULT_DATASET}", nnodes, node_rank, addr, port, nproc)


# --- GPUs -----------------------------------------------------------------------------------


def nvidia_smi_gpus() -> int:
    """GPUs the driver lists (`nvidia-smi -L`), whatever CUDA_VISIBLE_DEVICES says; 0 without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def count_gpus(environ: Mapping[str, str], config: TrainConfig, *, needed: bool = True) -> int:
    """The GPUs this node's processes can use, counted by torch (so CUDA_VISIBLE_DEVICES holds).

    A node whose driver lists GPUs while torch cannot use them would otherwise train on
    the CPU without a word: that fails here, with the fix. `needed=False` (the process
    count is set) skips importing torch when the driver lists no GPU.
    """
    if config.device == "cpu":
        return 0
    listed = nvidia_smi_gpus()
    if not listed and not needed:
        return 0
    import torch

    cuda = torch.version.cuda
    if cuda is None:
        if listed:
            raise LaunchError(
                f"this node has {listed} GPU(s) (nvidia-smi -L) but {sys.executable} has torch "
                f"{torch.__version__}, a CPU-only build: {install.cuda_torch_advice(sys.executable)}; or "
                "pass --device cpu to train on the CPU"
            )
        return 0
    count = torch.cuda.device_count()
    hidden = environ.get("CUDA_VISIBLE_DEVICES") is not None
    if count == 0 and listed and not hidden:
        raise LaunchError(
            f"torch {torch.__version__} (CUDA {cuda}) sees none of the {listed} GPU(s) nvidia-smi lists; "
            "check that the driver supports CUDA " + cuda + " (nvidia-smi shows the highest it supports)"
        )
    if count and config.data_backend == "dali":
        try:
            problem = install.dali_problem(cuda, install.installed_dali(), sys.executable)
        except install.InstallError as e:  # a CUDA version DALI has no wheel for
            raise LaunchError(str(e)) from None
        if problem:
            raise LaunchError(problem)
    return count


# --- shards ---------------------------------------------------------------------------------


@dataclass
class ShardScan:
    shards: list[tuple[Path, int]] = field(default_factory=list)  # (.rec, records)
    ignored: list[tuple[Path, str]] = field(default_factory=list)  # (path, why)

    @property
    def records(self) -> int:
        return sum(n for _, n in self.shards)


def count_records(idx: Path) -> int:
    """Records in a shard: its index has one line per record."""
    lines, last = 0, b"\n"
    with open(idx, "rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def _split_data_root(spec: str) -> list[str]:
    """One path if DATA_ROOT as a whole names one; else colon-separated paths (which may hold
    spaces) when it holds a colon; else space-separated ones."""
    spec = spec.strip()
    if spec and (Path(spec).exists() or pair(spec)[0].is_file()):
        return [spec]
    sep = r":+" if ":" in spec else r"\s+"
    return [part.strip() for part in re.split(sep, spec) if part.strip()]


def _scan_folder(folder: Path, scan: ShardScan) -> None:
    parquet = [p for p in folder.iterdir() if p.is_file() and p.suffix == ".parquet"]
    if parquet:
        scan.ignored.append(
            (folder, f"{len(parquet)} parquet file(s): data2rec.py's input, not training shards")
        )
    found = scan_folder(folder)
    scan.shards += [(rec, count_records(idx)) for rec, idx in found.shards]
    scan.ignored += found.left_out
    if not found.shards:
        below = sorted({p.parent for p in folder.glob(f"*/*{REC}")})
        where = ", ".join(map(str, below[:3]))
        hint = (
            f"; {REC} files are in {where}: put that folder in DATA_ROOT"
            if below
            else "; convert the data with data2rec.py first"
        )
        raise LaunchError(f"DATA_ROOT={folder} holds no training {REC}/{IDX} shards{hint}")


def _take_file(item: str, scan: ShardScan) -> None:
    rec, idx = pair(item)
    if not rec.is_file():
        raise LaunchError(
            f"DATA_ROOT entry {item} is neither a folder nor a .rec file or prefix; "
            "export DATA_ROOT=<folder of .rec/.idx shards>"
        )
    if not idx.is_file():
        raise LaunchError(
            f"DATA_ROOT entry {item}: {rec} has no {idx.name} beside it; rebuild it with data2rec.py"
        )
    scan.shards.append((rec, count_records(idx)))


def find_shards(data_root: str) -> ShardScan:
    """The training shards DATA_ROOT names (see the module docstring)."""
    items = _split_data_root(data_root)
    if not items:
        raise LaunchError("DATA_ROOT is empty; export DATA_ROOT=<folder of .rec/.idx shards>")
    scan = ShardScan()
    for item in items:
        if Path(item).is_dir():
            _scan_folder(Path(item), scan)
        else:
            _take_file(item, scan)
    return scan


def describe_shards(scan: ShardScan) -> list[str]:
    lines = [f"training on {len(scan.shards)} shard(s), {scan.records:,} records:"]
    for rec, n in scan.shards[:_LISTED]:
        lines.append(f"  {rec}  {n:,} records")
    if len(scan.shards) > _LISTED:
        lines.append(f"  ... and {len(scan.shards) - _LISTED} more")
    for path, why in scan.ignored:
        lines.append(f"ignored {path}: {why}")
    return lines


# --- the command ---------------------------------------------------------------------------


def resolve_train_args(train_args: Sequence[str], data_root: str) -> tuple[TrainConfig, ShardScan | None]:
    """train.py's settings for these flags, parsed by train.py's own parser, and the DATA_ROOT
    shards they train on (None: --train-data was given). argparse errors exit 2 as train.py's do."""
    args = build_parser(data_required=False).parse_args(list(train_args))
    if hasattr(args, "train_data"):  # given on the command line (the parser's default is SUPPRESS)
        return resolve(args), None
    scan = find_shards(data_root)
    return resolve(args, train_data=[str(rec) for rec, _ in scan.shards]), scan


def compile_cache_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Triton's and Inductor's cache folders on node-local disk unless the user chose them: their
    defaults sit under the home folder, which on a cluster is often NFS that every node shares
    (slow, and nodes race on the same files)."""
    user = re.sub(r"[^A-Za-z0-9_.-]", "_", environ.get("USER") or str(os.getuid()))
    base = Path(tempfile.gettempdir()) / f"rwkv-clip-{user}"
    wanted = {"TRITON_CACHE_DIR": base / "triton", "TORCHINDUCTOR_CACHE_DIR": base / "inductor"}
    return {k: str(v) for k, v in wanted.items() if not environ.get(k)}


def torchrun_command(
    env: LaunchEnv, nproc: int, scan: ShardScan | None, train_args: Sequence[str]
) -> list[str]:
    data = ["--train-data", *(str(rec) for rec, _ in scan.shards)] if scan else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(env.nnodes),
        "--node_rank",
        str(env.node_rank),
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        env.master_addr,
        "--master_port",
        str(env.master_port),
        str(REPO / "train.py"),
        *data,
        *train_args,
    ]


def check_gpu_node(gpus: int, config: TrainConfig) -> None:
    """A recipe run needs GPUs: a node without one that torch can use is refused (the recipes'
    B/32 on a CPU would take months), unless --device cpu asks for the CPU on purpose."""
    if gpus or config.device == "cpu":
        return
    import torch

    why = (
        f"torch {torch.__version__} is a CPU-only build"
        if torch.version.cuda is None
        else "torch sees no GPU (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them)"
    )
    raise LaunchError(
        f"this node has no GPU to train on ({why}); run the script on a GPU node (README: Training on GPUs), "
        "or pass --device cpu to train on the CPU on purpose (for a small run: python train.py --config "
        "RWKV_CLIP_tiny, docs/training.md)"
    )


def _without_failure_lines(record) -> bool:
    # torchelastic's "failed (exitcode: N) local_rank: ..." line: the run's end says it better.
    return not str(record.msg).startswith("failed (exitcode")


def run_torchrun(cmd: Sequence[str], environ: Mapping[str, str], prog: str) -> int:
    """torchrun (`cmd` as torchrun_command built it) in this process. When ranks fail, the last
    line is the one-line error a rank stopped on (train.py leaves it in ERRORS_ENV's folder), or
    else which rank failed with which exit status; never torchrun's traceback."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    errors = Path(tempfile.mkdtemp(prefix="rwkv-clip-launch-"))
    os.environ.update({**environ, ERRORS_ENV: str(errors)})  # the ranks' environment
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_without_failure_lines)
    try:
        run(parse_args(list(cmd[3:])))
        return 0
    except ChildFailedError as exc:
        failures = sorted(exc.failures.items())
        lines = [(errors / f"rank{rank}.txt") for rank, _ in failures]
        found = list(dict.fromkeys(p.read_text(encoding="utf-8").strip() for p in lines if p.is_file()))
        # The first rank to fail is the cause; the others were stopped by torchrun (negative: a signal).
        first = min(
            (f for _, f in failures),
            key=lambda f: (not (isinstance(f.exitcode, int) and f.exitcode > 0), f.timestamp),
        )
        code = first.exitcode if isinstance(first.exitcode, int) and first.exitcode > 0 else 1
        sys.stdout.flush()
        if found:
            print("\n".join(found), file=sys.stderr)
        else:
            ranks = ", ".join(str(r) for r, _ in failures)
            print(
                f"{prog}: train.py failed on rank(s) {ranks} (exit status {first.exitcode}); its output is "
                "above",
                file=sys.stderr,
            )
        return code
    finally:
        shutil.rmtree(errors, ignore_errors=True)


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    train_args = list(sys.argv[1:] if argv is None else argv)
    prog = environ.get("TRAIN_SCRIPT_NAME") or "launch"
    try:
        env = read_env(environ)
        config, scan = resolve_train_args(train_args, env.data_root)
        gpus = count_gpus(environ, config, needed=env.nproc_per_node is None or not environ.get("DRY_RUN"))
        if not environ.get("DRY_RUN"):  # a dry run prints the command as a GPU node would run it
            check_gpu_node(gpus, config)
        nproc = env.nproc_per_node or max(1, gpus)
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    for line in describe_shards(scan) if scan else []:
        print(f"{prog}: {line}", file=sys.stderr)
    for notice in recipe_notices(config):
        print(f"{prog}: NOTICE: {notice}", file=sys.stderr)
    cmd = torchrun_command(env, nproc, scan, train_args)
    caches = compile_cache_env(environ)
    if environ.get("DRY_RUN"):
        print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in caches.items()), shlex.join(cmd)]))
        return 0
    sys.stderr.flush()
    return run_torchrun(cmd, {**environ, **caches}, prog)


if __name__ == "__main__":
    sys.exit(main())
