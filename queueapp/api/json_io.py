"""JSON in and out of the API, hardened against hostile input.

- Parsing: nesting deep enough to exhaust Python's parser (`[[[[…` 100,000
  times) is a 400 like any other malformed JSON, not a RecursionError.
- Rendering: text that cannot be encoded as UTF-8 (an unpaired surrogate
  echoed back in an error message) is written with \\u escapes instead of
  failing the answer.
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework import parsers, renderers
from rest_framework.exceptions import ParseError


class JsonParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


class JsonRenderer(renderers.JSONRenderer):
    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return json.dumps(data, cls=self.encoder_class, ensure_ascii=True).encode()
