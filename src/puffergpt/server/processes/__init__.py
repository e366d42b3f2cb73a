"""Serving on every core and behind a balancer: ``workers.py`` (N worker processes),
``front.py`` (one address that passes each request to the worker holding its text) and
``probes.py`` (``/health``, ``/ready``, ``/metrics``)."""
