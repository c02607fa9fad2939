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
from queueapp.frontdoor.exchange import llama_swap_client
from queueapp.frontdoor.gateway import gateway
from queueapp.frontdoor.incoming_call import Call
from queueapp.models import Member

MODELS_PATH = "/v1/models"


async def list_models(call: Call) -> Answer:
    """`GET /v1/models`: llama-swap's list relayed; with several GPUs, every
    GPU's list merged (each model once, as the first GPU that answers lists it)."""
    member = await authenticate(call)
    if not isinstance(member, Member):
        return member
    await gateway.ready()  # the registered GPUs are read as it starts
    urls = sorted(set(gateway.gpu_urls.values())) or [await gateway.upstream_url(None)]
    answers = await asyncio.gather(
        *(llama_swap_client(url).get(MODELS_PATH, timeout=10) for url in urls),
        return_exceptions=True,
    )
    relayed = [a for a in answers if isinstance(a, httpx.Response)]
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
