"""`--validate full`'s second decoder: DALI's CPU image decoder, the one the DALI loader uses.

PIL (the PyTorch loader's decoder) is the stricter of the two on every fault we have met,
so this check finds little; it runs because "full" promises that both loaders' CPU
decoders read every stored image. A DALI pipeline that fails is unusable afterwards, so
a failing batch is retried one image at a time on fresh pipelines to find the culprit.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except Exception:  # not installed, or a broken install: the check is then PIL's alone
        return False
    return True


class DaliDecodeCheck:
    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size
        self._pipe = None

    def _build(self, batch_size: int):
        from nvidia.dali import fn, types
        from nvidia.dali.pipeline import Pipeline

        pipe = Pipeline(
            batch_size=batch_size,
            num_threads=1,
            device_id=None,
            exec_pipelined=False,
            exec_async=False,
            prefetch_queue_depth=1,
        )
        with pipe:
            data = fn.external_source(name="jpegs", dtype=types.UINT8)
            pipe.set_outputs(fn.decoders.image(data, device="cpu", output_type=types.RGB))
        pipe.build()
        return pipe

    def _run(self, pipe, payloads: list[bytes]) -> None:
        pipe.feed_input("jpegs", [np.frombuffer(p, np.uint8) for p in payloads])
        pipe.run()

    def failures(self, payloads: list[bytes]) -> dict[int, str]:
        """{index: DALI's message} for the payloads DALI's CPU decoder cannot decode."""
        bad: dict[int, str] = {}
        for start in range(0, len(payloads), self.batch_size):
            part = payloads[start : start + self.batch_size]
            if self._pipe is None:
                self._pipe = self._build(self.batch_size)
            try:
                self._run(self._pipe, part)
                continue
            except Exception:
                self._pipe = None
            for i, payload in enumerate(part):
                try:
                    self._run(self._build(1), [payload])
                except Exception as exc:
                    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                    bad[start + i] = lines[-1] if lines else type(exc).__name__
        return bad
