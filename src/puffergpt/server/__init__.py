"""The HTTP server over one loaded model, grouped by feature:

- ``app.py``: ``create_app`` builds what the routes share (``state.py``) and includes each feature;
- ``playground/``: the page and its API; ``openai/``: the OpenAI-compatible API;
- ``guards/``: who may call, from where, how much; ``processes/``: workers, front, probes;
- ``bodies.py``: one JSON parser and the playground's bounded bodies; ``errors.py``: one error
  shape; ``streaming.py``: generations in threads of their own; ``openapi_doc.py``: /openapi.json.

The JSON of a step, a text, an inspection and a view, and the bounds of a request, are
``app/protocol.py``'s (MCP and the CLI render the same); nothing here computes the model's numbers.

May import: the application layer and below, ``puffergpt.notebook``. Never ``puffergpt.mcp``.
"""

from puffergpt.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
