"""The learner's views over a text, each made of the searches that produced it:

- ``inspector.py``: a step looked inside (attention per head, the logit lens, what each part
  adds: ``inside.py``, ``attribution.py``), and a part switched off (ablation);
- ``views.py``: the embedding space (neighbours, analogies, a map, a token's path);
- ``contexts.py``: one word in two or three prompts, layer by layer;
- ``output_search.py``: the next token from the approximate index beside the exact search;
- ``patching.py``: activation patching, a clean run's activation copied into a corrupted run;
- ``lessons.py``: lessons as data (``puffergpt/lessons/*.yaml``), each step a claim computed by a
  check (``lab.py``: what the checks share and their registry; ``lesson_checks.py``: the checks).

May import: ``puffergpt.model``, ``puffergpt.texts``, and the store seam's errors.
"""
