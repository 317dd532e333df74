"""Running jobs: the driver around the pure core.

- ``host``: ``Host``, the loops (work, answers, sweeps, wake-ups) of one host process;
- ``settle``: read, ``evolve``, compare-and-set, batched per scope;
- ``work``: a handler per work entry kind;
- ``dispatch``: which command goes out, through a ``CommandSink``;
- ``recovery``, ``sweep``, ``schedule``, ``wakeup``: start-up, deadlines, pacing;
- ``workmaster``: recipe files as users hand them over.
"""

from sfc_host.execution.dispatch import CommandSink, Dispatcher, InProcessSink
from sfc_host.execution.host import Host
from sfc_host.execution.settle import Item, Settler
from sfc_host.execution.work import WorkHandler
from sfc_host.execution.workmaster import UsageError, compile_file, read_recipe_file

__all__ = [
    "CommandSink",
    "Dispatcher",
    "Host",
    "InProcessSink",
    "Item",
    "Settler",
    "UsageError",
    "WorkHandler",
    "compile_file",
    "read_recipe_file",
]
