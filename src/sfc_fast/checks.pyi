MAX_SECONDS: int
MAX_FIELD_CHARS: int
V110_FIELDS: tuple[str, ...]
STEP_KEYS: frozenset[str]
TRANSITION_KEYS: frozenset[str]
ACTION_KEYS: frozenset[str]
PLACEHOLDERS: frozenset[str]

class Checker:
    def __init__(self, minor: int) -> None: ...
