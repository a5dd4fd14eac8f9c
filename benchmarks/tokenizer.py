"""Captions per second of our CLIP tokenizer against open_clip's, on one core, same corpus.

The reference is open_clip's own tokenizer module, loaded by file path into this
process (it needs torch, ftfy and regex, which the project venv has; open_clip
itself is not installed here). By default its file comes from the test oracle venv
(benchmarks/oracles.py builds it on first use, about a minute); `--reference`
takes any open_clip/tokenizer.py.

Two synthetic corpora by default (benchmarks/corpora.py): clean captions (15%
non-ASCII) and hostile web captions (HTML entities, mojibake, CJK, emoji, control
characters, URLs); a third, `junk`, is glued hostile fragments and raw code points.
Each round times (thread CPU time) a fresh instance of each tokenizer over the
whole corpus in batches, twice: the first pass starts with empty caches (ours and
the reference's BPE cache), the second shows the steady state of a long run. The
median round is reported, per corpus. Outputs are compared before timing.

    .venv/bin/python -m benchmarks.tokenizer                        # clean and hostile corpora
    .venv/bin/python -m benchmarks.tokenizer --corpora hostile,junk -n 5000
    .venv/bin/python -m benchmarks.tokenizer --texts caps.txt         # one caption per line
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
        purelib = sysconfig.get_paths(
            vars={"base": str(python.parent.parent), "platbase": str(python.parent.parent)}
        )
        path = Path(purelib["purelib"]) / "open_clip" / "tokenizer.py"
    if not path.is_file():
        raise SystemExit(
            f"error: reference tokenizer {path} not found; pass --reference PATH/open_clip/tokenizer.py"
        )
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


CORPORA = {
    "clean": "synthetic captions, {intl:.0%} non-ASCII",
    "hostile": "web captions: HTML entities, mojibake, CJK, emoji, control characters, URLs",
    "junk": "glued hostile fragments, raw code points, ASCII noise",
}


def _corpus(name: str, n: int, intl_fraction: float) -> list[str]:
    from benchmarks.corpora import caption_corpus, junk_corpus, web_caption_corpus

    if name == "clean":
        return caption_corpus(n, seed=123, intl_fraction=intl_fraction)
    if name == "hostile":
        return web_caption_corpus(n, seed=123)
    return junk_corpus(n, seed=123)


def _parse_corpora(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted(set(names) - set(CORPORA))
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown corpus {', '.join(unknown) or value!r}; choose from {', '.join(CORPORA)}"
        )
    return list(dict.fromkeys(names))


def _compare(ref_module, texts: list[str], batch: int, rounds: int) -> dict[str, float]:
    """Median captions/s ratio (ours / reference) per pass, after checking the outputs agree."""
    import numpy as np

    from src.open_alip.tokenizer import SimpleTokenizer

    if not np.array_equal(SimpleTokenizer().tokenize_np(texts), ref_module.tokenize(texts).numpy()):
        raise SystemExit(
            "error: outputs differ from the reference on this corpus; timings would be meaningless"
        )
    # "first pass": fresh instances, empty caches. "second pass": the same instances
    # again, caches warm, as in a long conversion run where words keep recurring.
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        ref_tok, ours = ref_module.SimpleTokenizer(), SimpleTokenizer()
        for phase in ("first pass", "second pass"):
            times.setdefault(("reference", phase), []).append(_time_pass(ref_tok, texts, batch))
            times.setdefault(("ours", phase), []).append(_time_pass(ours.tokenize_np, texts, batch))
    ratios = {}
    for phase in ("first pass", "second pass"):
        ref_rate = len(texts) / statistics.median(times[("reference", phase)])
        ours_rate = len(texts) / statistics.median(times[("ours", phase)])
        ratios[phase] = ours_rate / ref_rate
        print(
            f"  {phase + ':':12} reference (open_clip) {ref_rate:9,.0f} captions/s | "
            f"ours (tokenize_np) {ours_rate:9,.0f} captions/s | ratio {ratios[phase]:.1f}x",
            flush=True,
        )
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--texts", type=Path, help="file with one caption per line, timed instead of the synthetic corpora"
    )
    parser.add_argument(
        "--corpora",
        type=_parse_corpora,
        default=["clean", "hostile"],
        help=f"comma-separated synthetic corpora out of {', '.join(CORPORA)} (default clean,hostile)",
    )
    parser.add_argument("-n", "--num", type=int, default=20000, help="captions per corpus (default 20000)")
    parser.add_argument(
        "--intl-fraction",
        type=float,
        default=0.15,
        help="share of non-ASCII captions in the clean corpus (default 0.15)",
    )
    parser.add_argument("--batch", type=int, default=256, help="captions per tokenize call (default 256)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds; the median is reported (default 3)"
    )
    parser.add_argument("--reference", type=Path, help="path of open_clip/tokenizer.py to compare against")
    args = parser.parse_args(argv)
    if args.num < 1 or args.batch < 1 or args.rounds < 1:
        raise SystemExit("error: --num, --batch and --rounds must be positive")
    if not 0.0 <= args.intl_fraction <= 1.0:
        raise SystemExit("error: --intl-fraction must be between 0 and 1")

    _pin_one_core()
    import torch

    torch.set_num_threads(1)
    if args.texts:
        corpora = [(args.texts.name, str(args.texts), _read_texts(args.texts, args.num))]
    else:
        corpora = [
            (name, CORPORA[name].format(intl=args.intl_fraction), _corpus(name, args.num, args.intl_fraction))
            for name in args.corpora
        ]
    ref_module, ref_path = _load_reference(args.reference)
    print(f"reference: {ref_path}")
    print(
        f"one core; batch {args.batch}; median of {args.rounds} rounds; "
        "first pass = empty caches on both sides, second pass = warm caches"
    )
    summary = []
    for name, description, texts in corpora:
        print(f"{name}: {len(texts)} texts ({description})", flush=True)
        ratios = _compare(ref_module, texts, args.batch, args.rounds)
        summary.append(f"{name} {ratios['first pass']:.1f}x / {ratios['second pass']:.1f}x")
    print(f"ratio ours/open_clip (first pass / second pass): {'; '.join(summary)}")


if __name__ == "__main__":
    main()
