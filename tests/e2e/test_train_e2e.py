"""train.py end to end on CPU: a tiny model learns from a small .rec the test writes,
a real kill and `--resume latest` reproduce the uninterrupted losses, a resume takes a new
--lr and passes over an unreadable newest checkpoint, 2 gloo processes under torchrun
(compiled, with accumulation), and the guards (NaN loss, wrong --train-num-samples, bad input)."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.corpora import write_colour_records
from tests._repo import REPO

PY = sys.executable
TORCHRUN = Path(sys.executable).with_name("torchrun")
BATCH, RECORDS, EPOCHS = 8, 96, 3  # 12 steps per epoch, 36 in all
# The smallest RWKV-CLIP that still has every part (1 block per tower, 4 patches).
TINY = [
    "--config",
    "RWKV_CLIP_tiny",
    "--n-layer",
    "1",
    "--image-depth",
    "1",
    "--n-embd",
    "32",
    "--image-embed-dims",
    "32",
    "--head-size",
    "16",
    "--image-num-heads",
    "2",
    "--input-size",
    "16",
    "--dim-att",
    "32",
    "--dim-ffn",
    "64",
    "--image-hidden-rate",
    "2",
    "--precision",
    "fp32",
]


def _env() -> dict[str, str]:
    # One thread per process: on a shared 2-core machine OpenMP spinning in several
    # processes costs far more than it gains.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _args(data: Path, output: Path, *extra: str) -> list[str]:
    return [
        "--train-data",
        str(data),
        "--output",
        str(output),
        *TINY,
        "--batch-size",
        str(BATCH),
        "--epochs",
        str(EPOCHS),
        "--lr",
        "1e-2",
        "--warmup",
        "3",
        "--workers",
        "1",
        "--device",
        "cpu",
        "--log-every-n-steps",
        "1",
        "--save-every-n-steps",
        "5",
        "--keep-checkpoints",
        "3",
        *extra,
    ]


def _dead_pid() -> int:
    """The pid of a process that has exited (what a killed save's temp file is named after)."""
    return int(
        subprocess.run(
            [PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )


def _run(cmd: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    """Run in a new session so a timeout can kill torchrun's workers too, not just torchrun."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[:3]} ran over {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _train(*args: str) -> subprocess.CompletedProcess:
    return _run([PY, "train.py", *args])


def _losses(output: Path) -> dict[int, float]:
    """Loss per step from metrics.jsonl; a resumed run's later lines win."""
    out = {}
    for line in (output / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "train":
            out[rec["step"]] = rec["loss"]
    return out


@pytest.fixture
def one_thread():
    """For runs inside the test process: tiny matrices gain nothing from threads that spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_colour_records(tmp_path_factory.mktemp("data") / "colours", RECORDS)


@pytest.fixture(scope="module")
def full_run(data, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("full") / "run"
    proc = _train(*_args(data, output))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return output


def test_tiny_model_learns(full_run):
    losses = _losses(full_run)
    assert sorted(losses) == list(range(1, EPOCHS * RECORDS // BATCH + 1))
    first, last = sum(losses[s] for s in range(1, 7)) / 6, sum(losses[s] for s in range(31, 37)) / 6
    assert last < first and last < math.log(BATCH)  # below chance for a batch of 8
    log = (full_run / "train.log").read_text()
    assert "samples/s per rank" in log and "ETA" in log and "data wait" in log
    assert list((full_run / "tensorboard").glob("events.out.tfevents.*"))
    # The summary, and the loss curve beside metrics.jsonl.
    assert f"finished at step 36: 36 steps, {36 * BATCH} samples in " in log and "samples/s)" in log
    assert "at the end, best " in log and f"(chance: ln {BATCH} = " in log
    assert f"checkpoints: {full_run / 'checkpoints'} (last: epoch_{EPOCHS:03d}.pt)" in log
    assert "evaluate the last one: python zero_shot.py --model-weight " in log  # run from the repository
    assert (full_run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_params_json_holds_the_resolved_configuration(full_run):
    params = json.loads((full_run / "params.json").read_text())
    assert params["model"]["n_layer"] == 1 and params["model"]["image_patch_size"] == 8  # flag, then JSON
    assert params["precision"] == "fp32" and "precision" not in params["model"]  # a run setting
    assert params["steps_per_epoch"] == RECORDS // BATCH and params["world_size"] == 1
    assert params["lr"] == 1e-2 and params["eps"] == 1e-8 and params["batch"]["global_batch"] == BATCH


def test_checkpoint_loads_into_create_model(full_run):
    from src.open_alip import create_model

    ckpt = full_run / "checkpoints" / f"epoch_{EPOCHS:03d}.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["step"] == EPOCHS * RECORDS // BATCH and (state["epoch"], state["epoch_step"]) == (EPOCHS, 0)
    # The released layout (text decays in bf16), plus the fp32 masters those round.
    assert state["state_dict"]["text_model.blocks.0.att.time_decay"].dtype == torch.bfloat16
    assert state["master_params"]["text_model.blocks.0.att.time_decay"].dtype == torch.float32
    model = create_model(json.loads((full_run / "params.json").read_text())["model"], pretrained=ckpt)
    saved = {**state["state_dict"], **state["master_params"]}
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    # Only the newest --keep-checkpoints step files stay; every epoch file stays.
    names = sorted(p.name for p in (full_run / "checkpoints").iterdir())
    assert names == [
        "epoch_001.pt",
        "epoch_002.pt",
        "epoch_003.pt",
        "step_000000025.pt",
        "step_000000030.pt",
        "step_000000035.pt",
    ]


def test_kill_and_resume_gives_the_uninterrupted_losses(data, full_run, tmp_path):
    output = tmp_path / "run"
    marker = output / "checkpoints" / "step_000000010.pt"
    proc = subprocess.Popen(
        [PY, "train.py", *_args(data, output)],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 200
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no clean-up of any kind: as a node failure would be
    proc.wait()
    assert marker.exists(), proc.stderr.read()[-2000:]
    assert not (output / "checkpoints" / f"epoch_{EPOCHS:03d}.pt").exists(), "the run ended before the kill"
    assert max(_losses(output)) >= 10

    resumed = _train(*_args(data, output, "--resume", "latest"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in (output / "train.log").read_text()
    # metrics.jsonl was cut back to the resumed step: each step is logged once.
    logged = [
        json.loads(line)["step"]
        for line in (output / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert logged == sorted(set(logged))
    want, got = _losses(full_run), _losses(output)
    assert sorted(got) == sorted(want)
    for step in range(11, max(want) + 1):
        assert got[step] == want[step], f"step {step}: {got[step]} after resume, {want[step]} uninterrupted"
    a = torch.load(full_run / "checkpoints" / f"epoch_{EPOCHS:03d}.pt", weights_only=True)["state_dict"]
    b = torch.load(output / "checkpoints" / f"epoch_{EPOCHS:03d}.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_gloo_processes_under_torchrun_compiled_with_accumulation(data, tmp_path):
    # The global batch of 8 on 2 processes with micro-batches of at most 2: accumulation 2. The
    # text decays stored in bf16 as the original does: DDP and the compiler meet mixed dtypes.
    output = tmp_path / "ddp"
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node",
        "2",
        "train.py",
        *_args(
            data,
            output,
            "--max-steps",
            "3",
            "--save-every-n-steps",
            "3",
            "--batch-size",
            "2",
            "--global-batch-size",
            "8",
            "--compile",
            "--compile-backend",
            "aot_eager",
            "--text-decay-dtype",
            "bf16",
            # lines by time alone, after every step: the ranks must agree on each one
            "--log-every-n-steps",
            "1000",
            "--log-every-s",
            "0.001",
        ),
    ]
    proc = _run(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = json.loads((output / "params.json").read_text())
    assert params["world_size"] == 2 and params["batch"] == {
        "micro_batch": 2,
        "accum_freq": 2,
        "global_batch": 8,
    }
    assert params["steps_per_epoch"] == RECORDS // 8
    state = torch.load(output / "checkpoints" / "step_000000003.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["data"]) == 2 and len(state["rng"]) == 2
    assert [d["rank"] for d in state["data"]] == [0, 1] and state["batch"]["accum_freq"] == 2
    assert state["state_dict"]["text_model.blocks.0.att.time_decay"].dtype == torch.bfloat16
    assert state["master_params"] == {}  # stored as the released layout has them: nothing to keep apart
    losses = _losses(output)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) for v in losses.values())
    log = (output / "train.log").read_text()
    assert "2 process(es)" in log and "compiled (aot_eager)" in log
    assert "torch.compile" not in log.replace("compiled (aot_eager)", "")  # the ranks agreed: no fallback
    assert "global batch 8 = 2 per micro-batch x 2 process(es) x accumulation 2" in log


def test_resume_takes_a_new_lr_and_passes_over_an_unreadable_checkpoint(data, full_run, tmp_path):
    # A copy of the full run's step-30 checkpoint, a newer one cut short, and a temp file that
    # a killed save left behind.
    output = tmp_path / "resumed"
    (output / "checkpoints").mkdir(parents=True)
    shutil.copy(full_run / "checkpoints" / "step_000000030.pt", output / "checkpoints")
    (output / "checkpoints" / "step_000000035.pt").write_bytes(b"PK\x03\x04")
    stale = output / "checkpoints" / f".step_000000034.pt.{_dead_pid()}.tmp"
    stale.write_bytes(b"partial")
    proc = _train(*_args(data, output, "--resume", "latest", "--lr", "1e-3", "--max-steps", "33"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (output / "train.log").read_text()
    assert "step_000000035.pt cannot be read" in log and "skipping it" in log
    assert "resuming from step_000000030.pt, the newest checkpoint that can be read" in log
    assert f"removed 1 temporary file(s) of interrupted saves: {stale.name}" in log and not stale.exists()
    assert "--lr 0.001 (was 0.01)" in log
    # The schedule is the same function of the step, at a tenth of the peak.
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())}
    before = {
        r["step"]: r["lr"]
        for r in map(json.loads, (full_run / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    }
    assert sorted(lrs) == [31, 32, 33]
    for step, lr in lrs.items():
        assert lr == pytest.approx(before[step] / 10, rel=1e-9)


def test_a_failed_save_after_resuming_past_an_unreadable_checkpoint_keeps_the_one_resumed_from(
    data, full_run, tmp_path
):
    # The newest step checkpoint is unreadable, an older one good, no epoch file, --keep-checkpoints 2;
    # the save the run makes fails (a file-size limit: the kernel refuses the write as a full disk does).
    output = tmp_path / "resumed"
    (output / "checkpoints").mkdir(parents=True)
    shutil.copy(full_run / "checkpoints" / "step_000000030.pt", output / "checkpoints")
    (output / "checkpoints" / "step_000000035.pt").write_bytes(b"PK\x03\x04")
    limit = (output / "checkpoints" / "step_000000030.pt").stat().st_size // 2

    def small_files() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    args = _args(data, output, "--resume", "latest", "--max-steps", "31", "--keep-checkpoints", "2")
    proc = subprocess.run(
        [PY, "train.py", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=small_files,
    )
    assert proc.returncode == 2 and "no space left on device" in proc.stderr, proc.stderr[-3000:]
    names = sorted(p.name for p in (output / "checkpoints").iterdir())
    assert names == ["step_000000030.pt"], names  # the unreadable one went first; the good one stayed
    from src.training.checkpoint import find_resume_checkpoint

    assert find_resume_checkpoint("latest", output)[0] == output / "checkpoints" / "step_000000030.pt"


def test_nan_loss_stops_with_the_last_good_checkpoint_intact(data, tmp_path, capsys, one_thread):
    import train

    output = tmp_path / "nan"
    # An absurd lr overflows the weights after the first update; the next loss is NaN.
    code = train.main(
        _args(
            data,
            output,
            "--lr",
            "1e30",
            "--warmup",
            "0",
            "--lr-scheduler",
            "const",
            "--grad-clip-norm",
            "0",
            "--save-every-n-steps",
            "1",
        )
    )
    assert code == 3
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: loss is nan at step 2") and err.count("\n") == 1, err
    assert "the last good checkpoint is" in err and "step_000000001.pt" in err
    assert [p.name for p in (output / "checkpoints").iterdir()] == ["step_000000001.pt"]
    assert torch.load(output / "checkpoints" / "step_000000001.pt", weights_only=True)["step"] == 1
    # A new run into the same folder would mix two runs' checkpoints.
    assert train.main(_args(data, output)) == 2
    assert "already holds checkpoints; pass --resume latest" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--train-num-samples", "1000"], "--train-num-samples 1000 is more than the 96 records"),
        (["--batch-size", "200"], "make no full batch of 200"),
        (["--config", "RWKV_CLIP_B64"], "--config RWKV_CLIP_B64"),
        (["--resume", "nowhere.pt"], "--resume nowhere.pt"),
        (["--epochs", "0"], "--epochs 0"),
        (["--pretrained", "nowhere.pt"], "--pretrained nowhere.pt"),
    ],
)
def test_bad_input_is_one_clear_line(data, tmp_path, capsys, one_thread, extra, expected):
    import train

    assert train.main(_args(data, tmp_path / "bad", *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and expected in err and err.count("\n") == 1, err


def test_an_output_file_and_an_unknown_device_are_one_line_each(data, tmp_path, capsys):
    import train

    (tmp_path / "a_file").write_text("")
    assert train.main(_args(data, tmp_path / "a_file")) == 2
    err = capsys.readouterr().err
    assert (
        err == f"train.py: error: --output {tmp_path / 'a_file'} is a file; pass a folder for the run's "
        "checkpoints and logs\n"
    )
    assert train.main(_args(data, tmp_path / "run", "--device", "tpu")) == 2
    err = capsys.readouterr().err
    assert err == "train.py: error: --device tpu: unknown device; use auto, cpu, cuda or cuda:N\n"


def test_resume_with_another_model_is_refused(data, full_run, tmp_path, capsys, one_thread):
    import train

    ckpt = full_run / "checkpoints" / "epoch_001.pt"
    assert train.main(_args(data, tmp_path / "other", "--resume", str(ckpt), "--n-layer", "2")) == 2
    err = capsys.readouterr().err
    assert f"--resume {ckpt}: " in err and "does not fit RWKV_CLIP: " in err and err.count("\n") == 1
    assert "resume with the --config and model flags the run was started with" in err


def test_zero_shot_evaluation_runs_at_epoch_ends(data, tmp_path, one_thread):
    import train
    from src.demo.corpus import write_classification_set

    tree = write_classification_set(tmp_path / "cls", per_class=1, seed=1, image_size=24)
    output = tmp_path / "zs"
    # --train-num-samples below the record count makes short epochs (3 steps of 8).
    assert (
        train.main(
            _args(
                data,
                output,
                "--epochs",
                "2",
                "--save-every-n-steps",
                "0",
                "--train-num-samples",
                "24",
                "--zeroshot-data",
                f"scenes={tree}",
                "--zeroshot-frequency",
                "2",
            )
        )
        == 0
    )
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 7))
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [6]  # after epoch 2 only
    assert 0.0 <= evals[0]["zeroshot_top1"] <= 100.0
    log = (output / "train.log").read_text()
    assert "eval after epoch 2" in log and "each epoch uses 24 samples" in log


def test_help_explains_the_flags(capsys):
    import train

    with pytest.raises(SystemExit) as exc:
        train.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--train-data",
        "--accum-freq",
        "--resume",
        "--gather-with-grad",
        "--config",
        "--image-patch-size",
        "--global-batch-size",
        "--wkv-impl",
        "--compile-backend",
        "--text-decay-dtype",
        "--max-bad-records",
        "--dist-timeout",
        "warmup-cosine",
    ):
        assert flag in out


def test_a_bad_record_is_skipped_counted_and_limited(tmp_path, capsys, one_thread):
    import train
    from tests._loader_helpers import write_shard

    data = write_shard(tmp_path / "data" / "damaged", range(48), k=1, corrupt={5}).with_suffix("")
    output = tmp_path / "run"
    assert (
        train.main(_args(data, output, "--epochs", "1", "--max-bad-records", "3", "--log-every-n-steps", "3"))
        == 0
    )
    counts = [json.loads(line)["bad_records"] for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert counts[-1] == 1 and counts == sorted(counts)  # steps 3 and 6: once met, counted for good
    log = (output / "train.log").read_text()
    assert "bad records 1 |" in log and log.count("damaged.rec record key 5 at byte") == 1  # named once
    assert train.main(_args(data, tmp_path / "strict", "--epochs", "1", "--max-bad-records", "0")) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and "--max-bad-records" in err and err.count("\n") == 1, err
