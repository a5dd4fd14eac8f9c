"""CLIP_benchmark's evaluation with RWKV-CLIP: the glue behind clip_benchmark_eval.py.

CLIP_benchmark (the `clip-benchmark` package, not a dependency of this toolkit) has no plugin
registry. Its `clip_benchmark.models` module keeps a dict `TYPE2FUNC` from a `--model_type` name to
a loader `(model_name, pretrained, cache_dir, device) -> (model, transform, tokenizer)`, and a list
`MODEL_TYPES` made from it; `load_clip` dispatches through the dict, and `clip_benchmark.cli` offers
the list (the same object) as the choices of `--model_type` and parses `sys.argv` in `main()`.
Adding our loader to both, in this process, before `main()` runs, is all registering takes.

Two things about 1.6.2 (the newest release) change what the wrapper passes or replaces, in this
process only (site-packages are not touched):
- its `metrics.zeroshot_classification.accuracy` calls `float()` on a one-element numpy array,
  which numpy 2 refuses (TypeError); `use_compatible_accuracy` swaps in a function with the same
  result (the share of images whose label is among the top-k logits) that numpy 1 and 2 accept,
  in that module and in `metrics.linear_probe`, which imports it by name.
- it runs the model under `torch.autocast` unless `--no_amp` is given (bfloat16 on CPU, float16 on
  CUDA). The wrapper passes `--no_amp` unless `--amp` is given, so that its numbers are the fp32
  numbers zero_shot.py computes, and says which precision it used.
- its datasets open each image inside the DataLoader, so one truncated file ends the whole run with
  a worker traceback. The wrapper wraps the dataset its `build_dataset` returns (`SkipUnreadable`)
  and the collate function (`DropUnreadable`): an unreadable image is left out, and counted and
  named at the end, as zero_shot.py and retrieval.py do (its metrics are then over the images read).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from src.errors import UserError
from src.evaluation.images import describe_failure, skip_notice
from src.evaluation.model_loader import ModelLoadError, load_model_and_transform
from src.open_alip import get_tokenizer
from src.open_alip.clip_benchmark_loader import MODEL_TYPE
from src.open_alip.errors import OpenAlipError

DEFAULT_MODEL = "RWKV_CLIP_B32"


class ClipBenchmarkError(UserError):
    """CLIP_benchmark is missing, or the model it was asked to load is not usable; one line."""


def load_for_clip_benchmark(
    model_name: str, pretrained: str, cache_dir: str | None = None, device: Any = "cpu"
):
    """CLIP_benchmark's loader signature over the inference CLIs' one loader
    (src/evaluation/model_loader.py): (model in fp32 eval mode, the evaluation transform, the
    tokenizer), with every error this CLI's one line. Weights are required."""
    weights = pretrained if pretrained is not None and str(pretrained).strip() else None
    try:
        model, transform = load_model_and_transform(model_name, weights, device, cache_dir=cache_dir)
        return model, transform, get_tokenizer(model_name)
    except (ModelLoadError, OpenAlipError) as exc:
        raise ClipBenchmarkError(str(exc)) from None


def register(models: ModuleType | Any) -> None:
    """Make `--model_type rwkv_clip` known to CLIP_benchmark's `models` module (see the module doc)."""
    models.TYPE2FUNC[MODEL_TYPE] = load_for_clip_benchmark
    if MODEL_TYPE not in models.MODEL_TYPES:
        models.MODEL_TYPES.append(MODEL_TYPE)


def compatible_accuracy(output: Any, target: Any, topk: Sequence[int] = (1,)) -> list[float]:
    """CLIP_benchmark's `accuracy(output, target, topk)`: for each k, the share of rows whose target
    is among the k largest logits (topk on the logits, as its version), as a Python float."""
    ranked = output.topk(max(topk), dim=1, largest=True, sorted=True).indices
    hits = ranked.eq(target.view(-1, 1))
    return [hits[:, :k].any(dim=1).sum().item() / len(target) for k in topk]


def use_compatible_accuracy(module: ModuleType | Any) -> Any:
    """Make the module's `evaluate` (zeroshot_classification's, linear_probe's) use
    `compatible_accuracy`; returns the function it replaced."""
    replaced = module.accuracy
    module.accuracy = compatible_accuracy
    return replaced


def _given(argv: Sequence[str], *options: str) -> bool:
    return any(a == o or a.startswith(o + "=") for a in argv for o in options)


def precision_of(argv: Sequence[str]) -> str:
    """The precision an `eval` with these (prepared) arguments runs the model in."""
    return "fp32" if "--no_amp" in argv else "amp"


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """CLIP_benchmark's arguments with our defaults: `eval` gets `--model_type rwkv_clip` and
    `--model RWKV_CLIP_B32` unless given, and `--no_amp` (fp32) unless our `--amp` asks for its
    autocast; weights must be named (its default is an open_clip tag)."""
    argv = list(argv)
    if not argv or argv[0] != "eval":
        return argv
    if "--amp" in argv:
        if "--no_amp" in argv:
            raise ClipBenchmarkError("--amp and --no_amp exclude each other; keep one (the default is fp32)")
        argv = [a for a in argv if a != "--amp"]
    elif "--no_amp" not in argv:
        argv.append("--no_amp")
    if not _given(argv, "--pretrained", "--pretrained_model"):
        raise ClipBenchmarkError(
            "eval needs weights: add --pretrained W (a .pt/.safetensors file or hf-hub:ORG/REPO[/FILE])"
        )
    extra = []
    if not _given(argv, "--model_type"):
        extra += ["--model_type", MODEL_TYPE]
    if not _given(argv, "--model", "--pretrained_model"):
        extra += ["--model", DEFAULT_MODEL]
    return [argv[0], *extra, *argv[1:]]


