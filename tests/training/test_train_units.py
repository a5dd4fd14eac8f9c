"""Training pieces on one process: accumulation, guards, schedules, batch plans, the typed
config, checkpoints (fallback, stale temp files), the text decays, device mapping."""

import json
import math
import random

import numpy as np
import pytest
import torch

from src.open_alip import create_model
from src.open_alip.loss import ClipLoss
from src.open_alip.model import strip_wrapper_prefixes
from src.training import checkpoint as ck
from src.training import main as train_main
from src.training.batching import plan_batches
from src.training.distributed import DistEnv, init_distributed
from src.training.errors import TrainingError
from src.training.loop import LOGIT_SCALE_MAX, NonFiniteLossError, Trainer, make_grad_scaler
from src.training.observe import Throughput, format_duration
from src.training.params import parse_config
from src.training.schedule import Schedule, warmup_steps_from
from src.training.state import _load_optimizer_moments
from tests._train_helpers import ToyClip, grads_of, toy_batch

CPU = DistEnv(0, 0, 1, torch.device("cpu"), None)


def _trainer(model, accum=1, precision="fp32", lr=0.05, clip=1.0):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    return Trainer(
        model,
        opt,
        Schedule("const", lr, 10, 0),
        ClipLoss(),
        CPU,
        precision=precision,
        grad_clip_norm=clip,
        accum_freq=accum,
        scaler=make_grad_scaler(precision, CPU.device),
    )


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
    r_big = t_big.step([(images, tokens)], 0)
    r_acc = t_acc.step([(images[i : i + 2], tokens[i : i + 2]) for i in range(0, 8, 2)], 0)
    assert r_acc.loss.item() == pytest.approx(r_big.loss.item(), rel=1e-12)
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
        feats = [model(*m, normalize=False) for m in micro]  # what the trainer asks for
        expected = ClipLoss()(torch.cat([f[0] for f in feats]), torch.cat([f[1] for f in feats]), feats[0][2])
    torch.manual_seed(123)
    assert trainer.step(micro, 0).loss.item() == pytest.approx(expected.item(), rel=1e-12)


def test_logit_scale_is_clamped_after_each_step():
    model = ToyClip()
    with torch.no_grad():
        model.logit_scale.fill_(LOGIT_SCALE_MAX + 1.0)
    _trainer(model).step([toy_batch(4, dtype=torch.float32)], 0)
    assert model.logit_scale.item() == pytest.approx(LOGIT_SCALE_MAX, rel=1e-6)  # float32 of ln 100


def test_a_nan_loss_is_recorded_on_the_device_and_raised_when_read():
    model = ToyClip()
    trainer = _trainer(model)
    good = toy_batch(4, dtype=torch.float32)
    bad_images = good[0].clone()
    bad_images[0, 0, 0, 0] = float("nan")
    trainer.step([good], 0)
    trainer.raise_if_nonfinite()  # nothing to report yet
    trainer.step([(bad_images, good[1])], 1)  # no host sync here: the step returns
    trainer.step([good], 2)
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 2$"):  # the first bad one, 1-based
        trainer.raise_if_nonfinite()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_reduce_the_loss(precision):
    torch.manual_seed(0)
    model = ToyClip()
    model.drop.p = 0.0
    trainer = _trainer(model, precision=precision, lr=0.02)
    batch = toy_batch(8, dtype=torch.float32)
    losses = [trainer.step([batch], s).loss.item() for s in range(15)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert (trainer.scaler is not None) == (precision == "fp16")


# --- the text decays ---------------------------------------------------------------------------


def _decays(model):
    return {
        k: v.detach().float().clone()
        for k, v in model.state_dict().items()
        if k.startswith("text_model.") and k.endswith(".att.time_decay")
    }


@pytest.mark.parametrize("storage", ["fp32", "bf16"])
def test_text_decays_train_in_bf16_unless_stored_in_bf16_as_the_original(storage):
    # The original stores time_decay in bf16: AdamW steps of ~1e-3 are below half a bf16 step
    # at magnitudes 1..6, so they round away. fp32 masters (the default) keep them.
    torch.manual_seed(0)
    model = create_model("RWKV_CLIP_tiny", n_layer=1, image_depth=1, input_size=16, vocab_size=256)
    if storage == "bf16":
        model.set_text_decay_dtype(torch.bfloat16)
    before = _decays(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.2, betas=(0.9, 0.98))
    trainer = Trainer(model, opt, Schedule("const", 1e-3, 4, 0), ClipLoss(), CPU, precision="bf16")
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        trainer.step(
            [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 256, (4, 77), generator=g))], step
        )
    moved = {k: bool((v != before[k]).any()) for k, v in _decays(model).items()}
    assert moved and all(moved.values()) == (storage == "fp32") and any(moved.values()) == (storage == "fp32")
    # Either way the saved weights are in the released layout (bf16 decays).
    key = next(iter(before))
    assert model.released_state_dict()[key].dtype == torch.bfloat16


