"""Lessons (lens/lessons.py, lessons/*.yaml): every lesson runs on the demo and every claim holds on
its starter; on a prompt where the copying story fails, the lesson says so; claims are computed
(the head found is the demo's copying head, the numbers in the claim are the evidence's); a bad
lesson file is refused by name; the HTTP routes, the CLI and the MCP tools answer the contract;
patching over HTTP streams its runs and can be stopped."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from puffergpt.cli import main
from puffergpt.lens import lessons
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from test_demo_model import COPY_HEAD, COPY_LAYER, COPY_PROMPT

FAILS = "x = 4\nk = 8\nm = 2\nx = 4\nk ="  # the demo answers " 2", not the " 8" to copy


def numpy_run(demo, lesson_id: str, prompt: str | None = None) -> dict:
    return lessons.run(lessons.get(lesson_id), lambda: Run(NumpyWeights(demo)), demo.config, prompt)


def test_there_are_at_least_five_lessons_each_a_file():
    got = lessons.load()
    assert len(got) >= 5
    assert {"prefill-decode", "temperature", "copying-head", "context", "save-insight"} <= set(got)
    assert sorted(p.stem for p in lessons.folder().glob("*.yaml")) == sorted(got)


@pytest.mark.parametrize("lesson_id", sorted(lessons.load()))
def test_every_claim_holds_on_the_starter(demo, lesson_id):
    got = numpy_run(demo, lesson_id)
    assert got["prompt"] == lessons.get(lesson_id).starter
    assert len(got["steps"]) == len(lessons.get(lesson_id).steps)
    for step in got["steps"]:
        assert step["holds"], f"{lesson_id}: {step['title']}: {step['claim']}"
        assert step["claim"] and step["evidence"]
    json.dumps(got["steps"])  # plain JSON: the page, the API and the CLI print it


def test_the_copying_lesson_finds_the_demos_head_and_fills_the_claims_from_the_numbers(demo):
    steps = numpy_run(demo, "copying-head")["steps"]
    found = steps[1]["evidence"]
    assert (found["layer"], found["head"]) == (COPY_LAYER, COPY_HEAD)
    assert f"L{COPY_LAYER} H{COPY_HEAD}" in steps[1]["claim"] and f"{found['weight']:.0%}" in steps[1]["claim"]
    assert f"{steps[5]['evidence']['restored']:.0%}" in steps[5]["claim"]
    assert all(s["evidence"]["layer"] == COPY_LAYER for s in steps[2:])  # the later steps test the head found


def test_on_a_prompt_where_the_copying_story_fails_the_lesson_says_so(demo):
    steps = numpy_run(demo, "copying-head", FAILS)["steps"]
    first = steps[0]
    assert not first["holds"]
    assert "' 2', not ' 8'" in first["claim"] and "does not hold" in first["claim"]
    assert first["evidence"]["answer"]["text"] == " 2" and first["evidence"]["target"]["text"] == " 8"
    assert not steps[3]["holds"], "switching a head off can't show the copy needs it when there is no copy"


def test_a_prompt_with_nothing_to_copy_says_why(demo):
    steps = numpy_run(demo, "copying-head", "The cat sat on the mat")["steps"]
    assert not any(s["holds"] for s in steps)
    assert "does not occur earlier" in steps[0]["claim"]


@pytest.mark.parametrize("text,says", [
    ("title: x\n", "'summary' must be some text"),
    ("title: x\nsummary: y\nstarter: z\nsteps: []\n", "'steps' must be a list of at least one step"),
    ("title: x\nsummary: y\nstarter: z\nsteps:\n  - {title: a, view: nowhere, say: b, check: copies}\n",
     "view 'nowhere' is not one of"),
    ("title: x\nsummary: y\nstarter: z\nsteps:\n  - {title: a, view: lens, say: b, check: magic}\n",
     "check 'magic' is not one of"),
    ("title: x\nsummary: y\nstarter: z\ncolour: red\nsteps: []\n", "unknown keys colour"),
    ("title: [x\n", "is not valid YAML"),
])
def test_a_bad_lesson_file_is_refused_by_name(text, says):
    with pytest.raises(lessons.LessonError) as e:
        lessons.parse("mine", text)
    assert "lesson 'mine'" in str(e.value) and says in str(e.value)


MINE = ("order: 0\ntitle: Mine\nsummary: s\nstarter: 'a = 7\\nb = 3\\na = 7\\nb ='\nsteps:\n"
        "  - {title: t, view: candidates, say: s, check: copies}\n")


def test_a_teachers_folder_adds_its_lessons_beside_the_shipped_and_replaces_by_name(tmp_path):
    (tmp_path / "my-lesson.yaml").write_text(MINE)
    (tmp_path / "temperature.yaml").write_text(MINE.replace("Mine", "Our temperature"))
    got = lessons.load(tmp_path)
    assert list(got)[0] == "my-lesson" and got["my-lesson"].steps[0].check == "copies"
    assert set(lessons.load()) < set(got), "the shipped lessons stay listed"
    assert got["temperature"].title == "Our temperature" and lessons.get("temperature").title != "Our temperature"


@pytest.mark.parametrize("make,says", [
    (lambda d: None, "holds no lesson"),
    (lambda d: (d / "x.yaml").write_text("title: [unclosed"), "x.yaml"),
    (lambda d: (d / "x.yaml").write_bytes(b"\xff\xfe"), "not UTF-8"),
])
def test_a_teachers_bad_folder_is_refused_naming_the_file(tmp_path, make, says):
    make(tmp_path)
    with pytest.raises(lessons.LessonError, match=says):
        lessons.check_folder(tmp_path)
    with pytest.raises(lessons.LessonError, match="not a folder of lessons"):
        lessons.check_folder(tmp_path / "nowhere")


def test_serve_and_the_cli_read_a_teachers_folder(tmp_path, loaded, demo):
    (tmp_path / "my-lesson.yaml").write_text(MINE)
    store, key = loaded(demo)
    from puffergpt.server import ServerConfig

    with TestClient(create_app(open_engine(store, demo.name, key), ServerConfig(lessons_dir=tmp_path))) as c:
        assert c.get("/api/lessons").json()[0] == {"id": "my-lesson", "title": "Mine", "steps": 1}
        ran = c.post("/api/lessons/my-lesson/run", json={})
        assert ran.status_code == 200 and ran.json()["steps"][0]["holds"] is True, ran.text
    run = CliRunner().invoke(main, ["lesson", "--lessons", str(tmp_path), "--model", "demo", "--engine", "reference",
                                    "--json", "my-lesson"], env={"PUFFERGPT_DATA": None})
    assert run.exit_code == 0 and json.loads(run.stdout)["steps"][0]["holds"] is True, run.output
    bad = CliRunner().invoke(main, ["lesson", "--lessons", str(tmp_path / "nowhere"), "my-lesson"])
    assert bad.exit_code != 0 and "not a folder of lessons" in bad.output, bad.output
    env = CliRunner().invoke(main, ["lesson"], env={"PUFFERGPT_LESSONS": str(tmp_path)})
    assert env.exit_code == 0 and "my-lesson" in env.output, env.output


@pytest.fixture(scope="module")
def client(loaded, demo):
    store, key = loaded(demo)
    with TestClient(create_app(open_engine(store, demo.name, key))) as c:
        yield c


def test_the_lessons_over_http(client):
    listed = client.get("/api/lessons").json()
    assert len(listed) >= 5 and all(set(x) == {"id", "title", "steps"} for x in listed)
    one = client.get("/api/lessons/copying-head").json()
    assert one["starter"] == COPY_PROMPT and [s["view"] for s in one["steps"]][:2] == ["candidates", "attention"]
    r = client.post("/api/lessons/copying-head/run", json={"prompt": FAILS})
    assert r.status_code == 200, r.text
    steps = r.json()["steps"]
    assert {"title", "claim", "holds", "evidence"} <= set(steps[0]) and steps[0]["holds"] is False
    assert r.json()["requests"] > 0, "each step's forward passes are searches, counted"
    ok = client.post("/api/lessons/copying-head/run", json={}).json()
    assert all(s["holds"] for s in ok["steps"])
    missing = client.get("/api/lessons/nowhere")
    assert missing.status_code == 404 and "there is no lesson 'nowhere'" in missing.json()["error"]["message"]
    long = client.post("/api/lessons/copying-head/run", json={"prompt": " a" * 100})
    assert long.status_code == 400 and "at most 64 tokens" in long.json()["error"]["message"]


@pytest.mark.parametrize("lesson_id", sorted(lessons.load()))
def test_every_claim_holds_on_the_starter_through_the_searches(client, lesson_id):
    """The same lessons on the search engine, over HTTP: each claim holds, and it cost requests."""
    got = client.post(f"/api/lessons/{lesson_id}/run", json={}).json()
    assert all(s["holds"] for s in got["steps"]), [s["claim"] for s in got["steps"] if not s["holds"]]
    assert got["requests"] > 0


def events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_patching_over_http_proposes_then_streams_its_runs(client, demo):
    clean, corrupt = COPY_PROMPT, COPY_PROMPT.replace("b = 3", "b = 5")
    p = client.post("/api/patching/propose", json={"clean": clean, "corrupt": corrupt}).json()
    assert (p["answer"]["text"], p["wrong"]["text"]) == (" 3", " 5")
    c = demo.config
    assert p["runs"] == {"positions": 2 + (c.n_layer + 1) * len(p["clean"]), "heads": 2 + c.n_layer * c.n_head}
    r = client.post("/api/patching", json={"clean": clean, "corrupt": corrupt, "answer": " 3", "wrong": " 5",
                                           "mode": "heads"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    got = events(r.text)
    assert got[0][0] == "start" and got[0][1]["runs"] == p["runs"]["heads"]
    assert [e for e, _ in got[1:-1]] == ["run"] * (c.n_layer * c.n_head) and got[-1][0] == "done"
    grid = got[-1][1]["heads"]
    assert grid[COPY_LAYER]["restored"][COPY_HEAD] == max(max(row["restored"]) for row in grid)
    assert got[-1][1]["requests"] >= p["runs"]["heads"] * (1 + 5 * c.n_layer)
    bad = client.post("/api/patching/propose", json={"clean": "a = 7", "corrupt": "a = 7\nb"})
    assert bad.status_code == 400 and "3 tokens and the corrupted one 5" in bad.json()["error"]["message"]


def test_lesson_cli_prints_each_claim_with_its_verdict(demo):
    run = CliRunner().invoke(main, ["lesson", "--model", "demo", "--engine", "reference", "--json", "copying-head",
                                    FAILS], env={"PUFFERGPT_DATA": None})
    assert run.exit_code == 0, run.output
    got = json.loads(run.stdout)
    assert got["steps"][0]["holds"] is False and set(got["steps"][0]) == {"title", "claim", "holds", "evidence"}
    text = CliRunner().invoke(main, ["lesson", "--model", "demo", "--engine", "reference", "temperature"],
                              env={"PUFFERGPT_DATA": None})
    assert text.exit_code == 0 and "holds" in text.output and "Temperature divides every logit" in text.output
    listed = CliRunner().invoke(main, ["lesson"])
    assert listed.exit_code == 0 and "copying-head" in listed.output
    bad = CliRunner().invoke(main, ["lesson", "nowhere"])
    assert bad.exit_code != 0 and "there is no lesson 'nowhere'" in bad.output
