"""``puffergpt bench``: speed measured side by side, never in a test.

- ``engines.py``: numpy, ``transformers`` and each backend decoding the same prompt;
- ``clients.py``: N simulated learners against one server, together and one after another.

May import: the application layer and below. Never ``puffergpt.server`` (it talks to one over HTTP).
"""
