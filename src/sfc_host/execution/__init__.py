"""Running jobs: the driver around the pure core.

- ``host``: ``Host``, the loops (work, answers, sweeps, wake-ups) of one host process;
- ``settle``: read, ``evolve``, compare-and-set, batched per scope;
- ``work``: a handler per work entry kind;
- ``dispatch``: which command goes out, through a ``CommandSink``;
- ``recovery``, ``sweep``, ``schedule``, ``wakeup``: start-up, deadlines, pacing;
- ``workmaster``: recipe files as users hand them over.
"""
