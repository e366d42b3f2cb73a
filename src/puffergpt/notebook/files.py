"""The insight files, read and written as untrusted: every read and write goes through
the ``insights`` folder's own descriptor, opened without following a link, so nothing is
read or written outside the notebook; a file is read only if it is a regular file of at
most MAX_FILE_BYTES in UTF-8, and written to a temporary file first, then linked under
its name (never over another insight's file)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from puffergpt.notebook.insight import INSIGHTS, MAX_FILE_BYTES, NotebookError, NotebookUnavailable


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
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotebookError(f"{rel} is not a regular file: move it out of the notebook's {INSIGHTS} folder")
        data = f.read(MAX_FILE_BYTES + 1)
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


def write_new(folder: int, insight_id: str, text: str) -> bool:
    """Write ``text`` to a temporary file and link it as ``<id>.md``; False if that
    name is taken (the link fails: no overwrite)."""
    tmp = f".{insight_id}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.link(tmp, f"{insight_id}.md", src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp, dir_fd=folder)
