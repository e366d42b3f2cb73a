"""The git-backed ``Notebook``: insight files written and committed in one step, read
back as untrusted (through the insights folder's descriptor, never a link), listed,
pushed. git runs as the ``git`` binary with argument lists (never a shell)."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import logging
import os
import secrets
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from puffergpt.notebook import files
from puffergpt.notebook.checks import check_body, check_evidence, check_id, check_tags, check_title, slug
from puffergpt.notebook.fileformat import parse, render
from puffergpt.notebook.insight import (
    DEFAULT_EMAIL,
    DEFAULT_NAME,
    GIT_TIMEOUT_S,
    ID_RE,
    INSIGHTS,
    MAX_QUERY_CHARS,
    PUSH_TIMEOUT_S,
    GitError,
    Insight,
    InsightNotFound,
    InvalidInsight,
    NotebookError,
)

log = logging.getLogger("puffergpt.notebook")


class Notebook:
    """A git repository of insight files. ``path`` is initialised as a repository when it
    is absent or empty (with ``create``); a non-empty directory that is not a repository
    of its own is refused. ``git`` is the git binary to run."""

    def __init__(self, path: str | Path, create: bool = True, git: str = "git"):
        self.path = Path(path).expanduser().absolute()
        self.git_binary = git
        self.lock = threading.Lock()  # one save or push at a time in this process (``_exclusive``)
        self._open(create)
        files.remove_stale(self.path)

    def _open(self, create: bool) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise NotebookError(f"{p} is a file, not a notebook directory: pick a directory")
        if not p.exists() and not create:
            raise NotebookError(f"there is no notebook at {p} yet: save an insight first (or give --notebook DIR)")
        p.mkdir(parents=True, exist_ok=True)
        # Several servers starting on one new notebook: one makes the repository, the others find it made.
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._open_locked(create)
        finally:
            os.close(fd)

    def _open_locked(self, create: bool) -> None:
        p = self.path
        if (p / ".git").exists():
            top = self._git("rev-parse", "--show-toplevel", what="read the notebook repository").strip()
            if Path(top).resolve() != p.resolve():
                raise NotebookError(
                    f"{p} is inside the git repository {top}, not one of its own: pick another directory"
                )
            return
        if p.exists() and any(p.iterdir()):
            raise NotebookError(f"{p} is not empty and is not a git repository: use an empty (or new) directory "
                                "for the notebook, or an existing notebook repository")
        if not create:
            raise NotebookError(f"there is no notebook at {p} yet: save an insight first (or give --notebook DIR)")
        self._git("init", "-q", "-b", "main", what="initialise the notebook repository")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One save or push at a time, in this process and across processes (several servers may
        share one notebook): git's index is one file, and a second ``git add`` would fail on its
        index.lock. An flock on .git/puffergpt.lock, released when the file closes (a process that
        dies lets go of it)."""
        with self.lock:
            lock = self.path / ".git" / "puffergpt.lock"
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            except OSError as e:
                raise files.unavailable(self.path, e, f"lock the notebook for a save ({lock})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    # --- git ---

    def _git(self, *args: str, what: str, timeout: float = GIT_TIMEOUT_S, env: dict | None = None) -> str:
        """Run git in the notebook with an argument list; GitError says what failed and why."""
        try:
            cmd = [self.git_binary, "-C", str(self.path), *self._identity(args), *args]
            r = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace",
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise GitError(
                f"could not {what}: git is not installed (no {self.git_binary!r} on PATH); install git"
            ) from None
        except subprocess.TimeoutExpired:
            raise GitError(f"could not {what}: git took more than {timeout:.0f} s") from None
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            if "index.lock" in err:
                raise GitError(
                    f"could not {what}: git's index is locked ({self.path / '.git' / 'index.lock'} exists). "
                    "Another git command is running in the notebook, or one crashed: "
                    "if none is running, delete that file"
                )
            raise GitError(f"could not {what}: git {args[0]} failed: {err[-800:] or f'exit status {r.returncode}'}")
        return r.stdout

    def _identity(self, args: tuple[str, ...]) -> list[str]:
        """``-c user.name=... -c user.email=...`` where the user's git has none, for commits."""
        if args[0] != "commit":
            return []
        out = []
        for key, default in (("user.name", DEFAULT_NAME), ("user.email", DEFAULT_EMAIL)):
            r = subprocess.run([self.git_binary, "-C", str(self.path), "config", "--get", key],
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if r.returncode != 0 or not r.stdout.strip():
                out += ["-c", f"{key}={default}"]
        return out

    def _pending(self) -> list[str]:
        """Insight files not committed as they are (a save whose commit failed), posix paths."""
        out = self._git(
            "status", "--porcelain", "-z", "--untracked-files=all", "--", INSIGHTS, what="read the notebook's status"
        )
        paths = [e[3:] for e in out.split("\0") if len(e) > 3 and e[1] != "D" and e[0] != "D"]
        return sorted(
            p for p in paths if PurePosixPath(p).suffix == ".md" and PurePosixPath(p).parent == PurePosixPath(INSIGHTS)
        )

    def _commit(self, message: str) -> str:
        files = self._pending()
        if not files:
            raise NotebookError("nothing to commit")  # save always has its new file
        self._git("add", "--", *files, what="stage the insight")
        self._git("commit", "-q", "-m", message, "--", *files, what="commit the insight")
        return self._git("rev-parse", "HEAD", what="read the commit").strip()

    # --- insights ---

    def save(self, title: str, body: str, tags: Sequence[str] | None, evidence: dict | None = None,
             key: str | None = None) -> Insight:
        """Write one insight file and commit it (with any earlier uncommitted ones). On a
        git failure the file stays and GitError says where; the next save commits it.
        ``evidence`` None is an insight from a conversation: the words only. ``key``: the
        client's idempotency key (``check_key``): a save retried with it (its answer lost, or a
        503 after the file was written) returns the insight the first one saved, committed."""
        ev = None if evidence is None else check_evidence(evidence)
        ins = Insight(id="", path="", title=check_title(title), body=check_body(body), tags=check_tags(tags),
                      date=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
                      model=ev["model"] if ev else None, evidence=ev, request=request_digest(key))
        with self._exclusive():
            if ins.request is not None and (saved := self._saved(ins)) is not None:
                return saved
            self._write(ins)
            earlier = [f for f in self._pending_or_empty() if f != ins.path]
            message = self._message(ins, earlier)
            try:
                ins.commit = self._commit(message)
            except GitError as e:
                raise GitError(f"the insight is saved in {self.path / ins.path} but not committed ({e}). "
                               "It will be committed with the next save.") from None
        return ins

    def _saved(self, ins: Insight) -> Insight | None:
        """The insight an earlier save with ins's key wrote (committed now if it was not), or
        None; InvalidInsight if that key saved other words (the lock held)."""
        old = next((i for i in self._read_all() if i.request == ins.request), None)
        if old is None:
            return None
        if (old.title, old.body.strip("\n"), old.tags) != (ins.title, ins.body.strip("\n"), ins.tags):
            raise InvalidInsight(f"this Idempotency-Key saved another insight ({old.id}): use a new key for a new "
                                 "insight, the same one only to retry the same save")
        old.commit = self._commits().get(old.path)
        if old.commit is None:  # the first save wrote the file, and its commit failed
            try:
                old.commit = self._commit(self._message(old, [f for f in self._pending_or_empty() if f != old.path]))
            except GitError as e:
                raise GitError(f"the insight is saved in {self.path / old.path} but not committed ({e}). "
                               "It will be committed with the next save.") from None
        return old

    def _pending_or_empty(self) -> list[str]:
        try:
            return self._pending()
        except GitError:
            return []  # the commit below reports git's failure

    def _write(self, ins: Insight) -> None:
        """Write the file under a new id; never over another insight's file, never through
        a link, nothing left half-written when the disk refuses."""
        stamp = ins.date[:19].replace(":", "").replace("T", "-")  # 2025-01-02-153000
        with files.insights_folder(self.path, create=True) as folder:
            for _ in range(8):
                ins.id = f"{stamp}-{slug(ins.title)}-{secrets.token_hex(3)}"
                ins.path = f"{INSIGHTS}/{ins.id}.md"
                try:
                    if files.write_new(folder, ins.id, render(ins)):
                        return
                except OSError as e:
                    raise files.unavailable(self.path, e, f"write the insight in {self.path / INSIGHTS}") from None
        raise NotebookError("could not find a free file name for the insight: try again")

    @staticmethod
    def _message(ins: Insight, earlier: list[str]) -> str:
        ev = ins.evidence
        lines = [f"Insight: {ins.title}", "",
                 f"{ev['kind']} evidence from {ev['model']} at position {ev['position']} "
                 f"(token {ev['token_id']}, {len(ev['candidates'])} candidates)." if ev
                 else "No evidence: saved from a conversation."]
        if ins.tags:
            lines.append(f"Tags: {', '.join(ins.tags)}")
        lines.append(f"File: {ins.path}")
        if earlier:
            lines += ["", "Also commits insight files not committed before (an earlier commit failed):", *earlier]
        return "\n".join(lines) + "\n"

    def get(self, insight_id: str) -> Insight:
        name = f"{check_id(insight_id)}.md"
        with files.insights_folder(self.path) as folder:
            try:
                text = None if folder is None else files.read(self.path, folder, name)
            except FileNotFoundError:
                text = None
        if text is None:
            raise InsightNotFound(f"no insight {insight_id!r} in {self.path}")
        ins = parse(text, f"{INSIGHTS}/{name}")
        ins.commit = self._commits().get(ins.path)
        return ins

    def list(self, query: str | None = None, tag: str | None = None) -> list[Insight]:
        """Insights, newest first; ``query`` matches title, body and tags (any case), ``tag``
        one tag. A file that does not read is left out with a warning in the log."""
        if query is not None and len(query) > MAX_QUERY_CHARS:
            raise InvalidInsight(f"the search has {len(query)} characters, at most {MAX_QUERY_CHARS}")
        q, t = (query or "").strip().casefold(), (tag or "").strip().casefold()
        commits, out = self._commits(), []
        for ins in self._read_all():
            if t and t not in (x.casefold() for x in ins.tags):
                continue
            if q and q not in "\n".join([ins.title, ins.body, *ins.tags]).casefold():
                continue
            ins.commit = commits.get(ins.path)
            out.append(ins)
        return sorted(out, key=lambda i: (i.date, i.id), reverse=True)

    def _read_all(self) -> Iterator[Insight]:
        """Every insight file that reads; one that does not is left out with a warning."""
        with files.insights_folder(self.path) as folder:
            for name in [] if folder is None else sorted(os.listdir(folder)):
                if not (name.endswith(".md") and ID_RE.fullmatch(name[:-3])):
                    continue
                try:
                    yield parse(files.read(self.path, folder, name), f"{INSIGHTS}/{name}")
                except (NotebookError, OSError) as e:
                    log.warning("skipping %s: %s", self.path / INSIGHTS / name, e)

    def _commits(self) -> dict[str, str]:
        """The latest commit of each insight file, from one git log."""
        try:
            out = self._git("log", "--format=%x00%H", "--name-only", "--", INSIGHTS, what="read the notebook's history")
        except GitError as e:
            if "does not have any commits" in str(e) or "bad default revision" in str(e):
                return {}
            raise
        latest: dict[str, str] = {}
        for block in out.split("\0")[1:]:
            sha, *files = block.strip().split("\n")
            for f in files:
                latest.setdefault(f.strip(), sha)
        return latest

    def push(self) -> dict:
        """Commit what an earlier save left uncommitted, then push to the remote with the
        user's own git setup. A failed push is a GitError; the commits stay."""
        with self._exclusive():
            remotes = self._git("remote", what="read the notebook's remotes").split()
            if not remotes:
                raise NotebookError(f"the notebook at {self.path} has no remote: add one with "
                                    f"`git -C {self.path} remote add origin URL`, then push again")
            if self._pending():
                self._commit("Insights saved earlier whose commit had failed\n")
            if not self._commits():
                raise NotebookError(f"the notebook at {self.path} has no insights yet: nothing to push")
            branch = self._git("rev-parse", "--abbrev-ref", "HEAD", what="read the notebook's branch").strip()
            upstream = self._upstream()
            remote = upstream.split("/", 1)[0] if upstream else ("origin" if "origin" in remotes else remotes[0])
            args = ("push", "--porcelain") if upstream else ("push", "--porcelain", remote, f"HEAD:refs/heads/{branch}")
            # The user's own environment (HOME, credential helpers), and never a prompt for a password nobody will type.
            env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
            try:
                out = self._git(*args, what=f"push the notebook to {remote}", timeout=PUSH_TIMEOUT_S, env=env)
            except GitError as e:
                raise GitError(
                    f"{e}. Your insights are committed in {self.path}: push again when the remote is reachable "
                    f"(if git says the remote has commits you lack, `git -C {self.path} pull --rebase` first)."
                ) from None
            head = self._git("rev-parse", "HEAD", what="read the commit").strip()
        return {"remote": remote, "branch": branch, "commit": head, "output": out.strip()}

    def _upstream(self) -> str | None:
        try:
            return (
                self._git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", what="read the upstream").strip()
                or None
            )
        except GitError:
            return None


MAX_KEY_CHARS = 255


def request_digest(key: str | None) -> str | None:
    """What an insight file keeps of its save's idempotency key: a digest (the key is the
    client's, and may say more than it should), or None without one. InvalidInsight for a key
    that is not 1 to 255 visible ASCII characters."""
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all("!" <= c <= "~" for c in key):
        raise InvalidInsight(f"an Idempotency-Key is 1 to {MAX_KEY_CHARS} visible ASCII characters (a UUID will do), "
                             f"not one of {len(key)} characters")
    return hashlib.sha256(key.encode()).hexdigest()[:32]
