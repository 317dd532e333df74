from sfc_fast.errors import SfcError

CODES: dict[str, str]

class Problem:
    code: str
    path: str
    message: str
    def __init__(self, code: str, path: str, message: str) -> None: ...
    def to_dict(self) -> dict[str, str]: ...

class RecipeError(SfcError, ValueError):
    problems: list[Problem]
    def __init__(self, problems: list[Problem]) -> None: ...
    @property
    def codes(self) -> list[str]: ...
