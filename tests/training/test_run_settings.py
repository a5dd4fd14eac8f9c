"""The run settings are defined once: train.py's parser is generated from TrainConfig's fields
(name, type, default, help), `--recipe` gives the paper's values under the flags given beside
it, and a run recorded by an earlier version still compares on resume."""

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from src.training import main as train_main
from src.training.config import RECIPES, TrainConfig, flag_of, recipe_notices, settings
from src.training.params import MODEL_KEYS, build_parser, parse_config
from src.training.schedule import Schedule
from tests._repo import REPO

# What deepglint/RWKV-CLIP's shell/train_RWKV_CLIP_B32_YFCC15M.sh and train.py ran with, as this
# toolkit's B/32 script passed them flag by flag before the recipe existed.
PAPER_B32 = {
    "config": "RWKV_CLIP_B32",
    "global_batch_size": 4096,
    "batch_size": None,
    "epochs": 32,
    "lr": 1e-3,
    "lr_scheduler": "cosine",
    "warmup": 0.1,
    "beta1": 0.9,
    "beta2": 0.98,
    "eps": 1e-8,
    "weight_decay": 0.2,
    "grad_clip_norm": 1.0,
    "precision": "bf16",
    "workers": 10,
}


def _parse(tmp_path: Path, *flags: str) -> TrainConfig:
    return parse_config(["--train-data", "d", "--output", str(tmp_path / "o"), *flags])


def _actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in build_parser()._actions if a.dest != "help"}


def test_every_setting_is_a_generated_flag_with_its_default_and_help(tmp_path):
    actions = _actions()
    for f in settings():
        action = actions.pop(f.name)
        assert flag_of(f.name) in action.option_strings, f.name
        assert action.help.startswith(f.metadata["help"].replace("%", "%%")), f.name
        shown = f.default not in (dataclasses.MISSING, None) and f.default is not False
        assert action.help.endswith(f" (default: {f.default})") == shown, f.name
        assert action.required == (f.default is dataclasses.MISSING), f.name
        assert action.choices == f.metadata["choices"], f.name
    # Every other flag is an architecture key of the model JSON: no run setting is written beside TrainConfig.
    assert set(actions) == set(MODEL_KEYS)
    # Not given, every setting is its field's default.
    cfg = _parse(tmp_path)
    for f in settings():
        if f.default is not dataclasses.MISSING:
            assert getattr(cfg, f.name) == f.default, f.name
    assert not {"model", "given"} & {f.name for f in settings()}


def test_the_flags_take_the_fields_types(tmp_path):
    cfg = _parse(
        tmp_path,
        "--workers",
        "3",
        "--lr=0.5",
        "--local-loss",
        "--batch-size",
        "auto",
        "--gradient-acc",
        "2",
        "--resume",
        "latest",
    )
    assert (cfg.workers, cfg.lr, cfg.local_loss, cfg.batch_size, cfg.accum_freq, cfg.resume) == (
        3,
        0.5,
        True,
        None,
        2,
        "latest",
    )
    assert isinstance(cfg.output, Path) and parse_config(
        ["--train-data", "a", "b", "--output", "o"]
    ).train_data == ("a", "b")
    assert cfg.given == {
        "train_data",
        "output",
        "workers",
        "lr",
        "local_loss",
        "batch_size",
        "accum_freq",
        "resume",
    }
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--train-data", "d", "--output", "o", "--work", "3"])  # allow_abbrev=False


def test_the_parser_and_the_launcher_import_no_torch():
    # train.py --help, a flag error and the recipe scripts' launcher answer in a tenth of a second,
    # not after torch's two (the implementations' names come from src/open_alip/choices.py).
    code = (
        "import sys, src.training.params, src.training.launch; "
        "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith(('src', 'dataloaders'))]"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True).returncode == 0
    )
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and "--mix-impl {torch,triton}" in proc.stdout


