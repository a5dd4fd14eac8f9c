#!/usr/bin/env python
"""Time per dataset of linear_probe.py on the paper's ten linear-probe datasets, on this machine,
against a second probe of the same weights that reads its features back from the cache.

Without --data it generates each dataset in the layout linear_probe.py reads (torchvision's), with
the real split sizes and class counts (`--scale` shrinks them) and JPEGs of a size typical of that
dataset (CIFAR: 32x32 arrays in its pickles): a few distinct class-coloured noisy images per
class, hard-linked for the rest, so the tree costs little disk while every image is still read and
decoded. Extraction time is therefore what real images of that size cost; the probe's fits run on
features of generated images, which real data may make slower to fit (more L-BFGS iterations).

`--solver ROWSxDIMxCLASSES` times the paper protocol's solver alone on random features of that shape
written to a memory-mapped file (ImageNet's training split: 1281167x640x1000): seconds per L-BFGS
iteration and the memory the fit took beside the file's size (on the CPU the process's anonymous
memory, which leaves out the file's pages; on a GPU torch's peak allocation).

For each dataset it runs linear_probe.py twice with the same weights and a fresh feature cache:
the first run extracts and probes, the second reads the cached features and probes again; it
prints images per split, extraction and probe seconds, fits and seconds per fit, both wall times
and their ratio, and writes them to --output (JSON).

  python -m benchmarks.linear_probe_time --model-weight demo_out/train/checkpoints/epoch_008.pt
  python -m benchmarks.linear_probe_time --model-weight W --model-name RWKV_CLIP_B32 \
      --datasets dtd,flowers --scale 0.1
  python -m benchmarks.linear_probe_time --solver 1281167x640x1000 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from src.evaluation.paper_datasets import CALTECH101_SPLIT, PAPER_DATASETS, SUN397_SPLIT
from src.evaluation.probe_settings import LINEAR_PROBE_DATASETS

# Width x height of the generated JPEGs: sizes typical of each dataset's images.
SIZES = {
    "food101": (512, 384),
    "pets": (500, 375),
    "flowers": (500, 600),
    "sun397": (500, 375),
    "stanford_car": (700, 470),
    "dtd": (600, 450),
    "caltech101": (300, 200),
    "aircraft": (1000, 680),
}
DISTINCT = 4  # distinct images per class; the others are hard links of these


class Writer:
    """Class-coloured noisy JPEGs, `DISTINCT` per class, and hard links of them."""

    def __init__(self, root: Path, size: tuple[int, int], classes: int, seed: int = 0):
        self.pool = root / ".pool"
        self.pool.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        hues = rng.uniform(30, 225, (classes, 3))
        w, h = size
        self.files = {}
        for k in range(classes):
            for j in range(DISTINCT):
                pixels = hues[k][None, None] + rng.normal(0, 30, (h // 8, w // 8, 3))
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).resize(
                    (w, h), Image.BILINEAR
                )
                path = self.pool / f"{k}_{j}.jpg"
                image.save(path, "JPEG", quality=90)
                self.files[k, j] = path
        self.count = 0

    def link(self, path: Path, label: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.link(self.files[label, self.count % DISTINCT], path)
        self.count += 1


def _per_class(total: int, classes: int) -> list[int]:
    return [label for label in range(classes) for _ in range(total // classes + (label < total % classes))]


def _mat_rows(rows: list[dict]) -> np.ndarray:
    fields = list(rows[0])
    out = np.zeros((1, len(rows)), dtype=[(f, object) for f in fields])
    for i, row in enumerate(rows):
        for f in fields:
            out[0, i][f] = row[f]
    return out


def _cifar(root: Path, name: str, scale: float) -> None:
    classes = PAPER_DATASETS[name].num_classes
    rng = np.random.default_rng(0)
    hues = rng.uniform(30, 225, (classes, 3))
    if name == "cifar10":
        base, meta, names_key, labels_key = (
            root / "cifar-10-batches-py",
            "batches.meta",
            b"label_names",
            b"labels",
        )
        files = [(f"data_batch_{i}", 10000) for i in range(1, 6)] + [("test_batch", 10000)]
    else:
        base, meta, names_key, labels_key = (
            root / "cifar-100-python",
            "meta",
            b"fine_label_names",
            b"fine_labels",
        )
        files = [("train", 50000), ("test", 10000)]
    base.mkdir(parents=True)
    with open(base / meta, "wb") as f:
        pickle.dump({names_key: [f"c{i}".encode() for i in range(classes)]}, f)
    for file, count in files:
        labels = _per_class(max(classes, round(count * scale)), classes)
        pixels = hues[labels][:, None, :] + rng.normal(0, 30, (len(labels), 1024, 3))
        data = np.clip(pixels, 0, 255).astype(np.uint8).transpose(0, 2, 1).reshape(len(labels), 3072)
        with open(base / file, "wb") as f:
            pickle.dump({b"data": data, labels_key: labels}, f)


def _food101(root: Path, scale: float) -> None:
    base, classes = root / "food-101", 101
    writer = Writer(root / "food-101", SIZES["food101"], classes)
    names = [f"dish_{k:03d}" for k in range(classes)]
    (base / "meta").mkdir(parents=True)
    for split, per in (("train", 750), ("test", 250)):
        meta = {}
        for k, name in enumerate(names):
            items = [f"{name}/{split}{i}" for i in range(max(1, round(per * scale)))]
            for item in items:
                writer.link(base / "images" / f"{item}.jpg", k)
            meta[name] = items
        (base / "meta" / f"{split}.json").write_text(json.dumps(meta))


def _pets(root: Path, scale: float) -> None:
    base, classes = root / "oxford-iiit-pet", 37
    writer = Writer(base, SIZES["pets"], classes)
    (base / "annotations").mkdir(parents=True)
    for split, file, total in (("train", "trainval.txt", 3680), ("test", "test.txt", 3669)):
        lines = []
        for i, label in enumerate(_per_class(max(classes, round(total * scale)), classes)):
            name = f"pet{label}_{split}{i}"
            writer.link(base / "images" / f"{name}.jpg", label)
            lines.append(f"{name} {label + 1} 1 1\n")
        (base / "annotations" / file).write_text("".join(lines))


def _flowers(root: Path, scale: float) -> None:
    from scipy.io import savemat

    base, classes = root / "flowers-102", 102
    writer = Writer(base, SIZES["flowers"], classes)
    ids, labels = {}, []
    for split, total in (("trnid", 1020), ("valid", 1020), ("tstid", 6149)):
        split_labels = _per_class(max(classes, round(total * scale)), classes)
        ids[split] = np.arange(len(labels) + 1, len(labels) + len(split_labels) + 1, dtype=np.uint16)[None]
        labels += split_labels
    for i, label in enumerate(labels, 1):
        writer.link(base / "jpg" / f"image_{i:05d}.jpg", label)
    savemat(base / "imagelabels.mat", {"labels": np.array([labels], dtype=np.uint8) + 1})
    savemat(base / "setid.mat", ids)


def _sun397(root: Path, scale: float) -> None:
    base, classes = root / "SUN397", 397
    writer = Writer(base, SIZES["sun397"], classes)
    names = [f"/c/class_{k:03d}" for k in range(classes)]
    base.mkdir(parents=True, exist_ok=True)
    (base / "ClassName.txt").write_text("".join(n + "\n" for n in names))
    # the seeded split needs the whole listing: all 108,754 entries, whatever --scale
    for i, label in enumerate(_per_class(sum(SUN397_SPLIT), classes)):
        writer.link(base / names[label].lstrip("/") / f"sun_{i:06d}.jpg", label)


def _stanford_car(root: Path, scale: float) -> None:
    from scipy.io import savemat

    base, classes = root / "stanford_cars", 196
    writer = Writer(base, SIZES["stanford_car"], classes)
    (base / "devkit").mkdir(parents=True)
    savemat(
        base / "devkit" / "cars_meta.mat",
        {"class_names": np.array([[f"Car {k}" for k in range(classes)]], dtype=object)},
    )
    for mat, folder, total in (
        (base / "devkit" / "cars_train_annos.mat", "cars_train", 8144),
        (base / "cars_test_annos_withlabels.mat", "cars_test", 8041),
    ):
        rows = []
        for i, label in enumerate(_per_class(max(classes, round(total * scale)), classes)):
            writer.link(base / folder / f"{i:05d}.jpg", label)
            rows.append({"class": label + 1, "fname": f"{i:05d}.jpg"})
        savemat(mat, {"annotations": _mat_rows(rows)})


def _dtd(root: Path, scale: float) -> None:
    data, classes = root / "dtd" / "dtd", 47
    writer = Writer(data, SIZES["dtd"], classes)
    names = [f"texture{k:02d}" for k in range(classes)]
    (data / "labels").mkdir(parents=True)
    for split in ("train", "val", "test"):
        lines = []
        for i, label in enumerate(_per_class(max(classes, round(1880 * scale)), classes)):
            line = f"{names[label]}/{names[label]}_{split}{i:04d}.jpg"
            writer.link(data / "images" / line, label)
            lines.append(line)
        (data / "labels" / f"{split}1.txt").write_text("\n".join(lines) + "\n")


def _caltech101(root: Path, scale: float) -> None:
    base, classes = root / "caltech101" / "101_ObjectCategories", 101
    writer = Writer(root / "caltech101", SIZES["caltech101"], classes)
    names = sorted(["Faces_easy"] + [f"class_{k:03d}" for k in range(classes - 1)])
    labels = _per_class(sum(CALTECH101_SPLIT), classes)  # the seeded split needs all 8,677, whatever --scale
    for label, name in enumerate(names):
        for i in range(1, labels.count(label) + 1):
            writer.link(base / name / f"image_{i:04d}.jpg", label)
    (base / "BACKGROUND_Google").mkdir()


def _aircraft(root: Path, scale: float) -> None:
    data, classes = root / "fgvc-aircraft-2013b" / "data", 100
    writer = Writer(data, SIZES["aircraft"], classes)
    variants = [f"Variant {k}" for k in range(classes)]
    data.mkdir(parents=True, exist_ok=True)
    (data / "variants.txt").write_text("\n".join(variants) + "\n")
    for split, total in (("train", 3334), ("val", 3333), ("test", 3333)):
        lines = []
        for i, label in enumerate(_per_class(max(classes, round(total * scale)), classes)):
            image_id = f"{split}{i:05d}"
            writer.link(data / "images" / f"{image_id}.jpg", label)
            lines.append(f"{image_id} {variants[label]}\n")
        (data / f"images_variant_{split}.txt").write_text("".join(lines))


GENERATORS: dict[str, Callable[[Path, float], None]] = {
    "cifar10": lambda root, scale: _cifar(root, "cifar10", scale),
    "cifar100": lambda root, scale: _cifar(root, "cifar100", scale),
    "food101": _food101,
    "pets": _pets,
    "flowers": _flowers,
    "sun397": _sun397,
    "stanford_car": _stanford_car,
    "dtd": _dtd,
    "caltech101": _caltech101,
    "aircraft": _aircraft,
}


def generate(root: Path, name: str, scale: float) -> Path:
    """The dataset under root/<name>/ (torchvision's root for it), written once per scale."""
    folder = root / name
    stamp = folder / ".generated"
    if stamp.is_file() and stamp.read_text() == str(scale):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    GENERATORS[name](folder, scale)
    stamp.write_text(str(scale))
    return folder


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the loader's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _probe(
    args: argparse.Namespace, name: str, data: Path, cache: Path, output: Path
) -> tuple[dict, float, float]:
    """One linear_probe.py run: (its result, wall seconds, CPU seconds)."""
    import linear_probe

    model = ["--model-name", args.model_name] if args.model_name else []
    argv = [
        *model,
        "--model-weight",
        args.model_weight,
        "--device",
        args.device,
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
        "--no-progress",
        "--datasets",
        f"{name}={data}",
        "--feature-cache",
        str(cache),
        "--output-dir",
        str(output),
    ]
    start, cpu = time.perf_counter(), _cpu_seconds()
    if linear_probe.main(argv) != 0:
        raise SystemExit(f"linear_probe.py failed on {name}")
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    return json.loads((output / f"linear_probe_{name}.json").read_text()), wall, cpu


