"""The playground API's main responses, as pydantic models: the OpenAPI schema (/docs)
names their fields. Each allows extra keys, and declares only keys every response has
(a key present only sometimes, such as an inspection's ``attribution``, stays an extra):
the JSON the page reads (``static/*.js``) is exactly what the routes render
(``render.py``, ``views.py``, ``completion.py``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class Info(Response):
    """The model served, what it holds in the store and costs, and the server's limits."""

    model: str
    backend: str
    metric: str
    config: dict[str, Any]
    documents: int
    namespaces: dict[str, Any]
    megabytes: float
    requests_per_token: int
    round_trips_per_token: int
    storage_usd_per_month: float
    rates: dict[str, Any]
    max_new_tokens: int
    max_open_texts: int
    about: dict[str, Any]
    starters: list[dict[str, Any]]
    embedding_words: dict[str, Any]
    context_starters: list[dict[str, Any]]
    fallback: str | None


class Status(Response):
    """How busy the server is (``/api/status``): texts generating (``running``, at most
    ``max_running``) and waiting their turn (``queued``), texts open, and the texts' searches
    (``asks``), the store requests made for them and those shared by several texts (``merged``)."""

    running: int
    queued: int
    max_running: int
    open_texts: int
    max_open_texts: int
    searches: dict[str, int]
    workers: int = 1  # server processes answering (serve --workers): their figures added up


class TextView(Response):
    """A text: its tokens (``length`` of them; ``known`` counts those kept after a step
    back), how far the model has read, and each generated position's step."""

    id: str
    length: int
    known: int
    read_upto: int
    tokens: list[dict[str, Any]]
    steps: dict[str, dict[str, Any]]


class Closed(Response):
    closed: str


class Stopping(Response):
    stopping: str


class Inspection(Response):
    """The view from the token at ``query_position``: attention (L, H, position) and the
    logit lens; with the attribution and the neurons when asked (extra keys)."""

    position: int
    query_position: int
    predicts_token: dict[str, Any] | None
    tokens: list[dict[str, Any]]
    attention: list
    scores: list
    lens: list[dict[str, Any]]
    lens_k: int
    decided_layer: int
    final_top1: dict[str, Any]
    requests: list[dict[str, Any]]
    recomputed: bool


class KV(Response):
    """A text's key namespace: which positions hold keys, and which read wrote them."""

    namespace: str | None
    layers: int
    heads: int
    length: int
    read_upto: int
    known: int
    documents: int | None
    per_layer: list[int] | None
    positions: list[dict[str, Any]]
    writes: list[dict[str, Any]]
    requests: list[dict[str, Any]]


class Analogy(Response):
    """"a is to b as c is to ?": the inputs, the answers, and what rows never trained did
    (``untrained_*`` None: not recorded in the store)."""

    tokens: dict[str, dict[str, Any]]
    results: list[dict[str, Any]]
    untrained_inputs: list[str] | None
    untrained_skipped: int | None
    note: str | None
    requests: list[dict[str, Any]]


class Neighbours(Response):
    token: dict[str, Any]
    results: list[dict[str, Any]]
    untrained_inputs: list[str] | None
    untrained_skipped: int | None
    note: str | None
    requests: list[dict[str, Any]]


class Map(Response):
    points: list[dict[str, Any]]
    explained: list[float]
    path: list[dict[str, Any]]
    degenerate: bool
    note: str | None
    requests: list[dict[str, Any]]


class Contexts(Response):
    """One word in 2 or 3 prompts, layer by layer (``contexts.py``): ``layers`` [{layer, cosine,
    lens, top}], each context's tokens and ``attention`` from the word (L x H x its position + 1)."""

    word_id: int
    word: dict[str, Any]
    positions: list[int]
    layers: list[dict[str, Any]]
    contexts: list[dict[str, Any]]
    attention: list[list[list[list[float]]]]
    k: int
    requests: list[dict[str, Any]]


class OutputSearch(Response):
    """The next token's search, exact and approximate, side by side (``output_search.at``): each
    one's tokens, logits, ms and rows scored (None: the store does not say), what the index missed
    (with its exact rank), recall@k; ``available`` False with ``why`` where there is no index."""

    available: bool
    position: int
    k: int
    why: str | None = None
    exact: dict[str, Any] | None = None
    approximate: dict[str, Any] | None = None
    missed: list[dict[str, Any]] | None = None
    recall: float | None = None
    same_greedy: bool | None = None
    index: dict[str, Any] | None = None
    requests: list[dict[str, Any]] = []


class Compare(Response):
    """The engine's top-k beside the reference's logits, and the largest difference."""

    prompt_tokens: int
    rows: list[dict[str, Any]]
    same_ids: bool
    max_abs_diff: float | None
    search: dict[str, Any]
    reference: dict[str, Any]
