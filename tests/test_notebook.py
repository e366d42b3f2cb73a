"""The insight notebook: files, commits, safety, git failures, push, replay, HTTP and CLI.

Evidence is made the way the playground makes it (a Text generating on the search
engine over the embedded store) and replayed against the numpy GPT-2, an independent
forward pass."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient

from helpers import message
from puffergpt import notebook as nb
from puffergpt.cli.notebook import notebook as notebook_cli
from puffergpt.lens import attribution, inspector
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights, Reference
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.notebook import GitError, InsightNotFound, InvalidInsight, Notebook, NotebookError
from puffergpt.search.manifest import open_engine
from puffergpt.server import errors
from puffergpt.server.playground.notebook import notebook_router
from puffergpt.texts.text import Text, opened

PROMPT = "The quick brown fox"
HOSTILE = "../../../etc/passwd <script>alert('x')</script> & <b>bold</b> 🎉🧠 ..\\..\\win"


@pytest.fixture(autouse=True)
def no_git_identity(tmp_path_factory, monkeypatch):
    """No user git config at all, as on a fresh machine: saves must still commit."""
    empty = tmp_path_factory.mktemp("gitconfig") / "config"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for k in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(k, raising=False)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def commits(repo: Path) -> list[str]:
    return git(repo, "log", "--format=%H").split()


GREEDY = Sampling(0.0, 40)


def step_evidence(run, model: str, prompt: str = PROMPT, n: int = 3, s: Sampling = GREEDY) -> dict:
    """Evidence as the playground attaches it: the last generated token of a text (on ``run``)."""
    text = Text(run)
    try:
        text.append(tokenizer.encode(prompt))
        step = list(text.generate(n, s))[-1]
        return {
            "kind": "token",
            "model": model,
            "prompt_ids": text.tokens[: text.length],
            "position": step.position,
            "token_id": step.token_id,
            "sampling": {"temperature": s.temperature, "top_k": s.top_k, "seed": s.seed},
            "candidates": [{"token_id": int(i), "logit": float(v)} for i, v in zip(step.ids, step.logits, strict=True)],
            "requests": [r.to_json() for r in step.requests],
        }
    finally:
        text.close()


@pytest.fixture(scope="module")
def engine_evidence(loaded, tiny) -> dict:
    store, key = loaded(tiny)
    return step_evidence(open_engine(store, tiny.name, key).open(), tiny.name, s=Sampling(0.8, 40, 7))


@pytest.fixture
def evidence(tiny) -> dict:
    """Small evidence for the tests about files and git (numpy: fast)."""
    return step_evidence(Run(NumpyWeights(tiny)), tiny.name, n=1, s=Sampling(1.0, 5, 3))


def after_controls(logits: np.ndarray, s: Sampling, seen: list[int], generated: list[int]) -> np.ndarray:
    """The controls as their definitions say, written out apart from sampling.py: transformers'
    RepetitionPenaltyLogitsProcessor over every token read, then OpenAI's penalties over the
    generated tokens, then the bias. (V,) -> (V,)"""
    x = np.asarray(logits, np.float64).copy()
    if s.repetition_penalty != 1:
        seen = np.unique(seen)
        x[seen] = np.where(x[seen] < 0, x[seen] * s.repetition_penalty, x[seen] / s.repetition_penalty)
    count = np.bincount(np.asarray(generated, np.int64), minlength=len(x))
    x -= count * s.frequency_penalty + (count > 0) * s.presence_penalty
    for t, b in s.logit_bias.items():
        x[t] += b
    return x


def numpy_candidates_at(ckpt):
    """The independent check: a full numpy forward over prompt_ids[:position], the controls applied."""
    ref = Reference(ckpt)

    def at(ids, position, k, s, generated):
        seen = list(ids[:position])
        logits = after_controls(ref.logits(seen)[-1], s, seen, [ids[q] for q in generated])  # (V,)
        top = np.argsort(-logits, kind="stable")[:k]
        return top.tolist(), logits[top].tolist()

    return at


# --- a save is one commit ----------------------------------------------------------------

def test_a_save_is_one_commit_holding_the_file(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")  # absent: initialised
    ins = book.save(
        "Temperature finally clicked", "Dividing by T before softmax flattens it.", ["temperature"], evidence
    )
    repo = tmp_path / "nb"
    assert commits(repo) == [ins.commit]
    assert git(repo, "show", "--name-only", "--format=", ins.commit).split() == [ins.path]
    on_disk = (repo / ins.path).read_text(encoding="utf-8")
    assert git(repo, "show", f"{ins.commit}:{ins.path}") == on_disk
    assert git(repo, "status", "--porcelain") == ""
    msg = git(repo, "log", "-1", "--format=%an <%ae>%n%B")
    assert msg.startswith(f"{nb.DEFAULT_NAME} <{nb.DEFAULT_EMAIL}>\nInsight: Temperature finally clicked\n")
    assert f"position {evidence['position']}" in msg and "Tags: temperature" in msg
    # the file: front matter, the learner's words, the readable evidence, the JSON block
    assert on_disk.startswith("---\nversion: 3\n")
    assert "Dividing by T before softmax flattens it." in on_disk
    assert tokenizer.decode(evidence["prompt_ids"][: evidence["position"]]) in on_disk
    assert f"{evidence['candidates'][0]['logit']:.6f}" in on_disk
    got = book.get(ins.id)
    assert (got.title, got.body, got.tags, got.model, got.commit) == (
        ins.title,
        ins.body,
        ins.tags,
        ins.model,
        ins.commit,
    )
    assert got.evidence == evidence  # the machine-readable block round-trips exactly


def test_the_user_git_identity_is_used_when_configured(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")
    git(tmp_path / "nb", "config", "user.name", "Ada Learner")
    git(tmp_path / "nb", "config", "user.email", "ada@example.org")
    book.save("Mine", "", [], evidence)
    assert git(tmp_path / "nb", "log", "-1", "--format=%an <%ae>").strip() == "Ada Learner <ada@example.org>"


def test_the_body_round_trips_whatever_markdown_it_holds(tmp_path, evidence):
    body = "## Evidence\n\n```json\n{\"not\": \"mine\"}\n```\n---\n\ttabbed, and ### Evidence data (format 1)"
    evidence = evidence | {"kind": "attention", "data": {"layer": 1, "head": 2, "weights": [0.5, 0.25, 0.25]}}
    book = Notebook(tmp_path / "nb")
    ins = book.save("---", body, None, evidence)
    got = book.get(ins.id)
    assert (got.title, got.body, got.evidence) == ("---", body, evidence)


def test_a_readable_section_edited_by_hand_still_reads(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")
    ins = book.save("Edited", "my words", [], evidence)
    f = tmp_path / "nb" / ins.path
    f.write_text(
        f.read_text(encoding="utf-8").replace("- kind: token", "- kind: token (I looked at this twice)"),
        encoding="utf-8",
    )
    got = book.get(ins.id)
    assert got.body == "my words" and got.evidence == evidence


# --- safety ------------------------------------------------------------------------------

def test_a_hostile_title_saves_safely(tmp_path, evidence):
    root = tmp_path / "nb"
    book = Notebook(root)
    ins = book.save(HOSTILE, "<img src=x onerror=alert(1)> 🎉", ["xss"], evidence)
    name = Path(ins.path).name
    assert re.fullmatch(r"[a-z0-9-]+\.md", name), name
    assert (root / ins.path).resolve().parent == (root / "insights").resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb"]  # nothing written outside the notebook
    assert sorted(p.name for p in (root / "insights").iterdir()) == [name]
    got = book.get(ins.id)
    assert got.title == HOSTILE and got.body == "<img src=x onerror=alert(1)> 🎉"
    assert git(root, "log", "-1", "--format=%s").strip() == f"Insight: {HOSTILE}"


def test_two_insights_with_the_same_title_are_two_files(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")
    a = book.save("Attention", "first", [], evidence)
    b = book.save("Attention", "second", [], evidence)
    assert a.path != b.path and a.id != b.id
    assert (book.get(a.id).body, book.get(b.id).body) == ("first", "second")
    assert commits(tmp_path / "nb") == [b.commit, a.commit]
    assert sorted(git(tmp_path / "nb", "ls-tree", "--name-only", "HEAD", "insights/").split()) == sorted(
        [a.path, b.path]
    )


def test_a_non_empty_directory_that_is_not_a_repository_is_refused(tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "thesis.txt").write_text("my thesis")
    with pytest.raises(NotebookError, match="is not empty and is not a git repository"):
        Notebook(d)
    assert sorted(p.name for p in d.iterdir()) == ["thesis.txt"] and (d / "thesis.txt").read_text() == "my thesis"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotebookError, match="is a file"):
        Notebook(tmp_path / "afile")


def test_an_empty_directory_is_initialised_and_an_existing_notebook_opens(tmp_path, evidence):
    d = tmp_path / "empty"
    d.mkdir()
    Notebook(d).save("One", "", [], evidence)
    assert len(Notebook(d).list()) == 1  # reopened: a repository of its own
    with pytest.raises(NotebookError, match="there is no notebook at"):
        Notebook(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()


def test_a_directory_inside_another_repository_is_its_own_or_refused(tmp_path, evidence):
    outer = tmp_path / "project"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / "notes").mkdir()
    (outer / "notes" / "a.md").write_text("a")
    with pytest.raises(NotebookError, match="is not empty and is not a git repository"):
        Notebook(outer / "notes")  # the outer project's folder is not a notebook
    ins = Notebook(outer / "book").save("Nested", "", [], evidence)  # an empty one becomes a repository of its own
    assert commits(outer / "book") == [ins.commit]
    assert (
        subprocess.run(["git", "-C", str(outer), "rev-parse", "HEAD"], capture_output=True).returncode != 0
    )  # the project untouched


@pytest.mark.parametrize("title, body, tags, problem", [
    ("", "", [], "the title is empty"),
    ("x" * (nb.MAX_TITLE_CHARS + 1), "", [], "at most 200"),
    ("two\nlines", "", [], "control characters"),
    ("ok", "\x1b[31mred", [], "control characters"),
    ("ok", "x" * (nb.MAX_BODY_CHARS + 1), [], f"at most {nb.MAX_BODY_CHARS}"),
    ("ok", "", ["two words"], "a tag is one word"),
    ("ok", "", ["../etc"], "a tag is one word"),
    ("ok", "", [f"t{i}" for i in range(nb.MAX_TAGS + 1)], f"at most {nb.MAX_TAGS}"),
    ("ok", "", "temperature", "a list of words"),
])
def test_bad_titles_bodies_and_tags_are_refused_with_a_reason(tmp_path, evidence, title, body, tags, problem):
    book = Notebook(tmp_path / "nb")
    with pytest.raises(InvalidInsight, match=re.escape(problem)):
        book.save(title, body, tags, evidence)
    assert not (tmp_path / "nb" / "insights").exists()


def bad(ev: dict, **change) -> dict:
    return {**ev, **change}


@pytest.mark.parametrize("change, problem", [
    (lambda e: bad(e, kind="poem"), "kind must be one of"),
    (lambda e: bad(e, prompt_ids=[1, 2, tokenizer.VOCAB_SIZE]), "prompt_ids[2] must be an integer in 0..50256"),
    (lambda e: bad(e, prompt_ids=[1, True]), "prompt_ids[1]"),
    (lambda e: bad(e, prompt_ids=[]), "prompt_ids must be a list of 1 to"),
    (lambda e: bad(e, position=0), "position must be an integer in 1.."),
    (lambda e: bad(e, position=len(e["prompt_ids"]) + 1), "position must be an integer"),
    (lambda e: bad(e, position=1, token_id=e["prompt_ids"][1] + 1), "is not the token at position 1"),
    (lambda e: bad(e, candidates=[{"token_id": 1, "logit": float("nan")}]), "must be a finite number"),
    (lambda e: bad(e, candidates=[{"token_id": 1, "logit": 1.0}, {"token_id": 1, "logit": 0.5}]), "repeat a token_id"),
    (lambda e: bad(e, candidates=[{"token_id": 1, "logit": 1.0, "text": "x"}]), "unknown keys text"),
    (lambda e: bad(e, sampling={"temperature": -1, "top_k": 5, "seed": None}), "temperature must be >= 0"),
    (lambda e: bad(e, sampling={"temperature": 1.0, "top_k": 5}), "sampling lacks seed"),
    (lambda e: bad(e, html="<b>"), "unknown keys html"),
    (lambda e: bad(e, candidates=[{"token_id": i, "logit": 0.0} for i in range(101)]), "a list of 1 to 100"),
    (lambda e: {k: v for k, v in e.items() if k != "model"}, "lacks model"),
    (lambda e: bad(e, data={"weights": [0.1] * 20_000}), "at most 49,152"),
])
def test_bad_evidence_is_refused_with_a_reason(tmp_path, evidence, change, problem):
    with pytest.raises(InvalidInsight, match=re.escape(problem)):
        Notebook(tmp_path / "nb").save("ok", "", [], change(evidence))


def test_ids_that_are_not_insights_are_not_found(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")
    book.save("One", "", [], evidence)
    for bad_id in ("../.git/config", "..", "a/b", "A", "x" * 200, ""):
        with pytest.raises(InsightNotFound, match="no insight"):
            book.get(bad_id)


# --- git failures: clear errors, nothing lost ---------------------------------------------

def test_a_locked_index_is_a_clear_error_and_the_next_save_commits_both(tmp_path, evidence):
    root = tmp_path / "nb"
    book = Notebook(root)
    first = book.save("Before", "", [], evidence)
    lock = root / ".git" / "index.lock"
    lock.write_text("")
    with pytest.raises(GitError, match="index is locked") as e:
        book.save("Stuck", "kept on disk", [], evidence)
    assert "saved in" in str(e.value) and "committed with the next save" in str(e.value)
    stuck = [p for p in (root / "insights").glob("*.md") if "stuck" in p.name]
    assert len(stuck) == 1 and "kept on disk" in stuck[0].read_text(encoding="utf-8")
    assert commits(root) == [first.commit]
    lock.unlink()  # the other git process ended
    after = book.save("After", "", [], evidence)
    assert commits(root) == [after.commit, first.commit]
    stuck_path = f"insights/{stuck[0].name}"
    assert sorted(git(root, "show", "--name-only", "--format=", after.commit).split()) == sorted(
        [stuck_path, after.path]
    )
    assert stuck_path in git(root, "log", "-1", "--format=%B")
    assert git(root, "status", "--porcelain") == ""


def test_no_git_binary_is_a_clear_error_and_the_file_stays(tmp_path, evidence, monkeypatch):
    root = tmp_path / "nb"
    book = Notebook(root)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no git to be found
    with pytest.raises(GitError, match="git is not installed") as e:
        book.save("No git", "still here", [], evidence)
    assert str(root / "insights") in str(e.value)
    with pytest.raises(GitError, match="git is not installed"):
        Notebook(root)
    monkeypatch.undo()
    kept = list((root / "insights").glob("*.md"))
    assert len(kept) == 1 and "still here" in kept[0].read_text(encoding="utf-8")
    later = Notebook(root).save("Git is back", "", [], evidence)
    assert len(git(root, "show", "--name-only", "--format=", later.commit).split()) == 2
    assert sorted(i.title for i in Notebook(root).list()) == ["Git is back", "No git"]


def test_saves_at_once_are_each_one_commit(tmp_path, evidence):
    from concurrent.futures import ThreadPoolExecutor

    book = Notebook(tmp_path / "nb")
    with ThreadPoolExecutor(4) as pool:
        saved = list(pool.map(lambda i: book.save(f"Same moment {i}", "", [], evidence), range(6)))
    assert len(set(commits(tmp_path / "nb"))) == 6 and sorted(commits(tmp_path / "nb")) == sorted(
        i.commit for i in saved
    )
    for ins in saved:
        assert git(tmp_path / "nb", "show", "--name-only", "--format=", ins.commit).split() == [ins.path]


# --- push --------------------------------------------------------------------------------

def test_push_to_a_bare_local_remote(tmp_path, evidence):
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    book = Notebook(tmp_path / "nb")
    ins = book.save("Pushed", "", [], evidence)
    git(tmp_path / "nb", "remote", "add", "origin", str(remote))
    r = book.push()
    assert (r["remote"], r["branch"], r["commit"]) == ("origin", "main", ins.commit)
    assert subprocess.run(["git", "--git-dir", str(remote), "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip() == ins.commit
    later = book.save("Pushed again", "", [], evidence)
    assert book.push()["commit"] == later.commit


def test_push_without_a_remote_says_how_to_add_one(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")
    git(tmp_path / "nb", "remote", "add", "origin", str(tmp_path / "r.git"))
    with pytest.raises(NotebookError, match="has no insights yet: nothing to push"):
        book.push()
    git(tmp_path / "nb", "remote", "remove", "origin")
    book.save("Local", "", [], evidence)
    with pytest.raises(NotebookError, match="has no remote: add one with `git -C"):
        book.push()


@pytest.mark.parametrize("url", ["file:///nonexistent/remote.git", "/nonexistent/remote.git"])
def test_push_to_an_unreachable_remote_is_a_clear_error_and_the_commit_stays(tmp_path, evidence, url):
    book = Notebook(tmp_path / "nb")
    ins = book.save("Unpushed", "", [], evidence)
    git(tmp_path / "nb", "remote", "add", "origin", url)
    with pytest.raises(GitError, match="could not push the notebook to origin") as e:
        book.push()
    assert "push again when the remote is reachable" in str(e.value)
    assert commits(tmp_path / "nb") == [ins.commit] and (tmp_path / "nb" / ins.path).is_file()


# --- replay ------------------------------------------------------------------------------

def test_replay_of_engine_evidence_matches_numpy(tmp_path, engine_evidence, tiny):
    book = Notebook(tmp_path / "nb")
    ins = book.save("Sampled on the engine", "", [], engine_evidence)
    r = nb.replay(book.get(ins.id), numpy_candidates_at(tiny))
    print(f"\nreplay, search engine (embedded, inner product) vs numpy, top-40 at position "
          f"{engine_evidence['position']}: max |logit diff| {r['max_abs_diff']:.3g}")
    assert r["same_ids"] and r["matches"] and r["first_differences"] == []
    assert r["max_abs_diff"] <= nb.TOLERANCE
    assert [c["token_id"] for c in r["now"]] == [c["token_id"] for c in engine_evidence["candidates"]]
    # the CLI's path (a Text over a numpy run) agrees too
    again = nb.replay(ins, nb.candidates_from_runs(lambda: Run(NumpyWeights(tiny))))
    assert again["matches"], again["first_differences"]


def tamper(book: Notebook, ins, rank: int, delta: float) -> None:
    """Change one stored logit in the file's JSON block, as an edit by hand would."""
    f = book.path / ins.path
    text = f.read_text(encoding="utf-8")
    c = ins.evidence["candidates"][rank]
    old = json.dumps(c)
    assert text.count(old) == 1
    f.write_text(text.replace(old, json.dumps({**c, "logit": c["logit"] + delta})), encoding="utf-8")


