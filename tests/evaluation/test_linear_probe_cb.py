"""The linear probe against its references, run in the CLIP_benchmark venv (benchmarks/oracles.py:
clip_benchmark_python, which also holds scikit-learn):

- `--protocol clip_benchmark` gives CLIP_benchmark 1.6.2's own numbers: its `linear_probe.evaluate`
  runs on the features our run cached, written into its feature folder as its own cache, and must
  report our top-1, top-5, mean per-class recall and weight decay;
- the paper protocol's L-BFGS solver minimises what scikit-learn's `LogisticRegression(C=1/lam)`
  minimises (CLIP's probe): the same probabilities and objective.

CLIP_benchmark's probe asserts it runs on CUDA and moves the model and batches there with `.cuda()`.
There is no GPU here, so its process runs with `-O` (no asserts) and `.cuda()` returns the CPU
tensor or module it is called on: the one stand-in in this file, for a GPU.
"""

import json

import numpy as np
import pytest
import torch

import linear_probe as linear_probe_cli
from benchmarks.oracles import REPO_ROOT, clip_benchmark_python, run_oracle
from src.evaluation.logistic import Rows, fit_logistic
from src.open_alip.model import get_model_config
from tests import _eval_layouts as layouts

EPOCHS = 3  # its --fewshot_epochs, fewer than its 10 to keep the 20 training runs of each side short

CB_SCRIPT = r"""
import json, os, sys
import numpy as np, torch
import clip_benchmark.metrics.linear_probe as lp
from src.evaluation.clip_bench import use_compatible_accuracy

torch.Tensor.cuda = lambda self, *args, **kwargs: self  # no GPU here (module doc)
torch.nn.Module.cuda = lambda self, *args, **kwargs: self
use_compatible_accuracy(lp)  # 1.6.2's accuracy() fails under numpy 2: clip_benchmark_eval.py's replacement
root, folders, epochs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
feature_dir = os.path.join(root, "features", "model")
os.makedirs(feature_dir)
for split, folder in folders.items():  # our cache entries, as its own cache files
    meta = json.load(open(os.path.join(folder, "meta.json")))
    x = np.fromfile(os.path.join(folder, "features.f32"), dtype=np.float32)
    x = x.reshape(meta["count"], meta["dim"])
    y = np.fromfile(os.path.join(folder, "labels.i64"), dtype=np.int64)
    torch.save(torch.from_numpy(x), os.path.join(feature_dir, f"features_{split}.pt"))
    torch.save(torch.from_numpy(y), os.path.join(feature_dir, f"targets_{split}.pt"))
torch.manual_seed(0)  # its command line's first step (--seed 0)
# evaluate(model, train_dataloader, dataloader, fewshot_k, batch_size, num_workers, lr, epochs, model_id,
#          seed, feature_root, device, val_dataloader, normalize, amp, verbose): the features are cached,
#          so the model and the loaders are never read; a val loader only has to be there (its --val_split)
out = lp.evaluate(None, None, None, -1, 64, 0, 0.1, epochs, "model", 0, os.path.join(root, "features"), "cpu",
                  val_dataloader=True, normalize=True, amp=False, verbose=False)
print(json.dumps({k: (None if isinstance(v, float) and v != v else v) for k, v in out.items()}))
"""

