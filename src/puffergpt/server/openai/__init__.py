"""The OpenAI-compatible feature, one folder as vLLM keeps it:

- ``routes.py``: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``;
- ``protocol.py``: their request bodies in OpenAI's names, the chat template, OpenAI's error shape;
- ``render.py``: the answers, whole or streamed; ``tokenize.py``: ``/tokenize`` and ``/detokenize``.
"""
