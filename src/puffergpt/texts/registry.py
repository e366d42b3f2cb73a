"""The open texts of one engine (the server's): a bound on how many, expiry when idle, and
closing drops their keys. A text itself, and ``opened`` (a text of its own), are ``text.py``."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.texts import recompute
from puffergpt.texts.text import Text, TextError, TextNotFound, log


def not_found(text_id: str) -> str:
    return (f"no open text {text_id!r} on this server (closed, expired, never opened, or held by a server that "
            "went away): reopen it from its token ids")


class Texts:
    """The open texts of one engine: a bound on how many, and expiry when idle."""

    def __init__(self, open_run: Callable[[], Run], max_open: int = 32, idle_s: float = 1800):
        self.open_run = open_run
        self.max_open = max_open
        self.idle_s = idle_s
        self._texts: dict[str, Text | None] = {}
        self._lock = threading.Lock()

    def create(self, ids: list[int]) -> Text:
        text = self._open()
        self._fill(text, lambda: text.append(ids))
        return text

    def reopen(self, ids: list[int], length: int, generated: dict[int, Sampling]) -> tuple[Text, list]:
        """A text another server held, opened here from what the page kept (``recompute.restore``): its
        token ids, and each generated position's sampling (its temperature and controls).
        -> (the text, the requests reopening it cost)"""
        text = self._open()
        return text, self._fill(text, lambda: recompute.restore(text, ids, length, generated))

    def _open(self) -> Text:
        """A new, empty text, counted among the open ones (at most ``max_open``)."""
        self.expire()
        with self._lock:
            if len(self._texts) >= self.max_open:
                raise TextError(f"{self.max_open} texts are open already: close one first")
            self._texts[placeholder := f"opening-{uuid.uuid4().hex}"] = None  # holds the place while it opens
        try:
            text = Text(self.open_run())  # store I/O: outside the registry's lock
        finally:
            with self._lock:
                self._texts.pop(placeholder, None)
        with self._lock:
            self._texts[text.id] = text
        return text

    def _fill(self, text: Text, fill: Callable[[], object]):
        """fill()'s value; on any failure the half-made text is closed (its keys dropped) first."""
        try:
            return fill()
        except BaseException:
            try:
                self.close(text.id)
            except Exception as e:
                log.warning("could not close text %s that failed to open: %s", text.id, e)
            raise

    def get(self, text_id: str) -> Text:
        """The open text, used now; TextNotFound if this server holds none by that id, or if its
        keys were unused past their TTL (then it is closed, and gone on every server alike)."""
        with self._lock:
            text = self._texts.get(text_id) if not text_id.startswith("opening-") else None
        if text is None:
            raise TextNotFound(not_found(text_id))
        if not text.used():
            try:
                self.close(text_id)
            except KeyError:
                pass  # closed meanwhile
            raise TextNotFound(f"text {text_id!r} expired (its keys were unused past their TTL, or their lease could "
                               "not be renewed) and is closed: reopen it from its token ids")
        return text

    def close(self, text_id: str) -> None:
        with self._lock:
            text = self._texts.get(text_id)
        if text is None:
            raise TextNotFound(not_found(text_id))
        with text.lock:
            text.close()  # if dropping its namespace fails, the text stays listed, to close again
        with self._lock:
            self._texts.pop(text_id, None)

    def expire(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [i for i, t in self._texts.items()
                   if t is not None and not t.generating and now - t.last_used > self.idle_s]
        closed = []
        for i in old:
            try:
                self.close(i)
                closed.append(i)
            except Exception as e:  # one text that can't close must not keep the others open
                log.warning("could not close idle text %s: %s", i, e)
        return closed

    def __len__(self) -> int:
        return len(self._texts)

    def close_all(self) -> None:
        for i in [i for i, t in list(self._texts.items()) if t is not None]:
            try:
                self.close(i)
            except Exception as e:
                log.warning("could not close text %s: %s", i, e)
