"""What a compiled GPU kernel does, read off its SASS: loops, barriers, loads, arithmetic.

    code, resources = disassemble(cubin)
    counts = analyse(code, trips=[49, 49])

`disassemble` runs the `cuobjdump` that ships in Triton's wheel (no GPU needed). `analyse`
builds the control-flow graph of the kernel's machine code, finds its loops (back edges to
a block that dominates their source, so out-of-line blocks that jump back are not loops)
and counts, per program, what one program executes when loop i runs `trips[i]` times
(loops ordered by the address of their first block; a nested loop runs its trips on every
iteration of the loops around it). Branches inside a loop are counted as taken both ways:
every instruction of a block runs once per iteration of its loops.

Used by benchmarks/kernel_static.py; the counts are per program (a CTA) and per warp for
instructions (every warp of a program runs the same code), per thread for registers.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")
_REGISTER = re.compile(r"\b(U?R[0-9]+|U?P[0-6])(\.64|\.128)?\b")
_TARGET = re.compile(r"0x([0-9a-f]+)")

# Opcode families (the part before the first dot).
BARRIERS = frozenset({"BAR"})  # bar.sync / bar.arrive / bar.red: a whole-CTA rendezvous
GLOBAL_LOADS = frozenset({"LDG", "LD", "ATOMG", "ATOM"})  # a value back from memory
ASYNC_COPIES = frozenset({"LDGSTS", "UTMALDG", "UBLKCP", "UTMAPF"})  # cp.async, TMA
TENSOR_CORE = frozenset({"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "DMMA", "BMMA", "BGMMA"})
# The FP32 (FMA) pipe: what the datasheet's non-tensor FP32 rate counts. One instruction is
# 32 lanes of one operation (an FFMA is a multiply and an add: 2 FLOP a lane).
FP32_PIPE = {"FFMA": 2, "FADD": 1, "FMUL": 1}
_NO_DESTINATION = frozenset(
    {
        "ST",
        "STG",
        "STS",
        "STL",
        "RED",
        "REDG",
        "BAR",
        "BRA",
        "EXIT",
        "BSSY",
        "BSYNC",
        "WARPSYNC",
        "DEPBAR",
        "MEMBAR",
        "ERRBAR",
        "NOP",
        "CALL",
        "RET",
        "YIELD",
        "LDGSTS",
        "LDGDEPBAR",
        "UTMALDG",
        "UTMASTG",
        "UBLKCP",
        "ARRIVES",
        "SYNCS",
        "FENCE",
        "CCTL",
        "WARPGROUP",
        "UTMACMDFLUSH",
        "BPT",
        "KILL",
        "NANOSLEEP",
        "STSM",
    }
)


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str  # "" or the guard, e.g. "@!P0"
    opcode: str  # with its modifiers, e.g. "LDG.E.U16"
    operands: str

    @property
    def family(self) -> str:
        return self.opcode.split(".")[0]

    def target(self) -> int | None:
        """A direct branch's target address (cuobjdump prints it in hex)."""
        found = _TARGET.search(self.operands) if self.family in ("BRA", "CALL") else None
        return int(found[1], 16) if found else None


def parse(text: str) -> list[Instruction]:
    """The instructions of `cuobjdump -sass` output for one kernel, in address order."""
    found = []
    for line in text.splitlines():
        match = _LINE.search(line)
        if match:
            address, guard, opcode, operands = match.groups()
            found.append(Instruction(int(address, 16), (guard or "").strip(), opcode, operands.strip()))
    return found