def test_a_tampered_logit_is_reported_as_a_mismatch(tmp_path, engine_evidence, tiny):
    book = Notebook(tmp_path / "nb")
    ins = book.save("Tampered", "", [], engine_evidence)
    tamper(book, ins, 3, 0.01)
    r = nb.replay(book.get(ins.id), numpy_candidates_at(tiny))
    assert not r["matches"] and r["same_ids"]
    assert r["max_abs_diff"] == pytest.approx(0.01, abs=nb.TOLERANCE)
    assert [d["rank"] for d in r["first_differences"]] == [3]
    # another model (or another order) is not the same either
    swapped = {
        **ins.evidence,
        "candidates": [ins.evidence["candidates"][1], ins.evidence["candidates"][0], *ins.evidence["candidates"][2:]],
    }
    r2 = nb.replay(swapped, numpy_candidates_at(tiny))
    assert not r2["same_ids"] and not r2["matches"] and [d["rank"] for d in r2["first_differences"]] == [0, 1]
    with pytest.raises(InvalidInsight, match="saved from model"):
        nb.replay(ins, numpy_candidates_at(tiny), model="gpt2")


# --- replay re-checks the evidence of the insight's kind ------------------------------------

@pytest.fixture(scope="module")
def inside_evidence(loaded, tiny) -> dict:
    """Evidence as Look inside saves it, made on the search engine over the store: a head's
    weights (rounded to 6 decimals, as the page gets them), the attribution with its versus,
    and the step run again with a head switched off."""
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    ev = step_evidence(engine.open(), tiny.name, n=2)
    p = ev["position"]
    with opened(engine.open, [*ev["prompt_ids"][:p], ev["token_id"]]) as t:
        t.candidates(p, 1)
        got, _, _ = inspector.inspect(t, p, 5, explain=True)
        off = inspector.ablate(t, p, ["attn 1.0"], engine.open, 5)
        mean = inspector.ablate(t, p, ["attn 1.0", "mlp 0"], engine.open, 5, "mean")
    a = got["attribution"]
    base = {k: v for k, v in ev.items() if k != "requests"}
    weights = [round(float(w), 6) for w in got["weights"][1, 0, :p]]
    return {
        "attention": base | {"kind": "attention", "data": {"layer": 1, "head": 0, "weights": weights}},
        "attribution": base | {"kind": "attribution", "data": {
            "token_id": a["token_id"], "logit": a["logit"], "parts": a["parts"], "versus": a["versus"]}},
        "ablation": base | {"kind": "ablation", "data": {"parts": off["parts"], "after": [
            {"token_id": int(i), "logit": float(v)} for i, v in zip(*off["after"], strict=True)]}},
        "ablation-mean": base | {"kind": "ablation", "data": {"parts": mean["parts"], "mode": "mean", "after": [
            {"token_id": int(i), "logit": float(v)} for i, v in zip(*mean["after"], strict=True)]}},
    }


