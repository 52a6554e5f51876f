"""The sculptor's inputs: checkpoint folders, HuggingFace model ids, importance matrices."""

__all__ = ["checkpoint", "hub", "imatrix"]  # submodules, imported on use
