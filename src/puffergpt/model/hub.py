"""GPT-2 checkpoints from the Hugging Face hub: a pinned revision, downloaded once into a
cache and verified (size and sha256) before it is used; fails within seconds offline.

``checkpoints.load("gpt2")`` comes here for the directory; everything about reading the
files is in ``checkpoints.py``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from puffergpt.model.errors import CheckpointError


class DownloadFailed(CheckpointError):
    """A hub file that could not be had now; ``reason`` says why in a few words, on one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class HubModel:
    repo: str
    revision: str
    sha256: str | None = None  # of model.safetensors; None where not pinned
    size: int | None = None


HUB_MODELS = {
    "gpt2": HubModel("openai-community/gpt2", "607a30d783dfa663caf39e06633721c8d4cfcd7e",
                     "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707", 548_105_171),
    # The rest of the family loads through the same code; they are not pinned here.
    "gpt2-medium": HubModel("openai-community/gpt2-medium", "main"),
    "gpt2-large": HubModel("openai-community/gpt2-large", "main"),
    "gpt2-xl": HubModel("openai-community/gpt2-xl", "main"),
    "distilgpt2": HubModel("distilbert/distilgpt2", "main"),
}

OFFLINE_HINT = (
    "Offline, use one of: --model demo (a small model that ships with puffergpt), "
    "--model PATH (a directory with config.json and model.safetensors in Hugging Face layout), "
    "or `puffergpt make-model OUT --preset gpt2` for random weights with GPT-2 small's shapes."
)


