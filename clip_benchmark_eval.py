"""Run CLIP_benchmark's evaluation on RWKV-CLIP (needs `pip install clip-benchmark`, not a dependency).

    python clip_benchmark_eval.py eval --model RWKV_CLIP_B32 --pretrained hf-hub:ORG/REPO \
        --dataset cifar10 --dataset_root data/cifar10 --output result.json

Every argument is CLIP_benchmark's own (`clip_benchmark eval --help`); this wrapper registers
`--model_type rwkv_clip` (the default here), makes `--model` default to RWKV_CLIP_B32 and requires
`--pretrained`: a .pt/.safetensors file or hf-hub:ORG/REPO[/FILE].

Precision: fp32 (the wrapper passes CLIP_benchmark's `--no_amp`), as zero_shot.py evaluates;
`--amp` runs CLIP_benchmark's default instead, torch.autocast (bfloat16 on CPU, float16 on CUDA),
whose numbers differ. The run says which it used. CLIP_benchmark 1.6.2's top-k accuracy fails
under numpy 2; the wrapper replaces that one function in this process (src/evaluation/clip_bench.py).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from src.errors import UserError, report
    from src.evaluation.clip_bench import run_clip_benchmark

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):  # CLIP_benchmark's own options: `eval --help`
        print(__doc__.strip())
        return 0 if args else 2
    try:
        return run_clip_benchmark(args)
    except UserError as exc:
        return report("clip_benchmark_eval.py", exc)


if __name__ == "__main__":
    sys.exit(main())
