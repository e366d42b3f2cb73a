"""The notebook's files opened safely (issue 31): a directory named like an insight (a
pulled notebook can carry one) is skipped in the list and refused by id, with no open
descriptor left behind; a temporary file a kill -9 left mid-save is cleaned when the
notebook opens; a front matter's title that is a list is named as the title's problem.

The descriptor counts are the process's own (/proc/self/fd), before and after 1,000
requests: the leak this guards against was one descriptor per request."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient

from helpers import message
from puffergpt import notebook as nb
from puffergpt.cli.notebook import notebook as notebook_cli
from puffergpt.notebook import Notebook, NotebookError
from puffergpt.server import errors
from puffergpt.server.playground.notebook import notebook_router

DIR_ID = "2099-01-01-000000-dir-abcdef"  # the probe's name: newest first, so listed before the rest


def no_replay(*_):
    raise AssertionError("nothing here has evidence: replay must not recompute")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def odd(tmp_path):
    """A notebook with one insight and a directory named like an insight: (notebook, good id)."""
    book = Notebook(tmp_path / "nb")
    good = book.save("Attention is a search", "over the text's own keys", ["attention"]).id
    (book.path / nb.INSIGHTS / f"{DIR_ID}.md").mkdir()
    return book, good


@pytest.fixture
def client(odd):
    book, good = odd
    app = FastAPI()
    errors.add_handlers(app)  # as create_app has them: every error an ErrorBody
    app.include_router(notebook_router(book, no_replay))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, book, good


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors through /proc/self/fd (Linux)")
def test_a_directory_named_like_an_insight_leaks_no_descriptor_over_1000_requests(client):
    c, book, good = client
    for _ in range(3):  # the client's and the app's own descriptors opened once, before counting
        c.get("/api/insights")
        c.get(f"/api/insights/{DIR_ID}")
    before = open_fds()
    statuses = set()
    for i in range(1000):
        r = c.get("/api/insights") if i % 2 else c.get(f"/api/insights/{DIR_ID}")
        statuses.add(r.status_code)
    after = open_fds()
    print(f"open descriptors: {before} before, {after} after 1,000 requests (500 lists, 500 gets)")
    assert statuses == {200, 409}, statuses
    assert after == before, f"{after - before} descriptors leaked over 1,000 requests ({before} -> {after})"


def test_a_directory_named_like_an_insight_is_409_by_id_and_skipped_in_the_list(client, caplog):
    c, book, good = client
    for r in (c.get(f"/api/insights/{DIR_ID}"), c.post(f"/api/insights/{DIR_ID}/replay")):
        detail = message(r)
        assert r.status_code == 409, (r.status_code, r.text[:300])
        assert f"insights/{DIR_ID}.md" in detail and "is a directory" in detail and "move it out" in detail, detail
    with caplog.at_level(logging.WARNING, logger="puffergpt.notebook"):
        r = c.get("/api/insights")
    assert r.status_code == 200 and [i["id"] for i in r.json()["insights"]] == [good]
    assert any(f"{DIR_ID}.md" in m and "is a directory" in m for m in caplog.messages), caplog.messages
    assert c.get(f"/api/insights/{good}").status_code == 200  # the rest of the notebook still reads


def test_the_cli_names_a_directory_named_like_an_insight(odd):
    book, good = odd
    run = CliRunner().invoke
    r = run(notebook_cli, ["show", DIR_ID, "--notebook", str(book.path)], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    assert f"insights/{DIR_ID}.md is a directory" in r.output and "Errno" not in r.output, r.output
    r = run(notebook_cli, ["list", "--json", "--notebook", str(book.path)], catch_exceptions=False)
    assert r.exit_code == 0 and good in r.output and DIR_ID not in r.output, r.output


def test_every_refused_file_kind_is_closed_on_its_way_out(odd):
    """Each kind of file that is not an insight (a directory, a FIFO, a link, one too big,
    not UTF-8) is refused through every path without a descriptor left open."""
    book, good = odd
    folder = book.path / nb.INSIGHTS
    text = (folder / f"{good}.md").read_text()
    kinds = {"fifo": "not a regular file", "link": "symbolic link", "big": "more than", "utf8": "UTF-8",
             "dir": "is a directory"}
    os.mkfifo(folder / "2099-01-01-000000-fifo-aaaaaa.md")
    (folder / "2099-01-01-000000-link-aaaaaa.md").symlink_to(folder / f"{good}.md")
    (folder / "2099-01-01-000000-big-aaaaaa.md").write_text(text + "w" * nb.MAX_FILE_BYTES)
    (folder / "2099-01-01-000000-utf8-aaaaaa.md").write_bytes(text.encode() + b"\xff")
    before = open_fds()
    for _ in range(50):
        for kind, words in kinds.items():
            iid = DIR_ID if kind == "dir" else f"2099-01-01-000000-{kind}-aaaaaa"
            with pytest.raises(NotebookError, match=words):
                book.get(iid)
        assert [i.id for i in book.list()] == [good]
    assert open_fds() == before


# --- a temporary file left by a kill -9 mid-save ---

def test_a_temporary_file_left_mid_save_is_removed_when_the_notebook_opens(tmp_path):
    book = Notebook(tmp_path / "nb")
    good = book.save("Kept", "", [])
    folder = book.path / nb.INSIGHTS
    stale, fresh = folder / ".2024-01-01-000000-lost-aaaaaa.tmp", folder / ".2024-01-01-000000-busy-bbbbbb.tmp"
    stale.write_text("---\nversion: 2\n")  # half a save: the process died before the link
    fresh.write_text("---\n")  # another process's save, still writing
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    others = [folder / "notes.tmp", folder / ".not an id.tmp"]  # not a name a save makes: not ours to remove
    for f in others:
        f.write_text("x")
        os.utime(f, (hour_ago, hour_ago))
    Notebook(book.path, create=False)
    assert not stale.exists()
    assert fresh.exists() and all(f.exists() for f in others)
    assert [i.id for i in Notebook(book.path).list()] == [good.id]


def test_a_save_killed_mid_write_leaves_nothing_after_the_next_open(tmp_path):
    """The real thing: a child process saving, killed with SIGKILL between writing the
    temporary file and linking it; the next open (once the file is stale) removes it."""
    root = tmp_path / "nb"
    Notebook(root)
    child = (
        "import os, sys\n"
        "from puffergpt.notebook import files\n"
        "real_link = os.link\n"
        "def die(*a, **k):\n"
        "    os.kill(os.getpid(), 9)\n"  # SIGKILL: no finally runs, as with kill -9
        "os.link = die\n"
        "from puffergpt.notebook import Notebook\n"
        "Notebook(sys.argv[1]).save('Lost', 'half written', [])\n"
    )
    r = subprocess.run([sys.executable, "-c", child, str(root)], capture_output=True, text=True, timeout=60)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])
    left = list((root / nb.INSIGHTS).glob(".*.tmp"))
    assert len(left) == 1, left  # what issue 31's probe found
    old = time.time() - 2 * nb.files.STALE_TMP_S
    os.utime(left[0], (old, old))
    Notebook(root, create=False)
    assert list((root / nb.INSIGHTS).iterdir()) == []


# --- the front matter's wording ---

def test_a_title_given_as_a_yaml_alias_list_is_named_as_the_title(tmp_path):
    book = Notebook(tmp_path / "nb")
    ins = book.save("A title", "words", ["attention", "heads"])
    f = book.path / ins.path
    text = f.read_text()
    # an anchor on the id's line, the title an alias of a list: a list where a title goes
    aliased = text.replace(f"id: {ins.id}\n", f"id: {ins.id}\nx: &words [one, two]\n", 1).replace(
        "title: A title\n", "title: *words\n", 1)
    assert aliased != text
    f.write_text(aliased)
    with pytest.raises(NotebookError) as e:
        book.get(ins.id)
    msg = str(e.value)
    assert "title" in msg and "tags" not in msg, msg
    assert "list" in msg, msg  # what it is, not only what it should be
    f.write_text(text.replace("tags:\n- attention\n- heads\n", "tags: {a: b}\n", 1))
    with pytest.raises(NotebookError, match="tags must be a list of words") as e:
        book.get(ins.id)
    assert "title" not in str(e.value).split(": ", 1)[1], str(e.value)
