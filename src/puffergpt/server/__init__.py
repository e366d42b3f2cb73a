"""The HTTP server: a router per resource over the application layer (``app.py`` says
which), its request bodies (``bodies.py``, ``openai_bodies.py``), and the static page
(../static/)."""

from puffergpt.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
