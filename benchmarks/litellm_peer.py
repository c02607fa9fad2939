"""A LiteLLM proxy in front of the same llama-swap simulator: the peer the
front door's added latency is measured against, in the same run.

LiteLLM is a benchmark dependency only. It lives in a virtual environment
of its own, `.venv-litellm/` at the repository's root (created here on the
first run, from PyPI), so that neither `make run` nor `make test` needs it
and its many pins never meet the project's. The proxy runs as
`make bench-frontdoor` would run any server: a process of its own, on the
loopback interface, stopped at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / ".venv-litellm"
REQUIREMENT = "litellm[proxy]>=1.50"
# The proxy refuses to start without a master key; a bench-only one.
MASTER_KEY = "sk-gpusched-bench-peer"
START_SECONDS = 120.0


def ensure_venv() -> Path:
    """The `litellm` command of `.venv-litellm/`, installed when missing."""
    command = PEER_VENV / "bin" / "litellm"
    if command.exists():
        return command
    print(f"LiteLLM peer: creating {PEER_VENV} ({REQUIREMENT})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run(
        [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", REQUIREMENT],
        check=True,
    )
    return command


def installed_version() -> str:
    result = subprocess.run(
        [
            str(PEER_VENV / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout.strip() or "unknown"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiteLlmProxy:
    """A running LiteLLM proxy that serves `models` from `upstream` (an
    OpenAI-compatible base URL ending in /v1)."""

    process: subprocess.Popen
    url: str
    version: str
    key: str = MASTER_KEY

    @classmethod
    def start(cls, *, upstream: str, models: list[str], log_dir: Path) -> LiteLlmProxy:
        command = ensure_venv()
        config = log_dir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            + "".join(
                f"  - model_name: {model}\n"
                "    litellm_params:\n"
                f"      model: openai/{model}\n"
                f"      api_base: {upstream}\n"
                "      api_key: unused\n"
                for model in models
            )
        )
        port = _free_port()
        # No DATABASE_URL: the proxy would take gpusched's for its own, and
        # the benchmark measures it as a stateless proxy.
        env = {
            **{name: value for name, value in os.environ.items() if name != "DATABASE_URL"},
            "LITELLM_MASTER_KEY": MASTER_KEY,
            # The price list ships with the package: no fetch at start.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
        }
        log = (log_dir / "litellm.log").open("ab")
        process = subprocess.Popen(
            [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        proxy = cls(process=process, url=f"http://127.0.0.1:{port}", version=installed_version())
        proxy._wait_ready()
        return proxy

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the LiteLLM proxy exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polling a process that is starting, with a deadline
        self.stop()
        raise RuntimeError(f"the LiteLLM proxy did not answer within {START_SECONDS:g} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
