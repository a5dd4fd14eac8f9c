"""Compiles the fused-mix kernels for an H100/H200 (sm_90) without a GPU and prints their
register use as JSON:

    python -m tests._mix_compile

As tests/_wkv_bi_triton_compile.py does for the WKV: the interpreter runs the kernels'
Python, this runs their GPU lowering (and the native bf16 rounding the interpreter
replaces), at the launch configuration `mix.py` uses. TRITON_INTERPRET must not be set.
"""

from __future__ import annotations

import json
import sys

from src.open_alip import mix
from src.open_alip import mix_triton_kernels as kernels
from tests._wkv_bi_triton_compile import resources


def _pointers(**dtypes: str) -> dict[str, str]:
    return {f"{name}_ptr": f"*{dtype}" for name, dtype in dtypes.items()} | {"R": "i32", "C": "i32"}


def main() -> int:
    blocks = {"BLOCK_R": mix._BLOCK_R, "BLOCK_C": mix._BLOCK_C, "SPANS": mix._MAX_SPANS}
    report = {}
    # The time mix's five mixes with the LoRA term (bf16 out, bf16 m) and a channel mix's two.
    for mixes, has_m in ((5, True), (2, False)):
        constants = {"K": mixes, "HAS_M": has_m} | blocks
        mixes_bf16 = {f"out{j}": "bf16" for j in range(5)}
        forward = _pointers(a="fp32", b="fp32", coef="fp32", m="bf16", **mixes_bf16)
        backward = _pointers(
            **{f"g{j}": "bf16" for j in range(5)},
            a="fp32",
            b="fp32",
            coef="fp32",
            m="bf16",
            da="fp32",
            db="fp32",
            dm="bf16",
            dcoef="fp32",
        )
        report[f"forward_K{mixes}"] = resources(kernels.mix_forward_kernel, forward, constants, mix.NUM_WARPS)
        report[f"backward_K{mixes}"] = resources(
            kernels.mix_backward_kernel,
            backward,
            constants | {"K_PAD": 1 << (mixes - 1).bit_length()},
            mix.NUM_WARPS,
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