def _anonymous_kb() -> tuple[int, int]:
    """(anonymous resident memory now, peak resident memory) of this process, in kB (Linux)."""
    fields = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line
    )
    return int(fields["RssAnon"].split()[0]), int(fields["VmHWM"].split()[0])


def solver(args: argparse.Namespace) -> int:
    """--solver: the fit alone on a memory-mapped random feature file (module doc)."""
    import torch

    from src.evaluation.logistic import Rows, fit_logistic, place

    try:
        rows, dim, classes = (int(v) for v in args.solver.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--solver {args.solver}: give ROWSxDIMxCLASSES, e.g. 1281167x640x1000") from None
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="probe-solver-", dir=args.data) as folder:
        path = Path(folder) / "features.f32"
        features = np.lib.format.open_memmap(
            path.with_suffix(".npy"), mode="w+", dtype=np.float32, shape=(rows, dim)
        )
        rng = np.random.default_rng(0)
        step = max(1, (1 << 24) // dim)
        labels = rng.integers(0, classes, rows)
        centres = rng.normal(size=(classes, dim)).astype(np.float32)
        for start in range(0, rows, step):  # class centres plus noise, L2-normalised, written chunk by chunk
            block = centres[labels[start : start + step]] + rng.normal(
                size=(min(step, rows - start), dim)
            ).astype(np.float32)
            features[start : start + step] = block / np.linalg.norm(block, axis=1, keepdims=True)
        features.flush()
        del features
        mapped = torch.from_numpy(np.load(path.with_suffix(".npy"), mmap_mode="c"))
        before, _ = _anonymous_kb()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        placed = place(Rows(mapped, torch.from_numpy(labels)), device)
        placed_s = time.perf_counter() - start
        fit = fit_logistic([placed], classes, 1e-2, device, max_iter=args.max_iter)
        after, peak = _anonymous_kb()
        size_gb = rows * dim * 4 / 1e9
        print(
            f"[bench] solver: {rows:,} x {dim} features ({size_gb:.2f} GB, memory-mapped), {classes} "
            f"classes, on {device}: placed in {placed_s:.1f} s; {fit.iterations} L-BFGS iterations, "
            f"{fit.evaluations} evaluations in {fit.seconds:.1f} s "
            f"({fit.seconds / max(fit.evaluations, 1):.2f} s per evaluation)"
        )
        if device.type == "cuda":
            print(f"[bench] solver: peak GPU memory {torch.cuda.max_memory_allocated(device) / 1e9:.2f} GB")
        else:
            print(
                f"[bench] solver: anonymous memory {before / 1e6:.2f} -> {after / 1e6:.2f} GB "
                f"(peak resident, file pages included: {peak / 1e6:.2f} GB)"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-weight", default=None, help="weights to probe (e.g. make demo's last checkpoint)")
    p.add_argument(
        "--solver",
        default=None,
        metavar="ROWSxDIMxCLASSES",
        help="time the solver alone on random memory-mapped features of this shape",
    )
    p.add_argument(
        "--max-iter", type=int, default=10, help="--solver: L-BFGS iterations at most (default %(default)s)"
    )
    p.add_argument(
        "--model-name",
        default=None,
        help="model config (default: the one the weights record, as linear_probe.py)",
    )
    p.add_argument(
        "--datasets", default=",".join(LINEAR_PROBE_DATASETS), help="comma-separated names (default: all ten)"
    )
    p.add_argument("--scale", type=float, default=1.0, help="share of each split's real size (default 1)")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder for the generated datasets, kept and reused (default: a temporary folder)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--workers", type=int, default=2, help="image decoding processes (default %(default)s)")
    p.add_argument(
        "--batch-size", type=int, default=256, help="images per forward pass (default %(default)s)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default %(default)s: steadier on a machine shared with other jobs)",
    )
    p.add_argument(
        "--no-rerun",
        action="store_true",
        help="skip the second, cached run (it repeats every fit: the probe seconds again)",
    )
    p.add_argument("--output", type=Path, default=None, help="write the timings as JSON here")
    args = p.parse_args(argv)
    if args.solver:
        return solver(args)
    if not args.model_weight:
        p.error("--model-weight is required (or --solver)")
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = sorted(set(names) - set(GENERATORS))
    if unknown:
        p.error(f"--datasets: unknown {unknown}; choose from {', '.join(GENERATORS)}")
    import torch

    torch.set_num_threads(args.threads)
    data_root = args.data or Path(tempfile.mkdtemp(prefix="probe-bench-"))
    rows, report = (
        [],
        {
            "model": args.model_name,
            "weights": args.model_weight,
            "device": args.device,
            "scale": args.scale,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "cpus": len(os.sched_getaffinity(0)),
            "torch_threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
            "load_average_at_start": os.getloadavg(),
            "datasets": {},
        },
    )
    try:
        for name in names:
            start = time.perf_counter()
            folder = generate(data_root, name, args.scale)
            generated = time.perf_counter() - start
            with tempfile.TemporaryDirectory(prefix="probe-run-") as run:
                cache, out = Path(run) / "cache", Path(run) / "out"
                first, first_wall, first_cpu = _probe(args, name, folder, cache, out)
                second_wall = second_cpu = None
                if not args.no_rerun:
                    second, second_wall, second_cpu = _probe(args, name, folder, cache, out)
                    assert second["metrics"] == first["metrics"]
                    assert all(e["reused"] for e in second["feature_cache"].values())
            fits = first["regularization"]["fits"]
            iterations = [s["iterations"] for s in first["regularization"]["sweep"]]
            entry = {
                "images": first["images"],
                "generate_seconds": generated,
                "extract_seconds": first["seconds"]["features"],
                "probe_seconds": first["seconds"]["probe"],
                "fits": fits,
                "seconds_per_fit": first["seconds"]["probe"] / fits,
                "lbfgs_iterations": iterations + [first["regularization"]["final_iterations"]],
                "first_wall_seconds": first_wall,
                "first_cpu_seconds": first_cpu,
                "cached_wall_seconds": second_wall,
                "cached_cpu_seconds": second_cpu,
                "score": first["score"],
                "metric": first["metric"],
            }
            report["datasets"][name] = entry
            images = first["images"]
            cached = "-" if second_wall is None else f"{second_wall:.1f}"
            ratio = "-" if second_wall is None else f"{first_wall / second_wall:.1f}x"
            rows.append(
                [
                    name,
                    f"{images['train']:,}/{images['val']:,}/{images['test']:,}",
                    f"{entry['extract_seconds']:.1f}",
                    f"{entry['probe_seconds']:.1f}",
                    str(fits),
                    f"{entry['seconds_per_fit']:.2f}",
                    f"{first_wall:.1f}",
                    f"{first_cpu:.1f}",
                    cached,
                    ratio,
                ]
            )
            print(
                f"[bench] {name}: first run {first_wall:.1f} s ({first_cpu:.1f} CPU s), from the cache "
                f"{cached} s",
                flush=True,
            )
    finally:
        if args.data is None:
            shutil.rmtree(data_root, ignore_errors=True)
    from src.evaluation.results import format_rows

    print(
        format_rows(
            [
                "dataset",
                "train/val/test",
                "extract s",
                "probe s",
                "fits",
                "s/fit",
                "first run s",
                "CPU s",
                "cached run s",
                "ratio",
            ],
            rows,
        )
    )
    report["load_average_at_end"] = os.getloadavg()
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
        print(f"[bench] -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
