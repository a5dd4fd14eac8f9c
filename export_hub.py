"""Turn trained weights into a folder ready for a Hugging Face hub model repo.

    python export_hub.py OUTPUT/checkpoints/epoch_032.pt --output rwkv-clip-b32-mine \
        --results zero_shot.json --results retrieval.json
    python -m src.hub_server --root rwkv-clip-b32-mine --repo-id me/rwkv-clip --repo-type model
    # then: create_model_and_transforms("hf-hub:me/rwkv-clip"), get_tokenizer("hf-hub:me/rwkv-clip")

The folder holds open_clip_config.json (the architecture), model.safetensors and a model card
(README.md) listing the training settings the checkpoint records and the evaluation results
given; docs/model.md ("Publishing weights") has the details.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="export_hub.py", description=__doc__.split("\n\n")[0])
    p.add_argument("weights", help="train.py checkpoint, .pt state dict, .safetensors or hf-hub:ORG/REPO[/FILE]")
    p.add_argument("--output", type=Path, required=True, help="folder to create (must not exist)")
    p.add_argument("--config", default=None,
                   help="model config name or JSON; default: the one a train.py checkpoint records")
    p.add_argument("--results", type=Path, action="append", default=[],
                   help="an evaluation's JSON output (zero_shot.py / retrieval.py), listed in the card; repeatable")
    p.add_argument("--title", default=None, help="the card's title (default: the folder's name)")
    return p


def _results(paths: list[Path]) -> dict:
    from src.errors import UserError

    found = {}
    for path in paths:
        try:
            found[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"--results {path}: cannot read it as JSON ({type(exc).__name__}); pass an evaluation's "
                            "JSON output") from None
    return found


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from src.errors import UserError, report
    from src.open_alip.errors import OpenAlipError
    from src.open_alip.hub_export import export_for_hub

    try:
        out = export_for_hub(args.weights, args.output, config=args.config, results=_results(args.results),
                             title=args.title)
    except OpenAlipError as exc:
        return report("export_hub.py", UserError(str(exc)))
    except UserError as exc:
        return report("export_hub.py", exc)
    print(f"[export_hub] {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
