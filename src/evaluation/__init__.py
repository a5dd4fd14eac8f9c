"""Zero-shot evaluation: dataset readers, the evaluation run, result files and the CLI glue.

Built on the model library (`src.open_alip`: model, tokenizer, zero-shot maths). The CLIs
zero_shot.py and retrieval.py and train.py's epoch-end hook use it.
"""
