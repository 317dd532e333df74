"""sfc-fast: the compiled core of the recipe-execution host.

Pure functions over array-based graphs: the recipe compiler and conditions, the
``evolve`` step over compact state documents, the deadline index, the embedded
runner and the table-driven state machines. No I/O, no clock: time comes in as
integer milliseconds.
"""

from sfc_fast import events
from sfc_fast.deadlines import DeadlineIndex
from sfc_fast.errors import SfcError
from sfc_fast.evolve import (
    Command,
    Decision,
    evolve,
    evolve_live,
    evolve_many,
    job_index,
    job_of_command,
    open_command,
    sent_markers,
)
from sfc_fast.machines import ENGINE, JOB_ORDER, MISSION, TASK, InvalidTransition, Machine
from sfc_fast.recipe import (
    MAX_RECIPE_BYTES,
    SCHEMA_V100,
    SCHEMA_V110,
    SCHEMAS,
    Graph,
    GraphFormatError,
    Problem,
    RecipeError,
    compile_recipe,
)
from sfc_fast.runner import Runner
from sfc_fast.state import StateFormatError, action_results, join_state, state_to_json

__all__ = [
    "ENGINE",
    "JOB_ORDER",
    "MAX_RECIPE_BYTES",
    "MISSION",
    "SCHEMAS",
    "SCHEMA_V100",
    "SCHEMA_V110",
    "TASK",
    "Command",
    "DeadlineIndex",
    "Decision",
    "Graph",
    "GraphFormatError",
    "InvalidTransition",
    "Machine",
    "Problem",
    "RecipeError",
    "Runner",
    "SfcError",
    "StateFormatError",
    "action_results",
    "compile_recipe",
    "events",
    "evolve",
    "evolve_live",
    "evolve_many",
    "job_index",
    "job_of_command",
    "join_state",
    "open_command",
    "sent_markers",
    "state_to_json",
]

__version__ = "0.1.0"
