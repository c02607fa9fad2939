"""`GET /v1/models`: the models llama-swap lists, as the front door's own.

An authenticated caller (queueapp/frontdoor/authentication.py) gets
llama-swap's list relayed unchanged; with several GPUs, every enabled GPU's
list merged, each model once. Nothing is queued: the list is read while
GPUs run their jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx

from queueapp.frontdoor.answers import Answer
from queueapp.frontdoor.authentication import authenticate
from queueapp.frontdoor.awaiting_grant import KEY_REFUSED_RETRY_SECONDS
from queueapp.frontdoor.exchange import llama_swap_client
from queueapp.frontdoor.gateway import gateway
from queueapp.frontdoor.incoming_call import Call
from queueapp.models import Member
from queueapp.upstream.client import KEY_REFUSED, key_refused

MODELS_PATH = "/v1/models"


async def list_models(call: Call) -> Answer:
    """`GET /v1/models`: llama-swap's list relayed; with several GPUs, every
    GPU's list merged (each model once, as the first GPU that answers lists it)."""
    member = await authenticate(call)
    if not isinstance(member, Member):
        return member
    await gateway.ready()  # the registered GPUs are read as it starts
    # Each llama-swap once (a URL may be listed twice), with its GPU's key.
    gpu_of = {url: gpu_id for gpu_id, url in sorted(gateway.gpu_urls.items())}
    urls = sorted(gpu_of) or [await gateway.upstream_url(None)]
    keys = [await gateway.auth_headers(gpu_of.get(url)) for url in urls]
    answers = await asyncio.gather(
        *(
            llama_swap_client(url).get(MODELS_PATH, timeout=10, headers=key)
            for url, key in zip(urls, keys, strict=True)
        ),
        return_exceptions=True,
    )
    responses = [a for a in answers if isinstance(a, httpx.Response)]
    # llama-swap refusing gpusched's key is no answer to relay: the caller
    # would read it as a refusal of its own key.
    relayed = [
        a for a in responses if not key_refused(a.status_code, a.headers.get("www-authenticate"))
    ]
    if not relayed and responses:
        return Answer.error(
            503,
            f"{KEY_REFUSED}: gpusched's configuration (LLAMA_SWAP_API_KEY), not your key",
            "server_error",
            "upstream_key_refused",
            Retry_After=str(KEY_REFUSED_RETRY_SECONDS),
        )
    if not relayed:
        return Answer.error(
            503, "llama-swap is unreachable", "server_error", "upstream_unreachable"
        )
    if len(urls) == 1:
        only = relayed[0]
        return Answer(
            only.status_code, only.content, only.headers.get("content-type", "application/json")
        )
    merged: dict[str, Any] = {}
    for answer in relayed:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            for entry in answer.json().get("data") or []:
                merged.setdefault(str(entry.get("id")), entry)
    body = {"object": "list", "data": [merged[model] for model in sorted(merged)]}
    return Answer(200, json.dumps(body).encode(), "application/json")