def sha256_file(path: Path, progress: bool = False) -> str:
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=f"sha256 {path.name}", disable=not progress) as bar:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def fetch_verified(fetch: Callable[[Path], Path], dest: Path, sha256: str | None, size: int | None = None,
                   progress: bool = True) -> Path:
    """Run ``fetch(tmpdir) -> file``, check its size and sha256, then move it to ``dest``.

    The file becomes visible at ``dest`` only once verified, so an interrupted or
    corrupt download never passes for a good one.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        got = Path(fetch(Path(tmp)))
        n = got.stat().st_size
        if size is not None and n != size:
            raise DownloadFailed(f"{dest.name}: downloaded {n:,} bytes, expected {size:,}; the download is incomplete "
                                 "or not the pinned file. Run the command again.",
                                 f"the download of {dest.name} was incomplete ({n:,} of {size:,} bytes) "
                                 "and was discarded")
        if sha256 is not None:
            digest = sha256_file(got, progress=progress)
            if digest != sha256:
                raise DownloadFailed(f"{dest.name}: sha256 {digest} does not match the pinned {sha256}; the file was "
                                     "discarded. Run the command again, or use a local checkpoint.",
                                     f"the downloaded {dest.name} did not match its pinned sha256 and was discarded")
        os.replace(got, dest)
    return dest


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("puffergpt")) / "checkpoints"


# Seconds to wait for the hub's first answer. huggingface_hub alone, with nothing cached,
# retries with backoff and then a 60 s metadata timeout (about 23 s offline); one bounded
# request first makes an unreachable hub fail in seconds.
HUB_TIMEOUT_S = 5.0


def default_model(timeout: float = HUB_TIMEOUT_S, progress: bool = True,
                  cache_dir: Path | None = None) -> tuple[str, str | None]:
    """The model to serve when none is named: ("gpt2", None) when GPT-2 small is in the
    cache (verified) or can be downloaded now; otherwise ("demo", note), the note one line
    saying why GPT-2 small could not be had and how to get it. A damaged cached file is
    removed, never used, and never keeps the demo model from serving."""
    m = HUB_MODELS["gpt2"]
    try:
        download(m, cache_dir, timeout=timeout, progress=progress)
        return "gpt2", None
    except DownloadFailed as e:
        why = e.reason
    except (CheckpointError, OSError) as e:  # e.g. a cache directory that can't be written
        why = _one_line(e)
    return "demo", (f"GPT-2 small could not be downloaded ({why}); to get it, run again with a network "
                    f"({m.size / 1e6:,.0f} MB, once) or pass --model PATH to a local copy in Hugging Face layout.")


def download(m: HubModel, cache_dir: Path | None = None, timeout: float = HUB_TIMEOUT_S, progress: bool = True) -> Path:
    """Download a hub checkpoint once into the cache, verified, and return its directory.

    Raises DownloadFailed within about ``timeout`` seconds when the hub can't be reached.
    """
    if not timeout > 0:
        raise ValueError(f"the hub timeout must be a positive number of seconds, got {timeout!r}")
    out = (cache_dir or default_cache_dir()) / m.repo.replace("/", "--") / m.revision
    damaged = check_cached(out / "model.safetensors", m.sha256, m.size, progress)
    for name, sha256, size in (("model.safetensors", m.sha256, m.size), ("config.json", None, None)):
        dest = out / name
        if dest.exists():
            continue
        try:
            probe_hub(m, name, timeout)
            with _hub_progress(progress):
                fetch_verified(_hub_fetch(m, name, timeout), dest, sha256, size, progress)
        except DownloadFailed as e:
            if not damaged:
                raise
            raise DownloadFailed(f"{damaged}, so it was removed; {e}",
                                 f"{damaged}, so it was removed; {e.reason}") from None
        except Exception as e:  # network errors come in many types across huggingface_hub versions
            raise DownloadFailed(f"could not download {m.repo}@{m.revision[:12]} from the Hugging Face hub "
                                 f"({type(e).__name__}: {e}). {OFFLINE_HINT}",
                                 f"the download failed: {type(e).__name__}: {_one_line(e)}") from None
        if sha256 is not None:
            _stamp(dest).write_text(_mark(dest, sha256))
    return out


def check_cached(path: Path, sha256: str | None, size: int | None, progress: bool = True) -> str | None:
    """None when ``path`` is absent or the pinned file; otherwise remove it and say why.

    Hashing 548 MB at every start is slow, so a verified file gets a stamp of its sha256,
    size and mtime; a file changed since (truncated, rewritten) no longer matches its stamp
    and is hashed again.
    """
    if sha256 is None or not path.exists():
        return None  # unpinned files are only ever moved into place complete (fetch_verified)
    stamp, n = _stamp(path), path.stat().st_size
    if stamp.is_file() and stamp.read_text() == _mark(path, sha256):
        return None
    if size is not None and n != size:
        why = f"the cached {path.name} was damaged ({n:,} of {size:,} bytes)"
    elif sha256_file(path, progress=progress) != sha256:
        why = f"the cached {path.name} was damaged (its sha256 is not the pinned one)"
    else:
        stamp.write_text(_mark(path, sha256))
        return None
    path.unlink()
    stamp.unlink(missing_ok=True)
    return why


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _mark(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def probe_hub(m: HubModel, filename: str, timeout: float = HUB_TIMEOUT_S) -> None:
    """Ask the hub for a file's metadata, one request with no retries; raise DownloadFailed
    (with a reason) unless it answers within ``timeout`` seconds.

    The request runs in a thread so that the deadline also bounds a DNS lookup, which no
    socket timeout covers.
    """
    import huggingface_hub

    url = huggingface_hub.hf_hub_url(m.repo, filename, revision=m.revision)
    host = urlparse(url).netloc
    result: list[BaseException | None] = []

    def ask() -> None:
        try:
            huggingface_hub.get_hf_file_metadata(url, timeout=timeout)
            result.append(None)
        except Exception as e:  # noqa: BLE001 - every failure becomes a reason below
            result.append(e)

    t = threading.Thread(target=ask, name="puffergpt-hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    if result and result[0] is None:
        return
    reason = _why_unreachable(result[0], host, timeout) if result else f"{host} did not answer within {timeout:g} s"
    raise DownloadFailed(f"could not download {m.repo}@{m.revision[:12]} from the Hugging Face hub: {reason}. "
                         f"{OFFLINE_HINT}", reason)


def _why_unreachable(e: BaseException, host: str, timeout: float) -> str:
    """A few words for why a request to the hub failed, from the exception and its causes."""
    chain: list[BaseException] = []
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for x in chain:
        if type(x).__name__ == "OfflineModeIsEnabled":
            return "HF_HUB_OFFLINE is set"
        if isinstance(x, socket.gaierror):
            return f"no network: {host} could not be resolved"
        if isinstance(x, ConnectionRefusedError):
            return f"{host} refused the connection"
        if isinstance(x, TimeoutError) or "Timeout" in type(x).__name__:
            return f"{host} did not answer within {timeout:g} s"
        if isinstance(x, OSError) and x.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN):
            return f"no network: no route to {host}"
        status = getattr(x.__dict__.get("response"), "status_code", None)
        if isinstance(status, int):
            return f"{host} answered HTTP {status}"
    return f"{host} could not be reached: {type(chain[0]).__name__}: {_one_line(chain[0])}"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300].rstrip(".")


def _hub_fetch(m: HubModel, filename: str, timeout: float) -> Callable[[Path], Path]:
    def fetch(tmp: Path) -> Path:
        import huggingface_hub

        got = huggingface_hub.hf_hub_download(m.repo, filename, revision=m.revision, local_dir=tmp,
                                              etag_timeout=timeout)
        return Path(got)
    return fetch


@contextmanager
def _hub_progress(progress: bool):
    """huggingface_hub's download bars off while ``progress`` is False (they are global)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if progress or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()
