"""The RWKV-CLIP training application: settings, distributed setup, batch split, schedules,
the train loop, checkpoints, logging and the launcher's checks. `train.py` is a thin CLI
over `main.run`; docs/architecture.md lists the modules.

Kept apart from `src.open_alip` (the library) so that importing the model or the
tokenizer does not drag in the trainer.
"""
