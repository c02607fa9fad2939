"""A stand-in for llama-swap that needs no GPU, for ``make run`` and the end-to-end tests.

It speaks llama-swap's HTTP surface (paths, model selection, ``/running``, ``/v1/models``,
``/health``, a model's load by ``GET /upstream/<model>/``, the error envelope, the 429
concurrency-limit answer, the ``/api/events`` stream, the unload routes, ``ttl``) so the
dispatcher is exercised exactly as it would be against the real proxy. Standard library
only (and the plain-Python policy layer for the swap rule, PyYAML for ``--config``), on
purpose: it is started as a separate process and must not depend on Django being
configured. Its routing engines are its own (``routing.py``), not the policy's.

  gpu.py       the simulated GPU: resident model, its process state, swaps, unloads, ttl,
               slots, admission, Retry-After, the in-flight list, the log
  server.py    llama-swap's HTTP surface in front of it, and `LlamaSwapSimulator`
  routes.py    its routes, llama-swap's messages and error envelope, the ``"sim"`` key
  events.py    ``/api/events``: Go's framing and JSON, the open streams, the events switch
  inflight.py  llama-swap's in-flight records: headers as Go keeps them, redaction
  payloads.py  the answers' bodies (chat, completion, embeddings, PNG, WAV, ...)
  cli.py       the command line, shared with ``manage.py simulate_llama_swap``
  api_keys.py  llama-swap's ``apiKeys`` check (``--api-key``), before any route
  config.py    ``--config``: a llama-swap YAML config's models and routing, checked
  sizing.py    a request's run time scaled by its size, for the models that opt in
  routing.py   llama-swap's group and matrix engines: what a model's load stops (pure)
  residency.py `RoutedGpu`: several models resident as the config's routing allows,
               requests that wait for a busy model instead of stopping it

With ``--config`` the simulator serves that config's models (aliases, ``concurrencyLimit``,
``ttl``) with its routing, several at once; ``residency.py`` says how requests wait, and the
one-model simplifications below hold only without a config.

Simulator-only extensions (not llama-swap's; real backends ignore unknown body keys):
  * request body key ``"sim": {"seconds": float, "status": int, "size_bytes": int}`` overrides
    the job duration, answers with an llama-swap style error of that status after the job
    time, or pads the answer to at least that many bytes (in the text field where the answer
    has one, otherwise in a top-level ``"sim_padding"`` string);
  * run times that follow the request's size, for the models that opt in (``--size-scaled``
    for all, ``metadata.simulator.size_scaled: true`` for one model of a config): the
    model's seconds are a reference request's, times each factor of the body's size over
    the reference's (``sizing.py``): video (an image or sdapi body naming ``num_frames``,
    ``frames``, ``video_frames`` or ``video_length``) × frames / 60 × steps / 20 × pixels /
    (832×480); image × count × pixels / 1024² × steps / 20; chat, completions, responses
    × max tokens / 256; speech × characters of ``input`` / 200; transcription × upload
    bytes / 1,000,000; embeddings × characters of ``input`` / 2,000. A factor the body
    does not give is the reference's, so a body without size fields runs the model's
    seconds, and ``"sim": {"seconds": N}`` wins over the size. Off by default: existing
    callers send ``steps``, ``max_tokens`` and ``input`` and time the model's seconds;
  * ``GET``/``POST /sim/events`` reads or flips the event switch (``{"enabled": bool}``;
    ``--no-events`` starts it off): off, every event is dropped (events.py says how);
  * ``GET /sim/log`` and ``POST /sim/reset``. Log entries: ``started_at`` is the admission
    time and ``finished_at`` the moment the slot is freed (a swap counts as part of the job),
    in-flight entries have ``finished_at`` and ``status`` null, refused ones have
    ``started_at``, ``in_flight``, ``load_seconds`` and ``run_seconds`` null, and a client
    that hung up before the answer was complete is logged with status 499: at once for
    chat, completions, responses and embeddings (llama-server stops), at the end of the
    render for images, audio and ``/sdapi/`` (those servers finish it; the GPU stays busy).
    ``body`` is the parsed JSON body (null for a form), ``body_bytes`` and ``body_sha256``
    the request body as received, byte for byte; a load (``GET /upstream/<model>/``) is
    logged like a request, with a ``body`` of null and a ``run_seconds`` of 0 (its time is
    its ``load_seconds``);
    ``in_flight`` is the count of requests in flight at its admission, itself included;
    ``load_seconds`` the cold load it waited for (its swap, or the rest of one under way)
    and ``run_seconds`` its run, slowed by the requests sharing the GPU, both fixed at
    admission;
  * ``GET /sim/credentials``: per request, the credential headers it carried (names only)
    and whether its key matched (`api_keys.ApiKeyGate.seen`); ``/sim/`` needs no key;
  * ``sent(seq)``: what was answered to the log entry ``seq`` (status, content type, body
    bytes; a stream's events without the chunk framing), kept for the latest answers only,
    so a test can compare a proxy's answer with the simulator's byte for byte.

Batching: a model may have ``parallel`` requests in flight at once (llama.cpp's
``--parallel N``, vLLM), each one slower the more share the GPU; a swap waits until nothing
is in flight (`gpu.SimulatedGpu` says how admission decides).

Deliberate simplifications (without ``--config``): llama-swap's concurrency limit is per
model and requests for another model wait in its queue; here a request that finds no free
slot (another model in flight, or its model's slots all taken) is refused, which is what a
dispatcher that knows the GPU's slots must never provoke. llama-swap always sends
``Retry-After: 1``; here it estimates when the earliest request in flight ends. A request that
arrives while its model's unload is stopping it is refused the same way (llama-swap waits
for the stop, then starts the model again). One model is resident at a time, so
``/running`` lists one process at most, and ``modelStatus`` lists configured models only
(as llama-swap's config does): one served through ``accept_any_model`` shows in
``/running`` with empty config fields.
"""

from queueapp.upstream.simulator.gpu import SimulatedGpu
from queueapp.upstream.simulator.payloads import PNG_B64
from queueapp.upstream.simulator.routes import error_envelope
from queueapp.upstream.simulator.server import LlamaSwapSimulator

__all__ = ["PNG_B64", "LlamaSwapSimulator", "SimulatedGpu", "error_envelope"]