def numpy_replay(ins, tiny) -> dict:
    return nb.replay(ins, numpy_candidates_at(tiny), data_at=nb.data_from_runs(lambda: Run(NumpyWeights(tiny))))


def doctor(book: Notebook, ins, data: dict) -> None:
    """Change the stored data in the file's JSON block, as an edit by hand would."""
    f = book.path / ins.path
    text = f.read_text(encoding="utf-8")
    old = json.dumps(ins.evidence["data"], ensure_ascii=False)
    assert text.count(old) == 1
    f.write_text(text.replace(old, json.dumps(data, ensure_ascii=False)), encoding="utf-8")


def test_replay_rechecks_a_heads_weights_the_attribution_and_an_ablation(tmp_path, inside_evidence, tiny):
    book = Notebook(tmp_path / "nb")
    for kind, ev in inside_evidence.items():
        r = numpy_replay(book.get(book.save(kind, "", [], ev).id), tiny)
        d = r["data"]
        print(f"\nreplay of {kind} data, search engine vs numpy: {d['checked']} items, "
              f"max |diff| {d['max_abs_diff']:.3g}")
        assert r["matches"] and d["matches"] and d["differences"] == [] and d["kind"] == ev["kind"]
        parts = len(ev["data"].get("parts", ()))  # the attribution: its logit and parts, twice with versus
        assert d["checked"] == {"attention": ev["position"], "ablation": 5, "attribution": 2 + 2 * parts}[ev["kind"]]
        assert d["max_abs_diff"] <= (nb.WEIGHT_TOLERANCE if kind == "attention" else nb.TOLERANCE)
    # a mean ablation is replayed as one: the same file read as zero ablation differs
    mean = book.save("mean", "", [], inside_evidence["ablation-mean"])
    doctor(book, mean, {k: v for k, v in mean.evidence["data"].items() if k != "mode"})
    assert not numpy_replay(book.get(mean.id), tiny)["data"]["matches"]
    # the stored attribution is the model's: its parts sum to the logit, numpy's forward pass says
    ev = inside_evidence["attribution"]
    a = ev["data"]
    logits = Reference(tiny).logits(ev["prompt_ids"][:ev["position"]])[-1]
    assert sum(x["value"] for x in a["parts"]) == pytest.approx(logits[a["token_id"]], abs=1e-3)
    assert a["logit"] - a["versus"]["logit"] == pytest.approx(sum(x["value"] for x in a["versus"]["parts"]), abs=1e-3)


