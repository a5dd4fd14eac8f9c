"""clip_benchmark_eval.py's glue against the real CLIP_benchmark 1.6.2, installed in its own venv
(benchmarks/oracles.py: clip_benchmark_python).

That venv holds CLIP_benchmark's zero-shot metric modules and what they import, with numpy 2 (the
numpy this toolkit installs), but not torchvision or open_clip, which its command line imports at
module level: torchvision's wheels are CUDA builds, not installed here. So its own `evaluate`
functions run on a tiny dataset with the wrapper's loader and metric replacement, and the wrapper's
command line is checked to stop with one line when CLIP_benchmark cannot be imported whole.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.oracles import REPO_ROOT, clip_benchmark_python, run_oracle

SCRIPT = r"""
import json, sys
import numpy as np, torch, torch.nn.functional as F
from PIL import Image
import clip_benchmark.metrics.zeroshot_classification as zc
import clip_benchmark.metrics.zeroshot_retrieval as zr
import clip_benchmark_eval
from src.evaluation.clip_bench import load_for_clip_benchmark, use_compatible_accuracy
from src.open_alip.zero_shot import build_class_embeddings, classification_metrics, retrieval_metrics

model, transform, tokenizer = load_for_clip_benchmark("RWKV_CLIP_tiny", sys.argv[1], None, "cpu")
model.eval()
rng = np.random.default_rng(0)
pictures = [Image.fromarray((rng.random((20 + 3 * i, 24, 3)) * 255).astype(np.uint8)) for i in range(12)]
images = torch.stack([transform(p) for p in pictures])
labels = torch.arange(12) % 6

class Tiny(torch.utils.data.Dataset):  # what CLIP_benchmark's evaluate reads: items and .classes
    classes = ["red", "green", "blue", "yellow", "purple", "grey"]
    def __len__(self):
        return 12
    def __getitem__(self, i):
        return images[i], int(labels[i])

loader = torch.utils.data.DataLoader(Tiny(), batch_size=5)
templates = ["a photo of a {c}.", "a drawing of a {c}."]
out = {"numpy": np.__version__}
try:
    zc.evaluate(model, loader, tokenizer, Tiny.classes, templates, "cpu", amp=False)
    out["as_released"] = "ran"
except TypeError as exc:
    out["as_released"] = f"TypeError: {exc}"
use_compatible_accuracy(zc)
out["fp32"] = zc.evaluate(model, loader, tokenizer, Tiny.classes, templates, "cpu", amp=False)
out["amp"] = zc.evaluate(model, loader, tokenizer, Tiny.classes, templates, "cpu", amp=True)
with torch.no_grad():
    prompts = [t.replace("{c}", "{}") for t in templates]
    classifier = build_class_embeddings(model, Tiny.classes, prompts, "cpu", tokenizer=tokenizer)
    features = F.normalize(model.encode_image(images), dim=-1)
out["ours"] = classification_metrics(100.0 * features @ classifier, labels, 6)

captions = [[f"photo number {i}", f"a picture, {i} of twelve"] for i in range(12)]
class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return 12
    def __getitem__(self, i):
        return images[i], captions[i]

pairs = torch.utils.data.DataLoader(
    Pairs(), batch_size=5, collate_fn=lambda b: (torch.stack([x for x, _ in b]), [t for _, t in b])
)
out["retrieval"] = zr.evaluate(model, pairs, tokenizer, "cpu", amp=False, recall_k_list=[1, 5])
with torch.no_grad():
    texts = F.normalize(model.encode_text(tokenizer([t for ts in captions for t in ts])), dim=-1)
