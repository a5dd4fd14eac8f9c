"""`rwkv-clip-export` (installed) and `export_hub.py` (the repository): trained weights -> a folder
ready for a hub model repo (hub_export.py does the work).

Torch is imported only once the arguments parse, so that `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .errors import OpenAlipError

SCRIPT = "rwkv-clip-export"
USAGE_EXAMPLE = """\
example:
  {prog} OUTPUT/checkpoints/epoch_032.pt --output rwkv-clip-b32-mine \\
      --results zero_shot.json --results retrieval.json
  rwkv-clip-hub-server --root rwkv-clip-b32-mine --repo-id me/rwkv-clip --repo-type model
  # then: create_model_and_transforms("hf-hub:me/rwkv-clip"), get_tokenizer("hf-hub:me/rwkv-clip")
The folder holds open_clip_config.json (the architecture), model.safetensors and a model card
(README.md) listing the training settings the checkpoint records and the evaluation results given.
"""


def build_parser(prog: str = SCRIPT) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Turn trained weights into a folder ready for a Hugging Face hub model repo.",
        epilog=USAGE_EXAMPLE.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "weights", help="train.py checkpoint, .pt state dict, .safetensors or hf-hub:ORG/REPO[/FILE]"
    )
    p.add_argument("--output", type=Path, required=True, help="folder to create (must not exist)")
    p.add_argument(
        "--config",
        default=None,
        help="model config name or JSON (default: the one a train.py checkpoint records)",
    )
    p.add_argument(
        "--results",
        type=Path,
        action="append",
        default=[],
        help="an evaluation's JSON output (zero_shot.py / retrieval.py), listed in the card; repeatable",
    )
    p.add_argument("--title", default=None, help="the card's title (default: the folder's name)")
    return p


def _read_results(paths: list[Path]) -> dict[str, Any]:
    found = {}
    for path in paths:
        try:
            found[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OpenAlipError(
                f"--results {path}: cannot read it as JSON ({type(exc).__name__}); pass an "
                "evaluation's JSON output"
            ) from None
    return found


def main(argv: list[str] | None = None, prog: str = SCRIPT) -> int:
    """Export as the command line says; a problem the user can fix is one `PROG: error:` line, exit 2."""
    args = build_parser(prog).parse_args(argv)
    from .hub_export import export_for_hub

    try:
        out = export_for_hub(
            args.weights,
            args.output,
            config=args.config,
            results=_read_results(args.results),
            title=args.title,
        )
    except OpenAlipError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"[{prog.removesuffix('.py')}] {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0