def test_a_doctored_weight_or_attribution_part_is_named_with_its_difference(tmp_path, inside_evidence, tiny,
                                                                            tiny_dir):
    book = Notebook(tmp_path / "nb")
    att = book.save("A head", "", [], inside_evidence["attention"])
    w = list(att.evidence["data"]["weights"])
    w[1] += 0.002
    doctor(book, att, {**att.evidence["data"], "weights": w})
    r = numpy_replay(book.get(att.id), tiny)
    assert r["candidates_match"] and not r["matches"] and not r["data"]["matches"]
    (d,) = r["data"]["differences"]
    assert d["item"] == "layer 1 head 0: weight at position 1"
    assert d["diff"] == pytest.approx(0.002, abs=nb.WEIGHT_TOLERANCE)
    ab = book.save("Its parts", "", [], inside_evidence["attribution"])
    data = json.loads(json.dumps(ab.evidence["data"]))
    head = next(x for x in data["parts"] if x["kind"] == "attn" and x["layer"] == 1 and x["head"] == 2)
    head["value"] += 0.01
    doctor(book, ab, data)
    r = numpy_replay(book.get(ab.id), tiny)
    assert not r["matches"] and [x["item"] for x in r["data"]["differences"]] == ["attribution: L1 H2"]
    assert r["data"]["differences"][0]["diff"] == pytest.approx(0.01, abs=nb.TOLERANCE)
    assert attribution.label(head) == "L1 H2"
    # the CLI names it too, and exits 1
    out = run("replay", ab.id, "--notebook", str(book.path), "--model", str(tiny_dir))
    assert out.exit_code == 1, out.output
    assert "attribution data: DIFFERS" in out.output and "attribution: L1 H2: stored" in out.output


