"""Compiles the bi_triton kernels for an H100/H200 (sm_90) without a GPU and prints their
register use as JSON:

    python -m tests._wkv_bi_triton_compile

Triton's interpreter runs the kernels' Python, not their GPU lowering; this compiles them
the way a GPU run would (to a cubin, with the ptxas that ships in the triton wheel) at
the launch configuration `wkv_bi_triton` uses, and reads registers and spills off the
cubin. TRITON_INTERPRET must not be set.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from src.open_alip import wkv_bi_triton_kernels as kernels
from src.open_alip.wkv_bi_triton import split_head_size, warps

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
# (head size, heads): the B/32 image and text towers, all inputs bf16 (the text tower's dtypes).
SHAPES = ((80, 8), (64, 10))


def resources(kernel, signature: dict[str, str], constants: dict[str, int], num_warps: int) -> dict[str, int]:
    source = ASTSource(
        fn=kernel, signature={**signature, **dict.fromkeys(constants, "constexpr")}, constexprs=constants
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
    found = re.search(r"REG:(\d+).*?LOCAL:(\d+)", usage)
    assert found, usage
    return {"registers": int(found[1]), "spill_bytes": int(found[2]), "num_warps": num_warps}


def main() -> int:
    tensor = "*bf16"
    forward = dict.fromkeys(("r", "k", "v", "w", "u"), tensor) | {"y": "*fp32", "T": "i32", "w_max": "fp32"}
    backward = (
        dict.fromkeys(("r", "k", "v", "w", "u"), tensor)
        | {"gy": "*fp32"}
        | dict.fromkeys(("dr", "dk", "dv", "dw"), tensor)
        | {"carry": "*fp32", "du_part": "*fp32", "T": "i32", "w_max": "fp32"}
    )
    report = {}
    for size, heads in SHAPES:
        first, rest = split_head_size(size)
        constants = {"H": heads, "N": size, "NA": first, "NB": rest}
        forward_warps, backward_warps = warps(size)
        report[f"forward_N{size}"] = resources(
            kernels.wkv_bi_forward_kernel, forward, constants, forward_warps
        )
        report[f"backward_N{size}"] = resources(
            kernels.wkv_bi_backward_kernel, backward, constants, backward_warps
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
