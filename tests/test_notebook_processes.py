"""Several processes opening and saving into one notebook at once (issue 32, item 3: several servers over
one notebook directory): every insight is written and committed, none lost, no save refused
for git's index.lock, none refused for a repository another is making. Each save holds an flock on
.git/puffergpt.lock (``Notebook._exclusive``), an opening one on the notebook's directory;
tests/stores/test_pg_servers.py does it through two real servers."""

from __future__ import annotations

import subprocess
import sys

from puffergpt.notebook import Notebook

SAVER = """
import sys
from puffergpt.notebook import Notebook
print("ready", flush=True)
sys.stdin.readline()  # all savers start together, each opening the notebook (made by the first)
book = Notebook(sys.argv[1])
for i in range(int(sys.argv[3])):
    book.save(f"{sys.argv[2]} insight {i}", "words", ["proc"])
print("saved", flush=True)
"""


def test_processes_making_and_saving_into_one_notebook_at_once_lose_nothing(tmp_path):
    """Three servers started on one new notebook directory: one makes the repository, the others
    find it made; then they all save at once."""
    n, names = 12, ("first", "second", "third")
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path / "nb"), name, str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in names]
    try:
        assert all(p.stdout.readline().strip() == "ready" for p in procs)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    book = Notebook(tmp_path / "nb")
    got = book.list()
    assert sorted(i.title for i in got) == sorted(f"{name} insight {i}" for name in names for i in range(n))
    assert all(i.commit for i in got)  # each committed
    log = subprocess.run(["git", "-C", str(tmp_path / "nb"), "log", "--format=%s"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(log) == len(names) * n  # one commit a save
    status = subprocess.run(["git", "-C", str(tmp_path / "nb"), "status", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout
    assert status == ""  # nothing left uncommitted, the lock file inside .git unseen
