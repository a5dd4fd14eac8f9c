"""benchmarks/gpu.py's sections for what the check machine may lack: DALI's GPU JPEG pipeline
and a one-process NCCL group. gpu.py runs each only where its package is present."""

from __future__ import annotations

import importlib.util
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_report import Budget, Results
from benchmarks.gpu_train import gb


def dali_missing() -> str | None:
    """Why the DALI section cannot run here, or None."""
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        return "nvidia-dali is not installed (its wheels are 200-400 MB; the GPU check runs without it)"
    return None


def nccl_missing() -> str | None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return "this torch has no NCCL"
    return None


def photo_records(folder: Path, records: int, unique: int) -> Path:
    """`records` JPEGs of 500x375 (photo-like: smooth colour fields plus grain), cycling
    over `unique` encoded images to keep generation short; captions are a fixed token list."""
    import cv2
    import numpy as np

    from src.recordio import IRHeader, MXIndexedRecordIO, pack

    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(unique):
        low = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        img = cv2.resize(low, (500, 375), interpolation=cv2.INTER_CUBIC)
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        jpegs.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
    label = np.zeros(77, np.float32)
    label[[0, 1, 2]] = (49406, 320, 49407)
    prefix = folder / "photos"
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for i in range(records):
            rec.write_idx(i, pack(IRHeader(0, label, i, 0), jpegs[i % unique]))
    return prefix


def section_dali(results: Results, budget: Budget, quick: bool = False) -> None:
    import torch

    from dataloaders.imagenet import build_loader

    records, batch, epochs = (512, 64, 2) if quick else (8192, 256, 3)
    threads = max(1, min(8, (os.cpu_count() or 2) - 2))
    case: dict[str, Any] = {"records": records, "batch": batch, "threads": threads, "epochs": epochs}
    with tempfile.TemporaryDirectory() as tmp:
        prefix = photo_records(Path(tmp), records, unique=256)
        loader = build_loader(
            f"{prefix}.rec",
            batch,
            input_size=224,
            train=True,
            backend="dali",
            device="cuda",
            num_threads=threads,
            rank=0,
            world_size=1,
            seed=0,
            cache_dir=tmp,
        )
        steady_images, steady_s, total_images, total_s = 0, 0.0, 0, 0.0
        for epoch in range(epochs):
            if epoch and not budget.allows(10.0):
                case["note"] = f"stopped after {epoch} epochs: section time budget spent"
                break
            loader.set_epoch(epoch)
            started = time.perf_counter()
            first_done = None
            for i, (images, tokens) in enumerate(loader):
                if i == 0:
                    torch.cuda.synchronize()
                    first_done = time.perf_counter()
                    case["device"] = str(images.device)
                    case["tokens_device"] = str(tokens.device)
                    case["shape"] = list(images.shape)
                    case["dtype"] = str(images.dtype)
                elif epoch:  # epoch 0 warms up the decoder
                    steady_images += images.shape[0]
            torch.cuda.synchronize()
            ended = time.perf_counter()
            if epoch and first_done is not None:
                steady_s += ended - first_done
                total_images += len(loader) * batch
                total_s += ended - started
        if steady_s:
            case["images_per_s"] = steady_images / steady_s
            case["images_per_s_with_rebuilds"] = total_images / total_s
    results.add_case("dali", case)
    results.set(
        "dali",
        note="images/s within epochs after the first (warm-up); with_rebuilds includes each epoch's pipeline "
        "build",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def section_nccl(results: Results, budget: Budget, quick: bool = False) -> None:
    import torch
    import torch.distributed as dist

    version = torch.cuda.nccl.version()
    case: dict[str, Any] = {
        "nccl_version": ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    }
    device = torch.device("cuda", 0)
    started = time.perf_counter()
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, device_id=device
    )
    try:
        case["init_s"] = round(time.perf_counter() - started, 3)
        n = (16 if quick else 256) * 2**20 // 4  # float32 elements
        x = torch.full((n,), 1.5, device=device)
        dist.all_reduce(x)  # warm-up: builds the communicator
        torch.cuda.synchronize()
        repeats = 5
        started = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / repeats
        case["all_reduce_gb"] = gb(x.numel() * 4)
        case["all_reduce_ms"] = 1e3 * seconds
        case["bus_gb_per_s"] = x.numel() * 4 / seconds / 1e9
        case["correct"] = bool((x == 1.5).all().item())  # a sum over one rank leaves it unchanged
    finally:
        dist.destroy_process_group()
    results.add_case("nccl", case)
