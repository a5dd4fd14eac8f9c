"""What every Triton kernel of a B/32 training step does on an H200, counted on a CPU.

    python -m benchmarks.kernel_static                  # the planner's micro-batch (about half a minute)
    python -m benchmarks.kernel_static --batch 512 --json kernel_static.json

Each kernel is compiled for sm_90 at the B/32 training shapes, exactly as a launch would
compile it (Triton's own compiler and the ptxas in its wheel; no GPU), and read back from
its machine code (benchmarks/sass.py): registers, spills, shared memory, blocks per SM,
barriers per token inside the serial loops, serial steps, programs and waves, tensor-core
instructions, asynchronous copies. One latency model, with the constants printed, turns
those counts into an estimated time per training step for every kernel, ours and fla's
alike:

* a program's critical path: its barriers x BARRIER_CYCLES, its dependent global-memory
  round trips x MEMORY_CYCLES (loads whose values are used in the same loop iteration;
  a chain of loads feeding each other's addresses counts each), and one cycle per
  instruction a warp issues;
* what the programs resident on one SM share: FP32 FLOPs at the datasheet's FP32 rate,
  tensor-core FLOPs at its dense rate for their input type, four instructions a cycle;
* a wave is as long as the longer of the two, with `blocks_per_sm` programs per SM (the
  last wave with the programs that are left); the waves run one after another.

Kernels: our bidirectional WKV (`bi_triton`) forward and backward, the fused token-shift
mixes (`mix`) forward and backward at each of their three sites, and the four fla kernels
that `--wkv-impl fla` launches twice per call (once per direction). fla autotunes its
launch configuration on the GPU; each fla kernel is given the configuration this model
rates fastest. fla's path also runs eager PyTorch ops (float32 copies, flips, sums of
per-tile partials); they are not Triton kernels and not in these rows.

The model has no memory-bandwidth term: bytes are counted by benchmarks/step_traffic.py. It
is an estimate for comparing kernels, not a measurement; benchmarks/gpu.py times them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from src.errors import UserError
from src.errors import report as report_error

PROG = "benchmarks.kernel_static"
CONFIG = "RWKV_CLIP_B32"

# ------------------------------------------------------------------ the machine and the model

SMS = 132
CLOCK_HZ = 1.98e9
BARRIER_CYCLES = 100
MEMORY_CYCLES = 500  # one dependent global-memory round trip
# H200 SXM datasheet rates (dense: half the "with sparsity" tensor figures), FLOP/s per GPU.
FP32_FLOPS = 67e12
TENSOR_FLOPS = {
    "bf16": 989.5e12,
    "f16": 989.5e12,
    "tf32": 494.7e12,
    "e4m3": 1979e12,
    "e5m2": 1979e12,
    "f64": 67e12,
}
ISSUE_PER_SM = 4  # instructions per cycle (four schedulers); one per cycle per warp
# Residency limits of one sm_90 SM.
MAX_BLOCKS_PER_SM = 32
MAX_WARPS_PER_SM = 64
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
TARGET = ("cuda", 90, 32)


def model_constants() -> dict[str, object]:
    return {
        "SMs": SMS,
        "clock_GHz": CLOCK_HZ / 1e9,
        "barrier_cycles": BARRIER_CYCLES,
        "memory_round_trip_cycles": MEMORY_CYCLES,
        "fp32_TFLOPs": FP32_FLOPS / 1e12,
        "tensor_TFLOPs_dense": {k: v / 1e12 for k, v in TENSOR_FLOPS.items()},
        "issue_per_SM_per_cycle": ISSUE_PER_SM,
        "max_blocks_per_SM": MAX_BLOCKS_PER_SM,
        "max_warps_per_SM": MAX_WARPS_PER_SM,
        "registers_per_SM": REGISTERS_PER_SM,
        "shared_bytes_per_SM": SHARED_PER_SM,
    }


def blocks_per_sm(registers: int, warps: int, shared: int) -> int:
    """Programs of `warps` warps, `registers` per thread and `shared` bytes resident on one SM."""
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = (REGISTERS_PER_SM // per_warp) // warps if per_warp else MAX_BLOCKS_PER_SM
    by_warps = MAX_WARPS_PER_SM // warps
    by_shared = SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK)
    return max(0, min(MAX_BLOCKS_PER_SM, by_registers, by_warps, by_shared))


@dataclass(frozen=True)
class Program:
    """One program's counts (benchmarks/sass.py) and its launch."""

    warps: int
    barriers: int  # executed by each warp
    round_trips: int
    instructions: int  # per warp
    fp32_flop: int  # per warp
    mma_flop: dict[str, int]  # per warp, by input type


