"""puffergpt: GPT-2 small as nothing but vector searches."""

__version__ = "0.1.0"
