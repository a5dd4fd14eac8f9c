"""What every rank must agree on before the first collective: the training data each one
found, the output folder each one writes and the batch plan each one follows. A disagreement
left unchecked shows up only as collectives that wait until --dist-timeout (different epoch
lengths, micro-batches or accumulation counts) or as a resume that finds no checkpoint;
checked here, it stops every rank at start with one line naming the ranks."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from src.errors import UserError
from src.training.distributed import DistEnv, barrier, broadcast_object, gather_object
from src.training.errors import TrainingError

TOKEN_PREFIX = ".rank-check-"


def data_view(shardset) -> dict:
    """This rank's view of the training data: shard names (not paths, which may differ
    between nodes that mount the same data elsewhere), their record counts and sizes."""
    shards = [
        (s.rec.name, int(c), int(z)) for s, c, z in zip(shardset.shards, shardset.counts, shardset.sizes)
    ]
    digest = hashlib.sha256(repr(shards).encode()).hexdigest()[:12]
    return {"host": socket.gethostname(), "records": shardset.total_records, "hash": digest, "shards": shards}


def _where(rank: int, view: dict) -> str:
    return f"rank {rank} on {view['host']}"


def build_on_every_rank(build: Callable[[], Any], env: DistEnv) -> Any:
    """`build()` on every rank; a UserError on any rank stops all of them (with its message),
    instead of leaving the others waiting in the next collective."""
    result, error = None, None
    try:
        result = build()
    except UserError as exc:
        error = f"{exc}" if not env.distributed else f"rank {env.rank} on {socket.gethostname()}: {exc}"
    errors = [e for e in gather_object(error, env) if e]
    if errors:
        raise TrainingError(errors[0])
    return result


def check_same_data(shardset, env: DistEnv) -> None:
    """Every rank sees the same shards with the same record counts, or all stop."""
    views = gather_object(data_view(shardset), env)
    first = views[0]
    odd = [r for r, v in enumerate(views) if v["hash"] != first["hash"]]
    if not odd:
        return
    r = odd[0]
    ours, theirs = set(first["shards"]), set(views[r]["shards"])
    diff = [
        f"only {_where(0, first)}: {', '.join(sorted(n for n, _, _ in ours - theirs)) or 'none'}",
        f"only {_where(r, views[r])}: {', '.join(sorted(n for n, _, _ in theirs - ours)) or 'none'}",
    ]
    raise TrainingError(
        f"ranks see different training data: {_where(0, first)} has {first['records']} records in "
        f"{len(first['shards'])} shard(s) (list hash {first['hash']}), {_where(r, views[r])} has "
        f"{views[r]['records']} in {len(views[r]['shards'])} (hash {views[r]['hash']}); ranks differing from "
        f"rank 0: {', '.join(map(str, odd))}; {'; '.join(diff)} (counting shards of another size too); give "
        "every node the same data (a .rec without its .idx is left out)"
    )


def check_shared_output(output: Path, env: DistEnv) -> None:
    """Rank 0 writes a token into --output and every rank reads it back: one folder all ranks see."""
    if not env.distributed:
        return
    token = broadcast_object(uuid.uuid4().hex if env.is_master else None, env)
    path = output / f"{TOKEN_PREFIX}{token}"
    if env.is_master:
        path.write_text(token)
    barrier(env)
    try:
        seen = path.read_text() == token
    except OSError:
        seen = False
    views = gather_object((seen, socket.gethostname()), env)
    barrier(env)
    if env.is_master:
        try:
            os.unlink(path)
        except OSError:
            pass
    blind = [f"rank {r} on {host}" for r, (ok, host) in enumerate(views) if not ok]
    if blind:
        raise TrainingError(
            f"--output {output} is not one folder all ranks see: {', '.join(blind)} cannot read what rank 0 "
            f"wrote there; pass a folder on storage every node shares"
        )


def check_same_plan(plan, checkpointing: bool, env: DistEnv) -> None:
    """Every rank takes the same micro-batch, accumulation and checkpointing, or all stop.

    `--batch-size auto` plans for the smallest GPU of all ranks (batching.plan_for_device), so
    this holds by construction; checked anyway, since ranks that differ in anything the plan
    depends on (a flag, the cost model's version on another node) would otherwise meet in
    all-gathers of different sizes and wait until --dist-timeout."""
    mine = (plan.micro_batch, plan.accum_freq, bool(checkpointing))
    plans = gather_object(mine, env)
    odd = [r for r, p in enumerate(plans) if p != plans[0]]
    if not odd:
        return

    def said(r: int) -> str:
        micro, accum, cp = plans[r]
        return f"rank {r}: micro-batch {micro} x accumulation {accum}, checkpointing {'on' if cp else 'off'}"

    raise TrainingError(
        f"ranks planned different batches ({said(0)}; {said(odd[0])}; ranks differing from rank 0: "
        f"{', '.join(map(str, odd))}); give every rank the same flags and software, or set --batch-size N"
    )