def tool(name: str) -> Path:
    """An NVIDIA binary tool from Triton's wheel (cuobjdump, nvdisasm, ptxas)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this triton wheel ships no NVIDIA tools")
    return path


def disassemble(cubin: bytes) -> tuple[list[Instruction], dict[str, int]]:
    """(instructions, resource usage) of a one-kernel cubin: REG, SHARED, LOCAL, STACK as cuobjdump
    reports them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run(
            [str(tool("cuobjdump")), "-sass", str(path)], capture_output=True, text=True, check=True
        ).stdout
        usage = subprocess.run(
            [str(tool("cuobjdump")), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    resources = {key: int(value) for key, value in re.findall(r"\b(REG|SHARED|LOCAL|STACK):(\d+)", usage)}
    return parse(sass), resources


# ------------------------------------------------------------------ control flow


@dataclass
class Block:
    start: int  # index of its first instruction
    end: int  # one past its last
    successors: list[int] = field(default_factory=list)  # block indices


def _ends_flow(ins: Instruction) -> bool:
    """Control never falls through past an unguarded EXIT, RET or BRA."""
    return ins.family in ("EXIT", "RET", "BRA") and not ins.predicate


def blocks(code: list[Instruction]) -> list[Block]:
    """Basic blocks; CALL is followed as a fall-through (callees are rare slow paths)."""
    index_of = {ins.address: i for i, ins in enumerate(code)}
    leaders = {0}
    for i, ins in enumerate(code):
        if ins.family in ("BRA", "EXIT", "RET"):
            if i + 1 < len(code):
                leaders.add(i + 1)
            target = ins.target() if ins.family == "BRA" else None
            if target is not None and target in index_of:
                leaders.add(index_of[target])
    starts = sorted(leaders)
    found = [Block(s, e) for s, e in zip(starts, starts[1:] + [len(code)])]
    block_at = {b.start: n for n, b in enumerate(found)}
    for n, block in enumerate(found):
        last = code[block.end - 1]
        if last.family == "BRA":
            target = last.target()
            if target is not None and target in index_of:
                block.successors.append(block_at[index_of[target]])
        if not _ends_flow(last) and n + 1 < len(found):
            block.successors.append(n + 1)
    return found


def _reachable(graph: list[Block]) -> list[int]:
    seen, stack = {0}, [0]
    while stack:
        for succ in graph[stack.pop()].successors:
            if succ not in seen:
                seen.add(succ)
                stack.append(succ)
    return sorted(seen)


def _dominators(graph: list[Block], nodes: list[int]) -> dict[int, set[int]]:
    preds: dict[int, list[int]] = {n: [] for n in nodes}
    for n in nodes:
        for s in graph[n].successors:
            preds[s].append(n)
    everything = set(nodes)
    dom = {n: set(everything) for n in nodes}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for n in nodes[1:]:
            new = set.intersection(*(dom[p] for p in preds[n])) if preds[n] else set()
            new = new | {n}
            if new != dom[n]:
                dom[n], changed = new, True
    return dom


@dataclass(frozen=True)
class Loop:
    header: int  # block index
    body: frozenset[int]  # block indices, the header included
    address: int  # of the header's first instruction


def loops(code: list[Instruction], graph: list[Block] | None = None) -> list[Loop]:
    """Natural loops (one per header; back edges to one header merge), by header address."""
    graph = graph if graph is not None else blocks(code)
    nodes = _reachable(graph)
    dom = _dominators(graph, nodes)
    preds: dict[int, list[int]] = {n: [] for n in nodes}
    for n in nodes:
        for s in graph[n].successors:
            preds[s].append(n)
    bodies: dict[int, set[int]] = {}
    for n in nodes:
        for s in graph[n].successors:
            if s in dom[n]:  # a back edge n -> s
                body = bodies.setdefault(s, {s})
                stack = [n]
                while stack:
                    m = stack.pop()
                    if m not in body:
                        body.add(m)
                        stack.extend(preds[m])
    return sorted(
        (Loop(h, frozenset(b), code[graph[h].start].address) for h, b in bodies.items()),
        key=lambda lp: lp.address,
    )


# ------------------------------------------------------------------ counting


def _registers(text: str) -> list[str]:
    """Register names in operand text, pairs and quads expanded (R4.64 -> R4, R5)."""
    names = []
    for name, width in _REGISTER.findall(text):
        if name in ("RZ", "URZ", "PT", "UPT"):
            continue
        count = {".64": 2, ".128": 4}.get(width, 1)
        prefix = name.rstrip("0123456789")
        number = int(name[len(prefix) :])
        names.extend(f"{prefix}{number + i}" for i in range(count))
    return names


def _split_operands(operands: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in operands:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if current:
        parts.append("".join(current).strip())
    return parts


def _destinations(ins: Instruction) -> list[str]:
    if ins.family in _NO_DESTINATION or not ins.operands:
        return []
    parts = _split_operands(ins.operands)
    width = 4 if ".128" in ins.opcode else 2 if ".64" in ins.opcode else 1
    first = _registers(parts[0])
    if len(first) == 1 and width > 1:
        prefix = first[0].rstrip("0123456789")
        number = int(first[0][len(prefix) :])
        first = [f"{prefix}{number + i}" for i in range(width)]
    # Carry-out / compare predicates written next to the result (IADD3 R4, P0, ...; ISETP P1, PT, ...).
    for part in parts[1:]:
        if re.fullmatch(r"U?P[0-6T]", part):
            first += _registers(part)
        else:
            break
    return first


def _sources(ins: Instruction, destinations: list[str]) -> list[str]:
    parts = _split_operands(ins.operands)
    skip = (
        0
        if ins.family in _NO_DESTINATION
        else 1 + sum(1 for p in parts[1 : len(destinations)] if re.fullmatch(r"U?P[0-6T]", p))
    )
    found = [r for p in parts[skip:] for r in _registers(p)]
    if ins.predicate:
        found += _registers(ins.predicate)
    return found


def round_trips(code: list[Instruction]) -> int:
    """Dependent global-memory round trips of straight-line `code`: the longest chain of loads,
    each feeding the next one's address, whose last value is used later in `code`.

    A load whose value is first used only after `code` (the next loop iteration) is not waited
    for here: its latency overlaps this iteration, as a software-pipelined load's does. An
    asynchronous copy (cp.async) counts one round trip when `code` itself waits for all of them
    (DEPBAR.LE SB0, 0x0); a wait that leaves copies in flight is a pipelined one.
    """
    depth: dict[str, int] = {}  # register -> loads in the chain that produced it
    pending: dict[str, int] = {}  # register written by a load, not yet used -> its chain length
    copies_issued = False
    longest = 0
    for ins in code:
        dests = _destinations(ins)
        sources = _sources(ins, dests)
        for reg in sources:
            if reg in pending:
                longest = max(longest, pending.pop(reg))
        incoming = max((depth.get(r, 0) for r in sources), default=0)
        is_load = ins.family in GLOBAL_LOADS
        produced = incoming + 1 if is_load else incoming
        for reg in dests:
            pending.pop(reg, None)
            depth[reg] = produced
            if is_load:
                pending[reg] = produced
        if ins.family in ASYNC_COPIES:
            copies_issued = True
        if copies_issued and ins.family == "DEPBAR" and re.search(r"SB0,\s*0x0\b", ins.operands):
            longest = max(longest, 1)
    return longest


@dataclass
class Counts:
    """What one program executes, per warp (instructions) and in total over its loops."""

    loops: list[dict]  # per loop: address, depth, trips, barriers, loads, instructions per iteration
    barriers: int = 0  # BAR instructions executed by one warp (every warp meets each one)
    barriers_in_loops: int = 0
    round_trips: int = 0  # dependent global-memory round trips waited for, in sequence
    instructions: int = 0  # per warp
    fp32_flop: int = 0  # per warp: lanes x FLOP of FFMA / FADD / FMUL
    mma: int = 0  # tensor-core instructions executed, per warp
    mma_flop: dict[str, int] = field(default_factory=dict)  # per warp, by input type (bf16, tf32, ...)
    cp_async: int = 0  # asynchronous copy instructions executed, per warp
    global_loads: int = 0  # per warp
    local_memory: int = 0  # LDL / STL executed per warp (spill traffic)


_MMA_SHAPE = re.compile(r"(?:\.|^)(\d+)x(\d+)x(\d+)")  # HGMMA.64x80x16
_HMMA_SHAPE = re.compile(r"\.(\d)(\d)(\d+)\b")  # HMMA.16816 -> m16 n8 k16


def _mma_flop(opcode: str) -> tuple[str, int]:
    """(input type, FLOP per warp) of one tensor-core instruction."""
    family = opcode.split(".")[0]
    kind = (
        "f64"
        if family == "DMMA"
        else next(
            (t for t in ("BF16", "F16", "TF32", "E4M3", "E5M2", "S8") if f".{t}" in opcode), "?"
        ).lower()
    )
    if family.endswith("GMMA"):  # one warpgroup instruction, issued by each of its 4 warps
        m, n, k = map(int, _MMA_SHAPE.search(opcode).groups())
        return kind, 2 * m * n * k // 4
    sized = re.search(r"\.(\d+)x(\d+)x(\d+)", opcode)  # DMMA.16x8x16
    if sized:
        m, n, k = map(int, sized.groups())
        return kind, 2 * m * n * k
    shape = re.search(r"\.(\d{3,5})\b", opcode)
    digits = shape[1] if shape else "1688"
    m, n, k = {
        "16816": (16, 8, 16),
        "1688": (16, 8, 8),
        "884": (8, 8, 4),
        "16832": (16, 8, 32),
        "1684": (16, 8, 4),
    }.get(digits, (16, 8, 8))
    return kind, 2 * m * n * k


def analyse(code: list[Instruction], trips: list[int]) -> Counts:
    """Per-program counts when loop i (by header address) runs trips[i] times per entry."""
    graph = blocks(code)
    found = loops(code, graph)
    if len(trips) != len(found):
        described = ", ".join(f"0x{lp.address:x} ({len(lp.body)} blocks)" for lp in found)
        raise ValueError(
            f"the kernel has {len(found)} loops ({described or 'none'}); {len(trips)} trip counts given"
        )
    reachable = set(_reachable(graph))
    counts = Counts(loops=[])

    def enclosing(block: int) -> list[int]:
        return [i for i, lp in enumerate(found) if block in lp.body]

    def runs(block: int) -> int:
        n = 1
        for i in enclosing(block):
            n *= trips[i]
        return n

    for b in sorted(reachable):
        times = runs(b)
        in_loop = bool(enclosing(b))
        for ins in code[graph[b].start : graph[b].end]:
            family = ins.family
            counts.instructions += times
            if family in BARRIERS:
                counts.barriers += times
                if in_loop:
                    counts.barriers_in_loops += times
            if family in GLOBAL_LOADS:
                counts.global_loads += times
            if family in ASYNC_COPIES:
                counts.cp_async += times
            if family in ("LDL", "STL"):
                counts.local_memory += times
            if family in FP32_PIPE:
                counts.fp32_flop += times * 32 * FP32_PIPE[family]
            if family in TENSOR_CORE:
                counts.mma += times
                kind, flop = _mma_flop(ins.opcode)
                counts.mma_flop[kind] = counts.mma_flop.get(kind, 0) + times * flop

    # Round trips: each loop's own blocks (not those of loops inside it) per iteration, and
    # the code outside every loop once.
    def own_code(block_ids: set[int]) -> list[Instruction]:
        return [ins for b in sorted(block_ids) for ins in code[graph[b].start : graph[b].end]]

    outside = reachable - set().union(*(lp.body for lp in found)) if found else reachable
    counts.round_trips = round_trips(own_code(outside))
    for i, lp in enumerate(found):
        inner = set().union(*(other.body for other in found if other.body < lp.body)) if found else set()
        mine = set(lp.body) - inner
        per_iteration = round_trips(own_code(mine))
        times = runs(lp.header)
        counts.round_trips += per_iteration * times
        body = own_code(mine)
        counts.loops.append(
            {
                "address": lp.address,
                "depth": len(enclosing(lp.header)) - 1,
                "trips": trips[i],
                "barriers": sum(ins.family in BARRIERS for ins in body),
                "round_trips": per_iteration,
                "instructions": len(body),
            }
        )
    return counts
