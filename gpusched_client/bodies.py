"""Request bodies built from a model and a prompt, for `gpusched submit --model`.

The path follows the model's kind, guessed from its name (llama-swap's
model list says nothing of kinds): a name with a word such as `image`,
`sdxl`, `flux` or `video` goes to image generation, `tts`, `speech` or
`kokoro` to speech, `embed` to embeddings, anything else to chat
completions. `--path` overrides the guess; the body follows the path.
"""

from __future__ import annotations

import re
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
IMAGES = "/v1/images/generations"
SPEECH = "/v1/audio/speech"
EMBEDDINGS = "/v1/embeddings"

# Words of a model's name (split at anything but letters and digits) that
# name its kind, as prefixes: `sdxl-turbo`, `flux1-dev`, `nomic-embed-text`.
_KIND_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (EMBEDDINGS, ("embed", "bge", "gte")),
    (SPEECH, ("tts", "speech", "kokoro", "piper", "voice", "orpheus", "bark")),
    (
        IMAGES,
        ("image", "img", "sd", "flux", "diffusion", "dall", "video", "wan", "ltx", "hunyuan"),
    ),
)


def path_for_model(model: str) -> str:
    """The path a job of `model` most likely goes to (chat when unsure)."""
    words = [word for word in re.split(r"[^a-z0-9]+", model.lower()) if word]
    for path, prefixes in _KIND_WORDS:
        if any(word.startswith(prefix) for word in words for prefix in prefixes):
            return path
    return CHAT


def body_for(path: str, *, model: str, prompt: str, voice: str | None = None) -> dict[str, Any]:
    """The body llama-swap's servers take at `path` for `prompt`: chat
    messages, a speech's `input` (and `voice`), an embedding's `input`, or a
    plain `prompt` (images, completions and any other path)."""
    if path == CHAT:
        return {"model": model, "messages": [{"role": "user", "content": prompt}]}
    if path == SPEECH:
        return {"model": model, "input": prompt, **({"voice": voice} if voice else {})}
    if path == EMBEDDINGS:
        return {"model": model, "input": prompt}
    return {"model": model, "prompt": prompt}
