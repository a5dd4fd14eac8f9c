"""The end-to-end demo, step by step: generate -> serve + download -> convert -> load -> train -> evaluate.

Every stage runs through the same command a user would type (data/hfd.sh, data2rec.py, dali.py,
torchrun train.py, zero_shot.py, retrieval.py), as a subprocess whose output goes to
``<output>/logs/<step>.log``. A failing step stops the demo with a one-line message naming the
step and its log.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from src.errors import UserError
from src.fsutil import atomic_write_json

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO_ROOT / "src" / "open_alip" / "model_configs" / "RWKV_CLIP_demo.json"
REPO_ID = "demo/synthetic-scenes"


class DemoError(UserError):
    """A demo step failed; the message names the step and where its log is."""


@dataclass
class DemoSettings:
    output: Path
    train_samples: int = 8000
    image_size: int = 64  # stored JPEG side; the model's input_size comes from the config
    shards: int = 2
    processes: int = 2
    batch_size: int = 64  # per process
    epochs: int = 8
    lr: float = 2e-3
    eval_per_class: int = 20
    retrieval_images: int = 120
    grid_images: int = 24
    config: Path = DEMO_CONFIG
    seed: int = 0
    threads_per_process: int = 1
    extra_train_args: list[str] = field(default_factory=list)

    @classmethod
    def quick(cls, output: Path) -> DemoSettings:
        """A reduced run for CI: every step runs, the model barely trains."""
        return cls(
            output=output,
            train_samples=512,
            epochs=1,
            batch_size=32,
            eval_per_class=3,
            retrieval_images=16,
            grid_images=12,
        )


@dataclass
class StepResult:
    name: str
    seconds: float
    detail: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(settings: DemoSettings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    threads = str(settings.threads_per_process)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
    # the loader's combined-index cache goes under the demo folder, not the user's home
    env["RWKV_CLIP_CACHE"] = str(Path(settings.output).resolve() / "cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def run_command(
    name: str,
    cmd: Sequence[str],
    log_path: Path,
    env: dict[str, str],
    echo: Callable[[str], bool] | None = None,
    timeout: float | None = None,
) -> None:
    """Run `cmd`, appending its output to `log_path`; lines for which `echo` is true are printed.
    Raises DemoError naming the step when the command fails."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                list(cmd),
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise DemoError(f"step '{name}' could not start {cmd[0]}: {exc.strerror}") from None
        deadline = time.monotonic() + timeout if timeout else None
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if echo is not None and echo(line):
                print(f"    {line.rstrip()}", flush=True)
            if deadline and time.monotonic() > deadline:
                proc.kill()
                break
        rc = proc.wait()
    if rc != 0:
        tail = _last_error_line(log_path)
        raise DemoError(
            f"step '{name}' failed ({Path(cmd[0]).name} exited with {rc}): {tail} [log: {log_path}]"
        )


def _last_error_line(log_path: Path) -> str:
    lines = [
        ln.strip() for ln in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()
    ]
    for line in reversed(lines):
        if "error" in line.lower():
            return line[-300:]
    return lines[-1][-300:] if lines else "no output"


