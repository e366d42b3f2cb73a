"""The insight files, read and written as untrusted: every read and write goes through
the ``insights`` folder's own descriptor, opened without following a link, so nothing is
read or written outside the notebook; a file is read only if it is a regular file of at
most MAX_FILE_BYTES in UTF-8, and written to a temporary file first, then linked under
its name (never over another insight's file)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from puffergpt.notebook.insight import ID_RE, INSIGHTS, MAX_FILE_BYTES, NotebookError, NotebookUnavailable

log = logging.getLogger("puffergpt.notebook")

# A save writes its temporary file in milliseconds: one this old was left by a process
# that died mid-save, never one that another process is still writing.
STALE_TMP_S = 60


@contextlib.contextmanager
def insights_folder(notebook: Path, create: bool = False) -> Iterator[int | None]:
    """The insights folder as a directory descriptor that every read and write goes
    through, opened without following a symbolic link (a link would lead out of the
    notebook); None when it is absent and not ``create``."""
    folder, fd = notebook / INSIGHTS, None
    try:
        root = os.open(notebook, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fd = _open_folder(root, create)
        finally:
            os.close(root)
    except FileNotFoundError:
        if create:
            raise NotebookUnavailable(
                f"the notebook folder {notebook} is gone: serve again with --notebook DIR"
            ) from None
    except OSError as e:
        if folder.is_symlink():
            raise NotebookError(
                f"{folder} is a symbolic link (to {os.readlink(folder)}): puffergpt reads and writes "
                "insights only inside the notebook. Replace the link with a folder holding the same "
                "files"
            ) from None
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise NotebookError(
                f"{folder} is not a folder: move it away, and the next save makes the folder"
            ) from None
        raise unavailable(notebook, e, f"open {folder}", writing=create) from None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _open_folder(root: int, create: bool) -> int | None:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW  # a link is ELOOP (or ENOTDIR), not followed
    try:
        return os.open(INSIGHTS, flags, dir_fd=root)
    except FileNotFoundError:
        if not create:
            return None
    with contextlib.suppress(FileExistsError):  # made meanwhile by another process
        os.mkdir(INSIGHTS, dir_fd=root)
    return os.open(INSIGHTS, flags, dir_fd=root)


def unavailable(notebook: Path, e: OSError, doing: str, writing: bool = True) -> NotebookUnavailable:
    if not writing:
        fix = "check that the server's user may read the notebook's files"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = (f"the notebook is read-only: make it writable (`chmod -R u+w {notebook}`) "
               "or serve with another --notebook DIR")
    elif e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        fix = "the disk is full: free some space and save again"
    else:
        fix = "check the notebook's folder and save again"
    return NotebookUnavailable(f"could not {doing}: {e.strerror or e}. {fix[0].upper()}{fix[1:]}")


def read(notebook: Path, folder: int, name: str) -> str:
    """One insight file's text, read as untrusted: a regular file in the folder (not a
    link, a FIFO, a device), at most MAX_FILE_BYTES, UTF-8. FileNotFoundError when it
    is absent; NotebookError naming the file otherwise."""
    rel = f"{INSIGHTS}/{name}"
    try:  # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotebookError(f"{rel} is a symbolic link: puffergpt reads insights only inside the notebook, "
                                "never through a link. Replace the link with the file itself") from None
        raise unavailable(notebook, e, f"read {notebook / rel}", writing=False) from None
    try:  # closed on every path: a descriptor kept per refused file took the server down (issue 31)
        data = _regular_file(fd, rel)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise NotebookError(f"{rel} has more than {MAX_FILE_BYTES} bytes, more than a save writes: "
                            f"move it out of the notebook's {INSIGHTS} folder")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotebookError(
            f"{rel} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}): fix the file, "
            f"or restore its committed version with `git -C {notebook} checkout -- {rel}`"
        ) from None


def _regular_file(fd: int, rel: str) -> bytes:
    """At most MAX_FILE_BYTES + 1 bytes of an open file, if it is a regular file; the
    caller closes ``fd`` (fstat first: fdopen of a directory raises, and leaked it)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise NotebookError(f"{rel} is a directory, not an insight file: move it out of the notebook's "
                            f"{INSIGHTS} folder")
    if not stat.S_ISREG(mode):
        raise NotebookError(f"{rel} is not a regular file: move it out of the notebook's {INSIGHTS} folder")
    with os.fdopen(fd, "rb", closefd=False) as f:
        return f.read(MAX_FILE_BYTES + 1)


def write_new(folder: int, insight_id: str, text: str) -> bool:
    """Write ``text`` to a temporary file and link it as ``<id>.md``; False if that
    name is taken (the link fails: no overwrite)."""
    tmp = f".{insight_id}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=folder)
    try:
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n", closefd=False) as f:
                f.write(text)
        finally:
            os.close(fd)
        os.link(tmp, f"{insight_id}.md", src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)


def remove_stale(notebook: Path) -> list[str]:
    """Remove the temporary files of saves whose process died between writing and linking
    (a kill -9): ``.<id>.tmp`` files in the insights folder older than STALE_TMP_S, which
    no save still writing can be. Returns their names; a failure is a warning only."""
    removed: list[str] = []
    try:
        with insights_folder(notebook) as folder:
            for name in [] if folder is None else os.listdir(folder):
                if not (name.startswith(".") and name.endswith(".tmp") and ID_RE.fullmatch(name[1:-4])):
                    continue
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime > STALE_TMP_S:
                    os.unlink(name, dir_fd=folder)
                    removed.append(name)
                    log.info("removed %s: a save that did not finish left it", notebook / INSIGHTS / name)
    except (NotebookError, OSError) as e:  # a read-only notebook still reads
        log.warning("could not remove the temporary files of unfinished saves in %s: %s", notebook / INSIGHTS, e)
    return removed
