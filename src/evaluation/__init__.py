"""Zero-shot evaluation: dataset readers, which reader reads an item (specs.py), the one model
loader of the inference CLIs (model_loader.py), image listing and the skipping loader (images.py),
embeddings, the evaluation run, result files and the CLI glue.

Built on the model library (`src.open_alip`: model, tokenizer, zero-shot maths). The CLIs
zero_shot.py, retrieval.py, embed.py, clip_benchmark_eval.py and train.py's epoch-end hook use it.
"""
