"""The end-to-end demo: a synthetic image-caption corpus and the script that runs every stage on it."""