def test_fp32_masters_are_used_in_the_compute_dtype(monkeypatch):
    # Under bf16 autocast the decays enter the WKV as bf16 values (as the original's stored ones
    # do), so a model holding masters and one holding their bf16 rounding compute the same.
    from src.open_alip import rwkv6

    seen = []

    def spy(r, k, v, w, u, impl):
        seen.append((w, u))
        return real_wkv(r, k, v, w, u, impl=impl)

    real_wkv = rwkv6.wkv
    monkeypatch.setattr(rwkv6, "wkv", spy)
    torch.manual_seed(0)
    masters = create_model("RWKV_CLIP_tiny", n_layer=1, image_depth=1, input_size=16).eval()
    with torch.no_grad():
        for block in masters.text_model.blocks:
            block.att.time_decay.add_(1e-3)  # below half a bf16 step at magnitudes 1..6
            block.att.time_faaaa.add_(1e-5)
    rounded = create_model("RWKV_CLIP_tiny", n_layer=1, image_depth=1, input_size=16).eval()
    rounded.load_state_dict(masters.released_state_dict())
    assert not torch.equal(
        rounded.text_model.blocks[0].att.time_decay, masters.text_model.blocks[0].att.time_decay
    )
    tokens = torch.randint(0, 49408, (2, 77), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        masters.encode_text(tokens)
        rounded.encode_text(tokens)
    (w_masters, u_masters), (w_rounded, u_rounded) = seen
    assert w_masters.dtype == torch.bfloat16
    assert torch.equal(w_masters, w_rounded) and torch.equal(u_masters, u_rounded)


# --- schedules ---------------------------------------------------------------------------------


def _torch_lrs(make, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.98))
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append((opt.param_groups[0]["lr"], opt.param_groups[0]["betas"][0]))
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("total", [100, 37])
def test_cosine_is_the_originals_onecycle_exactly(total):
    # The original's --lr-scheduler cosine built OneCycleLR(max_lr=[lr], ..., pct_start=0.1).
    want = _torch_lrs(
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=[1e-3], total_steps=total, pct_start=0.1),
        total,
    )
    for kind in ("cosine", "onecycle"):
        sched = Schedule(kind, 1e-3, total, warmup=0.1)
        assert [(sched.lr_at(s), sched.beta1_at(s)) for s in range(total)] == want


def test_linear_is_the_originals_decay_without_warmup():
    want = _torch_lrs(
        lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=50), 50
    )
    sched = Schedule("linear", 1e-3, 50, warmup=0.1)
    for s, (lr, beta1) in enumerate(want):
        # LinearLR leaves beta1 alone, and so does the schedule (None: the optimizer's own).
        assert sched.lr_at(s) == pytest.approx(lr, rel=1e-9, abs=1e-15) and sched.beta1_at(s) is None
        assert beta1 == 0.9
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0, betas=(0.8, 0.98))
    sched.apply(opt, 7)
    assert opt.param_groups[0]["betas"] == (0.8, 0.98)


def test_warmup_then_cosine_to_zero():
    assert warmup_steps_from(0.1, 100) == 10 and warmup_steps_from(25, 100) == 25
    sched = Schedule("warmup-cosine", 1.0, 100, warmup=0.1)
    f = [sched.lr_at(s) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[9:], f[10:]))
    assert f[55] == pytest.approx(0.5, abs=0.02) and f[99] < 0.001
    assert Schedule("warmup-linear", 1.0, 100, warmup=10).lr_at(55) == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ValueError, match="--lr-scheduler 'step'"):
        Schedule("step", 1.0, 3, 0)


def test_apply_sets_lr_and_beta1_on_every_group():
    opt = torch.optim.AdamW(
        [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))], lr=1.0, betas=(0.9, 0.98)
    )
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    sched = Schedule("cosine", 2e-3, 100, 0.1)
    assert sched.apply(opt, 10) == sched.lr_at(10)
    assert all(
        g["lr"] == sched.lr_at(10) and g["betas"] == (sched.beta1_at(10), 0.98) for g in opt.param_groups
    )


