"""The original's ImageNet validation preprocessing, through DALI as it ran it: decode to RGB,
resize the shorter side to 256/224 x the input size with a triangular filter, centre crop to
the input size, CLIP mean/std normalisation (docs/evaluation.md).

The encoded bytes come from files or `.rec` records (read here, so a rank's slice of the
dataset is exactly the items it is given) and are fed to a DALI pipeline: the `mixed` decoder
(nvJPEG) on a GPU, as the original, or the CPU decoder elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import torch

from src.evaluation.datasets import ImageSource, read_encoded
from src.evaluation.images import Batch, describe_failure
from src.jpeg import NO_TABLES, jpeg_structure_fault
from src.open_alip.constants import CLIP_MEAN, CLIP_STD


def resize_shorter(input_size: int) -> int:
    """The shorter side before the crop: int(256 / 224 * size), 256 at the usual 224."""
    return int(256 / 224 * input_size)


def dali_preprocessing(input_size: int, device: torch.device | str) -> str:
    """What result files record as "preprocessing" for this path (the decoder follows the device,
    as in the original: nvJPEG on a GPU)."""
    decoder = "mixed (nvJPEG)" if torch.device(device).type == "cuda" else "cpu"
    return (
        f"DALI, {decoder} decoder: triangular resize of the shorter side to {resize_shorter(input_size)}, "
        f"centre crop, CLIP mean/std (the original's ImageNet path)"
    )


def _build_pipeline(input_size: int, batch_size: int, workers: int, device: torch.device):
    from nvidia.dali import Pipeline, fn, types

    gpu = device.type == "cuda"
    device_id = (device.index if device.index is not None else torch.cuda.current_device()) if gpu else None
    # Synchronous: each run() decodes exactly the batch fed before it (reading files is ours).
    pipe = Pipeline(
        batch_size=batch_size,
        num_threads=max(1, workers),
        device_id=device_id,
        exec_async=False,
        exec_pipelined=False,
    )
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        images = fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB)
        images = fn.resize(
            images, size=resize_shorter(input_size), mode="not_smaller", interp_type=types.INTERP_TRIANGULAR
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            crop=(input_size, input_size),
            mean=[m * 255 for m in CLIP_MEAN],
            std=[s * 255 for s in CLIP_STD],
            mirror=0,
        )
        pipe.set_outputs(images)
    pipe.build()
    return pipe


def _to_torch(output, device: torch.device) -> torch.Tensor:
    from nvidia.dali.plugin.pytorch import feed_ndarray

    tensor = output.as_tensor()
    out = torch.empty(tensor.shape(), dtype=torch.float32, device=device if device.type == "cuda" else "cpu")
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(tensor, out, cuda_stream=stream)
    return out


def _read_checked(source: ImageSource) -> tuple[np.ndarray | None, int | None, str | None]:
    """(encoded bytes, stored label, None), or (None, None, why it is skipped)."""
    try:
        data, stored = read_encoded(source)
    except Exception as exc:  # an unreadable file or record is skipped like an undecodable image
        return None, None, describe_failure(exc)
    if data[:2] == b"\xff\xd8":
        # Cheap, and it finds what a decoder would stumble on (DALI fails a whole batch at once).
        fault = jpeg_structure_fault(data)
        if fault is not None and fault.kind != NO_TABLES:
            return None, None, f"not a whole JPEG: {fault.text}"
    return np.frombuffer(data, dtype=np.uint8), stored, None


def _decode(pipe, encoded: list[np.ndarray], device: torch.device) -> torch.Tensor:
    pipe.feed_input("encoded", encoded)
    (output,) = pipe.run()
    return _to_torch(output, device)


def dali_val_batches(
    images: Sequence[ImageSource],
    labels: Sequence[int],
    input_size: int,
    batch_size: int,
    device: torch.device | str,
    workers: int = 1,
) -> Iterator[Batch]:
    """`Batch`es of `images` in order: float32 [B, 3, S, S] on `device`, int64 labels, the
    positions of the images decoded, and (position, reason) for each one skipped.

    A record's label is the one stored in it (as DALI's mxnet reader returns it); a file's is
    `labels[i]`. Files are read by `workers` threads while DALI decodes with as many. An image
    that cannot be read, is not a whole JPEG, or that DALI cannot decode is skipped: DALI fails
    a whole batch for one bad image, so such a batch is decoded again one image at a time.
    """
    device = torch.device(device)
    rebuild = partial(_build_pipeline, input_size, batch_size, workers, device)
    pipes = [rebuild()]  # replaced after a failure
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for start in range(0, len(images), batch_size):
            read = list(pool.map(_read_checked, images[start : start + batch_size]))
            failed = [(start + i, why) for i, (_, _, why) in enumerate(read) if why is not None]
            good = [i for i, (_, _, why) in enumerate(read) if why is None]
            pixels: torch.Tensor | None = None
            if good:
                try:
                    pixels = _decode(pipes[0], [read[i][0] for i in good], device)
                except RuntimeError:
                    # A DALI pipeline is unusable after an error: each decode below gets a sound one.
                    pixels, good = _decode_one_by_one(pipes, rebuild, read, good, start, failed, device)
            batch_labels = [labels[start + i] if read[i][1] is None else read[i][1] for i in good]
            yield Batch(
                pixels,
                torch.tensor(batch_labels, dtype=torch.long),
                [start + i for i in good],
                sorted(failed),
            )


def _decode_one_by_one(
    pipes: list,
    rebuild,
    read: list,
    good: list[int],
    start: int,
    failed: list[tuple[int, str]],
    device: torch.device,
) -> tuple[torch.Tensor | None, list[int]]:
    decoded, kept = [], []
    pipes[0] = rebuild()
    for i in good:
        try:
            decoded.append(_decode(pipes[0], [read[i][0]], device))
            kept.append(i)
        except RuntimeError as exc:
            failed.append((start + i, f"DALI could not decode it ({_dali_reason(exc)})"))
            pipes[0] = rebuild()
    return (torch.cat(decoded) if decoded else None), kept


def _dali_reason(exc: RuntimeError) -> str:
    """The line of DALI's multi-line error that says what failed (it opens with its own traceback)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    after = lines[lines.index("encountered:") + 1 :] if "encountered:" in lines else lines
    return next(
        (line for line in after if "no longer valid" not in line), lines[0] if lines else "unknown error"
    )
