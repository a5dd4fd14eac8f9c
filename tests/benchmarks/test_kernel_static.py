"""benchmarks/sass.py and benchmarks/kernel_static.py: counts read off compiled code, checked on
small kernels whose answers are known, and the latency model's arithmetic.

The kernels are compiled for sm_90 on this CPU with the ptxas and cuobjdump in Triton's wheel
(no GPU: nothing is launched); TRITON_INTERPRET must not be set for that, and a wheel without
the NVIDIA tools skips those tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import triton
import triton.language as tl

from benchmarks import kernel_static as ks
from benchmarks import sass

_TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
compiles = pytest.mark.skipif(
    not _TOOLS.exists() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs the NVIDIA tools of Triton's wheel and compiled (not interpreted) kernels",
)

# ------------------------------------------------------------------ SASS text, no compiler

# A loop (0x40..0x70, back edge at 0x70) and an out-of-line block (0xa0) that jumps back to the
# join point 0x90: a backward branch that is not a loop.
_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   ISETP.GE.AND P0, PT, R2, 0x1, PT ;
        /*0020*/              @!P0 BRA 0x80 ;
        /*0030*/                   MOV R3, RZ ;
        /*0040*/                   LDG.E R4, desc[UR4][R6.64] ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/                   FFMA R3, R4, R4, R3 ;
        /*0070*/               @P0 BRA 0x40 ;
        /*0080*/               @P1 BRA 0xa0 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   FADD R3, R3, 1 ;
        /*00b0*/                   BRA 0x90 ;
        /*00c0*/                   BRA 0xc0;
"""


def test_parse_reads_addresses_guards_and_opcodes():
    code = sass.parse(_SASS)
    assert [hex(i.address) for i in code[:3]] == ["0x0", "0x10", "0x20"]
    assert code[2].predicate == "@!P0" and code[2].opcode == "BRA" and code[2].target() == 0x80
    assert code[4].family == "LDG" and code[5].family == "BAR"


def test_a_back_edge_to_a_non_dominating_block_is_not_a_loop():
    code = sass.parse(_SASS)
    found = sass.loops(code)
    assert [hex(lp.address) for lp in found] == ["0x40"]  # not the out-of-line jump to 0x90, nor dead 0xc0


def test_counts_scale_with_the_trip_count():
    counts = sass.analyse(sass.parse(_SASS), trips=[7])
    assert counts.barriers == counts.barriers_in_loops == 7
    assert counts.fp32_flop == 7 * 32 * 2 + 32  # the loop's FFMA, and the out-of-line FADD once
    assert counts.round_trips == 7  # the loaded value is used in the same iteration
    assert counts.loops == [
        {"address": 0x40, "depth": 0, "trips": 7, "barriers": 1, "round_trips": 1, "instructions": 4}
    ]
    with pytest.raises(ValueError, match="1 loops .*2 trip counts"):
        sass.analyse(sass.parse(_SASS), trips=[7, 1])


def test_round_trips_follow_data_dependences():
    chain = sass.parse("""
        /*0000*/   LDG.E R2, desc[UR4][R8.64] ;
        /*0010*/   IMAD.WIDE R4, R2, 0x4, R10 ;
        /*0020*/   LDG.E R6, desc[UR4][R4.64] ;
        /*0030*/   FADD R7, R6, R6 ;
        /*0040*/   LDG.E R9, desc[UR4][R12.64] ;
    """)
    # an index load feeding an address, whose data is used: two in sequence; the last load's
    # value is never used here (a prefetch), so it waits for nothing
    assert sass.round_trips(chain) == 2