def test_resume_keeps_the_moments_and_takes_the_new_settings(tmp_path):
    p = torch.nn.Parameter(torch.ones(3))
    old = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)
    p.grad = torch.ones(3)
    old.step()
    ck.atomic_save({"optimizer": old.state_dict()}, tmp_path / "o.pt")
    new = torch.optim.AdamW([p], lr=1e-5, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.1)
    _load_optimizer_moments(new, torch.load(tmp_path / "o.pt", weights_only=True)["optimizer"])
    group = new.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-5, (0.8, 0.9), 1e-8, 0.1)
    assert torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"]) and new.state[p]["step"] == 1


def test_a_resume_lists_what_changed_and_names_the_renamed_schedule(tmp_path):
    cfg = parse_config(["--train-data", "d", "--output", str(tmp_path), "--lr", "1e-4", "--epochs", "4"])
    schedule = Schedule(cfg.lr_scheduler, cfg.lr, 400, cfg.warmup)
    # A checkpoint of the first format: flags under "args", written when 'cosine' meant warmup + cosine.
    old = {"args": {"lr": 1e-3, "lr_scheduler": "cosine", "epochs": 4, "eps": 1e-6, "beta2": 0.98}}
    changed, renamed = train_main._setting_changes(old, cfg, schedule, 10)
    assert changed == (
        f"changed on resume, in effect from step 11 (lr there {schedule.lr_at(10):.4g}): "
        "--lr 0.0001 (was 0.001), --eps 1e-08 (was 1e-06)"
    )
    assert "when the name meant warmup-cosine" in renamed and "pass --lr-scheduler warmup-cosine" in renamed
    assert train_main._setting_changes({"run": cfg.to_json()}, cfg, schedule, 10) == []


# --- the global batch --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "cap", "micro", "accum", "effective"),
    [
        (8, 512, 512, 1, 4096),
        (1, 512, 512, 8, 4096),
        (2, 512, 512, 4, 4096),
        (16, 512, 256, 1, 4096),
        (4, 256, 256, 4, 4096),
        (3, 512, 455, 3, 4095),
        (6, 512, 341, 2, 4092),
    ],
)
def test_the_global_batch_is_kept_through_accumulation(world, cap, micro, accum, effective):
    plan = plan_batches(per_process_max=cap, world_size=world, global_batch=4096)
    assert (plan.micro_batch, plan.accum_freq, plan.global_batch) == (micro, accum, effective)
    assert plan.micro_batch <= cap
    notice = plan.shortfall_notice()
    assert (notice is None) == (effective == 4096)
    if notice:
        assert f"the global batch is {effective}, not the --global-batch-size 4096" in notice


def test_without_a_global_batch_the_flags_multiply():
    plan = plan_batches(per_process_max=64, world_size=2, accum_freq=3)
    assert (plan.micro_batch, plan.accum_freq, plan.global_batch, plan.shortfall_notice()) == (
        64,
        3,
        384,
        None,
    )
    assert plan_batches(per_process_max=512, world_size=2, global_batch=4096, accum_freq=8).micro_batch == 256
    with pytest.raises(TrainingError, match="--global-batch-size 2 is smaller than the 4 processes"):
        plan_batches(per_process_max=8, world_size=4, global_batch=2)


# --- the typed config --------------------------------------------------------------------------


def test_one_typed_config_with_the_architecture_apart(tmp_path):
    cfg = parse_config(
        [
            "--train-data",
            "d",
            "--output",
            str(tmp_path / "o"),
            "--config",
            "RWKV_CLIP_tiny",
            "--n-layer",
            "3",
            "--drop-path-rate",
            "0.1",
            "--open-checkpoint",
            "True",
            "--gradient-acc",
            "2",
            "--global-batch-size",
            "64",
        ]
    )
    assert cfg.model["n_layer"] == 3 and cfg.model["drop_path_rate"] == 0.1 and cfg.model["with_cp"] is True
    assert not {"precision", "workers", "data_type"} & set(cfg.model)  # run settings stay out
    assert (cfg.accum_freq, cfg.global_batch_size, cfg.eps, cfg.precision, cfg.lr_scheduler) == (
        2,
        64,
        1e-8,
        "bf16",
        "cosine",
    )
    assert cfg.warmup == 0.1 and cfg.beta1 == 0.9  # filled in, not given
    assert cfg.given == {"train_data", "output", "config", "accum_freq", "global_batch_size"}
    assert json.loads(json.dumps(cfg.to_json()))["model"]["n_layer"] == 3
    with pytest.raises(AttributeError):
        cfg.lr = 1.0  # frozen: built once, passed down


