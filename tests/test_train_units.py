"""Training pieces on one process: accumulation, guards, schedule, checkpoints, params."""


import math
import random

import numpy as np
import pytest
import torch

from src.open_alip.loss import ClipLoss
from src.open_alip.model import strip_wrapper_prefixes
from src.training import checkpoint as ck
from src.training.distributed import DistEnv, init_distributed
from src.training.errors import TrainingError
from src.training.loop import LOGIT_SCALE_MAX, NonFiniteLossError, Trainer, make_grad_scaler
from src.training.observe import Throughput, format_duration
from src.training.params import build_parser, check_args, resolve_model_config
from src.training.schedule import build_scheduler, lr_factor, warmup_steps_from
from tests._train_helpers import ToyClip, grads_of, toy_batch

CPU = DistEnv(0, 0, 1, torch.device("cpu"), None)


def _trainer(model, accum=1, precision="fp32", lr=0.05, clip=1.0):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    sched = build_scheduler(opt, kind="const", total_steps=10, warmup=0)
    return Trainer(model, opt, sched, ClipLoss(), CPU, precision=precision, grad_clip_norm=clip,
                   accum_freq=accum, scaler=make_grad_scaler(precision, CPU.device))


def _capture_grads(trainer):
    """Snapshot the gradients the optimizer is about to apply (the step clears them)."""
    seen = {}
    trainer.optimizer.register_step_pre_hook(lambda *_: seen.update(grads_of(trainer.raw_model)))
    return seen


def test_accumulation_equals_one_big_batch():
    images, tokens = toy_batch(8)
    big, acc = ToyClip().double(), ToyClip().double()
    big.drop.p = acc.drop.p = 0.0
    t_big, t_acc = _trainer(big, clip=0), _trainer(acc, accum=4, clip=0)
    g_big, g_acc = _capture_grads(t_big), _capture_grads(t_acc)
    r_big = t_big.step([(images, tokens)])
    r_acc = t_acc.step([(images[i : i + 2], tokens[i : i + 2]) for i in range(0, 8, 2)])
    assert r_acc.loss == pytest.approx(r_big.loss, rel=1e-12)
    for name, g in g_big.items():
        torch.testing.assert_close(g_acc[name], g, rtol=1e-10, atol=1e-12, msg=name)
    for (name, p), q in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-10, atol=1e-12, msg=name)


def test_accumulation_replays_dropout_masks():
    # With dropout on, the gradient pass must see the masks of the feature-caching pass;
    # the returned loss is then exactly the loss of the cached (no-grad) features.
    images, tokens = toy_batch(6)
    model = ToyClip().double()
    trainer = _trainer(model, accum=3)
    micro = [(images[i : i + 2], tokens[i : i + 2]) for i in range(0, 6, 2)]
    torch.manual_seed(123)
    with torch.no_grad():
        feats = [model(*m) for m in micro]
        expected = ClipLoss()(torch.cat([f[0] for f in feats]), torch.cat([f[1] for f in feats]), feats[0][2])
    torch.manual_seed(123)
    assert trainer.step(micro).loss == pytest.approx(expected.item(), rel=1e-12)


def test_logit_scale_is_clamped_after_each_step():
    model = ToyClip()
    with torch.no_grad():
        model.logit_scale.fill_(LOGIT_SCALE_MAX + 1.0)
    _trainer(model).step([toy_batch(4, dtype=torch.float32)])
    assert model.logit_scale.item() == pytest.approx(LOGIT_SCALE_MAX, rel=1e-6)  # float32 of ln 100


def test_nan_loss_stops_before_touching_the_weights():
    model = ToyClip()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    images, tokens = toy_batch(4, dtype=torch.float32)
    images[0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="nan"):
        _trainer(model).step([(images, tokens)])
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.grad is None


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_reduce_the_loss(precision):
    torch.manual_seed(0)
    model = ToyClip()
    model.drop.p = 0.0
    trainer = _trainer(model, precision=precision, lr=0.02)
    batch = toy_batch(8, dtype=torch.float32)
    losses = [trainer.step([batch]).loss for _ in range(15)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert (trainer.scaler is not None) == (precision == "fp16")


def test_warmup_then_cosine_to_zero():
    assert warmup_steps_from(0.1, 100) == 10 and warmup_steps_from(25, 100) == 25
    f = [lr_factor(s, kind="cosine", total_steps=100, warmup_steps=10) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[9:], f[10:]))
    assert f[55] == pytest.approx(0.5, abs=0.02) and f[99] < 0.001
    with pytest.raises(ValueError, match="--lr-scheduler"):
        build_scheduler(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), kind="step", total_steps=3,
                        warmup=0)