def test_a_format_1_file_still_reads_and_replays_its_data(tmp_path, inside_evidence, tiny):
    book = Notebook(tmp_path / "nb")
    ins = book.save("Old", "words", [], inside_evidence["attention"])
    f = book.path / ins.path
    f.write_text(f.read_text().replace("version: 3", "version: 1").replace("(format 3)", "(format 1)"))
    back = book.get(ins.id)
    assert (back.body, back.evidence) == ("words", ins.evidence)
    assert numpy_replay(back, tiny)["data"]["matches"]


# --- HTTP --------------------------------------------------------------------------------

@pytest.fixture
def client(tmp_path, tiny):
    book = Notebook(tmp_path / "nb")
    app = FastAPI()
    errors.add_handlers(app)  # as create_app has them: every error an ErrorBody
    app.include_router(notebook_router(book, numpy_candidates_at(tiny), model=tiny.name))
    with TestClient(app) as c:
        yield c, book


def test_http_save_list_show_replay(client, engine_evidence):
    c, book = client
    r = c.post(
        "/api/insights", json={"title": HOSTILE, "body": "my words", "tags": ["attention"], "evidence": engine_evidence}
    )
    assert r.status_code == 201, r.text
    saved = r.json()
    assert set(saved) >= {"id", "path", "commit"} and saved["title"] == HOSTILE
    assert commits(book.path) == [saved["commit"]]
    assert git(book.path, "show", f"{saved['commit']}:{saved['path']}").count("my words") == 1
    c.post("/api/insights", json={"title": "Other", "body": "unrelated", "tags": ["kv"], "evidence": engine_evidence})
    assert [i["id"] for i in c.get("/api/insights", params={"tag": "attention"}).json()["insights"]] == [saved["id"]]
    assert [i["id"] for i in c.get("/api/insights", params={"q": "MY WORDS"}).json()["insights"]] == [saved["id"]]
    assert len(c.get("/api/insights").json()["insights"]) == 2
    full = c.get(f"/api/insights/{saved['id']}").json()
    assert full["title"] == HOSTILE and full["evidence"] == engine_evidence and full["commit"] == saved["commit"]
    rep = c.post(f"/api/insights/{saved['id']}/replay")
    assert rep.status_code == 200 and rep.json()["matches"] and rep.json()["max_abs_diff"] <= nb.TOLERANCE


