"""The application layer every edge calls (the CLI, the server, MCP, the bench):

- ``completion.py``: the one path that reads a prompt and writes tokens (``/v1``, ``generate``,
  Compare, the notebook's replay, the bench), and a choice as a client may see it.

May import: ``puffergpt.model``, ``puffergpt.texts``, ``puffergpt.lens``. Never an edge.
"""
