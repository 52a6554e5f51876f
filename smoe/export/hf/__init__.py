"""A vault and its scout back into a HuggingFace checkpoint folder (``smoe export --hf``).

* :mod:`smoe.export.hf.names`: which checkpoint tensor each vault tensor becomes (the names and
  layout the source had, from the manifest, or the family's standard names);
* :mod:`smoe.export.hf.transformers_config`: the ``config.json`` written (a copy, or rebuilt from
  the arch block and the scout's shapes, naming what it had to assume);
* :mod:`smoe.export.hf.checkpoint`: the streamed, atomic writer of the folder (shards, index,
  config);
* :mod:`smoe.export.hf.folder`: the folder's marker ``smoe-export.json``, and what ``--force``
  may delete of an earlier export (only what its marker lists, never a source checkpoint).
"""

__all__ = ["checkpoint", "folder", "names", "transformers_config"]
