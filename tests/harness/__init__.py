"""Shared harness for prewarm's end-to-end tests: start real processes on loopback, discover
their ports from what they print, poll conditions with deadlines (never fixed sleeps as
synchronisation), and stop everything they started.

Binaries come from `target/debug/` (built by `make test` before pytest runs) unless
`PREWARM_BIN_DIR` says otherwise. Envoy and the filter `.wasm` come from `PREWARM_ENVOY` and
`PREWARM_FILTER_WASM`, which the Makefile sets.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


def bin_path(name: str) -> Path:
    """Path of one of the workspace's binaries."""
    return Path(os.environ.get("PREWARM_BIN_DIR", REPO / "target" / "debug")) / name


def envoy_path() -> Path:
    return Path(os.environ.get("PREWARM_ENVOY", REPO / ".venv" / "bin" / "envoy-1.40"))


def filter_wasm_path() -> Path:
    return Path(
        os.environ.get(
            "PREWARM_FILTER_WASM",
            REPO / "target" / "wasm32-wasip1" / "wasm-release" / "prewarm_filter.wasm",
        )
    )


def wait_until(
    condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = ""
):
    """Polls `condition` until it returns a truthy value, which is returned; raises
    `TimeoutError` naming `what` after `timeout` seconds. Exceptions count as not yet."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - a condition that raises is "not yet"
            last_error = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or condition}: {last_error!r}")
        time.sleep(interval)


class ManagedProcess:
    """A child process whose combined output is kept in a log file and scanned for a readiness
    line. `ready` is a regex; its match is available as `self.match` once started."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        ready: Optional[str] = None,
        env: Optional[dict] = None,
        timeout: float = 30.0,
        cwd: Optional[Path] = None,
    ):
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.match: Optional[re.Match] = None
        self._lines: list[str] = []
        self._cond = threading.Condition()
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        if ready:
            pattern = re.compile(ready)
            self.match = wait_until(lambda: self._find(pattern), timeout, what=f"{self.argv[0]} ready ({ready})")

    def _pump(self):
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            with self._cond:
                self._lines.append(line)

    def _find(self, pattern: re.Pattern):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}: {self.output()[-2000:]}")
        with self._cond:
            for line in self._lines:
                m = pattern.search(line)
                if m:
                    return m
        return None

    def output(self) -> str:
        with self._cond:
            return "".join(self._lines)

    def wait_for_output(self, regex: str, timeout: float = 10.0) -> re.Match:
        pattern = re.compile(regex)
        return wait_until(lambda: self._find(pattern), timeout, what=f"output {regex}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int):
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 10.0) -> Optional[int]:
        """SIGTERM, then SIGKILL after `grace` seconds. Returns the exit code."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=grace)
        self._reader.join(timeout=2)
        self._log.close()
        return self.proc.returncode

    def kill(self):
        """SIGKILL, no grace: a crash."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


LISTENING = r"listening on http://(?P<addr>[0-9.]+:\d+)"
"""The readiness line every prewarm binary prints once its port is bound: `... listening on
http://127.0.0.1:PORT`."""
