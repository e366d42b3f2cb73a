"""The embedding views: an analogy, a word's neighbours, a map of token vectors (with
the path of a text's token through the layers). Each is a fetch and a search or two on
weights of its own, counted in the response's ``requests``. The next token of a text's
position found exactly and through the approximate index, side by side (``output_search.py``).
And a word in two or three contexts and a control, layer by layer (``contexts.py``): a prefill and a lens search a
prompt, each in a run of its own."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from puffergpt.app.protocol import view_json
from puffergpt.lens import contexts, inspector, output_search, views
from puffergpt.search.engine import Engine
from puffergpt.server.bodies import AnalogyBody, ContextsBody, MapBody, NeighboursBody, OutputSearchBody
from puffergpt.server.playground import responses
from puffergpt.server.playground.responses import BODY, errors
from puffergpt.server.state import EngineDep, TextsDep, open_text
from puffergpt.texts.text import TextError

router = APIRouter(prefix="/api", tags=["views"])
VIEW = errors(*BODY, 503)


def view(engine: Engine, compute: Callable[[object], dict]) -> dict:
    """A view on weights of its own (a fetch and a search or two), closed after."""
    run = engine.views()  # no text: no namespace of keys to make and drop
    try:
        with run.session.recording(extra=True) as requests:
            d = compute(run.weights)
        return view_json(d, requests)
    finally:
        run.session.close()


@router.post("/analogy", response_model=responses.Analogy, operation_id="findAnalogy",
             summary="a is to b as c is to ?", responses=VIEW)
def analogy(body: AnalogyBody, engine: EngineDep) -> dict:
    """"a is to b as c is to ?": the tokens nearest by cosine to wte[b] - wte[a] + wte[c]."""
    return view(engine, lambda p: views.analogy(p, body.a, body.b, body.c, body.k, engine.token_counts))


@router.post("/analogy/card", response_model=responses.CardAnalogies, operation_id="scoreCardAnalogies",
             summary="How many of the demo card's analogies the model gets right", responses=VIEW)
def card_analogies(engine: EngineDep) -> dict:
    """How many of the demo card's analogies this model gets right, with the same search."""
    return view(engine, lambda p: views.card_analogies(p, engine.token_counts))


@router.post("/neighbours", response_model=responses.Neighbours, operation_id="findNeighbours",
             summary="A word's nearest tokens", responses=VIEW)
def neighbours(body: NeighboursBody, engine: EngineDep) -> dict:
    """The k tokens nearest by cosine to the word's embedding row."""
    return view(engine, lambda p: views.neighbours(p, body.word, body.k, engine.token_counts))


@router.post("/map", response_model=responses.Map, operation_id="mapEmbeddings",
             summary="Token vectors on a plane", responses=errors(*BODY, 404, 503))
def embedding_map(body: MapBody, engine: EngineDep, texts: TextsDep) -> dict:
    """Some token vectors on a plane, and the path of a text's token through the layers."""
    residual = None
    if body.text_id is not None:
        t = open_text(body.text_id, texts)
        if body.position is None:
            raise TextError("map: give the position whose path to draw with the text")
        got, _, _ = inspector.inspect(t, body.position, 5, explain=False)
        residual = got["residual"]
    return view(engine, lambda p: views.embedding_map(p, list(body.words), residual, engine.token_counts))


@router.post("/output_search", response_model=responses.OutputSearch, operation_id="compareOutputSearch",
             summary="The next token found exactly and through the approximate index",
             responses=errors(*BODY, 404, 503))
def output_search_view(body: OutputSearchBody, texts: TextsDep) -> dict:
    """The next token at a text's position found both ways, exact (every token vector scored) and
    through the store's approximate index, side by side: what the index missed, and each one's time."""
    got, requests = output_search.at(open_text(body.text_id, texts), body.position, body.k, body.ef)
    return view_json(got, requests)


@router.post("/contexts", response_model=responses.Contexts, operation_id="compareContexts",
             summary="One word in 2 or 3 contexts, layer by layer", responses=VIEW)
def contexts_view(body: ContextsBody, engine: EngineDep) -> dict:
    """One word in 2 or 3 prompts and an optional control (the first's sense): per layer the
    cosine of its vectors beside the control pair's, each context's lens and attention, the
    word's training count, and the lines read in words."""
    got = contexts.contexts(engine.open, engine.config, body.word, list(body.prompts), body.k, body.control,
                            engine.token_counts)
    return view_json(got, got["requests"])
