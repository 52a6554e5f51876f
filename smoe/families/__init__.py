"""What smoe knows of model families: ``config.json`` spellings -> arch facts.

Shared by the sculptor (reading a checkpoint) and export (writing one back), so that
neither imports the other.
"""

__all__ = ["config"]  # submodules, imported on use
