"""The OpenAI-compatible front door (calls.py) and where its callers wait
(gateway.py)."""

from queueapp.frontdoor.answers import openai_error
from queueapp.frontdoor.calls import FRONT_DOOR_PATHS, MODELS_PATH, front_door_app

__all__ = ["FRONT_DOOR_PATHS", "MODELS_PATH", "front_door_app", "openai_error"]
