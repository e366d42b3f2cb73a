"""The playground's HTTP feature: the page and its API.

- ``static.py``: the page, ``/how``, their scripts, and the API's docs from local assets;
- ``texts.py``: open, edit, generate (server-sent events), stop, close, look inside, switch parts off;
- ``views.py``: the embedding and output-search views; ``model.py``: ``/api/info`` and Compare;
- ``notebook.py``: save, list, read and replay insights;
- ``responses.py``: the OpenAPI models of the JSON the page reads (its shapes are
  ``app/protocol.py``'s, rendered here, computed nowhere here).
"""
