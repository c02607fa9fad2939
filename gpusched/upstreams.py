"""The GPUs named in `LLAMA_SWAP_URL`: one llama-swap upstream per GPU.

`LLAMA_SWAP_URL` is a comma-separated list; each entry is `NAME=URL`, or a
bare URL, named `gpu0`, `gpu1`, … by its position. One URL is one GPU, named
`gpu0`. Plain Python: settings read it at start-up, and the dispatcher and
`make run` at call time (a test may change the setting).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# A GPU's name appears in URLs, metrics labels and a django-q2 cluster name.
GPU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_UPSTREAM = "http://127.0.0.1:9292"


class UpstreamListInvalid(ValueError):
    """`LLAMA_SWAP_URL` cannot be read; the message says which entry and why."""


@dataclass(frozen=True)
class Upstream:
    name: str
    url: str


def default_gpu_name(position: int) -> str:
    return f"gpu{position}"


def parse_upstreams(text: str) -> list[Upstream]:
    """The GPUs of a `LLAMA_SWAP_URL` value, in order."""
    upstreams: list[Upstream] = []
    entries = [entry.strip() for entry in text.split(",")]
    for position, entry in enumerate(entries):
        if not entry:
            raise UpstreamListInvalid(
                f"LLAMA_SWAP_URL: entry {position + 1} is empty (entries are comma-separated)"
            )
        name, separator, url = entry.partition("=")
        if not separator:
            name, url = default_gpu_name(position), entry
        name, url = name.strip(), url.strip().rstrip("/")
        if not GPU_NAME.fullmatch(name):
            raise UpstreamListInvalid(
                f"LLAMA_SWAP_URL: {name!r} is not a GPU name (letters, digits, '_', '.', '-'; "
                "at most 64, starting with a letter or digit)"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamListInvalid(
                f"LLAMA_SWAP_URL: {url!r} (GPU {name}) is not an http:// or https:// URL"
            )
        if any(upstream.name == name for upstream in upstreams):
            raise UpstreamListInvalid(f"LLAMA_SWAP_URL: the GPU name {name!r} is given twice")
        upstreams.append(Upstream(name=name, url=url))
    return upstreams


def dispatch_cluster_name(gpu: str) -> str:
    """The django-q2 cluster (its queue in the broker) of one GPU's dispatcher."""
    return f"dispatch-{gpu}"