class Demo:
    """Runs the steps in order; each is a method so tests can run a prefix of the pipeline."""

    def __init__(self, settings: DemoSettings):
        self.s = settings
        self.out = Path(settings.output).resolve()
        self.logs = self.out / "logs"
        self.python = sys.executable
        self.results: list[StepResult] = []
        self.summary: dict = {}

    # -- helpers ---------------------------------------------------------------------------
    def _step(self, index: int, total: int, name: str, what: str, fn: Callable[[], str]) -> None:
        print(f"[demo {index}/{total}] {name}: {what}", flush=True)
        start = time.monotonic()
        try:
            detail = fn() or ""
        except DemoError:
            raise
        except Exception as exc:  # any library error becomes a one-line step failure
            raise DemoError(f"step '{name}' failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.monotonic() - start
        self.results.append(StepResult(name, seconds, detail))
        print(
            f"[demo {index}/{total}] {name}: done in {seconds:.1f}s{' - ' + detail if detail else ''}",
            flush=True,
        )

    def _model_config(self) -> dict:
        return json.loads(Path(self.s.config).read_text())

    # -- steps -------------------------------------------------------------------------------
    def make_corpus(self) -> str:
        from src.demo.corpus import write_hub_corpus

        repo = self.out / "hub_repo"
        if repo.exists():
            shutil.rmtree(repo)
        paths = write_hub_corpus(repo, self.s.train_samples, self.s.seed, self.s.image_size, self.s.shards)
        size = sum(p.stat().st_size for p in paths)
        return (
            f"{self.s.train_samples} image-caption pairs in {len(paths)} parquet shards ({size / 1e6:.1f} MB)"
        )

    def download(self) -> str:
        from src.open_alip.hub_server import serve_in_background

        target = self.out / "download"
        if target.exists():
            shutil.rmtree(target)
        with serve_in_background(self.out / "hub_repo", REPO_ID, "dataset") as server:
            env = _env(self.s, HF_ENDPOINT=server.endpoint)
            env.pop("HF_TOKEN", None)  # the local hub needs none; never send a real one to it
            run_command(
                "download",
                [
                    "bash",
                    str(REPO_ROOT / "data" / "hfd.sh"),
                    REPO_ID,
                    "--dataset",
                    "--local-dir",
                    str(target),
                ],
                self.logs / "download.log",
                env,
            )
        got = sorted((target / "data").glob("*.parquet"))
        want = sorted((self.out / "hub_repo" / "data").glob("*.parquet"))
        if [p.name for p in got] != [p.name for p in want]:
            raise DemoError(f"step 'download' fetched {len(got)} of {len(want)} parquet shards into {target}")
        for a, b in zip(got, want):
            if a.read_bytes() != b.read_bytes():
                raise DemoError(f"step 'download': {a} differs from the served file")
        return f"{len(got)} shards via data/hfd.sh from a local hub at 127.0.0.1, verified"

    def convert(self) -> str:
        shards = self.out / "shards"
        if shards.exists():
            shutil.rmtree(shards)
        parquet = sorted(str(p) for p in (self.out / "download" / "data").glob("*.parquet"))
        run_command(
            "convert",
            [
                self.python,
                "data2rec.py",
                *parquet,
                "--output",
                str(shards / "scenes"),
                "--shard-size",
                str(-(-self.s.train_samples // self.s.shards)),
                "--workers",
                "2",
                "--no-progress",
            ],
            self.logs / "convert.log",
            _env(self.s),
        )
        recs = sorted(shards.glob("*.rec"))
        if not recs:
            raise DemoError(f"step 'convert' wrote no .rec shards under {shards}")
        return f"{len(recs)} RecordIO shards in {shards}"

    def loader_check(self) -> str:
        grid = self.out / "loader_batch.png"
        input_size = int(self._model_config()["input_size"])
        run_command(
            "loader",
            [
                self.python,
                "dali.py",
                "--data",
                str(self.out / "shards"),
                "--batch-size",
                "16",
                "--steps",
                "2",
                "--input-size",
                str(input_size),
                "--device",
                "cpu",
                "--workers",
                "1",
                "--save-grid",
                str(grid),
            ],
            self.logs / "loader.log",
            _env(self.s),
        )
        return f"DALI CPU pipeline read batches; first batch saved to {grid.name}"

    def train(self) -> str:
        run_dir = self.out / "train"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        steps_per_epoch = self.s.train_samples // (self.s.batch_size * self.s.processes)
        cmd = [
            self.python,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(self.s.processes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            "train.py",
            "--config",
            str(self.s.config),
            "--train-data",
            str(self.out / "shards"),
            "--batch-size",
            str(self.s.batch_size),
            "--epochs",
            str(self.s.epochs),
            "--lr",
            str(self.s.lr),
            "--lr-scheduler",
            "warmup-cosine",
            "--warmup",
            "0.05",
            "--precision",
            "fp32",
            "--device",
            "cpu",
            "--seed",
            str(self.s.seed),
            "--workers",
            "1",
            "--save-every-n-steps",
            "0",
            "--log-every-n-steps",
            str(max(1, min(10, steps_per_epoch // 2))),
            "--output",
            str(run_dir),
            *self.s.extra_train_args,
        ]
        run_command(
            "train",
            cmd,
            self.logs / "train.log",
            _env(self.s),
            echo=lambda line: " step " in line or "error" in line.lower(),
        )
        checkpoints = sorted((run_dir / "checkpoints").glob("epoch_*.pt"))
        if not checkpoints:
            raise DemoError(f"step 'train' finished without an epoch checkpoint in {run_dir / 'checkpoints'}")
        self.checkpoint = checkpoints[-1]
        return (
            f"{self.s.epochs} epochs x {steps_per_epoch} steps on {self.s.processes} processes -> "
            f"{self.checkpoint.name}"
        )

    def evaluate(self) -> str:
        from src.demo.corpus import write_classification_set, write_retrieval_set

        eval_dir = self.out / "eval_data"
        if eval_dir.exists():
            shutil.rmtree(eval_dir)
        tree = write_classification_set(
            eval_dir / "classification", self.s.eval_per_class, self.s.seed, self.s.image_size
        )
        karpathy = write_retrieval_set(
            eval_dir / "retrieval", self.s.retrieval_images, self.s.seed, self.s.image_size
        )
        results = self.out / "eval_results"
        common = [
            "--model-name",
            str(self.s.config),
            "--model-weight",
            str(self.checkpoint),
            "--output-dir",
            str(results),
            "--device",
            "cpu",
            "--workers",
            "0",
            "--no-progress",
        ]
        run_command(
            "zero-shot classification",
            [
                self.python,
                "zero_shot.py",
                "--datasets",
                f"scenes={tree}",
                "--templates",
                f"scenes={eval_dir / 'classification' / 'templates.json'}",
                *common,
            ],
            self.logs / "zero_shot.log",
            _env(self.s),
        )
        run_command(
            "retrieval",
            [self.python, "retrieval.py", "--datasets", f"scenes={karpathy}", *common],
            self.logs / "retrieval.log",
            _env(self.s),
        )
        self.classification = json.loads((results / "classification_scenes.json").read_text())
        self.retrieval = json.loads((results / "retrieval_scenes.json").read_text())
        m = self.classification["metrics"]
        return f"top-1 {m['top1']:.1f}% (chance {self.classification['chance_top1']:.1f}%)"

    def report(self) -> str:
        import torch

        from src import figures
        from src.demo.scenes import all_descriptions
        from src.evaluation.model_loader import load_model
        from src.evaluation.run import evaluate_classification
        from src.open_alip.zero_shot import encode_texts

        points = figures.read_loss_points(self.out / "train" / "metrics.jsonl")
        global_batch = self.s.batch_size * self.s.processes
        figures.plot_loss_curve(
            points,
            self.out / "loss_curve.png",
            title="contrastive loss (2 processes, CPU)",
            reference=math.log(global_batch),
            reference_label=f"chance: ln({global_batch})",
        )
        # predicted captions: the best of every scene description the grammar can produce
        torch.set_num_threads(self.s.threads_per_process)
        device = torch.device("cpu")
        model = load_model(self.s.config, self.checkpoint, device)
        input_size = int(model.config["input_size"])
        tree = self.out / "eval_data" / "classification" / "images"
        cls = evaluate_classification(model, f"scenes={tree}", input_size, device, return_predictions=True)
        data = cls.pop("data")
        step = max(1, len(data.images) // self.s.grid_images)
        picks = list(range(0, len(data.images), step))[: self.s.grid_images]
        descriptions = all_descriptions()
        with torch.no_grad():
            text = encode_texts(model, descriptions, device)
            from src.evaluation.datasets import load_rgb, preprocess_pil

            images = torch.stack([preprocess_pil(load_rgb(data.images[i]), input_size) for i in picks])
            image_emb = torch.nn.functional.normalize(model.encode_image(images).float(), dim=-1)
        best = (image_emb @ text.t()).argmax(dim=1).tolist()
        captions = []
        for i, b in zip(picks, best):
            truth = data.classnames[data.labels[i]]
            guess = data.classnames[cls["predictions"][i]]
            captions.append(
                [
                    (f"true: {truth}", figures.INK),
                    (f"zero-shot: {guess}", figures.GOOD if guess == truth else figures.BAD),
                    (descriptions[b], figures.GOOD if truth in descriptions[b] else figures.BAD),
                ]
            )
        figures.caption_grid(
            [load_rgb(data.images[i]) for i in picks],
            captions,
            self.out / "predictions.png",
            title=f"held-out scenes: true class, zero-shot class, best caption of all {len(descriptions)}",
        )
        return "loss_curve.png, predictions.png"

    # -- driver ------------------------------------------------------------------------------
    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        # a re-run starts clean; only the demo's own sub-folders are ever removed
        for stale in ("logs", "eval_results"):
            if (self.out / stale).is_dir():
                shutil.rmtree(self.out / stale)
        steps = [
            (
                "corpus",
                "generating a synthetic image-caption corpus in the hub's parquet format",
                self.make_corpus,
            ),
            (
                "download",
                "serving it from a local hub on 127.0.0.1 and fetching it with data/hfd.sh",
                self.download,
            ),
            ("convert", "packing the parquet shards into RecordIO with data2rec.py", self.convert),
            ("loader", "smoke-testing the DALI loader with dali.py", self.loader_check),
            ("train", f"torchrun --nproc_per_node {self.s.processes} train.py on CPU", self.train),
            ("evaluate", "zero-shot classification and retrieval on held-out scenes", self.evaluate),
            ("report", "drawing the loss curve and a grid of predictions", self.report),
        ]
        start = time.monotonic()
        for i, (name, what, fn) in enumerate(steps, 1):
            self._step(i, len(steps), name, what, fn)
        self.summary = self._summary(time.monotonic() - start)
        atomic_write_json(self.out / "summary.json", self.summary)
        return self.summary

    def _summary(self, seconds: float) -> dict:
        cls, ret = self.classification, self.retrieval
        n_img = ret["num_images"]
        return {
            "wall_time_s": round(seconds, 1),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.s).items()},
            "checkpoint": str(self.checkpoint),
            "classification": {
                "num_images": cls["num_images"],
                "num_classes": cls["num_classes"],
                "chance_top1": cls["chance_top1"],
                **cls["metrics"],
            },
            "retrieval": {
                "num_images": n_img,
                "num_captions": ret["num_captions"],
                "chance_R@1_image_to_text": 100.0 * 5 / ret["num_captions"],
                "chance_R@1_text_to_image": 100.0 / n_img,
                **ret["metrics"],
            },
            "steps": [asdict(r) for r in self.results],
        }


def format_summary(summary: dict) -> str:
    cls, ret = summary["classification"], summary["retrieval"]
    rows = [
        ("zero-shot classification top-1", cls["top1"], cls["chance_top1"]),
        ("zero-shot classification top-5", cls["top5"], min(100.0, 5 * cls["chance_top1"])),
        ("mean per-class recall", cls["mean_per_class_recall"], cls["chance_top1"]),
        ("image->text R@1", ret["image_to_text_R@1"], ret["chance_R@1_image_to_text"]),
        ("text->image R@1", ret["text_to_image_R@1"], ret["chance_R@1_text_to_image"]),
        ("text->image R@5", ret["text_to_image_R@5"], min(100.0, 5 * ret["chance_R@1_text_to_image"])),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'metric'.ljust(width)}  {'model':>7}  {'chance':>7}", "-" * (width + 18)]
    lines += [f"{name.ljust(width)}  {value:6.1f}%  {chance:6.1f}%" for name, value, chance in rows]
    lines.append(
        f"({cls['num_classes']} classes, {cls['num_images']} held-out images; retrieval over "
        f"{ret['num_images']} images x 5 captions; wall time {summary['wall_time_s'] / 60:.1f} min)"
    )
    return "\n".join(lines)
