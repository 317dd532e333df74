"""A small driver over ``evolve`` for the core's tests: one job, explicit time."""

from __future__ import annotations

from typing import Any

from sfc_fast import compile_recipe
from sfc_fast.events import Start
from sfc_fast.evolve import Decision, evolve
from sfc_fast.state import state_to_json


class Job:
    """Holds one job's state bytes and applies events the way a host would."""

    def __init__(self, recipe: dict[str, Any], schema: str, job: str = "J",
                 scope: str = "s1", params: dict[str, Any] | None = None,
                 now: int = 1_000) -> None:
        self.graph = compile_recipe(recipe, schema)
        self.job = job
        self.now = now
        self.state: bytes | None = None
        self.log: list[Decision] = []
        self.last = self.apply(Start(job, scope, params))

    def apply(self, event: Any, at: int | None = None) -> Decision:
        if at is not None:
            self.now = at
        d = evolve(self.graph, self.state, event, self.now)
        if d.applied:
            self.state = d.state
        self.log.append(d)
        self.last = d
        return d

    def view(self) -> dict[str, Any]:
        assert self.state is not None
        return state_to_json(self.graph, self.state)

    def cmd(self, action: str) -> str:
        """The open command id of an action."""
        c = self.view()["actions"][action]["command_id"]
        assert c is not None, action
        return c

    @property
    def status(self) -> str:
        return self.last.status

    def active(self) -> list[str]:
        return self.view()["active_steps"]


def dispatched(d: Decision) -> list[str]:
    """Command ids a decision sends, in order."""
    return [c.command_id for c in d.commands]