def item_name(dataset: Any, index: int) -> str:
    """The file of item `index` where a torchvision-style dataset says (ImageFolder's samples,
    Flowers102's _image_files, CLIP_benchmark's Flickr data, CocoCaptions' ids), else its position."""
    try:
        for attribute in ("samples", "imgs", "data"):
            items = getattr(dataset, attribute, None)
            if isinstance(items, list) and index < len(items) and isinstance(items[index], tuple):
                return str(items[index][0])
        files = getattr(dataset, "_image_files", None)
        if isinstance(files, list) and index < len(files):
            return str(files[index])
        if hasattr(dataset, "coco") and hasattr(dataset, "ids"):
            return str(dataset.coco.loadImgs(dataset.ids[index])[0]["file_name"])
    except Exception:  # a name is a courtesy; the position always works
        pass
    return f"item {index}"


class SkipUnreadable:
    """A CLIP_benchmark dataset whose items that cannot be read come back as None, each noted as a
    small JSON file in `notes` (DataLoader workers are processes of their own). Every other
    attribute (classes, templates, ...) is the wrapped dataset's."""

    def __init__(self, dataset: Any, notes: Path) -> None:
        self.dataset, self.notes = dataset, notes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "notes"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception as exc:  # any decoder failure means "unreadable", as in src/evaluation/images.py
            note = {"index": index, "image": item_name(self.dataset, index), "error": describe_failure(exc)}
            (self.notes / f"{index}.json").write_text(json.dumps(note))
            return None


class DropUnreadable:
    """A collate function that leaves out the None items SkipUnreadable made."""

    def __init__(self, collate: Callable[[list], Any]) -> None:
        self.collate = collate

    def __call__(self, items: list) -> Any:
        kept = [item for item in items if item is not None]
        if not kept:
            raise ClipBenchmarkError(
                f"none of the {len(items)} images of a batch could be read; lower --batch_size "
                "or remove the unreadable files (zero_shot.py names each)"
            )
        return self.collate(kept)


@contextlib.contextmanager
def skipping_unreadable(cli: ModuleType | Any) -> Iterator[Path]:
    """While the block runs, `cli.build_dataset` wraps its dataset in SkipUnreadable and
    `cli.get_dataset_collate_fn` its collate function in DropUnreadable; yields the notes folder."""
    notes = Path(tempfile.mkdtemp(prefix="rwkv-clip-cb-skips-"))
    build, collate_of = cli.build_dataset, cli.get_dataset_collate_fn
    cli.build_dataset = lambda *args, **kwargs: SkipUnreadable(build(*args, **kwargs), notes)
    cli.get_dataset_collate_fn = lambda name: DropUnreadable(collate_of(name))
    try:
        yield notes
    finally:
        cli.build_dataset, cli.get_dataset_collate_fn = build, collate_of
        shutil.rmtree(notes, ignore_errors=True)


def skipped_items(notes: Path) -> list[dict[str, str]]:
    """[{"image", "error"}] of the notes SkipUnreadable left, in dataset order."""
    found = [json.loads(p.read_text()) for p in notes.glob("*.json")]
    return [{"image": n["image"], "error": n["error"]} for n in sorted(found, key=lambda n: n["index"])]


def run_clip_benchmark(argv: Sequence[str]) -> int:
    """Register the loader and run CLIP_benchmark's command line with `argv` (after prepare_argv)."""
    argv = prepare_argv(argv)
    try:
        import clip_benchmark.cli as cli
        import clip_benchmark.metrics.linear_probe as linear_probe
        import clip_benchmark.metrics.zeroshot_classification as zeroshot_classification
        import clip_benchmark.models as models
    except ImportError as exc:
        raise ClipBenchmarkError(
            f"cannot import CLIP_benchmark ({exc}); install it with `pip install clip-benchmark` "
            "(it is not a dependency of this toolkit)"
        ) from None
    register(models)
    replaced = use_compatible_accuracy(zeroshot_classification), use_compatible_accuracy(linear_probe)
    if argv and argv[0] == "eval":
        print(
            f"clip_benchmark_eval.py: precision {precision_of(argv)} "
            "(fp32 unless --amp; --amp is CLIP_benchmark's autocast: bfloat16 on CPU, float16 on CUDA)",
            file=sys.stderr,
            flush=True,
        )
    saved = sys.argv
    sys.argv = ["clip_benchmark", *argv]  # its main() parses sys.argv and takes no arguments
    try:
        with skipping_unreadable(cli) as notes:
            result = cli.main()
            skipped = skipped_items(notes)
    except ClipBenchmarkError as exc:  # raised in a loader worker: torch wraps it in its traceback text
        last = str(exc).strip().splitlines()[-1]
        raise ClipBenchmarkError(last.split("ClipBenchmarkError: ", 1)[-1]) from None
    finally:
        sys.argv = saved
        zeroshot_classification.accuracy, linear_probe.accuracy = replaced
    if skipped:
        print(
            skip_notice("clip_benchmark_eval.py:", skipped)
            + "\nclip_benchmark_eval.py: its metrics are over the "
            "images that could be read",
            file=sys.stderr,
        )
    return int(result or 0)
