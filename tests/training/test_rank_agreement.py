"""Start-up agreement between ranks, with 2 real gloo processes: different shard views (as two
nodes scanning their own DATA_ROOT would get) and an --output one rank cannot see both stop
every rank with one line naming the ranks, instead of a hang until --dist-timeout."""

import os
import socket
import subprocess
import sys

from benchmarks.corpora import write_colour_records
from tests._repo import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(data: list[str], outputs: list[str]) -> list[str]:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.training._agreement_worker", data[rank], outputs[rank]],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        outs.append(out.strip())
    return outs


def test_same_view_agrees_and_different_views_stop_every_rank(tmp_path):
    a, b = tmp_path / "node_a", tmp_path / "node_b"
    for folder in (a, b):
        write_colour_records(folder / "part-0", 8, side=8)
    write_colour_records(a / "part-1", 4, side=8)  # a shard node b does not have
    out = tmp_path / "out"
    out.mkdir()
    assert _two_ranks([str(a / "part-0.rec")] * 2, [str(out)] * 2) == ["agreed", "agreed"]
    lines = _two_ranks([str(a), str(b)], [str(out)] * 2)
    host = socket.gethostname()
    assert lines[0] == lines[1]  # both ranks stop, with the same line
    assert lines[0].startswith(
        f"error: ranks see different training data: rank 0 on {host} has 12 records in 2 shard(s)"
    ), lines[0]
    assert f"rank 1 on {host} has 8 in 1" in lines[0] and f"only rank 0 on {host}: part-1.rec" in lines[0]
    assert "\n" not in lines[0]


def test_an_output_one_rank_cannot_see_stops_every_rank(tmp_path):
    data = write_colour_records(tmp_path / "part-0", 8, side=8)
    outs = [tmp_path / "node_a_out", tmp_path / "node_b_out"]  # as two nodes' local disks
    for o in outs:
        o.mkdir()
    lines = _two_ranks([str(data)] * 2, [str(o) for o in outs])
    host = socket.gethostname()
    assert lines == [
        f"error: --output {outs[0]} is not one folder all ranks see: rank 1 on {host} cannot read "
        "what rank 0 wrote there; pass a folder on storage every node shares",
        f"error: --output {outs[1]} is not one folder all ranks see: rank 1 on {host} cannot read "
        "what rank 0 wrote there; pass a folder on storage every node shares",
    ]
    assert not list(outs[0].iterdir())  # the token is removed


def test_data_missing_on_one_rank_stops_every_rank(tmp_path):
    data = write_colour_records(tmp_path / "part-0", 8, side=8)
    out = tmp_path / "out"
    out.mkdir()
    lines = _two_ranks([str(data), str(tmp_path / "elsewhere" / "part-0.rec")], [str(out)] * 2)
    assert lines[0] == lines[1] and lines[0].startswith(f"error: rank 1 on {socket.gethostname()}: "), lines
    assert "elsewhere" in lines[0] and "\n" not in lines[0]
