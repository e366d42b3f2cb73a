"""The playground API's main responses, as pydantic models: the OpenAPI schema (/docs)
names their fields. Each allows extra keys, and declares only keys every response has
(a key present only sometimes, such as an inspection's ``attribution``, stays an extra):
the JSON the page reads (``static/*.js``) is exactly what the routes render
(``app/protocol.py``, ``completion.py``). ``errors`` declares the error answers a
route really sends, each in the one error shape (``ErrorBody``, ``errors.py``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from puffergpt.server.openai.protocol import ErrorBody

WHY = {  # what each error status means on /api (a route may say it more exactly)
    400: "a value the route refuses (the message names it and what to do), or a body that is not JSON",
    401: "a write without the server's API key (serve --api-key): send Authorization: Bearer KEY",
    403: "sent by a page on an origin not allowed (serve --cors-origin; the notebook takes only its own page)",
    404: "no open text with this id on this server (code text_not_found: open it again)",
    409: "the text is generating: stop it or wait for its end",
    413: "a body over the server's bound",
    415: "a body that is not Content-Type: application/json",
    422: "a field of the wrong type or out of its bounds (param names it)",
    501: "this server has no reference checkpoint",
    503: "the store (or the notebook's disk or git) failed: the message says why; try again",
}
BODY = (400, 403, 413, 415, 422)  # a route with a JSON body: the body's checks, before the route runs


def errors(*codes: int, why: dict[int, str] | None = None) -> dict:
    """The ``responses`` of a route for these error statuses, each an ``ErrorBody``;
    ``why`` says one more exactly than ``WHY``."""
    said = WHY | (why or {})
    return {c: {"model": ErrorBody, "description": said[c]} for c in sorted(set(codes))}


def event_stream(what: str) -> dict:
    """A 200 that is server-sent events (``text/event-stream``), ``what`` saying which."""
    return {"description": what, "content": {"text/event-stream": {"schema": {"type": "string", "description": what}}}}


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
    auth: dict[str, bool]  # api_key: writes and /v1 need one (the page asks); public_read_only: no notebook writes


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


class Ablated(Response):
    """A step run again with parts of the model switched off at every position: the candidates
    before and after (best first), the top choice in each and whether it ``changed``, the rank of
    the token at the position in each (None: not among them, or no token there yet), and the
    requests the rerun cost (marked extra)."""

    position: int
    parts: list[str]
    mode: str
    chosen: dict[str, Any] | None
    before: list[dict[str, Any]]
    after: list[dict[str, Any]]
    top1_before: dict[str, Any]
    top1_after: dict[str, Any]
    changed: bool
    chosen_rank_before: int | None
    chosen_rank_after: int | None
    requests: list[dict[str, Any]]


class Probabilities(Response):
    """A step's candidates with their probabilities over the whole vocabulary (``p_all`` at T = 1, ``p_all_t``
    at the step's T) beside the sampler's (``prob``, over these candidates), the normaliser n_T at each
    temperature of the page's slider ([T, n_T]: p = exp((logit - n_T) / T)), the candidates' share of all the
    mass at T = 1 (``mass``), and the search it cost (none when the step had it: marked extra)."""

    position: int
    temperature: float
    candidates: list[dict[str, Any]]
    normalisers: list[list[float]]
    mass: float
    n_vocab: int
    requests: list[dict[str, Any]]


class Writes(Response):
    """What head ``layer``.``head`` writes at ``position`` (the query), a source position a piece: its attention
    ``weight``, its ``effect`` on the logit of ``token`` (read as the attribution reads a part) and the ``top``
    tokens it pushes; the effects sum to ``total``, the head's part in the attribution."""

    token_id: int
    token: dict[str, Any]
    position: int
    layer: int
    head: int
    sources: list[dict[str, Any]]
    total: float
    requests: list[dict[str, Any]]


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


class Rarity(Response):
    """Rows seen rarely in training (``views._rarity``): each result's ``count`` and ``rare``,
    the rare input words, and a note; ``counts_known`` false (and the counts None) for a model
    whose token counts are unknown."""

    rare_below: int
    counts_known: bool
    rare_inputs: list[str] | None
    rare_results: int | None
    rare_note: str | None


class Analogy(Rarity):
    """"a is to b as c is to ?": the inputs, the answers, and what rows never trained did
    (``untrained_*`` None: not recorded in the store)."""

    tokens: dict[str, dict[str, Any]]
    results: list[dict[str, Any]]
    untrained_inputs: list[str] | None
    untrained_skipped: int | None
    note: str | None
    requests: list[dict[str, Any]]


class CardAnalogies(Response):
    """How many of the demo card's analogies the model gets right (``views.card_analogies``)."""

    right: int
    tried: int
    listed: int
    results: list[dict[str, Any]]
    requests: list[dict[str, Any]]


class Neighbours(Rarity):
    token: dict[str, Any]
    results: list[dict[str, Any]]
    untrained_inputs: list[str] | None
    untrained_skipped: int | None
    note: str | None
    requests: list[dict[str, Any]]


class Map(Response):
    """``axis_frequency``: Pearson's r of the first axis with log(1 + count), None when the
    counts are unknown (``axis_note`` says so)."""

    points: list[dict[str, Any]]
    explained: list[float]
    path: list[dict[str, Any]]
    degenerate: bool
    note: str | None
    axis_frequency: dict[str, Any] | None
    axis_note: str | None
    requests: list[dict[str, Any]]


class Contexts(Response):
    """One word in 2 or 3 prompts, layer by layer (``contexts.py``): ``layers`` [{layer, cosine,
    lens, top (each token's training count and rare mark), control (with a control)}], each
    context's tokens and ``attention`` from the word (L x H x its position + 1), the ``control``
    prompt (None: none), the word's ``rarity``, the lines in words (``reading``) and why the lens
    rows say little where they do (``lens_note``)."""

    word_id: int
    word: dict[str, Any]
    positions: list[int]
    layers: list[dict[str, Any]]
    contexts: list[dict[str, Any]]
    control: dict[str, Any] | None
    attention: list[list[list[list[float]]]]
    rarity: dict[str, Any]
    reading: list[str]
    lens_note: str | None
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


# --- the notebook's (routes in notebook.py) ---

class InsightSummary(Response):
    """An insight as the notebook lists it; ``commit`` is the git commit that holds its file."""

    id: str
    path: str
    title: str
    tags: list[str]
    date: str
    model: str | None
    kind: str | None
    evidence: bool
    commit: str | None


class InsightList(Response):
    insights: list[InsightSummary]


class Insight(Response):
    """An insight whole: its words and, if it has any, its evidence (notebook.md's shape)."""

    id: str
    path: str
    title: str
    body: str
    tags: list[str]
    date: str
    model: str | None
    evidence: dict[str, Any] | None
    commit: str | None


class Replay(Response):
    """The stored candidates recomputed now: whether they still match (``replayable`` False
    with the ``reason`` when there is nothing to replay)."""

    id: str
    model: str | None
    position: int | None
    replayable: bool
    matches: bool | None


class Pushed(Response):
    remote: str
    branch: str
    commit: str
    output: str
