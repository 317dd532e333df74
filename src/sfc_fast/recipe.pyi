from typing import Any

from sfc_fast.canonical import canonical_json as canonical_json
from sfc_fast.checks import MAX_FIELD_CHARS as MAX_FIELD_CHARS
from sfc_fast.checks import MAX_SECONDS as MAX_SECONDS
from sfc_fast.checks import PLACEHOLDERS as PLACEHOLDERS
from sfc_fast.checks import V110_FIELDS as V110_FIELDS
from sfc_fast.compiler import MAX_PARAMS_CHARS as MAX_PARAMS_CHARS
from sfc_fast.compiler import MAX_RECIPE_BYTES as MAX_RECIPE_BYTES
from sfc_fast.graph import BRANCH_TYPE_NAMES as BRANCH_TYPE_NAMES
from sfc_fast.graph import BRANCH_TYPES as BRANCH_TYPES
from sfc_fast.graph import INTERACTION_NAMES as INTERACTION_NAMES
from sfc_fast.graph import INTERACTIONS as INTERACTIONS
from sfc_fast.graph import QUALIFIER_NAMES as QUALIFIER_NAMES
from sfc_fast.graph import QUALIFIERS as QUALIFIERS
from sfc_fast.graph import SCHEMA_V100 as SCHEMA_V100
from sfc_fast.graph import SCHEMA_V110 as SCHEMA_V110
from sfc_fast.graph import SCHEMAS as SCHEMAS
from sfc_fast.graph import TRANSITION_KINDS as TRANSITION_KINDS
from sfc_fast.graph import Graph as Graph
from sfc_fast.graph import GraphFormatError as GraphFormatError
from sfc_fast.problems import CODES as CODES
from sfc_fast.problems import Problem as Problem
from sfc_fast.problems import RecipeError as RecipeError

MAX_ELEMENTS: int

def schema_minor(dataschema: object) -> int: ...
def compile_recipe(data: dict[str, Any] | str | bytes, dataschema: str) -> Graph: ...
