"""The searches: GPT-2's weights as documents in a store, every product one exact search.

- ``documents.py``: a row w with bias b as d = (w, b, pad), the query q = (x, 1, 0), and the
  product read back from the distance (y = (M² + |q|² − distance) / 2);
- ``engine.py``: the ``Engine`` over one loaded model, which opens a text's run (``model.session.Run``):
  ``weights.py``, the products it supplies to the forward pass, each a search; ``session.py``, the
  text's session: its requests (counted and priced, ``costs.py``), its turn, its namespace of keys;
- ``scheduler.py``: many texts' searches batched into one request per matrix;
- ``sweeper.py``: the key namespaces of texts no server holds any more, dropped, and those it holds kept;
- ``pace.py``: how long a token read, scored or generated takes on this engine, measured as texts run;
- ``load.py``: a checkpoint written into a store (and the approximate index over its token vectors);
- ``verify.py``: every stored document read back against the manifest;
- ``manifest.py``: the manifest that vouches for a load, read and checked, and the engine opened over it.

May import: ``puffergpt.model``, ``puffergpt.stores`` and ``puffergpt.settings`` (its defaults).
"""
