"""JSON's C half, `_json`, for the status lines (stages/wire/status.py) and
the held layer's list (stages/helper/held_layer.py): the `json` package's
import loads `re` (json.decoder's), some 5.5 ms of CPU in the helper, which
loads neither on its way to Ready (a start-up trick, stages/startup/tricks.py).
With the tricks off, the same three functions as the json package holds them
(its C ones, where CPython has them, as here)."""
from __future__ import annotations

from stages import startup

if startup.ON:
    from _json import encode_basestring, make_encoder, make_scanner   # noqa: F401
else:
    from json.encoder import c_make_encoder as make_encoder, encode_basestring  # noqa: F401
    from json.scanner import make_scanner  # noqa: F401
