"""The HTTP server over one loaded model, grouped by feature:

- ``app.py``: ``create_app`` builds what the routes share (``state.py``) and includes each feature;
- ``playground/``: the page and its API; ``openai/``: the OpenAI-compatible API;
- ``guards/``: who may call, from where, how much; ``processes/``: workers, front, probes;
- ``bodies.py``: one JSON parser and the playground's bounded bodies; ``errors.py``: one error
  shape; ``streaming.py``: generations in threads of their own; ``openapi_doc.py``: /openapi.json.

May import: the application layer and below, ``puffergpt.notebook``. Never ``puffergpt.mcp``.
"""

from puffergpt.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
