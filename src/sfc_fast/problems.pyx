# cython: language_level=3
"""What can be wrong with a recipe: the stable problem codes, one ``Problem`` each, and
``RecipeError``, which carries every problem the compiler found at once."""

from sfc_fast.errors import SfcError

# Problem codes. Stable: tools and tests match on them.
CODES = {
    "SFC001": "not exactly one initial step",
    "SFC002": "duplicate name",
    "SFC003": "unknown step or branch",
    "SFC004": "invalid action name",
    "SFC005": "timeout must be a positive whole number of seconds",
    "SFC006": "unknown qualifier",
    "SFC007": "unknown interaction",
    "SFC008": "empty branch or empty branch path",
    "SFC009": "step in more than one branch path",
    "SFC010": "hold field without HoldTypeId",
    "SFC011": "condition does not parse",
    "SFC012": "v1.1.0 field in a v1.0.0 recipe",
    "SFC013": "missing field or wrong type",
    "SFC014": "unusable recipe (dataschema, not JSON, not an object)",
    "SFC015": "recipe too large",
    "SFC016": "reset of an action that is not stored",
    "SFC017": "duration missing or not allowed",
    "SFC018": "field not allowed for this interaction",
    "SFC019": "transition crosses a branch path",
    "SFC020": "unknown branch type",
    "SFC021": "unknown field",
    "SFC022": "unknown placeholder in Match",
    "SFC023": "initial step inside a branch path",
    "SFC024": "retries must be a whole number >= 0",
}


class Problem:
    """One problem of a recipe: a stable ``code``, a JSON ``path`` and a ``message``."""

    __slots__ = ("code", "path", "message")

    def __init__(self, code: str, path: str, message: str) -> None:
        self.code = code
        self.path = path
        self.message = message

    def __repr__(self) -> str:
        return f"Problem({self.code!r}, {self.path!r}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.code} {self.path}: {self.message}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and (
            (self.code, self.path, self.message) == (other.code, other.path, other.message))

    def __hash__(self) -> int:
        return hash((self.code, self.path, self.message))

    def to_dict(self) -> dict:
        return {"code": self.code, "path": self.path, "message": self.message}


class RecipeError(SfcError, ValueError):
    """A recipe that cannot run; ``problems`` lists every problem found."""

    def __init__(self, problems: list) -> None:
        self.problems = list(problems)
        first = self.problems[0] if self.problems else None
        more = len(self.problems) - 1
        text = str(first) if first is not None else "unusable recipe"
        if more > 0:
            text += f" (and {more} more problem{'s' if more > 1 else ''})"
        super().__init__(text)

    @property
    def codes(self) -> list:
        return [p.code for p in self.problems]