def test_an_old_config_json_with_run_settings_still_loads(tmp_path):
    from src.open_alip import get_model_config

    old = {**get_model_config("RWKV_CLIP_tiny"), "precision": "bf16", "workers": 10, "data_type": "utf-8"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    cfg = parse_config(
        ["--train-data", "d", "--output", str(tmp_path / "o"), "--config", str(tmp_path / "old.json")]
    )
    assert cfg.model == get_model_config("RWKV_CLIP_tiny") and cfg.workers == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch-size", "0"], "--batch-size 0: must be at least 1"),
        (["--global-batch-size", "0"], "--global-batch-size 0: must be at least 1"),
        (["--image-embed-dims", "320"], "--image-embed-dims 320 differs from --n-embd"),
        (["--config", "RWKV_CLIP_B64"], "--config RWKV_CLIP_B64"),
        (["--beta2", "1.5"], "--beta2 1.5: must be in [0, 1)"),
    ],
)
def test_bad_values_are_refused_with_the_flag_named(tmp_path, extra, message):
    with pytest.raises(TrainingError, match=message.replace("[", r"\[").replace(")", r"\)")):
        parse_config(
            ["--train-data", "d", "--output", str(tmp_path / "o"), "--config", "RWKV_CLIP_tiny", *extra]
        )


def test_an_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(TrainingError, match=r"--output .*run is a file; pass a folder"):
        parse_config(["--train-data", "d", "--output", str(tmp_path / "run")])


# --- checkpoints -------------------------------------------------------------------------------


def _fake_ckpt(step):
    return {
        "state_dict": {},
        "optimizer": {},
        "step": step,
        "epoch": 0,
        "epoch_step": step,
        "data": [],
        "rng": [],
    }


def test_latest_skips_an_unreadable_newest_checkpoint(tmp_path):
    assert ck.find_resume_checkpoint("latest", tmp_path) == (None, [])
    for step in (2, 4):
        ck.atomic_save(_fake_ckpt(step), ck.step_checkpoint_path(tmp_path, step))
    ck.step_checkpoint_path(tmp_path, 6).write_bytes(b"PK\x03\x04 cut short by a full disk")
    ck.atomic_save({"state_dict": {}, "step": 5}, ck.epoch_checkpoint_path(tmp_path, 1))  # lacks the rest
    path, warnings = ck.find_resume_checkpoint("latest", tmp_path)
    assert path == ck.step_checkpoint_path(tmp_path, 4)
    assert "step_000000006.pt cannot be read" in warnings[0] and warnings[0].endswith("skipping it")
    assert "epoch_001.pt lacks optimizer" in warnings[1]
    assert warnings[2] == "resuming from step_000000004.pt, the newest checkpoint that can be read"
    with pytest.raises(TrainingError, match="--resume .*nope.pt: no such checkpoint file"):
        ck.find_resume_checkpoint(str(tmp_path / "nope.pt"), tmp_path)
    with pytest.raises(
        TrainingError, match="step_000000006.pt cannot be read"
    ):  # named explicitly: no fallback
        ck.find_resume_checkpoint(str(ck.step_checkpoint_path(tmp_path, 6)), tmp_path)


