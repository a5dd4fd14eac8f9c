"""ClipLoss: the math on one process, and 2 real gloo processes with batch B each
against 1 process with batch 2B (loss, gradients, and whole optimizer steps, also compiled
with accumulation)."""

import math

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from src.open_alip.loss import ClipLoss
from src.training.distributed import DistEnv, all_reduce_mean, cleanup, init_distributed, wrap_ddp
from src.training.loop import Trainer
from src.training.schedule import Schedule
from tests._train_helpers import ToyClip, free_port, grads_of, run_guarded, set_torchrun_env, toy_batch

B = 3  # per-rank batch
MODES = {  # name -> (local_loss, gather_with_grad); the exact ones
    "global": (False, False),
    "global_gather_grad": (False, True),
    "local_gather_grad": (True, True),
}
STEPS = 3


def test_matches_the_definition_on_one_process():
    torch.manual_seed(0)
    img, txt = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    scale = torch.tensor(12.0, dtype=torch.float64)
    loss = ClipLoss(rank=0, world_size=1)(img, txt, scale)
    a, b = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    logits = (scale * a @ b.T).numpy()
    expected = 0.0
    for i in range(5):  # -log softmax of the matching pair, both directions
        expected -= logits[i, i] - math.log(sum(math.exp(v) for v in logits[i]))
        expected -= logits[i, i] - math.log(sum(math.exp(v) for v in logits[:, i]))
    assert loss.item() == pytest.approx(expected / 10, rel=1e-12)


def test_normalises_and_prefers_aligned_pairs():
    torch.manual_seed(0)
    feats = torch.randn(6, 4)
    scale = torch.tensor(50.0)
    aligned = ClipLoss()(feats * 3.0, feats, scale)  # scale of the features must not matter
    shuffled = ClipLoss()(feats, feats[torch.tensor([1, 2, 3, 4, 5, 0])], scale)
    assert aligned.item() < 0.1 < shuffled.item()


def _trainer(model, env, loss_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
    schedule = Schedule("warmup-cosine", 0.05, total_steps=STEPS, warmup=1)
    return opt, Trainer(model, opt, schedule, loss_fn, env, precision="fp32", grad_clip_norm=0.5)


def _worker_body(rank: int, out, port: int) -> None:
    set_torchrun_env(rank, 2, port)
    env = init_distributed("cpu")
    assert env.backend == "gloo" and env.world_size == 2
    images, tokens = toy_batch(2 * B)
    mine = slice(rank * B, (rank + 1) * B)
    results = {}
    for name, (local, with_grad) in {**MODES, "local_no_grad": (True, False)}.items():
        model = ToyClip().double()
        model.drop.p = 0.0
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        loss_fn = ClipLoss(
            local_loss=local, gather_with_grad=with_grad, rank=env.rank, world_size=env.world_size
        )
        loss = loss_fn(*ddp(images[mine], tokens[mine]))
        loss.backward()
        results[name] = {"loss": all_reduce_mean(loss.detach(), env).item(), "grads": grads_of(model)}
    # Whole optimizer steps (AdamW, clipping, schedule, logit-scale clamp) through the Trainer,
    # in train.py's DDP (gradients as bucket views, static graph).
    model = ToyClip().double()
    model.drop.p = 0.0
    ddp = wrap_ddp(model, env, static_graph=True)
    _, trainer = _trainer(ddp, env, ClipLoss(rank=env.rank, world_size=env.world_size))
    losses = []
    for step in range(STEPS):
        imgs, toks = toy_batch(2 * B, seed=10 + step)
        losses.append(trainer.step([(imgs[mine], toks[mine])], step).loss.item())
    results["trainer"] = {
        "losses": losses,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }
    # The same steps compiled, with the batch accumulated in B micro-batches: DDP's no_sync must
    # be found inside torch.compile's wrapper, so gradients are all-reduced once per step (a
    # comm hook counts the all-reduces), not once per micro-batch.
    model = ToyClip().double()
    model.drop.p = 0.0
    ddp = wrap_ddp(model, env, static_graph=False)
    allreduces = []

    def count_allreduce(_, bucket):
        allreduces.append(1)
        fut = torch.distributed.all_reduce(bucket.buffer().div_(env.world_size), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, count_allreduce)
    compiled = torch.compile(ddp, backend="aot_eager")
    _, trainer = _trainer(compiled, env, ClipLoss(rank=env.rank, world_size=env.world_size))
    trainer.accum_freq = B
    losses = []
    for step in range(STEPS):
        imgs, toks = (t[mine] for t in toy_batch(2 * B, seed=10 + step))
        losses.append(trainer.step([(imgs[i : i + 1], toks[i : i + 1]) for i in range(B)], step).loss.item())
    results["compiled_accum"] = {
        "losses": losses,
        "allreduces": len(allreduces),
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }
    torch.save(results, out / f"rank{rank}.pt")
    cleanup(env)


def _worker(rank: int, out, port: int) -> None:
    run_guarded(_worker_body, rank, out, port)


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    try:
        mp.spawn(_worker, args=(out, free_port()), nprocs=2, join=True)
    except Exception:
        errors = "\n".join(p.read_text() for p in sorted(out.glob("error_*.txt")))
        pytest.fail(f"gloo workers failed:\n{errors}")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


def _single_process(local: bool, with_grad: bool):
    images, tokens = toy_batch(2 * B)
    model = ToyClip().double()
    model.drop.p = 0.0
    loss = ClipLoss(local_loss=local, gather_with_grad=with_grad, rank=0, world_size=1)(
        *model(images, tokens)
    )
    loss.backward()
    return loss.item(), grads_of(model)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_two_processes_equal_one_process_with_double_batch(two_process_results, mode):
    loss1, grads1 = _single_process(*MODES[mode])
    for rank in range(2):
        got = two_process_results[rank][mode]
        assert got["loss"] == pytest.approx(loss1, rel=1e-12)
        assert got["grads"].keys() == grads1.keys()
        for name, g in grads1.items():
            torch.testing.assert_close(got["grads"][name], g, rtol=1e-10, atol=1e-12, msg=f"{mode}: {name}")


def test_local_loss_without_grad_gather_has_the_global_loss_value(two_process_results):
    # Its gradient is open_clip's approximation (documented); the loss value is exact.
    loss1, _ = _single_process(True, False)
    assert two_process_results[0]["local_no_grad"]["loss"] == pytest.approx(loss1, rel=1e-12)


@pytest.mark.parametrize("variant", ["trainer", "compiled_accum"])
def test_optimizer_steps_on_two_processes_equal_one_process(two_process_results, variant):
    model = ToyClip().double()
    model.drop.p = 0.0
    env = DistEnv(0, 0, 1, torch.device("cpu"), None)
    _, trainer = _trainer(model, env, ClipLoss(rank=0, world_size=1))
    losses = [trainer.step([toy_batch(2 * B, seed=10 + s)], s).loss.item() for s in range(STEPS)]
    for rank in range(2):
        got = two_process_results[rank][variant]
        assert got["losses"] == pytest.approx(losses, rel=1e-12)
        for name, p in model.named_parameters():
            torch.testing.assert_close(got["params"][name], p.detach(), rtol=1e-10, atol=1e-12, msg=name)
    assert losses[-1] < losses[0]


def test_compiled_accumulation_syncs_gradients_once_per_step(two_process_results):
    # ToyClip's parameters fill one DDP bucket: one all-reduce per optimizer step.
    assert [r["compiled_accum"]["allreduces"] for r in two_process_results] == [STEPS, STEPS]
