"""Every setting of a server, defined once: its name, type, default, the command-line flag and
environment variable that set it (if any) and its help.

The CLI builds its options from this table (``cli/options.py``: ``option``), the server its
``ServerConfig`` (the settings that go to "config", ``server/state.py``) and ``serve
--workers`` its ``WorkerSpec`` (those that go to "worker"); the scheduler and the sweeper take
their defaults from it. A backend declares its own settings (a DSN, a key) as ``Setting``s too,
on its factory (``stores/__init__.py``). A new server setting is one entry here.

Why a layer of its own, at the bottom, and not in ``cli/``: every layer reads it (stores for
their settings' shape, search and app for defaults, the server for its configuration, the CLI
for its options), and the server may not import the CLI. The environment is read by the CLI
alone: here a variable is only a name.

May import: nothing of puffergpt (and not click: the CLI turns settings into options).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    name: str  # the Python name: ServerConfig's or WorkerSpec's field, the command's parameter, a factory's argument
    help: str
    default: object = None
    type: object = str | None  # the value's type, as its field is annotated: int, float | None, tuple[str, ...]
    flag: str | None = None  # the command-line option ("--max-texts"); None: set by code (or by its variable)
    env: str | None = None  # the environment variable the CLI reads when the flag is not given
    to: tuple[str, ...] = ()  # where it goes beside the command: "config" (ServerConfig), "worker" (WorkerSpec)
    range: tuple | None = None  # (lo, hi) the flag accepts, in the flag's unit
    choices: tuple[str, ...] | None = None
    scale: float = 1  # the setting is the flag's value times this: --idle-minutes 30 is idle_s 1800
    metavar: str | None = None
    check: str | None = None  # "module:function" the CLI checks and normalises each value with (ValueError: bad)
    secret: bool = False  # kept out of repr and of command lines: a key, a DSN with a password


SERVER: tuple[Setting, ...] = (
    Setting("backend", "the vector database that holds the weights (`puffergpt backends` lists those installed)",
            "embedded", str, "--backend", metavar="NAME", to=("worker",), check="puffergpt.stores:check_backend"),
    Setting("data_dir", "where the embedded store keeps its files, pgvector's local server and the notebook "
                        "[env PUFFERGPT_DATA; default: the user data dir]", None, Path | None, "--data",
            env="PUFFERGPT_DATA"),
    Setting("notebook_path", "the insight notebook, a git repository [default: DATA/notebook]", None, Path | None,
            "--notebook"),
    Setting("lessons_dir", "a folder of your own lessons, one YAML file each (docs/lessons.md), listed beside the "
                           "shipped ones; a file named like a shipped lesson replaces it [env PUFFERGPT_LESSONS]",
            None, Path | None, "--lessons", env="PUFFERGPT_LESSONS", metavar="DIR", to=("config",),
            check="puffergpt.lens.lessons:check_folder"),
    Setting("output_search", "how the next token is found: exact scores every token vector; approximate searches "
                             "the store's HNSW index (built by `puffergpt load --output-index`), which may miss "
                             "some of the best (docs/benchmarks.md)", "exact", str, "--output-search",
            choices=("exact", "approximate"), to=("worker",)),
    Setting("host", "the address to listen on", "127.0.0.1", str, "--host"),
    Setting("port", "the port to listen on (0: any free one)", 8000, int, "--port", range=(0, 65535)),
    Setting("max_open_texts", "texts open at once", 32, int, "--max-texts", range=(1, 1000), to=("config",)),
    Setting("max_running", "texts generating at once (their searches are merged); the others wait their turn",
            16, int, "--max-running", range=(1, 1000), to=("worker",)),
    Setting("idle_s", "an idle text is closed after this long", 1800.0, float, "--idle-minutes",
            range=(0.1, 10080), scale=60, to=("config",)),
    Setting("text_ttl_s", "the keys of a text nobody used for this long are dropped by any server on the same "
                          "store, a killed server's too (docs/deploy.md)", 1800.0, float, "--text-ttl",
            range=(1, 7 * 86400), metavar="SECONDS", to=("worker",)),
    Setting("workers", "server processes, each on a core of its own, behind one address; auto: one a core. "
                       "Many learners at once need many (docs/how-it-works.md#every-core)", "1", str, "--workers",
            metavar="N|auto", check="puffergpt.server.processes.workers:count"),
    Setting("cors_origins", "a page elsewhere allowed to drive the API, as scheme://host[:port] (repeat for more); "
                            "none by default: only the server's own page and clients that send no Origin (curl, "
                            "SDKs). Never the notebook's routes", (), tuple[str, ...], "--cors-origin",
            metavar="ORIGIN", check="puffergpt.server.guards.cross_site:check_origin", to=("config",)),
    Setting("allowed_hosts", "another name clients may reach the server by (the Host header), beside 127.0.0.1 and "
                             "localhost: host.docker.internal for a container, a reverse proxy's name; repeat for "
                             "more", (), tuple[str, ...], "--allowed-host", metavar="HOST"),
    Setting("api_keys", "require this key (Authorization: Bearer KEY) on /v1 and on every request that changes "
                        "state or costs work; repeat for more [env PUFFERGPT_API_KEY, keys separated by commas] "
                        "(docs/deploy.md#keys)", (), tuple[str, ...], "--api-key", env="PUFFERGPT_API_KEY",
            metavar="KEY", check="puffergpt.server.guards.auth:check_key", secret=True, to=("config",)),
    Setting("api_key_file", "read the keys from this file, one a line (# comments), beside --api-key: unlike a "
                            "flag, never seen in `ps` (docs/deploy.md#keys)", None, Path | None, "--api-key-file",
            metavar="PATH", check="puffergpt.server.guards.auth:check_key_file"),
    Setting("public_read_only", "anyone may generate; the notebook's writes need the key (with none set: no one "
                                "may write)", False, bool, "--public-read-only", to=("config",)),
    Setting("no_auth", "on an address other machines reach, without a key: let anyone do anything, notebook "
                       "included", False, bool, "--no-auth"),
    Setting("public_url", "the address clients reach this server at (https://puffer.example.org, behind a proxy or "
                          "a tunnel): the OpenAPI document's server, for a GPT action or a generated client. "
                          "[default: the address each request came to]", None, str | None, "--public-url",
            metavar="URL", check="puffergpt.server.openapi_doc:check_public_url", to=("config",)),
    # 600 s: 512 GPT-2 tokens take ~1.5 min embedded.
    Setting("max_request_s", "a generation or completion running longer is ended with an error naming this limit",
            600.0, float | None, "--max-request-seconds", range=(1, 86400), to=("config",)),
    # Summed over a request's choices: each prompt token read, each scored over the whole vocabulary (echo
    # with logprobs), each new one. 8,192: 8 chat choices of a full context, or lm-eval's --batch_size 4 of
    # whole-context log-likelihoods.
    Setting("max_request_tokens", "tokens a /v1 request may compute over its choices (prompt tokens read, scored, "
                                  "new); more is refused up front", 8192, int, "--max-request-tokens",
            range=(1, 10**7), to=("config",)),
    # Set by code, not by a flag:
    Setting("max_new_tokens", "a request's new tokens: the most a body may ask, and the server's bound", 512, int,
            to=("config",)),
    Setting("trusted_hosts", "Host headers accepted (from --host and --allowed-host); None accepts any", None,
            tuple[str, ...] | None, to=("config",)),
    Setting("fallback", "why the model is the demo one, when GPT-2 small could not be had", None, str | None,
            to=("config",)),
    Setting("read_timeout_s", "a request body must keep arriving: each piece within this", 10.0, float,
            to=("config",)),
    Setting("body_timeout_s", "a request body must arrive within this in all", 30.0, float, to=("config",)),
    Setting("header_timeout_s", "a request's line and headers must arrive within this in all (from the "
                                "connection's start, or the end of its last answer)", 10.0, float, to=("config",)),
    Setting("max_connections", "connections open at once (the front's, and each process's); one more is answered "
                               "503 and closed", 1024, int, "--max-connections", range=(8, 100_000),
            to=("config",)),
)
_BY_NAME = {s.name: s for s in SERVER}


def named(name: str) -> Setting:
    return _BY_NAME[name]


def default(name: str):
    return _BY_NAME[name].default


def going(to: str) -> tuple[Setting, ...]:
    """The settings that go ``to`` "config" or "worker", in the table's order."""
    return tuple(s for s in SERVER if to in s.to)


def fields(to: str) -> list[tuple[str, object, dataclasses.Field]]:
    """The dataclass fields of the settings that go ``to`` (for ``dataclasses.make_dataclass``):
    each named, typed and defaulted as here, a secret left out of its repr."""
    return [(s.name, s.type, dataclasses.field(default=s.default, repr=not s.secret)) for s in going(to)]
