"""Helpers to run the real `prewarm-gateway` binary in end-to-end tests.

- `start_gateway(tmp_path, config)` writes the configuration (a dict, rendered as TOML, or TOML
  text) with `server.listen = 127.0.0.1:0` and a state directory under `tmp_path` unless given,
  starts `target/debug/prewarm-gateway serve --config ...`, waits for its
  `prewarm-gateway listening on http://127.0.0.1:PORT` line and returns a `Gateway` (process, base
  URL, tokens, config path). Unless the configuration says otherwise, the gateway gets the three
  tokens below (admin, read, signal).
- `Gateway.admin(method, path, json=...)` calls an admin endpoint with the admin token;
  `Gateway.get(path)` reads with the read token (the signal token for the filters' routes,
  `/v1/routing` and `/v1/embeddings/warm`), as a dashboard or a filter would; `Gateway.signals(batch)` posts a signal batch
  with the signal token, as a filter does.
- `fingerprint(model, text)` is core's block chain of `text` (hex hashes), from the gateway
  binary's `fingerprint` command: what a filter would signal for it; `arms_of(definition,
  units)` the arm the filters give each unit (`arm`); `compare(arm, reference)` two samples by
  the experiment report's rule (`compare`).
- `to_toml(dict)` renders the small TOML subset the gateway's configuration uses.

The caller stops the process (`gw.proc.stop()`: SIGTERM, SIGKILL after a grace period).
"""
from __future__ import annotations

import itertools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import requests

from . import LISTENING, ManagedProcess, bin_path

ADMIN_TOKEN = "test-admin-token"
READ_TOKEN = "test-read-token"
SIGNAL_TOKEN = "test-signal-token"
_counter = itertools.count()


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot render {v!r} as TOML")


def to_toml(config: dict, prefix: str = "") -> str:
    """Tables of scalars, nested tables and arrays of tables (lists of dicts)."""
    lines: list[str] = []
    nested: list[tuple[str, Any]] = []
    for key, value in config.items():
        if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(x, dict) for x in value)):
            nested.append((key, value))
        else:
            lines.append(f"{key} = {_value(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in nested:
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += f"\n[{name}]\n" + to_toml(value, f"{name}.")
        else:
            for item in value:
                out += f"\n[[{name}]]\n" + to_toml(item, f"{name}.")
    return out


@dataclass
class Gateway:
    proc: ManagedProcess
    url: str
    token: str
    config_path: Path

    def admin(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = kwargs.pop("headers", {})
        headers["Authorization"] = f"Bearer {self.token}"
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        headers = kwargs.pop("headers", {})
        token = SIGNAL_TOKEN if path.startswith(("/v1/routing", "/v1/embeddings/")) else READ_TOKEN
        headers.setdefault("Authorization", f"Bearer {token}")
        return requests.get(f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def signals(self, batch: dict, **kwargs) -> requests.Response:
        headers = kwargs.pop("headers", {})
        headers.setdefault("Authorization", f"Bearer {SIGNAL_TOKEN}")
        return requests.post(f"{self.url}/v1/signals", json=batch, headers=headers, timeout=30, **kwargs)

    def feedback(self, model: str, key: str, count: int) -> None:
        """Raises a prefix's hotness by `count` successful responses (+0.5 each)."""
        batch = {"version": "1.0", "source": "test", "signals": [
            {"kind": "feedback", "model": model, "prefix": key.split("-")[1], "outcome": "succeeded",
             "count": count}]}
        r = self.signals(batch)
        assert r.status_code == 202 and r.json()["feedback"] == 1, r.text


def fingerprint(model: str, text: str, block_tokens: int = 64) -> list[str]:
    """Core's block hashes of `text` for `model` (`prewarm-gateway fingerprint`)."""
    out = subprocess.run([bin_path("prewarm-gateway"), "fingerprint", "--model", model,
                          "--block-tokens", str(block_tokens)],
                         input=text.encode(), capture_output=True, timeout=30, check=True).stdout
    return json.loads(out)["blocks"]


def arms_of(definition: dict, units: list[str]) -> dict[str, Optional[str]]:
    """The arm the filters give each unit in experiment `definition`: core's
    `Experiment::arm_of`, through `prewarm-gateway arm` (one implementation of the rule)."""
    distinct = sorted(set(units))
    out = subprocess.run([str(bin_path("prewarm-gateway")), "arm", "--experiment", json.dumps(definition)],
                         input="".join(json.dumps(u) + "\n" for u in distinct),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(zip(distinct, (json.loads(line) or None for line in out.splitlines())))


def compare_run(body: str) -> subprocess.CompletedProcess:
    """`prewarm-gateway compare` on the JSON `body` (`{"arm": [...], "reference": [...]}`)."""
    return subprocess.run([str(bin_path("prewarm-gateway")), "compare"], input=body,
                          capture_output=True, text=True, timeout=60)


def compare(arm: list[float], reference: list[float], arm_prompt_tokens: Optional[list[float]] = None,
            reference_prompt_tokens: Optional[list[float]] = None) -> dict:
    """Two samples by the experiment report's rule (Welch's t, Mann-Whitney U, `significant`
    when both p < 0.01); with each value's prompt tokens, also adjusted for prompt length
    (`prompt_adjusted`)."""
    body: dict = {"arm": arm, "reference": reference}
    if arm_prompt_tokens is not None or reference_prompt_tokens is not None:
        body.update(arm_prompt_tokens=arm_prompt_tokens or [], reference_prompt_tokens=reference_prompt_tokens or [])
    done = compare_run(json.dumps(body))
    done.check_returncode()
    return json.loads(done.stdout)


def write_config(tmp_path: Path, config: Union[dict, str], name: str) -> Path:
    path = Path(tmp_path) / f"{name}.toml"
    if isinstance(config, str):
        text = config
    else:
        config = json.loads(json.dumps(config))  # deep copy
        server = config.setdefault("server", {})
        server.setdefault("listen", "127.0.0.1:0")
        server.setdefault("admin_token", ADMIN_TOKEN)
        server.setdefault("read_token", READ_TOKEN)
        server.setdefault("signal_token", SIGNAL_TOKEN)
        state = config.setdefault("state", {})
        state.setdefault("dir", str(Path(tmp_path) / "gateway-state"))
        text = to_toml(config)
    path.write_text(text)
    return path


def start_gateway(
    tmp_path: Path,
    config: Union[dict, str, None] = None,
    name: Optional[str] = None,
    env: Optional[dict] = None,
    timeout: float = 30.0,
    fd_limit: Optional[int] = None,
) -> Gateway:
    """Starts the gateway with `config` (dict or TOML text); see the module docs. `fd_limit` runs
    it with that soft and hard descriptor limit (`prlimit`)."""
    label = name or f"gateway-{next(_counter)}"
    path = write_config(tmp_path, config if config is not None else {}, label)
    full_env = {"PREWARM_LOG": "info"}
    if env:
        full_env.update(env)
    argv = [bin_path("prewarm-gateway"), "serve", "--config", path]
    if fd_limit is not None:
        argv = ["prlimit", f"--nofile={fd_limit}:{fd_limit}", "--"] + argv
    proc = ManagedProcess(
        argv,
        Path(tmp_path) / f"{label}.log",
        ready=LISTENING,
        env=full_env,
        timeout=timeout,
    )
    assert proc.match is not None
    return Gateway(proc, f"http://{proc.match.group('addr')}", ADMIN_TOKEN, path)
