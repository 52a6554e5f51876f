"""A vault back out: float32 safetensors (:mod:`.float32`) or a transformers folder (:mod:`.hf`)."""

__all__ = ["float32", "hf"]  # submodules, imported on use
