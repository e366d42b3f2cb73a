"""The notebook's HTTP routes: save an insight with its evidence, list, read, replay.

``notebook_router(notebook, candidates_at)`` is included by the app; ``candidates_at`` is
the engine's (see ``puffergpt.notebook.CandidatesAt``). Thin: it parses, calls the notebook, and
renders; the notebook checks everything it stores."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from pydantic import Field, StringConstraints

from puffergpt import notebook as nb
from puffergpt.notebook import CandidatesAt, Notebook
from puffergpt.server.bodies import Strict
from puffergpt.server.playground.responses import BODY, Insight, InsightList, InsightSummary, Pushed, Replay, errors
from puffergpt.stores.base import StoreError

Tag = Annotated[str, StringConstraints(min_length=1, max_length=nb.MAX_TAG_CHARS)]


class InsightBody(Strict):
    title: str = Field(..., min_length=1, max_length=nb.MAX_TITLE_CHARS, description="a short title")
    body: str = Field("", max_length=nb.MAX_BODY_CHARS, description="what the learner understood, in their words")
    tags: list[Tag] = Field(default_factory=list, max_length=nb.MAX_TAGS, description="one-word tags")
    # None: an insight from a conversation; else checked by the notebook (check_evidence), which names the problem
    evidence: dict[str, Any] | None = Field(None, description="the playground's token and candidates, to replay; "
                                                              "leave it out for an insight from a conversation")


@contextlib.contextmanager
def http_errors():
    """Notebook errors as 4xx/5xx with the notebook's message: a file of the notebook that
    does not read (not UTF-8, a symbolic link, damaged) is a 409 naming it; a notebook that
    cannot be written (read-only, a full disk) a 503 with the reason."""
    try:
        yield
    except nb.InsightNotFound as e:
        raise HTTPException(404, str(e)) from None
    except nb.InvalidInsight as e:
        raise HTTPException(400, str(e)) from None
    except (nb.GitError, nb.NotebookUnavailable) as e:  # the notebook's disk or git, not the request: the file is kept
        raise HTTPException(503, str(e)) from None
    except StoreError as e:
        raise HTTPException(503, f"the store failed: {e}") from None
    except nb.NotebookError as e:
        raise HTTPException(409, str(e)) from None


class Book:
    """The app's notebook, and how it recomputes candidates to replay an insight: the
    engine's ``candidates_at`` (see ``puffergpt.notebook.CandidatesAt``), running
    ``model``: replaying an insight saved from another model is a 400 that names both."""

    def __init__(self, notebook: Notebook, candidates_at: CandidatesAt, model: str | None = None,
                 data_at: nb.DataAt | None = None):
        self.notebook, self.candidates_at, self.model, self.data_at = notebook, candidates_at, model, data_at


def book(request: Request) -> Book:
    return request.state.book  # set by the router ``notebook_router`` made


BookDep = Annotated[Book, Depends(book)]
router = APIRouter(prefix="/api/insights")  # tags per route: an action imports "notebook", never the push
# The notebook's own errors (http_errors): a file of it that does not read, its disk or git failing
UNREADABLE = {409: "a file of the notebook does not read (not UTF-8, a symbolic link, damaged): the message names it",
              503: "the notebook could not be written or read (its disk, git): nothing saved was lost"}
NO_INSIGHT = {404: "no insight with this id"}


@router.post("", status_code=201, response_model=InsightSummary, operation_id="saveInsight", tags=["notebook"],
             summary="Save an insight to the notebook",
             responses=errors(*BODY, 401, 409, 503, why=UNREADABLE | {400: "a bad title, body, tag or evidence: the "
                                                                           "message names it"}))
def save(body: InsightBody, b: BookDep,
         idempotency_key: Annotated[str | None, Header(description="any unique string (a UUID): a save retried "
                                                                   "with the same key returns the same insight, "
                                                                   "never a second one")] = None) -> dict:
    """Save what the learner understood as an insight: one Markdown file and one git commit in
    their notebook. Give a short title, the learner's words as body, and one-word tags. A retry
    with the same Idempotency-Key returns the first save's insight."""
    with http_errors():
        ins = b.notebook.save(body.title, body.body, body.tags, body.evidence, key=idempotency_key)
    return ins.summary()


@router.get("", response_model=InsightList, operation_id="listInsights", tags=["notebook"],
            summary="List the notebook's insights", responses=errors(409, 422, 503, why=UNREADABLE))
def list_insights(b: BookDep,
                  q: Annotated[str | None, Query(max_length=nb.MAX_QUERY_CHARS,
                                                 description="words to find in titles, bodies and tags")] = None,
                  tag: Annotated[str | None, Query(max_length=nb.MAX_TAG_CHARS,
                                                   description="only the insights with this tag")] = None) -> dict:
    """The notebook's insights, newest first; q searches titles, bodies and tags, tag keeps
    those with that tag."""
    with http_errors():
        return {"insights": [i.summary() for i in b.notebook.list(query=q, tag=tag)]}


@router.post("/push", response_model=Pushed, operation_id="pushNotebook", tags=["notebook-git"],
             summary="Push the notebook to its git remote", responses=errors(401, 403, 409, 503, why={
                 409: "the notebook has no remote, or no insights yet", 503: "git could not push: the commits stay"}))
def push(b: BookDep) -> dict:
    """Push the notebook to its remote (the user's git setup); 409 without a remote,
    503 with git's reason when the push fails (the commits stay)."""
    with http_errors():
        return b.notebook.push()


@router.get("/{insight_id}", response_model=Insight, operation_id="getInsight", tags=["notebook"],
            summary="Read one insight", responses=errors(404, 409, 503, why=UNREADABLE | NO_INSIGHT))
def show(insight_id: str, b: BookDep) -> dict:
    """One insight whole: its title, body, tags and any evidence."""
    with http_errors():
        return b.notebook.get(insight_id).to_json()


@router.post("/{insight_id}/replay", response_model=Replay, operation_id="replayInsight", tags=["notebook"],
             summary="Replay an insight's evidence with the model", responses=errors(400, 403, 404, 409, 503, why={
                 400: "the insight was saved from another model, or the model can't read its prompt",
                 **UNREADABLE, **NO_INSIGHT}))
def replay(insight_id: str, b: BookDep) -> dict:
    """The stored candidates recomputed now, and the data of the insight's kind (a head's
    weights, a lens layer, an analogy, the attribution, a rerun with parts off), and whether
    they still match."""
    with http_errors():
        ins = b.notebook.get(insight_id)
        try:
            result = nb.replay(ins, b.candidates_at, model=b.model, data_at=b.data_at)
        except nb.InvalidInsight:
            raise
        except ValueError as e:  # the engine refused the prompt (context, vocabulary)
            raise nb.InvalidInsight(f"the model could not replay this insight: {e}") from None
    position = ins.evidence["position"] if ins.evidence else None  # None: nothing to replay (the result says so)
    return {"id": ins.id, "model": ins.model, "position": position, **result}


def notebook_router(notebook: Notebook, candidates_at: CandidatesAt, model: str | None = None,
                    data_at: nb.DataAt | None = None) -> APIRouter:
    """The routes over one notebook, to include in an app. ``model``, when given, is the
    model ``candidates_at`` (and ``data_at``) runs."""
    b = Book(notebook, candidates_at, model, data_at)

    def with_book(request: Request) -> None:
        request.state.book = b

    r = APIRouter(dependencies=[Depends(with_book)])
    r.include_router(router)
    return r