def test_tensor_core_flop_by_instruction_shape():
    assert sass._mma_flop("HMMA.16816.F32.BF16") == ("bf16", 2 * 16 * 8 * 16)
    assert sass._mma_flop("HMMA.1688.F32.TF32") == ("tf32", 2 * 16 * 8 * 8)
    assert sass._mma_flop("HGMMA.64x128x16.F32.BF16") == ("bf16", 2 * 64 * 128 * 16 // 4)  # per warp of 4
    assert sass._mma_flop("DMMA.16x8x16") == ("f64", 2 * 16 * 8 * 16)


# ------------------------------------------------------------------ the model's arithmetic


def test_blocks_per_sm_takes_the_tightest_limit():
    assert ks.blocks_per_sm(registers=32, warps=1, shared=0) == ks.MAX_BLOCKS_PER_SM
    assert ks.blocks_per_sm(registers=64, warps=4, shared=0) == 8  # 64 warps an SM
    assert ks.blocks_per_sm(registers=255, warps=8, shared=0) == 1  # 256 x 8 x 32 registers
    assert ks.blocks_per_sm(registers=128, warps=4, shared=0) == 4
    assert ks.blocks_per_sm(registers=32, warps=4, shared=100 * 1024) == 2  # 228 KB an SM


def test_waves_and_time():
    p = ks.Program(warps=4, barriers=10, round_trips=2, instructions=1000, fp32_flop=0, mma_flop={})
    assert ks.latency_cycles(p) == 10 * ks.BARRIER_CYCLES + 2 * ks.MEMORY_CYCLES + 1000
    assert ks.work_cycles(p) == 4 * 1000 / ks.ISSUE_PER_SM
    one_wave = ks.SMS * 2
    seconds, waves = ks.estimate_seconds(p, one_wave, resident=2)
    assert waves == 1 and seconds == pytest.approx(max(3000, 2 * 1000) / ks.CLOCK_HZ)
    seconds, waves = ks.estimate_seconds(p, one_wave + 1, resident=2)
    assert waves == 2 and seconds == pytest.approx((3000 + 3000) / ks.CLOCK_HZ)  # the tail's one program
    assert ks.estimate_seconds(p, 0, resident=2) == (0.0, 0)


# ------------------------------------------------------------------ compiled kernels


@triton.jit
def _barrier_loop(x, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(T):
        acc = acc * 0.5 + tl.load(x + t * BLOCK + offs)
        tl.debug_barrier()
    tl.store(x + offs, acc)


@triton.jit
def _nested(x, A, B):
    for _a in range(A):
        for _b in range(B):
            tl.debug_barrier()
    tl.store(x, 1.0)


@triton.jit
def _matmul(a, b, c, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    om, on, ok = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    x = tl.load(a + om[:, None] * K + ok[None, :])
    y = tl.load(b + ok[:, None] * N + on[None, :])
    tl.store(c + om[:, None] * N + on[None, :], tl.dot(x, y))


@triton.jit
def _pipelined(a, b, c, K, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(a + o[:, None] * K + k0 + o[None, :])
        y = tl.load(b + (k0 + o[:, None]) * BLOCK + o[None, :])
        acc = tl.dot(x, y, acc)
    tl.store(c + o[:, None] * BLOCK + o[None, :], acc)


def _counts(fn, arguments, warps, trips, stages=3):
    compiled = ks.compile_sm90(fn, arguments, warps, stages)
    return compiled, sass.analyse(compiled.code, trips)


@compiles
def test_one_explicit_barrier_and_one_fma_per_element_and_step():
    compiled, counts = _counts(
        _barrier_loop,
        {"x": ("*fp32", None), "T": ("i32", 5), "BLOCK": ("constexpr", 128)},
        warps=4,
        trips=[5],
    )
    assert [lp["barriers"] for lp in counts.loops] == [1]
    assert counts.barriers_in_loops == 5
    assert counts.fp32_flop * 4 == 5 * 128 * 2  # 128 lanes, one FFMA each per step, over 4 warps
    assert counts.round_trips >= 5  # each step waits for its load
    assert compiled.spills == 0 and compiled.registers > 0


@compiles
def test_nested_loops_multiply():
    _, counts = _counts(
        _nested, {"x": ("*fp32", None), "A": ("i32", 3), "B": ("i32", 4)}, warps=1, trips=[3, 4]
    )
    assert [lp["depth"] for lp in counts.loops] == [0, 1]
    assert counts.barriers == 12


@compiles
@pytest.mark.parametrize("shape,warps", [((64, 64, 64), 4), ((16, 32, 64), 1)], ids=["wgmma", "mma"])
def test_tensor_core_flop_add_up_to_the_product(shape, warps):
    m, n, k = shape
    args = {
        "a": ("*bf16", None),
        "b": ("*bf16", None),
        "c": ("*fp32", None),
        "M": ("constexpr", m),
        "N": ("constexpr", n),
        "K": ("constexpr", k),
    }
    _, counts = _counts(_matmul, args, warps=warps, trips=[])
    assert counts.mma > 0
    assert sum(counts.mma_flop.values()) * warps == 2 * m * n * k
    assert set(counts.mma_flop) == {"bf16"}


@compiles
def test_asynchronous_copies_come_with_software_pipelining():
    args = {
        "a": ("*bf16", None),
        "b": ("*bf16", None),
        "c": ("*fp32", None),
        "K": ("i32", 256),
        "BLOCK": ("constexpr", 64),
    }
    pipelined = ks.compile_sm90(_pipelined, args, 4, num_stages=3)
    plain = ks.compile_sm90(_pipelined, args, 4, num_stages=1)
    count = lambda compiled: sum(ins.family in sass.ASYNC_COPIES for ins in compiled.code)  # noqa: E731
    assert count(pipelined) > 0 and count(plain) == 0


@compiles
def test_a_row_has_the_keys_the_json_promises(tmp_path):
    launch = ks.Launch(
        kernel="barrier_loop",
        impl="mix",
        tower="image",
        pass_="fwd",
        fn=_barrier_loop,
        arguments={"x": ("*fp32", None), "T": ("i32", 8), "BLOCK": ("constexpr", 128)},
        num_warps=4,
        programs=1000,
        trips=[8],
        tokens=8,
        calls=3,
    )
    row = ks.measure(launch)
    data = row.to_json()
    assert list(data) == [
        "kernel",
        "impl",
        "tower",
        "pass",
        "registers",
        "spills",
        "shared_bytes",
        "blocks_per_sm",
        "barriers_per_step",
        "serial_steps",
        "programs",
        "waves",
        "mma",
        "cp_async",
        "est_ms",
    ]
    assert data["barriers_per_step"] == 1.0 and data["serial_steps"] == 8 and data["programs"] == 1000
    assert data["waves"] == -(-1000 // (ks.SMS * data["blocks_per_sm"]))
    json.dumps(data)


def test_bad_batch_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        ks.parse_args(["--batch", "0"])
    assert exc.value.code == 2 and "--batch 0: give a positive micro-batch" in capsys.readouterr().err
