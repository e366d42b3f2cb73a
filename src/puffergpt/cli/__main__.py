"""``python -m puffergpt.cli``: the ``puffergpt`` command."""

from puffergpt.cli import main

main()
