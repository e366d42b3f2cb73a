"""GPT-2 as math, knowing no store: the bottom layer.

- ``reference.py``: the one forward pass (layer norm, GELU, softmax, attention mixing) over the
  seam ``Weights`` (what supplies the weights' products, nothing else), and ``NumpyWeights``, numpy's;
- ``session.py``: the seam beside it, ``Session`` (what a text's run needs of what runs it:
  requests recorded, a turn, its namespace of keys), ``Local`` (numpy's), and ``Run``, the two together;
- ``checkpoints.py``, ``hub.py``, ``errors.py``: a checkpoint found, downloaded (pinned,
  verified), made (the presets) and read; ``info.py``: the model described for a newcomer;
- ``tokenizer.py``, ``sampling.py``: text to ids and back; picking the next token;
- ``untrained.py``, ``token_counts.py``: which token vectors training never (or barely) moved.

May import: numpy, safetensors, the tokenizer's libraries, and nothing else of puffergpt.
"""
