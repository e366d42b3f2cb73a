"""The HTTP server: the playground's API (app.py), its request bodies (bodies.py),
the OpenAI-compatible routes (openai.py), and the static page (../static/)."""

from puffergpt.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
