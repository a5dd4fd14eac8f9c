"""The RWKV-CLIP training application: parameters, distributed setup, schedule,
the train loop, checkpoints and logging. `train.py` is a thin CLI over `main.run`.

Kept apart from `src.open_alip` (the library) so that importing the model or the
tokenizer does not drag in the trainer.
"""
