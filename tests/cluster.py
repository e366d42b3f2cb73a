"""Several ``puffergpt serve`` processes over one database, behind Debian's HAProxy: what
docs/deploy.md describes, started for a test (tests/stores/test_pg_servers.py) or a
measurement (benchmarks/servers.py). Everything binds 127.0.0.1 on free ports; every process
is stopped at the end, whatever happened."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

START_S = 180.0  # a server's start on a loaded 2-core machine: imports, the store verified by count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if found is None:
        raise RuntimeError("these tests need Debian's haproxy: run `make test`, which installs it "
                           "(or `sudo apt-get install haproxy`)")
    return found


def haproxy_config(port: int, servers: dict[str, int]) -> str:
    """docs/deploy.md's configuration, on loopback: round-robin over the servers, a cookie that
    keeps a learner on one (for speed only), a request that finds its server gone sent to another."""
    lines = [
        "global", "    maxconn 512",
        "defaults", "    mode http", "    timeout connect 2s", "    timeout client 120s", "    timeout server 120s",
        "    retries 3", "    option redispatch 1",
        "frontend learners", f"    bind 127.0.0.1:{port}", "    default_backend puffergpt",
        "backend puffergpt", "    balance roundrobin", "    cookie puffergpt insert indirect nocache",
        "    option httpchk", "    http-check send meth GET uri /ready ver HTTP/1.1 hdr Host 127.0.0.1",
    ]
    lines += [f"    server {name} 127.0.0.1:{p} check inter 250ms fall 1 rise 1 cookie {name}"
              for name, p in servers.items()]
    return "\n".join(lines) + "\n"


class Cluster:
    """``serve`` processes named s1, s2, ... over one store, and HAProxy in front at ``url``."""

    def __init__(self, workdir: Path, serve_args: list[str], n: int = 2):
        self.workdir, self.serve_args = workdir, serve_args
        self.ports = {f"s{i + 1}": free_port() for i in range(n)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.lb_port = free_port()
        self.url = f"http://127.0.0.1:{self.lb_port}"
        self.haproxy: subprocess.Popen | None = None

    def __enter__(self) -> Cluster:
        try:
            for name in self.ports:
                self.start(name, wait=False)
            for name in self.ports:
                self.wait_up(name)
            self.start_haproxy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def server_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str, wait: bool = True) -> None:
        cmd = [sys.executable, "-m", "puffergpt.cli", "serve", *self.serve_args, "--port", str(self.ports[name])]
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it; closed at stop
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        if wait:
            self.wait_up(name)
            if self.haproxy is not None:
                self.wait_balanced()

    def wait_up(self, name: str) -> None:
        deadline, p = time.monotonic() + START_S, self.procs[name]
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"server {name} exited ({p.returncode}): {self.log(name)}")
            try:
                if httpx.get(self.server_url(name) + "/api/status", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server {name} did not start within {START_S:.0f} s: {self.log(name)}")

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]

    def wait_balanced(self, within_s: float = 30.0) -> None:
        """Until the balancer answers (its health check has found a server up)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.haproxy.poll() is not None:
                raise RuntimeError(f"haproxy exited: {(self.workdir / 'haproxy.log').read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/api/status", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"haproxy did not answer within {within_s:.0f} s")

    def start_haproxy(self) -> None:
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(haproxy_config(self.lb_port, self.ports))
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its configuration: {check.stdout}{check.stderr}")
        log = open(self.workdir / "haproxy.log", "ab")  # noqa: SIM115
        self.haproxy = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        log.close()
        self.wait_balanced()

    def kill(self, name: str) -> None:
        """kill -9: nothing of the server runs after it, nothing is closed."""
        p = self.procs[name]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def stop(self) -> None:
        for p in [*self.procs.values(), *([self.haproxy] if self.haproxy else [])]:
            if p.poll() is None:
                p.terminate()
        for p in [*self.procs.values(), *([self.haproxy] if self.haproxy else [])]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