def test_http_errors_are_4xx_with_a_message(client, evidence, tiny):
    c, book = client
    ok = {"title": "t", "body": "", "tags": [], "evidence": evidence}
    cases = [
        ({**ok, "extra": 1}, 422, "extra"),
        ({**ok, "title": 5}, 422, "string"),
        ({**ok, "title": "x" * 201}, 422, "200"),
        ({**ok, "tags": ["x" * 33]}, 422, "32"),
        ({**ok, "evidence": {**evidence, "token_id": -1}}, 400, "token_id must be an integer"),
        ({**ok, "title": "  "}, 400, "the title is empty"),
    ]
    for body, status, words in cases:
        r = c.post("/api/insights", json=body)
        assert r.status_code == status and words in r.text, (body.get("title"), r.status_code, r.text)
    assert not (book.path / "insights").exists()  # nothing half-saved
    assert c.get("/api/insights/nope").status_code == 404
    assert c.get("/api/insights/..%2F.git%2Fconfig").status_code == 404
    assert c.get("/api/insights", params={"q": "x" * 201}).status_code == 422
    other = {**evidence, "model": "gpt2"}
    saved = c.post("/api/insights", json={**ok, "evidence": other}).json()
    r = c.post(f"/api/insights/{saved['id']}/replay")
    assert r.status_code == 400 and "saved from model 'gpt2'" in message(r)
    (book.path / ".git" / "index.lock").write_text("")
    r = c.post("/api/insights", json=ok)
    assert r.status_code == 503 and "index is locked" in message(r)


def test_http_push(client, evidence, tmp_path):
    c, book = client
    saved = c.post("/api/insights", json={"title": "t", "body": "", "tags": [], "evidence": evidence}).json()
    r = c.post("/api/insights/push")
    assert r.status_code == 409 and "has no remote" in message(r)
    git(book.path, "remote", "add", "origin", "file:///nonexistent/remote.git")
    r = c.post("/api/insights/push")
    assert r.status_code == 503 and "could not push the notebook to origin" in message(r)
    assert commits(book.path) == [saved["commit"]]
    remote = tmp_path / "ok.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(book.path, "remote", "set-url", "origin", str(remote))
    r = c.post("/api/insights/push")
    assert r.status_code == 200 and r.json()["commit"] == saved["commit"]


# --- CLI ---------------------------------------------------------------------------------

def run(*args: str):
    return CliRunner().invoke(notebook_cli, list(args), catch_exceptions=False)


def test_cli_list_show_replay_push(tmp_path, engine_evidence, tiny_dir):
    root = tmp_path / "nb"
    book = Notebook(root)
    ins = book.save("KV cache", "keys are kept, values too", ["kv"], engine_evidence)
    r = run("list", "--notebook", str(root))
    assert r.exit_code == 0 and ins.id in r.output and "KV cache" in r.output and ins.commit[:10] in r.output
    assert run("list", "nothing-like-this", "--notebook", str(root)).output.strip() == "no insights match"
    assert json.loads(run("list", "--tag", "kv", "--json", "--notebook", str(root)).output)["id"] == ins.id
    r = run("show", ins.id, "--notebook", str(root))
    assert r.exit_code == 0 and "keys are kept, values too" in r.output and "candidates, best first" in r.output
    assert json.loads(run("show", ins.id, "--json", "--notebook", str(root)).output)["evidence"] == engine_evidence
    r = run("replay", ins.id, "--notebook", str(root), "--model", str(tiny_dir))
    assert r.exit_code == 0 and "matches" in r.output, r.output
    tamper(book, ins, 0, 0.5)
    r = run("replay", ins.id, "--notebook", str(root), "--model", str(tiny_dir))
    assert r.exit_code == 1 and "DIFFERS" in r.output and "rank 0" in r.output
    r = run("push", "--notebook", str(root))
    assert r.exit_code == 1 and "has no remote" in r.output
    remote = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(root, "remote", "add", "origin", str(remote))
    r = run("push", "--notebook", str(root))
    assert r.exit_code == 0 and "pushed main" in r.output and "to origin" in r.output


