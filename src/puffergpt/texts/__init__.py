"""Texts: what a learner works on, read through any ``Run`` (numpy's or the searches').

- ``text.py``: a ``Text`` (type, generate, step back, branch, cut: only unread tokens cost),
  its ``Step`` s, and ``opened`` (a text of its own, closed on any exit);
- ``probabilities.py``: a step's candidates' probabilities over the whole vocabulary (one search more);
- ``recompute.py``: candidates computed again where the text did not generate them (a text reopened from
  another server's, an insight replayed), after the controls each was generated with;
- ``registry.py``: ``Texts``, the open texts of one engine (a bound, expiry when idle).

May import: ``puffergpt.model``. Never a store: a text reaches the searches only through the
seam, so the same text runs on numpy and on every backend.
"""