@pytest.mark.parametrize("kind", ["cosine", "onecycle"])
def test_scheduler_state_survives_a_weights_only_round_trip(tmp_path, kind):
    def make():
        p = torch.nn.Parameter(torch.zeros(2))
        opt = torch.optim.AdamW([p], lr=1e-3)
        return opt, build_scheduler(opt, kind=kind, total_steps=50, warmup=0.2)

    opt, sched = make()
    for _ in range(7):
        opt.step()
        sched.step()
    ck.atomic_save({"scheduler": sched.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    opt2, sched2 = make()
    opt2.load_state_dict(state["optimizer"])
    sched2.load_state_dict(state["scheduler"])
    for _ in range(3):
        opt.step(), sched.step(), opt2.step(), sched2.step()
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr(), rel=1e-12)
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    ck.atomic_save({"rng": ck.capture_rng_state(), "state_dict": {}}, tmp_path / "r.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ck.restore_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "checkpoints" / "step_000000002.pt"
    ck.atomic_save({"state_dict": {"w": torch.ones(2)}, "step": 2}, target)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ck.atomic_save({"state_dict": {}, "bad": Unpicklable()}, target)
    assert torch.equal(torch.load(target, weights_only=True)["state_dict"]["w"], torch.ones(2))
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp file left


def test_latest_checkpoint_pruning_and_resume_resolution(tmp_path):
    assert ck.resolve_resume("latest", tmp_path) is None
    for step in (2, 4, 6):
        ck.atomic_save({"state_dict": {}, "step": step}, ck.step_checkpoint_path(tmp_path, step))
    ck.atomic_save({"state_dict": {}, "step": 5}, ck.epoch_checkpoint_path(tmp_path, 1))
    (ck.checkpoint_dir(tmp_path) / ".step_000000008.pt.1.tmp").write_bytes(b"partial")  # killed mid-write
    assert ck.resolve_resume("latest", tmp_path) == ck.step_checkpoint_path(tmp_path, 6)
    ck.prune_step_checkpoints(tmp_path, keep=1)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [5, 6]
    with pytest.raises(FileNotFoundError, match="--resume"):
        ck.resolve_resume(str(tmp_path / "nope.pt"), tmp_path)


def test_strip_wrapper_prefixes():
    sd = {"module._orig_mod.logit_scale": 1, "module.text_model.emb.weight": 2, "image_model.x": 3}
    assert strip_wrapper_prefixes(sd) == {"logit_scale": 1, "text_model.emb.weight": 2, "image_model.x": 3}


def test_flags_override_the_config_json():
    args = build_parser().parse_args(
        ["--train-data", "d", "--output", "o", "--n-layer", "3", "--drop-path-rate", "0.1",
         "--open-checkpoint", "True", "--precision", "fp32", "--gradient-acc", "2"]
    )
    check_args(args)
    base = {"n_layer": 6, "n_embd": 640, "image_embed_dims": 640, "drop_path_rate": 0.3, "precision": "bf16",
            "with_cp": False, "ctx_len": 77}
    cfg = resolve_model_config(args, base)
    assert cfg == {**base, "n_layer": 3, "drop_path_rate": 0.1, "with_cp": True, "precision": "fp32"}
    assert args.accum_freq == 2
    args.image_embed_dims = 320
    with pytest.raises(TrainingError, match="--image-embed-dims 320"):
        resolve_model_config(args, base)


def test_bad_values_are_refused_with_the_flag_named():
    args = build_parser().parse_args(["--train-data", "d", "--output", "o", "--batch-size", "0"])
    with pytest.raises(TrainingError, match="--batch-size 0"):
        check_args(args)


def test_single_process_without_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    env = init_distributed("auto")
    assert (env.rank, env.world_size, env.distributed) == (0, 1, False)


def test_progress_formatting():
    assert format_duration(26 * 3600 + 5 * 60) == "1d02h05m"
    assert format_duration(3 * 3600 + 7 * 60 + 10) == "3h07m"
    assert format_duration(189) == "3m09s"
    meter = Throughput(samples_per_step=8, world_size=2, total_steps=100, start_step=0)
    meter.add_data_wait(0.0)
    out = meter.report(10)
    assert out["samples_per_s"] == pytest.approx(2 * out["samples_per_s_per_rank"])
    assert out["eta_s"] == pytest.approx(90 * out["step_time_s"])
