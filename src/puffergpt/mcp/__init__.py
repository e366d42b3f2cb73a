"""``puffergpt mcp``: the Model Context Protocol server an assistant drives.

- ``server.py``: the tools (generate, look inside, save and list insights), on a model of its
  own or on a running ``serve``;
- ``stdio.py``: the wire (one JSON-RPC message a line), hardened against malformed input.

May import: the application layer and below, and ``puffergpt.notebook``. Never ``puffergpt.server``.
"""