def test_cli_replay_on_the_search_engine(tmp_path, tiny, tiny_dir, evidence):
    from puffergpt.search import load, manifest
    from puffergpt.stores import open_store

    data = tmp_path / "data"
    store = open_store("embedded", data)
    load.load(store, tiny, manifest.model_key(str(tiny_dir)), progress=False)
    store.close()
    ins = Notebook(data / "notebook").save("On the store", "", [], evidence)  # made on numpy, replayed on searches
    r = run("replay", ins.id, "--data", str(data), "--engine", "search", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["matches"] and out["max_abs_diff"] <= nb.TOLERANCE and out["engine"] == "search"


def test_cli_errors_are_one_clear_line(tmp_path):
    r = run("list", "--notebook", str(tmp_path / "absent"))
    assert r.exit_code == 1 and "there is no notebook at" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "absent").exists()
    r = run("list", "--data", str(tmp_path))  # the default: DATA/notebook
    assert r.exit_code == 1 and str(tmp_path / "notebook") in r.output
    Notebook(tmp_path / "nb")
    r = run("show", "../etc", "--notebook", str(tmp_path / "nb"))
    assert r.exit_code == 1 and "no insight" in r.output


def test_cli_reads_notebook_files_as_untrusted(tmp_path, evidence):
    """A file that is not UTF-8, a symbolic link out of the notebook (the file or the
    insights folder): one clear line naming it, never a traceback or the outside file."""
    book = Notebook(tmp_path / "nb")
    ins = book.save("Kept", "my words", [], evidence)
    f = book.path / ins.path
    f.write_bytes(f.read_bytes().replace(b"my words", b"my w\xf6rds"))
    r = run("show", ins.id, "--notebook", str(book.path))
    assert r.exit_code == 1 and f"{ins.path} is not valid UTF-8 (byte 0xf6" in r.output and "Traceback" not in r.output
    assert f"git -C {book.path} checkout -- {ins.path}" in r.output  # the command that restores it
    git(book.path, "checkout", "--", ins.path)
    assert run("show", ins.id, "--notebook", str(book.path)).exit_code == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    f.rename(outside / f.name)
    f.symlink_to(outside / f.name)
    r = run("show", ins.id, "--notebook", str(book.path))
    assert r.exit_code == 1 and f"{ins.path} is a symbolic link" in r.output and "my words" not in r.output
    f.unlink()
    (book.path / "insights").rmdir()
    (book.path / "insights").symlink_to(outside)
    for args in (("show", ins.id), ("list",)):
        r = run(*args, "--notebook", str(book.path))
        assert r.exit_code == 1 and "insights is a symbolic link" in r.output and "my words" not in r.output, r.output
    with pytest.raises(NotebookError, match="symbolic link"):
        book.save("Elsewhere", "", [], evidence)
    assert [p.name for p in outside.iterdir()] == [f.name]  # nothing written through the link


# --- insights from a conversation: no evidence ------------------------------------------

WORDS = "Attention is a weighted average of values.\n\n```json\n{\"not\": \"evidence\"}\n```"


def test_an_insight_without_evidence_saves_reads_lists_and_has_nothing_to_replay(tmp_path, evidence):
    book = Notebook(tmp_path / "nb")
    ins = book.save("From a chat", WORDS, ["attention"])
    assert ins.evidence is None and ins.model is None and commits(book.path) == [ins.commit]
    text = git(book.path, "show", f"{ins.commit}:{ins.path}")
    assert text.startswith("---\nversion: 2\n") and "## Evidence" not in text and "model: null" in text
    assert "No evidence: saved from a conversation." in git(book.path, "log", "-1", "--format=%B")
    back = book.get(ins.id)  # the body's own ```json block is words, not evidence
    assert (back.title, back.body, back.tags, back.evidence) == ("From a chat", WORDS, ["attention"], None)
    assert back.commit == ins.commit
    with_ev = book.save("From the page", "", [], evidence)  # written as format 3
    assert git(book.path, "show", f"HEAD:{with_ev.path}").startswith("---\nversion: 3\n")
    listed = {i.id: i.summary() for i in book.list()}
    assert listed[ins.id]["kind"] is None and listed[ins.id]["evidence"] is False and listed[with_ev.id]["evidence"]
    assert [i.id for i in book.list(query="weighted AVERAGE")] == [ins.id]
    r = nb.replay(back, candidates_at=None)  # nothing is recomputed
    assert r == {"replayable": False, "matches": None, "reason": nb.NOTHING_TO_REPLAY}