def latency_cycles(p: Program) -> float:
    """One program alone: its barriers, its dependent round trips, one instruction a cycle."""
    return p.barriers * BARRIER_CYCLES + p.round_trips * MEMORY_CYCLES + p.instructions


def work_cycles(p: Program) -> float:
    """SM cycles one program's arithmetic and issue occupy when it shares the SM."""
    per_cycle = CLOCK_HZ * SMS
    fp32 = p.warps * p.fp32_flop / (FP32_FLOPS / per_cycle)
    tensor = sum(
        p.warps * flop / (TENSOR_FLOPS.get(kind, TENSOR_FLOPS["tf32"]) / per_cycle)
        for kind, flop in p.mma_flop.items()
    )
    issue = p.warps * p.instructions / ISSUE_PER_SM
    return max(fp32, tensor, issue)


def estimate_seconds(p: Program, programs: int, resident: int) -> tuple[float, int]:
    """(seconds for one launch of `programs`, waves) with `resident` programs per SM."""
    if programs == 0:
        return 0.0, 0
    if resident < 1:
        raise ValueError("a program that fits no SM")
    per_wave = SMS * resident
    full, rest = divmod(programs, per_wave)
    latency, work = latency_cycles(p), work_cycles(p)
    cycles = full * max(latency, resident * work)
    if rest:
        cycles += max(latency, -(-rest // SMS) * work)
    return cycles / CLOCK_HZ, full + (1 if rest else 0)


# ------------------------------------------------------------------ compiling


@dataclass(frozen=True)
class Compiled:
    registers: int
    spills: int  # bytes of local memory per thread (spill stores and stack)
    shared: int  # bytes per program
    code: list  # sass.Instruction


def compile_sm90(
    fn, arguments: dict[str, tuple[str, object]], num_warps: int, num_stages: int = 3
) -> Compiled:
    """Compile JIT function `fn` for sm_90. `arguments`: name -> (type, value) with type a Triton
    signature type ("*bf16", "i32", "fp32") or "constexpr"; the value decides the specialisation a
    launch would make (pointers 16-byte aligned, integers divisible by 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from benchmarks import sass

    names = fn.arg_names
    signature, constants, attrs = {}, {}, {}
    for name in names:
        kind, value = arguments[name]
        signature[name] = kind
        if kind == "constexpr":
            constants[name] = value
        elif kind.startswith("*") or (
            kind in ("i32", "i64")
            and isinstance(value, int)
            and value % 16 == 0
            and names.index(name) not in fn.do_not_specialize
        ):
            attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    missing = set(arguments) - set(names)
    if missing:
        raise ValueError(f"{fn.__name__} has no arguments {sorted(missing)}")
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    kernel = triton.compile(
        source, target=GPUTarget(*TARGET), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    _, usage = sass.disassemble(kernel.asm["cubin"])
    code, _ = sass.disassemble(rolled_cubin(kernel.asm["ptx"]))
    # Triton's shared memory is dynamic (metadata.shared); cuobjdump's SHARED is the static part.
    shared = max(int(kernel.metadata.shared), usage.get("SHARED", 0))
    return Compiled(usage.get("REG", 0), usage.get("LOCAL", 0) + usage.get("STACK", 0), shared, code)


def rolled_cubin(ptx: str) -> bytes:
    """The kernel's PTX assembled again with loop unrolling off, for counting.

    ptxas unrolls small loops (by 4, with a remainder loop), so the machine code's loops are no
    longer the source's and per-iteration counts need the unroll factor. With the PTX pragma
    "nounroll" at module scope each source loop stays one loop of one iteration per step; every
    iteration executes the same barriers, loads and arithmetic as the unrolled code's, less a
    little loop overhead. Registers, spills and shared memory are read off Triton's own cubin.
    """
    import subprocess
    import tempfile

    from benchmarks import sass

    lines = ptx.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(".address_size"))
    lines.insert(at + 1, '.pragma "nounroll";')
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text("\n".join(lines) + "\n")
        # The options Triton 3.7 gives ptxas (its backends/nvidia/compiler.py), for sm_90a.
        subprocess.run(
            [str(sass.tool("ptxas")), "--regAllocOptLevel=2", "--gpu-name=sm_90a", str(src), "-o", str(out)],
            check=True,
            capture_output=True,
        )
        return out.read_bytes()


def jit_function(kernel):
    """The JITFunction under autotuners and heuristics."""
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


# ------------------------------------------------------------------ launches


@dataclass(frozen=True)
class Launch:
    """One kernel of a training step at one launch configuration."""

    kernel: str  # the row's name
    impl: str  # bi_triton, fla or mix
    tower: str
    pass_: str  # fwd or bwd
    fn: Callable
    arguments: dict[str, tuple[str, object]]
    num_warps: int
    programs: int
    trips: list[int]  # per loop of the compiled code, by address
    tokens: int  # tokens one program walks in its serial loops
    calls: int  # launches per training step
    num_stages: int = 3
    config: str = ""  # an autotuned kernel's configuration


@dataclass
class Row:
    launch: Launch
    registers: int
    spills: int
    shared_bytes: int
    blocks_per_sm: int
    barriers_per_step: float
    serial_steps: int
    programs: int
    waves: int
    mma: int
    cp_async: int
    est_ms: float
    loops: list[dict] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        la = self.launch
        return {
            "kernel": la.kernel,
            "impl": la.impl,
            "tower": la.tower,
            "pass": la.pass_,
            "registers": self.registers,
            "spills": self.spills,
            "shared_bytes": self.shared_bytes,
            "blocks_per_sm": self.blocks_per_sm,
            "barriers_per_step": round(self.barriers_per_step, 3),
            "serial_steps": self.serial_steps,
            "programs": self.programs,
            "waves": self.waves,
            "mma": self.mma,
            "cp_async": self.cp_async,
            "est_ms": round(self.est_ms, 4),
        }


def measure(launch: Launch, compiled: Compiled | None = None) -> Row:
    from benchmarks import sass

    compiled = compiled or compile_sm90(launch.fn, launch.arguments, launch.num_warps, launch.num_stages)
    counts = sass.analyse(compiled.code, launch.trips)
    program = Program(
        launch.num_warps,
        counts.barriers,
        counts.round_trips,
        counts.instructions,
        counts.fp32_flop,
        counts.mma_flop,
    )
    resident = blocks_per_sm(compiled.registers, launch.num_warps, compiled.shared)
    seconds, waves = estimate_seconds(program, launch.programs, resident)
    serial = round(sum(lp["trips"] for lp in counts.loops if lp["depth"] == 0))
    return Row(
        launch=launch,
        registers=compiled.registers,
        spills=compiled.spills,
        shared_bytes=compiled.shared,
        blocks_per_sm=resident,
        barriers_per_step=counts.barriers_in_loops / max(launch.tokens, 1),
        serial_steps=serial,
        programs=launch.programs,
        waves=waves,
        mma=counts.mma * launch.num_warps,
        cp_async=counts.cp_async * launch.num_warps,
        est_ms=1e3 * seconds * launch.calls,
        loops=counts.loops,
    )


@dataclass(frozen=True)
class Tower:
    name: str
    batch: int  # samples per launch (the micro-batch)
    tokens: int
    heads: int
    size: int  # head size
    channels: int
    layers: int
    forward_runs: int  # forward passes per training step (accumulation, checkpointing)
    backward_runs: int
    w_dtype: str  # the decay logit's dtype under bf16 autocast


def towers(batch: int, accumulation: int = 1, checkpointing: bool = False) -> list[Tower]:
    """The B/32 towers as the model runs them under bf16 autocast at micro-batch `batch`."""
    from src.open_alip.model import get_model_config
    from src.perf.cost_model import tower_depth, tower_wkv_shape
    from src.perf.step_trace import TOWERS

    cfg = get_model_config(CONFIG)
    out = []
    for name in TOWERS:
        shape = tower_wkv_shape(cfg, name)
        out.append(
            Tower(
                name,
                batch,
                shape.tokens,
                shape.heads,
                shape.head_size,
                shape.channels,
                tower_depth(cfg, name),
                forward_runs=accumulation * (2 if checkpointing else 1),
                backward_runs=accumulation,
                # The image tower's decay logit is float32 (a float32 parameter plus a LoRA); the text
                # tower keeps its decays in bf16 as the released models do.
                w_dtype="fp32" if name == "image" else "bf16",
            )
        )
    return out


def _pointers(dtype: str, *names: str) -> dict[str, tuple[str, object]]:
    return {name: (f"*{dtype}", None) for name in names}


def _const(**values: object) -> dict[str, tuple[str, object]]:
    return {name: ("constexpr", value) for name, value in values.items()}


def bi_triton_launches(t: Tower) -> list[Launch]:
    from src.open_alip import wkv_bi_triton as binding

    return [
        Launch(
            kernel=f"wkv_bi_{name}",
            impl="bi_triton",
            tower=t.name,
            pass_=pass_,
            fn=jit_function(fn),
            arguments=args,
            num_warps=warps,
            programs=programs,
            trips=trips,
            tokens=tokens,
            calls=t.layers * (t.forward_runs if pass_ == "fwd" else t.backward_runs),
            num_stages=stages,
        )
        for name, pass_, fn, args, warps, stages, programs, trips, tokens in binding.static_launches(
            t.batch, t.tokens, t.heads, t.size, "bf16", t.w_dtype
        )
    ]


def mix_launches(t: Tower) -> list[Launch]:
    from src.open_alip import mix
    from src.open_alip import mix_triton_kernels as kernels

    rows = t.batch * t.tokens
    (grid_rows, grid_cols), spans = mix._launch(rows, t.channels)
    programs = grid_rows * grid_cols
    blocks = _const(BLOCK_R=mix._BLOCK_R, BLOCK_C=mix._BLOCK_C, SPANS=spans)
    sizes = {"R": ("i32", rows), "C": ("i32", t.channels)}
    out = []
    # Per block: the time mix's first mix (x + xx * maa_x, no LoRA term), its five mixes with the
    # LoRA term, and the channel mix's two (rwkv6.py, vision_rwkv.py, text_rwkv.py).
    for mixes, has_m in ((1, False), (5, True), (2, False)):
        forward = (
            _pointers("fp32", "a_ptr", "b_ptr", "coef_ptr")
            | _pointers("bf16", "m_ptr")
            | _pointers("bf16", *(f"out{j}_ptr" for j in range(5)))
            | sizes
            | _const(K=mixes, HAS_M=has_m)
            | blocks
        )
        backward = (
            _pointers("bf16", *(f"g{j}_ptr" for j in range(5)))
            | _pointers("fp32", "a_ptr", "b_ptr", "coef_ptr")
            | _pointers("bf16", "m_ptr", "dm_ptr")
            | _pointers("fp32", "da_ptr", "db_ptr", "dcoef_ptr")
            | sizes
            | _const(K=mixes, K_PAD=1 << (mixes - 1).bit_length(), HAS_M=has_m)
            | blocks
        )
        name = f"mix_K{mixes}{'_lora' if has_m else ''}"
        for pass_, fn, args, runs in (
            ("fwd", kernels.mix_forward_kernel, forward, t.forward_runs),
            ("bwd", kernels.mix_backward_kernel, backward, t.backward_runs),
        ):
            out.append(
                Launch(
                    kernel=f"{name}_{pass_}",
                    impl="mix",
                    tower=t.name,
                    pass_=pass_,
                    fn=jit_function(fn),
                    arguments=args,
                    num_warps=mix.NUM_WARPS,
                    programs=programs,
                    trips=[spans],
                    tokens=mix._BLOCK_R * spans,
                    calls=t.layers * runs,
                )
            )
    return out


def fla_launches(t: Tower) -> list[list[Launch]]:
    """fla-core's fused recurrent RWKV-6 kernels as `wkv_fla` launches them (twice a call: one per
    direction), each as the list of its autotuner's configurations."""
    from src.open_alip import wkv_fla as binding

    fused = binding._import_fla()
    n, T, H, K = t.batch, t.tokens, t.heads, t.size
    common = {
        "scale": ("fp32", 1.0),
        "T": ("i32", T),
        "B": ("constexpr", n),
        "H": ("constexpr", H),
        "cu_seqlens": ("constexpr", None),
        "IS_VARLEN": ("constexpr", False),
    }
    per_call = 2  # one launch per direction
    fwd_calls, bwd_calls = t.layers * t.forward_runs * per_call, t.layers * t.backward_runs * per_call

    def tiles(kind: str) -> tuple[int, int, int]:
        bk, bv = binding.FLA_TILES[kind]
        bk, bv = min(_pow2(K), bk), min(_pow2(K), bv)
        return bk, bv, -(-K // bk) * -(-K // bv)

    def variants(name, kernel, args, pass_, programs, trips, tokens, calls) -> list[Launch]:
        tuner = kernel
        while not hasattr(tuner, "configs"):
            tuner = tuner.fn
        out = []
        for cfg in tuner.configs:
            extra = _const(**cfg.kwargs)
            run_args = args | extra
            grid_programs = programs(cfg.kwargs) if callable(programs) else programs
            loop_trips = trips(cfg.kwargs) if callable(trips) else trips
            out.append(
                Launch(
                    kernel=name,
                    impl="fla",
                    tower=t.name,
                    pass_=pass_,
                    fn=jit_function(kernel),
                    arguments=run_args,
                    num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages,
                    programs=grid_programs,
                    trips=loop_trips,
                    tokens=tokens,
                    calls=calls,
                    config=", ".join(
                        [f"{k}={v}" for k, v in cfg.kwargs.items()] + [f"num_warps={cfg.num_warps}"]
                    ),
                )
            )
        return out

    f32 = "fp32"
    bk, bv, tiles_fwd = tiles("fwd")
    forward = (
        _pointers(f32, "q", "k", "v", "w", "u", "o")
        | common
        | _const(
            h0=None,
            ht=None,
            K=K,
            V=K,
            BK=bk,
            BV=bv,
            REVERSE=False,
            USE_INITIAL_STATE=False,
            STORE_FINAL_STATE=False,
        )
    )
    qk, qv, tiles_dq = tiles("dq")
    dq = (
        _pointers(f32, "k", "v", "w", "u", "do", "dq", "dq1")
        | common
        | _const(h0=None, K=K, V=K, BK=qk, BV=qv, REVERSE=False, USE_INITIAL_STATE=False)
    )
    kk, kv, tiles_dkv = tiles("dkv")
    dkv = (
        _pointers(f32, "q", "k", "v", "w", "u", "do", "dk", "dk1", "dv")
        | common
        | _const(dh0=None, K=K, V=K, BK=kk, BV=kv, REVERSE=False, USE_INITIAL_STATE=False)
    )
    dw = (
        _pointers(f32, "q", "k", "dq", "dk", "dw")
        | {k: common[k] for k in ("scale", "T", "cu_seqlens", "IS_VARLEN", "H")}
        | _const(K=K, REVERSE=True)
    )
    heads = n * H
    return [
        variants(
            "fla_fused_recurrent_fwd",
            fused.fused_recurrent_rwkv6_fwd_kernel,
            forward,
            "fwd",
            tiles_fwd * heads,
            [T],
            T,
            fwd_calls,
        ),
        variants(
            "fla_fused_recurrent_bwd_dq",
            fused.fused_recurrent_rwkv6_bwd_kernel_dq,
            dq,
            "bwd",
            tiles_dq * heads,
            [T],
            T,
            bwd_calls,
        ),
        variants(
            "fla_fused_recurrent_bwd_dkv",
            fused.fused_recurrent_rwkv6_bwd_kernel_dkv,
            dkv,
            "bwd",
            tiles_dkv * heads,
            [T],
            T,
            bwd_calls,
        ),
        variants(
            "fla_fused_recurrent_bwd_dw",
            fused.fused_recurrent_rwkv6_bwd_kernel_dw,
            dw,
            "bwd",
            lambda c: -(-K // c["BK"]) * heads,
            lambda c: [-(-T // c["BT"])],
            T,
            bwd_calls,
        ),
    ]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ------------------------------------------------------------------ the report


def planned_batch() -> tuple[int, int, bool, str]:
    """(micro-batch, accumulation, checkpointing, the planner's line) for B/32 on an H200 with fla.

    The planner measures fla's memory by running the model on FakeTensors, which on a CPU needs
    Triton's interpreter, and this process must compile kernels, not interpret them: the plan is
    made in a child process started with TRITON_INTERPRET=1.
    """
    import os
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = "from benchmarks.kernel_static import _print_plan; _print_plan()"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise UserError(
            f"the planner failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}; "
            "give --batch N to skip it"
        )
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    return plan["micro_batch"], plan["accum_steps"], plan["grad_checkpointing"], plan["explanation"]


def _print_plan() -> None:
    from benchmarks.training_cost import GLOBAL_BATCH, GPU_SPECS, GPUS
    from src.perf.planner import plan_micro_batch

    plan = plan_micro_batch(
        CONFIG,
        wkv_impl="fla",
        precision="bf16",
        device_memory_bytes=GPU_SPECS["h200"].memory_bytes,
        global_batch=GLOBAL_BATCH,
        world_size=GPUS,
        bucket_view=True,
    )
    print(
        json.dumps(
            {
                "micro_batch": plan.micro_batch,
                "accum_steps": plan.accum_steps,
                "grad_checkpointing": plan.grad_checkpointing,
                "explanation": plan.explanation,
            }
        )
    )


def collect(
    batch: int,
    accumulation: int = 1,
    checkpointing: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Row]:
    rows = []
    for tower in towers(batch, accumulation, checkpointing):
        for launch in bi_triton_launches(tower) + mix_launches(tower):
            progress(f"compiling {launch.kernel} ({tower.name})")
            rows.append(measure(launch))
        for options in fla_launches(tower):
            progress(f"compiling {options[0].kernel} ({tower.name}), {len(options)} configurations")
            rows.append(min((measure(launch) for launch in options), key=lambda row: row.est_ms))
    return rows


COLUMNS = (
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
)


def render(rows: list[Row]) -> list[str]:
    table = [[str(row.to_json()[c]) for c in COLUMNS] + [row.launch.config] for row in rows]
    header = [*COLUMNS, "config"]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in table]
    return lines


def totals(rows: list[Row]) -> dict[str, float]:
    """est_ms per training step by impl (the WKV's forward + backward; the mixes)."""
    out: dict[str, float] = {}
    for row in rows:
        out[row.launch.impl] = out.get(row.launch.impl, 0.0) + row.est_ms
    return out


def goals(rows: list[Row]) -> list[str]:
    """Issue 40's goals for our WKV, checked against these rows."""
    ours = [r for r in rows if r.launch.impl == "bi_triton"]
    total = totals(rows)
    ratio = total.get("bi_triton", 0.0) / total["fla"] if total.get("fla") else math.inf
    worst_barriers = max((r.barriers_per_step for r in ours), default=0.0)
    spills = sum(r.spills for r in ours)
    occupancy = all(r.blocks_per_sm >= 2 or r.waves >= 4 for r in ours)

    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        f"bi_triton / fla estimate: {ratio:.3f} (goal <= 1/3: {mark(ratio <= 1 / 3)})",
        f"largest barriers per step in bi_triton's serial loops: {worst_barriers:.2f} (goal <= 2: "
        f"{mark(worst_barriers <= 2)})",
        f"bi_triton spills: {spills} bytes ({mark(spills == 0)})",
        f"bi_triton >= 2 blocks per SM or >= 4 waves: {mark(occupancy)}",
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="micro-batch per GPU (default: what the planner picks for B/32 on an H200 with fla, "
        "global batch 4096 on 8 GPUs; about half a minute to work out)",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch {args.batch}: give a positive micro-batch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from benchmarks import sass

        sass.tool("cuobjdump")
    except (ImportError, FileNotFoundError) as exc:
        return report_error(PROG, UserError(f"cannot read compiled kernels here: {exc}"))
    accumulation, checkpointing = 1, False
    if args.batch is None:
        try:
            batch, accumulation, checkpointing, line = planned_batch()
        except UserError as exc:
            return report_error(PROG, exc)
        print(f"planner: {line}", flush=True)
    else:
        batch = args.batch
        print(f"micro-batch {batch} (given)", flush=True)
    rows = collect(
        batch, accumulation, checkpointing, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    print(f"model constants: {json.dumps(model_constants())}")
    print("\n".join(render(rows)))
    for impl, ms in totals(rows).items():
        print(f"total est_ms per training step, {impl}: {ms:.2f}")
    print("\n".join(goals(rows)))
    if args.json is not None:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps([row.to_json() for row in rows], indent=1) + "\n")
        tmp.replace(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
