"""Compiles the bi_triton kernels for an H100/H200 (sm_90) without a GPU and prints what the
compiled code holds, as JSON:

    python -m tests._wkv_bi_triton_compile [image] [text]

Triton's interpreter runs the kernels' Python, not their GPU lowering; this compiles them
the way a launch at the B/32 training shapes of the named towers (default both) would
(benchmarks/kernel_static.py: Triton's compiler and the ptxas in its wheel) and reads registers,
spills, barriers per token in the serial loops and the estimate off the machine code, by tower
and kernel. TRITON_INTERPRET must not be set.
"""

from __future__ import annotations

import json
import sys

from benchmarks import kernel_static


def resources(
    kernel, signature: dict[str, str], constants: dict[str, object], num_warps: int
) -> dict[str, int]:
    """Registers and spill bytes of `kernel` compiled for sm_90 (tests/_mix_compile.py uses it)."""
    arguments = {name: (kind, None) for name, kind in signature.items()}
    arguments |= {name: ("constexpr", value) for name, value in constants.items()}
    compiled = kernel_static.compile_sm90(kernel, arguments, num_warps)
    return {"registers": compiled.registers, "spill_bytes": compiled.spills, "num_warps": num_warps}


def main() -> int:
    wanted = sys.argv[1:] or ["image", "text"]
    report: dict[str, dict] = {}
    for tower in kernel_static.towers(512):
        if tower.name not in wanted:
            continue
        for launch in kernel_static.bi_triton_launches(tower):
            row = kernel_static.measure(launch).to_json()
            report.setdefault(tower.name, {})[launch.kernel] = {
                key: row[key]
                for key in (
                    "registers",
                    "spills",
                    "blocks_per_sm",
                    "barriers_per_step",
                    "programs",
                    "waves",
                    "est_ms",
                )
            }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
