"""Numbers fixed by CLIP's tokenizer and image normalisation, shared by the whole toolkit."""

CONTEXT_LENGTH = 77  # tokens per caption (the model config's `ctx_len`)
SOT_TOKEN = 49406  # <start_of_text>
EOT_TOKEN = 49407  # <end_of_text>
VOCAB_SIZE = 49408

# Per-channel RGB mean and std of CLIP's training images, for pixels in [0, 1].
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# The training crop (random resized crop): area share and aspect ranges, and tries before the
# centred fallback (the original's DALI num_attempts).
TRAIN_AREA = (0.7, 1.0)
TRAIN_ASPECT = (0.8, 1.25)
TRAIN_CROP_ATTEMPTS = 100
