"""The API's JSON renderer: strict JSON, and never a 500 for a stored value strict JSON cannot hold.

Input is checked (``rl_engine.safe_json``), but rows stored before that check may hold lone surrogates or
non-finite numbers; a data migration repairs them. Should one still reach a response, the response is
rendered from the repaired copy (U+FFFD, null) instead of failing for every reader of that run.
"""

from __future__ import annotations

import logging

from rest_framework.renderers import JSONRenderer

from rl_engine.safe_json import json_repaired


class SafeJSONRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except (UnicodeEncodeError, ValueError):  # lone surrogate; NaN or Infinity under strict JSON
            logging.getLogger("api").warning("response held values strict JSON cannot: rendered repaired")
            return super().render(json_repaired(data), accepted_media_type, renderer_context)
