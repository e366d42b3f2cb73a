"""What stands before every route: who may call (``auth.py``), from which site
(``cross_site.py``), under which Host name (``hosts.py``), with how large a body (``body_limit.py``)."""
