"""The application layer every edge calls (the CLI, the server, MCP, the bench):

- ``completion.py``: the one path that reads a prompt and writes tokens (``/v1``, ``generate``,
  Compare, the notebook's replay, the bench), and a choice as a client may see it;
- ``protocol.py``: what the edges share: the limits of a request and the JSON of a step, a
  text, an inspection, an ablation and a view (the server, MCP and the CLI render it).

May import: ``puffergpt.model``, ``puffergpt.texts``, ``puffergpt.lens``, ``puffergpt.settings`` (a default).
Never an edge.
"""