def test_an_unknown_format_is_refused_with_a_reason(tmp_path):
    book = Notebook(tmp_path / "nb")
    ins = book.save("t", "b", [])
    path = book.path / ins.path
    path.write_text(path.read_text().replace("version: 2", "version: 5"))
    with pytest.raises(NotebookError, match=r"format 5; this puffergpt reads formats 1, 2, 3, 4: upgrade puffergpt "
                                            r"\(pip install -U puffergpt\)"):
        book.get(ins.id)


def test_http_saves_an_insight_without_evidence(client):
    c, book = client
    r = c.post("/api/insights", json={"title": "From a chat", "body": "words", "tags": ["x"]})
    assert r.status_code == 201, r.text
    saved = r.json()
    assert saved["evidence"] is False and saved["kind"] is None and commits(book.path) == [saved["commit"]]
    assert c.get(f"/api/insights/{saved['id']}").json()["evidence"] is None
    assert [i["id"] for i in c.get("/api/insights").json()["insights"]] == [saved["id"]]
    rep = c.post(f"/api/insights/{saved['id']}/replay")
    assert rep.status_code == 200 and rep.json()["replayable"] is False and "nothing to replay" in rep.json()["reason"]
    for body, status, words in [({"body": "b"}, 422, "title"), ({"title": " "}, 400, "the title is empty"),
                                ({"title": "t", "evidence": {"kind": "token"}}, 400, "evidence  lacks model"),
                                ({"title": "t", "tags": "one"}, 422, "list")]:
        r = c.post("/api/insights", json=body)
        assert r.status_code == status and words in r.text, (body, r.status_code, r.text)


def test_cli_shows_and_replays_an_insight_without_evidence(tmp_path):
    book = Notebook(tmp_path / "nb")
    ins = book.save("From a chat", "words", [])
    r = run("list", "--notebook", str(book.path))
    assert r.exit_code == 0 and nb.NO_EVIDENCE in r.output
    r = run("show", ins.id, "--notebook", str(book.path))
    assert r.exit_code == 0 and "words" in r.output and nb.NO_EVIDENCE in r.output
    r = run("replay", ins.id, "--notebook", str(book.path))
    assert r.exit_code == 0 and r.output.strip() == f"{ins.id}: {nb.NOTHING_TO_REPLAY}"
    r = run("replay", ins.id, "--json", "--notebook", str(book.path))
    assert json.loads(r.output)["replayable"] is False


# --- saves retried safely (issue 43): the same Idempotency-Key, the same insight -------------------

def test_a_save_retried_with_its_key_returns_the_same_insight(tmp_path, evidence):
    root = tmp_path / "nb"
    book = Notebook(root)
    first = book.save("Heads copy", "my words", ["attention"], evidence, key="retry-me-0001")
    again = book.save("Heads copy", "my words", ["attention"], evidence, key="retry-me-0001")
    assert (again.id, again.path, again.commit) == (first.id, first.path, first.commit)
    assert len(list((root / "insights").glob("*.md"))) == 1 and commits(root) == [first.commit]
    other = book.save("Heads copy", "my words", ["attention"], evidence, key="another-key")  # a new key: a new one
    assert other.id != first.id and len(commits(root)) == 2
    assert "retry-me" not in (root / first.path).read_text(encoding="utf-8")  # only a digest of the key is kept
    assert "request" not in book.get(first.id).to_json()
    with pytest.raises(InvalidInsight, match="saved another insight"):
        book.save("Something else", "", [], evidence, key="retry-me-0001")
    for bad in ("", "has space", "x" * 256):
        with pytest.raises(InvalidInsight, match="Idempotency-Key"):
            book.save("t", "", [], evidence, key=bad)


def test_a_save_whose_commit_failed_is_committed_by_its_retry_not_saved_twice(tmp_path, evidence):
    """The issue's case: a save answered 503 (git, a full disk) may have written its file; the client
    retries as told, with its key: one insight, committed now, the same id."""
    root = tmp_path / "nb"
    book = Notebook(root)
    lock = root / ".git" / "index.lock"
    lock.write_text("")
    with pytest.raises(GitError, match="index is locked"):
        book.save("Stuck", "kept on disk", [], evidence, key="key-of-the-save")
    lock.unlink()
    retry = Notebook(root).save("Stuck", "kept on disk", [], evidence, key="key-of-the-save")  # another server, say
    assert len(list((root / "insights").glob("*.md"))) == 1 and retry.commit == commits(root)[0]
    assert git(root, "show", "--name-only", "--format=", retry.commit).split() == [retry.path]
    assert git(root, "status", "--porcelain") == ""


def test_http_save_takes_an_idempotency_key(client, evidence):
    c, book = client
    body = {"title": "Once", "body": "", "tags": [], "evidence": evidence}
    a = c.post("/api/insights", json=body, headers={"Idempotency-Key": "7d9c1f0e-retry"})
    b = c.post("/api/insights", json=body, headers={"Idempotency-Key": "7d9c1f0e-retry"})
    assert a.status_code == b.status_code == 201 and a.json() == b.json(), (a.text, b.text)
    assert len(c.get("/api/insights").json()["insights"]) == 1
    bad = c.post("/api/insights", json=body, headers={"Idempotency-Key": "x" * 300})
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"] and "xxxx" not in bad.text
    other = c.post("/api/insights", json={**body, "title": "Twice"}, headers={"Idempotency-Key": "7d9c1f0e-retry"})
    assert other.status_code == 400 and "saved another insight" in other.json()["error"]["message"]
