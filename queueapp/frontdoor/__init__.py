"""The OpenAI-compatible front door (calls.py, its ASGI entry, names the
modules of a call's steps) and where its callers wait (gateway.py)."""

from queueapp.frontdoor.answers import openai_error
from queueapp.frontdoor.calls import front_door_app
from queueapp.frontdoor.model_list import MODELS_PATH
from queueapp.upstream.client import FRONT_DOOR_PATHS

__all__ = ["FRONT_DOOR_PATHS", "MODELS_PATH", "front_door_app", "openai_error"]
