"""The OpenAI-compatible front door (calls.py) and where its callers wait
(gateway.py)."""

from queueapp.frontdoor.answers import openai_error
from queueapp.frontdoor.calls import MODELS_PATH, front_door_app
from queueapp.upstream.client import FRONT_DOOR_PATHS

__all__ = ["FRONT_DOOR_PATHS", "MODELS_PATH", "front_door_app", "openai_error"]
