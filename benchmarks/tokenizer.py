"""Captions per second of our CLIP tokenizer against open_clip's, on one core, same corpus.

The reference is open_clip's own tokenizer module, loaded by file path into this
process (it needs torch, ftfy and regex, which the project venv has; open_clip
itself is not installed here). By default its file comes from the test oracle venv
(benchmarks/oracles.py builds it on first use, about a minute); `--reference`
takes any open_clip/tokenizer.py.

Each round times (thread CPU time) a fresh instance of each tokenizer over the
whole corpus in batches, twice: the first pass starts with empty caches (ours and
the reference's BPE cache), the second shows the steady state of a long run. The
median round is reported. Outputs are compared before timing.

    .venv/bin/python -m benchmarks.tokenizer                 # synthetic captions, 15% non-ASCII
    .venv/bin/python -m benchmarks.tokenizer --texts caps.txt  # one caption per line
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sysconfig
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _pin_one_core() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _load_reference(path: Path | None):
    if path is None:
        from benchmarks.oracles import reference_python

        python = reference_python()
        purelib = sysconfig.get_paths(vars={"base": str(python.parent.parent), "platbase": str(python.parent.parent)})
        path = Path(purelib["purelib"]) / "open_clip" / "tokenizer.py"
    if not path.is_file():
        raise SystemExit(f"error: reference tokenizer {path} not found; pass --reference PATH/open_clip/tokenizer.py")
    spec = importlib.util.spec_from_file_location("reference_clip_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def _read_texts(path: Path, limit: int) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            texts = [line.rstrip("\n") for _, line in zip(range(limit), f)]
    except OSError as e:
        raise SystemExit(f"error: cannot read --texts {path}: {e.strerror}") from None
    if not texts:
        raise SystemExit(f"error: --texts {path} holds no lines; give a file with one caption per line")
    return texts


def _time_pass(tokenize, texts: list[str], batch: int) -> float:
    # CPU time of this thread: other jobs on a shared machine do not inflate it.
    start = time.thread_time()
    for i in range(0, len(texts), batch):
        tokenize(texts[i : i + batch])
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--texts", type=Path, help="file with one caption per line (default: synthetic captions)")
    parser.add_argument("-n", "--num", type=int, default=20000, help="number of captions (default 20000)")
    parser.add_argument("--intl-fraction", type=float, default=0.15,
                        help="share of non-ASCII synthetic captions (default 0.15)")
    parser.add_argument("--batch", type=int, default=256, help="captions per tokenize call (default 256)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; the median is reported (default 3)")
    parser.add_argument("--reference", type=Path, help="path of open_clip/tokenizer.py to compare against")
    args = parser.parse_args(argv)
    if args.num < 1 or args.batch < 1 or args.rounds < 1:
        raise SystemExit("error: --num, --batch and --rounds must be positive")
    if not 0.0 <= args.intl_fraction <= 1.0:
        raise SystemExit("error: --intl-fraction must be between 0 and 1")

    _pin_one_core()
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from benchmarks.corpora import caption_corpus
    from src.open_alip.tokenizer import SimpleTokenizer

    if args.texts:
        texts, source = _read_texts(args.texts, args.num), str(args.texts)
    else:
        texts = caption_corpus(args.num, seed=123, intl_fraction=args.intl_fraction)
        source = f"synthetic captions, {args.intl_fraction:.0%} non-ASCII"
    ref_module, ref_path = _load_reference(args.reference)
    print(f"corpus: {len(texts)} texts ({source}); batch {args.batch}; one core")
    print(f"reference: {ref_path}")

    if not np.array_equal(SimpleTokenizer().tokenize_np(texts), ref_module.tokenize(texts).numpy()):
        raise SystemExit("error: outputs differ from the reference on this corpus; timings would be meaningless")

    # "first pass": fresh instances, empty caches. "second pass": the same instances
    # again, caches warm, as in a long conversion run where words keep recurring.
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        ref_tok, ours = ref_module.SimpleTokenizer(), SimpleTokenizer()
        for phase in ("first pass", "second pass"):
            times.setdefault(("reference", phase), []).append(_time_pass(ref_tok, texts, args.batch))
            times.setdefault(("ours", phase), []).append(_time_pass(ours.tokenize_np, texts, args.batch))
    for phase in ("first pass", "second pass"):
        ref_rate = len(texts) / statistics.median(times[("reference", phase)])
        ours_rate = len(texts) / statistics.median(times[("ours", phase)])
        print(f"{phase}: reference (open_clip) {ref_rate:10,.0f} captions/s | "
              f"ours (tokenize_np) {ours_rate:10,.0f} captions/s | ratio {ours_rate / ref_rate:.1f}x")

if __name__ == "__main__":
    main()
