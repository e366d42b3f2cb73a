"""The error every way of getting a checkpoint raises (a bad name, a missing file, a failed
download), below both ``checkpoints.py`` and ``hub.py`` so that neither imports the other's caller."""


class CheckpointError(Exception):
    """A checkpoint that can't be found, fetched or read; the message says what to do."""