def test_help_shows_a_default_only_where_there_is_one(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--lr LR peak learning rate (default: 0.001)" in out
    assert "--warmup WARMUP rise or warmup: a fraction of all steps if < 1, else steps (default: 0.1)" in out
    assert "--resume RESUME 'latest' (newest readable checkpoint" in out
    assert "(default: None)" not in out and "(default: False)" not in out
    assert "--recipe {rwkv_clip_b32_yfcc15m,rwkv_clip_b16_yfcc15m}" in out
    assert "--config RWKV_CLIP_B32 --global-batch-size 4096 --batch-size auto --epochs 32 --lr 0.001" in out


@pytest.mark.parametrize(
    ("name", "config"),
    [("rwkv_clip_b32_yfcc15m", "RWKV_CLIP_B32"), ("rwkv_clip_b16_yfcc15m", "RWKV_CLIP_B16")],
)
def test_the_recipe_gives_the_papers_values(tmp_path, name, config):
    cfg = _parse(tmp_path, "--recipe", name)
    assert {k: getattr(cfg, k) for k in PAPER_B32} == {**PAPER_B32, "config": config}
    assert cfg.recipe == name and cfg.model["image_patch_size"] == int(config[-2:])
    assert recipe_notices(cfg) == []
    assert set(RECIPES[name].values) <= {f.name for f in settings()}


def test_flags_given_beside_the_recipe_win_and_are_announced(tmp_path):
    # Before or after --recipe, as --flag value or --flag=value: a given flag wins.
    cfg = _parse(
        tmp_path,
        "--lr",
        "2e-3",
        "--recipe",
        "rwkv_clip_b32_yfcc15m",
        "--global-batch-size=1024",
        "--batch-size",
        "64",
        "--epochs",
        "32",
    )
    assert (cfg.lr, cfg.global_batch_size, cfg.batch_size, cfg.epochs, cfg.weight_decay) == (
        2e-3,
        1024,
        64,
        32,
        0.2,
    )
    assert recipe_notices(cfg) == [
        "--global-batch-size 1024 replaces the recipe's 4096 (512 per GPU x 8 GPUs in the paper's run); the "
        "contrastive batch, and so the results, will differ",
        "--lr 0.002 replaces the recipe's 0.001",
    ]  # not the micro-batch (speed and memory only), nor --epochs given at the recipe's value
    assert (
        _parse(tmp_path, "--recipe", "rwkv_clip_b32_yfcc15m", "--config", "RWKV_CLIP_tiny").config
        == "RWKV_CLIP_tiny"
    )


def _float_flags() -> list[str]:
    return sorted(
        opt
        for a in build_parser()._actions
        for opt in a.option_strings[:1]
        if a.type is not None and getattr(a.type, "__name__", "") in ("finite_float", "float")
    )


def test_every_float_flag_refuses_inf_and_nan_when_parsed(tmp_path, capsys):
    # Once: --lr inf trained one step and saved a checkpoint of non-finite weights, exit 0.
    flags = _float_flags()
    assert {
        "--lr",
        "--warmup",
        "--beta1",
        "--beta2",
        "--eps",
        "--weight-decay",
        "--grad-clip-norm",
        "--dropout",
        "--drop-path-rate",
    } <= set(flags)
    for flag in flags:
        for bad in ("inf", "-inf", "nan", "-Infinity"):
            with pytest.raises(SystemExit) as exit_info:
                _parse(tmp_path, f"{flag}={bad}")
            assert exit_info.value.code == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err == f"train.py: error: argument {flag}: expected a finite number, got '{bad}'", err
    assert _parse(tmp_path, "--lr", "1e-4", "--dropout", "0.1").lr == 1e-4


def test_a_non_finite_value_given_in_code_is_refused_too(tmp_path):
    from src.training.config import build_config
    from src.training.errors import TrainingError

    with pytest.raises(TrainingError, match="--lr inf: must be a finite number"):
        build_config({"train_data": ["d"], "output": str(tmp_path / "o"), "lr": float("inf")}, {})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--input-size", "0"], "--input-size 0: must be at least 1"),
        (["--input-size", "7"], "--input-size 7: must be a multiple of image_patch_size 8"),
        (["--dropout", "2"], "--dropout 2.0: must be in [0, 1)"),
        (["--drop-path-rate", "1"], "--drop-path-rate 1.0: must be in [0, 1)"),
        (["--image-patch-size", "0"], "--image-patch-size 0: must be at least 1"),
        (
            ["--head-size", "24"],
            "--config RWKV_CLIP_tiny: model config key n_embd 64: must be a multiple of head_size 24",
        ),
    ],
)
def test_model_flags_are_checked_when_the_config_is_built(tmp_path, capsys, flags, message):
    # Once each a traceback from the model or the loader (a kernel larger than the image, a division by zero).
    import train

    assert (
        train.main(
            ["--train-data", "d", "--output", str(tmp_path / "o"), "--config", "RWKV_CLIP_tiny", *flags]
        )
        == 2
    )
    assert capsys.readouterr().err == f"train.py: error: {message}\n"


def test_a_recipe_value_is_checked_like_a_flag(tmp_path):
    from src.training.errors import TrainingError

    with pytest.raises(TrainingError, match="--beta2 1.5: must be in"):
        _parse(tmp_path, "--recipe", "rwkv_clip_b32_yfcc15m", "--beta2", "1.5")


def test_a_run_recorded_before_the_recipes_still_compares_on_resume(tmp_path):
    cfg = _parse(tmp_path, "--lr", "1e-4")
    schedule = Schedule(cfg.lr_scheduler, cfg.lr, 400, cfg.warmup)
    # params.json / a checkpoint's "run" of the previous version: no "recipe", "given" only for warmup/beta1.
    before = {k: v for k, v in cfg.to_json().items() if k != "recipe"} | {"given": ["warmup"], "lr": 1e-3}
    assert train_main._setting_changes({"run": before}, cfg, schedule, 10) == [
        f"changed on resume, in effect from step 11 (lr there {schedule.lr_at(10):.4g}): --lr 0.0001 "
        "(was 0.001)"
    ]
