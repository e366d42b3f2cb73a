"""What a text's run needs besides the weights' products: the session it runs in.

A forward pass asks ``reference.Weights`` for products and for nothing else. Around it, a text
needs more of whatever runs it: the requests a block of work made (the views show them), a
turn among the texts generating on one engine, and its namespace of keys (counted, kept from
other servers' sweeps, dropped at the end). That is the ``Session``. The engine's
(``search/session.py``) does all of it; a numpy run's is ``Local``, which makes no request,
takes no turn and keeps nothing in a store.

Opening a text gives a ``Run``: its weights and its session, side by side. A text's weights are
its own, since ``attention_scores`` stores the text's keys (numpy's in memory, the engine's in
the session's namespace): a Run is opened for one text and closed with it (``session.close``).

Both seams live here, at the bottom, because each side of them imports only ``model/``: a text
(``texts/``) on one side, the engine (``search/``) on the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from puffergpt.model.reference import Weights


class KeysExpired(KeyError):
    """The text's keys are past their lease (``search/sweeper.py``): any server may have dropped
    them, so the text is gone and must be reopened from its token ids. A 404 ``text_not_found``
    on the playground's paths, as a text this server does not hold; never "the store failed"."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Session(Protocol):
    """What a text's run needs of what runs it, beside the weights' products."""

    keys_ns: str | None  # the namespace of this text's keys; None: none (numpy, the embedding views)

    def recording(self, extra: bool = False) -> AbstractContextManager[list]:
        """The requests the weights made inside the block, in order, in the list it yields (filled
        as the block ends); ``extra``: marked as asked by a learning view, not needed for the
        token. Blocks nest: an inner block's requests are the outer's too."""

    def slot(self, should_stop: Callable[[], bool] | None = None) -> AbstractContextManager[bool]:
        """A generation's turn among texts (``scheduler.Scheduler``): yields False if
        ``should_stop`` said so while it waited."""

    def stepping(self) -> AbstractContextManager[None]:
        """A step computed inside the block, in lockstep with other texts' (``scheduler.Batcher``)."""

    def wrote_token(self) -> None:
        """A generation wrote a token: counted where the server reports it (``/metrics``)."""

    def key_counts(self) -> list[int] | None:
        """Keys stored per layer (the KV cache view); None where there is no store to count."""

    def touch(self) -> bool:
        """The text is in use: its keys kept from other servers' sweeps (``sweeper.py``). False
        when they may be gone already (unused past their TTL): the text must be reopened. While
        the text waits for a ``slot`` or works inside ``recording``, its keys are kept without a
        touch, however long that lasts; a block that finds them gone raises ``KeysExpired``."""

    def close(self) -> None:
        """Let go of what the run holds (a text's namespace of keys)."""


class Local:
    """A numpy run's session: no requests to record, no turn to take, no store to keep keys in."""

    keys_ns = None

    @contextmanager
    def recording(self, extra: bool = False) -> Iterator[list]:
        yield []

    def slot(self, should_stop: Callable[[], bool] | None = None) -> AbstractContextManager[bool]:
        return nullcontext(True)

    def stepping(self) -> AbstractContextManager[None]:
        return nullcontext()

    def wrote_token(self) -> None:
        pass

    def key_counts(self) -> None:
        return None

    def touch(self) -> bool:
        return True

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Run:
    """One text's run: the weights its forward passes ask, and the session they run in
    (``Local`` unless said: ``Run(NumpyWeights(ckpt))`` is a numpy run)."""

    weights: Weights
    session: Session = field(default_factory=Local)