out["retrieval_ours"] = retrieval_metrics(features, texts, torch.arange(12).repeat_interleave(2), ks=(1, 5))
from src.evaluation.clip_benchmark_protocol import clip_benchmark_retrieval_metrics
out["retrieval_ours_form"] = clip_benchmark_retrieval_metrics(out["retrieval_ours"])
out["wrapper_rc"] = clip_benchmark_eval.main(["eval", "--dataset", "cifar10", "--pretrained", sys.argv[1]])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def clip_benchmark_run(tiny_weights):
    proc = run_oracle(clip_benchmark_python(), SCRIPT, str(tiny_weights.path), cwd=REPO_ROOT)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_released_accuracy_fails_under_numpy2_and_the_replacement_matches_ours(clip_benchmark_run):
    out, _ = clip_benchmark_run
    assert out["numpy"].startswith("2.")
    # the bug the wrapper works around, as 1.6.2 ships it
    assert out["as_released"].startswith("TypeError") and "scalar" in out["as_released"]
    fp32, ours = out["fp32"], out["ours"]
    # CLIP_benchmark reports fractions, we report percent; same images, labels and model in fp32
    assert fp32["acc1"] * 100 == pytest.approx(ours["top1"])
    assert fp32["acc5"] * 100 == pytest.approx(ours["top5"])
    assert fp32["mean_per_class_recall"] * 100 == pytest.approx(ours["mean_per_class_recall"])
    assert set(out["amp"]) == {
        "acc1",
        "acc5",
        "mean_per_class_recall",
    }  # its autocast (bfloat16 on CPU) runs too


def test_retrieval_recall_matches_ours(clip_benchmark_run):
    out, _ = clip_benchmark_run
    theirs, ours = out["retrieval"], out["retrieval_ours"]
    for k in (1, 5):
        # its "image retrieval" is text -> image, its "text retrieval" image -> text
        assert theirs[f"image_retrieval_recall@{k}"] * 100 == pytest.approx(ours[f"text_to_image_R@{k}"])
        assert theirs[f"text_retrieval_recall@{k}"] * 100 == pytest.approx(ours[f"image_to_text_R@{k}"])


def test_our_clip_benchmark_form_has_its_keys(clip_benchmark_run):
    out, _ = clip_benchmark_run
    assert out["retrieval_ours_form"] == pytest.approx(out["retrieval"])


BUNDLED = r"""
import json, pathlib, sys
import clip_benchmark  # the package's own folder; its datasets/__init__ would import torchvision
folder = pathlib.Path(clip_benchmark.__file__).parent / "datasets"
print(json.dumps({kind: json.loads((folder / f"en_{kind}.json").read_text())
                  for kind in ("classnames", "zeroshot_classification_templates")}))
"""


def test_our_definitions_use_clip_benchmarks_bundled_names_and_templates(tmp_path):
    from src.evaluation.clip_benchmark_protocol import CLIP_BENCHMARK_NAMES, read_clip_benchmark_dataset
    from src.evaluation.paper_datasets import find_paper_dataset
    from src.open_alip.zero_shot import load_metadata
    from tests import _eval_layouts as layouts

    bundled = json.loads(run_oracle(clip_benchmark_python(), BUNDLED).stdout)
    names, templates = bundled["classnames"], bundled["zeroshot_classification_templates"]
    for ours, theirs in CLIP_BENCHMARK_NAMES.items():  # the same templates, {c} written {}
        assert load_metadata(ours)[1] == [t.replace("{c}", "{}") for t in templates[theirs]], ours
    assert (
        load_metadata("flowers")[0] == names["flowers"]
        and load_metadata("imagenet")[0] == names["imagenet1k"]
    )
    layouts.write_caltech101(tmp_path, total=101)
    layouts.write_pets(tmp_path, every_breed=True)
    for ours, theirs in (("caltech101", "caltech101"), ("pets", "pets")):
        # its caltech101 list is what its builder uses; its pets list is what torchvision derives
        assert read_clip_benchmark_dataset(find_paper_dataset(ours), tmp_path)[0].classnames == names[theirs]


def test_wrapper_names_the_missing_part_in_one_line(clip_benchmark_run):
    out, stderr = clip_benchmark_run
    assert out["wrapper_rc"] == 2
    lines = [line for line in stderr.splitlines() if line.startswith("clip_benchmark_eval.py:")]
    assert lines == [
        "clip_benchmark_eval.py: error: cannot import CLIP_benchmark (No module named 'torchvision'); "
        "install it with `pip install clip-benchmark` (it is not a dependency of this toolkit)"
    ]
