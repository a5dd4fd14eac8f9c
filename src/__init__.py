"""RWKV-CLIP toolkit library. The top-level scripts are thin shells over this package."""
