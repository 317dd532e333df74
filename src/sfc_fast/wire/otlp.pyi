from collections.abc import Sequence
from typing import Any

def encode_spans(spans: Sequence[Any]) -> bytes: ...