SKLEARN_SCRIPT = r"""
import json, sys
import numpy as np
from sklearn.linear_model import LogisticRegression

data = np.load(sys.argv[1])
out = {}
for lam in json.loads(sys.argv[2]):
    clf = LogisticRegression(C=1.0 / lam, max_iter=10000, tol=1e-10)
    clf.fit(data["x"].astype(np.float64), data["y"])
    out[str(lam)] = {"coef": clf.coef_.tolist(), "intercept": clf.intercept_.tolist(),
                     "proba": clf.predict_proba(data["test"].astype(np.float64)).tolist()}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_clip_benchmark_protocol_gives_clip_benchmarks_own_numbers(tmp_path, capsys):
    config = tmp_path / "micro.json"
    config.write_text(json.dumps(get_model_config("RWKV_CLIP_tiny", **layouts.MICRO)))
    weights = tmp_path / "micro.pt"
    torch.save(layouts.micro_model().state_dict(), weights)
    # close colours, much noise: a probe that is neither perfect nor chance, so the search matters
    colours = [(120, 100, 100), (100, 120, 100), (100, 100, 120), (110, 110, 110), (125, 125, 95)]
    own = layouts.write_own_splits(tmp_path / "own", colours, {"train": 12, "val": 5, "test": 8}, noise=40)
    rc = linear_probe_cli.main(
        [
            "--model-name",
            str(config),
            "--model-weight",
            str(weights),
            "--device",
            "cpu",
            "--workers",
            "0",
            "--no-progress",
            "--wkv-impl",
            "reference",
            "--protocol",
            "clip_benchmark",
            "--cb-epochs",
            str(EPOCHS),
            "--output-dir",
            str(tmp_path / "out"),
            "--datasets",
            f"own={own}",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    ours = json.loads((tmp_path / "out" / "linear_probe_own.json").read_text())
    folders = {split: entry["folder"] for split, entry in ours["feature_cache"].items()}
    proc = run_oracle(
        clip_benchmark_python(),
        CB_SCRIPT,
        str(tmp_path),
        json.dumps(folders),
        str(EPOCHS),
        cwd=REPO_ROOT,
        options=("-O",),
    )
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    mine = ours["clip_benchmark_metrics"]
    assert theirs["weight_decay"] == mine["weight_decay"]
    for key in ("lp_acc1", "lp_acc5", "lp_mean_per_class_recall"):
        assert theirs[key] == pytest.approx(mine[key], abs=1e-6), key  # ours: float32 percentages
    assert 0.3 < theirs["lp_acc1"] < 1.0  # a probe that the search had to get right
    assert {k: theirs[k] for k in ("epochs", "seed", "fewshot_k", "normalized")} == {
        k: mine[k] for k in ("epochs", "seed", "fewshot_k", "normalized")
    }


def test_the_lbfgs_probe_matches_scikit_learns_logistic_regression(tmp_path):
    g = torch.Generator().manual_seed(3)
    centres = torch.randn(4, 10, generator=g)
    y = torch.arange(160) % 4
    x = torch.nn.functional.normalize(centres[y] + 1.5 * torch.randn(160, 10, generator=g), dim=-1)
    test = torch.nn.functional.normalize(torch.randn(40, 10, generator=g), dim=-1)
    np.savez(tmp_path / "data.npz", x=x.numpy(), y=y.numpy(), test=test.numpy())
    lams = [1e-3, 1e-1, 10.0]
    proc = run_oracle(clip_benchmark_python(), SKLEARN_SCRIPT, str(tmp_path / "data.npz"), json.dumps(lams))
    reference = json.loads(proc.stdout)
    for lam in lams:
        fit = fit_logistic([Rows(x, y)], 4, lam, "cpu", tolerance=1e-6)
        ref = reference[str(lam)]
        proba = torch.softmax(fit.logits(test).double(), dim=1)
        torch.testing.assert_close(proba, torch.tensor(ref["proba"], dtype=torch.float64), atol=2e-4, rtol=0)
        # the objective at its solution, in our scaling: mean cross-entropy + lam / (2n) ||W||^2
        w, b = (
            torch.tensor(ref["coef"], dtype=torch.float64),
            torch.tensor(ref["intercept"], dtype=torch.float64),
        )
        logits = x.double() @ w.t() + b
        theirs = torch.nn.functional.cross_entropy(logits, y) + lam / (2 * len(y)) * w.square().sum()
        assert fit.loss == pytest.approx(theirs.item(), rel=1e-5), lam