def test_temp_files_of_interrupted_saves_are_removed(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()  # a pid that has exited
    folder = ck.checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    stale = [folder / f".step_000000008.pt.{dead}.tmp", tmp_path / f".params.json.{dead}.tmp"]
    for p in stale:
        p.write_bytes(b"partial")
    live = folder / f".step_000000009.pt.{__import__('os').getpid()}.tmp"  # a save in progress
    live.write_bytes(b"partial")
    assert sorted(ck.remove_interrupted_saves(tmp_path)) == sorted(stale)
    assert live.exists() and not any(p.exists() for p in stale)


def test_pruning_keeps_the_newest_step_files_and_every_epoch_file(tmp_path):
    for step in (2, 4, 6):
        ck.atomic_save(_fake_ckpt(step), ck.step_checkpoint_path(tmp_path, step))
    ck.atomic_save(_fake_ckpt(5), ck.epoch_checkpoint_path(tmp_path, 1))
    ck.prune_step_checkpoints(tmp_path, keep=1)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [5, 6]


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


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    ck.atomic_save({"rng": ck.capture_rng_state(), "state_dict": {}}, tmp_path / "r.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ck.restore_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_strip_wrapper_prefixes():
    sd = {"module._orig_mod.logit_scale": 1, "module.text_model.emb.weight": 2, "image_model.x": 3}
    assert strip_wrapper_prefixes(sd) == {"logit_scale": 1, "text_model.emb.weight": 2, "image_model.x": 3}


# --- processes and devices ---------------------------------------------------------------------


def test_single_process_without_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    env = init_distributed("auto")
    assert (env.rank, env.world_size, env.distributed) == (0, 1, False)


def test_the_model_and_the_loader_get_the_process_gpu(monkeypatch, tmp_path):
    # No GPU can run here: torch is told it sees 4 (only the mapping is tested).
    import dataloaders.imagenet
    from src.devices import DeviceError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    seen = {}
    monkeypatch.setattr(dataloaders.imagenet, "build_loader", lambda data, batch, **kw: seen.update(kw))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg = parse_config(["--train-data", "d", "--output", str(tmp_path), "--config", "RWKV_CLIP_tiny"])
    for local_rank in range(4):
        monkeypatch.setenv("RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("WORLD_SIZE", "1")  # no process group: only the device is resolved
        env = init_distributed(cfg.device)
        assert env.device == torch.device("cuda", local_rank)
        train_main._build_loader(cfg, plan_batches(per_process_max=8, world_size=1), env)
        assert seen["device"] == env.device
    monkeypatch.setenv("LOCAL_RANK", "4")
    with pytest.raises(
        DeviceError, match=r"LOCAL_RANK 4: only 4 GPU\(s\) are visible \(CUDA_VISIBLE_DEVICES=4,5,6,7\)"
    ):
        init_distributed(cfg.device)


def test_progress_formatting():
    assert format_duration(26 * 3600 + 5 * 60) == "1d02h05m"
    assert format_duration(3 * 3600 + 7 * 60 + 10) == "3h07m"
    assert format_duration(189) == "3m09s"
    meter = Throughput(samples_per_step=8, world_size=2, total_steps=100, start_step=0)
    meter.add_data_wait(0.0)
    out = meter.report(10)
    assert out["samples_per_s"] == pytest.approx(2 * out["samples_per_s_per_rank"])
    assert out["eta_s"] == pytest.approx(90 * out["step_time_s"])


# --- --batch-size auto ---------------------------------------------------------------------------


def test_batch_size_auto_without_a_gpu_caps_micro_batches_at_the_recipe_batch():
    from src.training.batching import AUTO_CPU_BATCH, plan_for_device

    plan, checkpointing, why = plan_for_device(
        model_config={},
        wkv_impl="chunked",
        precision="bf16",
        device=torch.device("cpu"),
        world_size=2,
        global_batch=4096,
        accum_freq=None,
        batch_size=None,
        force_checkpointing=False,
    )
    assert (plan.micro_batch, plan.accum_freq, plan.global_batch) == (AUTO_CPU_BATCH, 4, 4096)
    assert not checkpointing and "no GPU" in why


@pytest.mark.parametrize(("gib", "world", "global_batch"), [(4, 1, 512), (80, 3, 4096)])
def test_batch_size_auto_on_a_gpu_follows_the_cost_model(monkeypatch, gib, world, global_batch):
    # No GPU can run here: torch is made to report a GPU of `gib` GiB; the cost model itself
    # measures on FakeTensors and needs none.
    from src.open_alip import get_model_config
    from src.perf.planner import plan_micro_batch
    from src.training import batching

    class Properties:
        total_memory = gib << 30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    config = get_model_config("RWKV_CLIP_tiny")
    plan, checkpointing, why = batching.plan_for_device(
        model_config=config,
        wkv_impl="chunked",
        precision="bf16",
        device=torch.device("cuda", 0),
        world_size=world,
        global_batch=global_batch,
        accum_freq=None,
        batch_size=None,
        force_checkpointing=False,
    )
    expected = plan_micro_batch(
        config,
        wkv_impl="chunked",
        precision="bf16",
        device_memory_bytes=gib << 30,
        global_batch=global_batch // world * world,
        world_size=world,
        bucket_view=True,
    )
    assert (plan.micro_batch, plan.accum_freq, checkpointing) == (
        expected.micro_batch,
        expected.accum_steps,
        expected.grad_checkpointing,
    )
    assert plan.global_batch == global_batch // world * world and why.startswith("--batch-size auto: ")
    assert (plan.shortfall_notice() is None) == (global_batch % world == 0)
    with pytest.raises(TrainingError, match="--batch-size auto chooses the accumulation itself"):
        batching.plan_for_device(
            model_config=config,
            wkv_impl="chunked",
            precision="bf16",
            device=torch.device("cuda", 0),
            world_size=world,
            global_batch=global_batch,
            accum_freq=2,
            batch_size=None,
            force_checkpointing=False,
        )
