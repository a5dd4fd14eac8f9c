"""Turn trained weights into a folder ready for a Hugging Face hub model repo.

    python export_hub.py OUTPUT/checkpoints/epoch_032.pt --output rwkv-clip-b32-mine \
        --results zero_shot.json --results retrieval.json
    python -m src.open_alip.hub_server --root rwkv-clip-b32-mine --repo-id me/rwkv-clip --repo-type model
    # then: create_model_and_transforms("hf-hub:me/rwkv-clip"), get_tokenizer("hf-hub:me/rwkv-clip")

The command is the library's (src/open_alip/export_cli.py), installed as `rwkv-clip-export`;
docs/model.md ("Publishing weights") has the details.
"""

from __future__ import annotations

import sys

from src.open_alip.export_cli import main

if __name__ == "__main__":
    sys.exit(main(prog="export_hub.py"))
