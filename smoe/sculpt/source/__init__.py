"""The sculptor's inputs: checkpoint folders, their model cards, HuggingFace model ids,
importance matrices."""

__all__ = ["card", "checkpoint", "hub", "imatrix"]  # submodules, imported on use
