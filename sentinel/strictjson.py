"""Strict JSON for every file the testbed writes: NaN and +-Inf become `null`, never bare `NaN`.

Python's `json` writes `NaN` and `Infinity` by default, which no other JSON parser accepts. A loss that
diverged, a ratio of two infinities or an undefined statistic is written as `null` here (the README says
so); numpy scalars and arrays become plain numbers and lists. Reading is strict too: `loads` refuses
`NaN` / `Infinity` tokens instead of turning them into floats.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def clean(obj: Any) -> Any:
    """A copy of `obj` that `json.dumps(..., allow_nan=False)` accepts: non-finite floats -> None."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return clean(obj.tolist())
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj  # anything else: json.dumps raises TypeError, which is a bug to fix at its source


def dumps(obj: Any, **kwargs: Any) -> str:
    """`json.dumps` of `clean(obj)`, refusing any NaN or Inf that slipped through."""
    return json.dumps(clean(obj), allow_nan=False, **kwargs)


def _refuse(token: str) -> None:
    raise ValueError(f"{token} is not JSON (strict JSON writes null for a non-finite number)")


def loads(text: str | bytes) -> Any:
    """`json.loads` that refuses NaN, Infinity and -Infinity tokens (ValueError)."""
    return json.loads(text, parse_constant=_refuse)
