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

import numpy as np
import torch

from src.evaluation.datasets import EvalDataError, ImageSource, read_encoded
from src.open_alip.constants import CLIP_MEAN, CLIP_STD


def resize_shorter(input_size: int) -> int:
    """The shorter side before the crop: int(256 / 224 * size), 256 at the usual 224."""
    return int(256 / 224 * input_size)


def dali_preprocessing(input_size: int, device: torch.device | str) -> str:
    """What result files record as "preprocessing" for this path (the decoder follows the device,
    as in the original: nvJPEG on a GPU)."""
    decoder = "mixed (nvJPEG)" if torch.device(device).type == "cuda" else "cpu"
    return (f"DALI, {decoder} decoder: triangular resize of the shorter side to {resize_shorter(input_size)}, "
            f"centre crop, CLIP mean/std (the original's ImageNet path)")


def _build_pipeline(input_size: int, batch_size: int, workers: int, device: torch.device):
    from nvidia.dali import Pipeline, fn, types

    gpu = device.type == "cuda"
    device_id = (device.index if device.index is not None else torch.cuda.current_device()) if gpu else None
    # Synchronous: each run() decodes exactly the batch fed before it (reading files is ours).
    pipe = Pipeline(batch_size=batch_size, num_threads=max(1, workers), device_id=device_id,
                    exec_async=False, exec_pipelined=False)
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        images = fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, size=resize_shorter(input_size), mode="not_smaller",
                           interp_type=types.INTERP_TRIANGULAR)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", crop=(input_size, input_size),
            mean=[m * 255 for m in CLIP_MEAN], std=[s * 255 for s in CLIP_STD], mirror=0,
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


def dali_val_batches(
    images: Sequence[ImageSource],
    labels: Sequence[int],
    input_size: int,
    batch_size: int,
    device: torch.device | str,
    workers: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(float32 [B, 3, S, S] on `device`, int64 labels [B]) batches of `images` in order.

    A record's label is the one stored in it (as DALI's mxnet reader returns it); a file's is
    `labels[i]`. Files are read by `workers` threads while DALI decodes with as many.
    """
    device = torch.device(device)
    pipe = _build_pipeline(input_size, batch_size, workers, device)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for start in range(0, len(images), batch_size):
            chunk = images[start : start + batch_size]
            read = list(pool.map(read_encoded, chunk))
            encoded = [np.frombuffer(data, dtype=np.uint8) for data, _ in read]
            batch_labels = [labels[start + i] if stored is None else stored for i, (_, stored) in enumerate(read)]
            pipe.feed_input("encoded", encoded)
            try:
                (output,) = pipe.run()
            except RuntimeError as exc:
                first, last = chunk[0], chunk[-1]
                raise EvalDataError(
                    f"DALI could not decode an image among {first} .. {last}: {str(exc).splitlines()[0]}"
                ) from None
            yield _to_torch(output, device), torch.tensor(batch_labels, dtype=torch.long)
