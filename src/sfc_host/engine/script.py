"""What a script declares: ``@task``, ``@mission`` and ``Variable``.

A script is a ``.py`` file in the scripts folder::

    from sfc_host.engine import Variable, mission, task

    parts = Variable("parts", 0)

    @task(interval=1.0)                 # every second; auto_start=True by default
    async def count(api):
        parts.set(parts.get() + 1)

    @mission
    async def transfer(api, source, target):
        api.log.info(f"from {source}")
        yield                           # a point where the mission may pause or cancel
        api.score += 1

The decorators return the function unchanged, so a script stays importable and
testable on its own; while the engine builds, they also register the declaration
with that build (file and line included, for error messages).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from sfc_host.errors import SfcHostError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()


@dataclass(frozen=True)
class TaskDef:
    """A periodic Task: ``fn(api)`` (or ``fn()``) every ``interval`` seconds.

    ``interval`` 0 runs executions back to back (a loop, e.g. a stream consumer).
    """

    name: str
    fn: Callable[..., Any]
    interval: float
    auto_start: bool = True
    file: str = "<builtin>"
    line: int = 0
    builtin: bool = False
    critical: bool = False   # an execution error faults the whole engine (host loops)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def takes_api(self) -> bool:
        return _takes_positional(self.fn)


@dataclass(frozen=True)
class MissionDef:
    """A Mission: an async generator function ``fn(api, **args)``."""

    name: str
    fn: Callable[..., Any]
    file: str = "<builtin>"
    line: int = 0

    @property
    def takes_api(self) -> bool:
        return _takes_positional(self.fn)

    def parameters(self) -> list[str]:
        params = list(inspect.signature(self.fn).parameters.values())
        if self.takes_api:
            params = params[1:]
        return [p.name for p in params]

    def check_args(self, args: dict[str, Any]) -> None:
        """ValueError saying why ``fn(api, **args)`` would not take these arguments (an
        instance started with them would only fail with a TypeError)."""
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return     # nothing to check against: the call will tell
        try:
            sig.bind(*((None,) if self.takes_api else ()), **args)
        except TypeError as e:
            raise ValueError(f"mission {self.name}({', '.join(self.parameters())}): "
                             f"{e}") from None


def check_mission_call(defs: Mapping[str, MissionDef], name: str,
                       args: dict[str, Any]) -> MissionDef:
    """The mission ``name`` of a build, if its function takes ``args``; ValueError saying
    which missions there are, or why the arguments do not fit."""
    defn = defs.get(name)
    if defn is None:
        raise UnknownMission(name, f"missions: {', '.join(sorted(defs)) or 'none'}")
    defn.check_args(args)
    return defn


class UnknownMission(SfcHostError, ValueError):
    """A mission name the build does not have; ``known`` lists the ones it has."""

    def __init__(self, name: str, known: str) -> None:
        super().__init__(f"no mission {name!r} ({known})")
        self.known = known


def _takes_positional(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


@dataclass
class Declarations:
    """Everything one build collected, in declaration order."""

    tasks: list[TaskDef] = field(default_factory=list)
    missions: list[MissionDef] = field(default_factory=list)
    variables: list[Variable[Any]] = field(default_factory=list)


#: The build that is executing scripts right now (None outside a build).
COLLECTING: ContextVar[Declarations | None] = ContextVar("sfc_engine_collecting", default=None)


def _where(fn: Callable[..., Any]) -> tuple[str, int]:
    code = getattr(fn, "__code__", None)
    if code is None:
        return "<unknown>", 0
    return code.co_filename, code.co_firstlineno


@overload
def task(fn: F, /) -> F: ...
@overload
def task(*, interval: float = 1.0, auto_start: bool = True,
         name: str | None = None) -> Callable[[F], F]: ...


def task(fn: Any = None, /, *, interval: float = 1.0, auto_start: bool = True,
         name: str | None = None) -> Any:
    """Declare a periodic Task (sync or async function taking ``api``)."""
    if not isinstance(interval, int | float) or isinstance(interval, bool) \
            or not math.isfinite(interval) or interval < 0:
        raise ValueError(f"@task interval must be a number of seconds >= 0, not {interval!r}")

    def deco(f: F) -> F:
        if not callable(f) or inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f):
            raise TypeError(f"@task needs a plain function or an async function, not {f!r} "
                            "(a generator is a @mission)")
        file, line = _where(f)
        d = TaskDef(name or f.__name__, f, float(interval), bool(auto_start), file, line)
        c = COLLECTING.get()
        if c is not None:
            c.tasks.append(d)
        f.__sfc_task__ = d  # type: ignore[attr-defined]
        return f

    return deco(fn) if fn is not None else deco


@overload
def mission(fn: F, /) -> F: ...
@overload
def mission(*, name: str | None = None) -> Callable[[F], F]: ...


def mission(fn: Any = None, /, *, name: str | None = None) -> Any:
    """Declare a Mission: an ``async def`` with ``yield`` points (an async generator)."""

    def deco(f: F) -> F:
        if not inspect.isasyncgenfunction(f):
            raise TypeError(f"@mission needs an async generator function (async def with "
                            f"yield), not {getattr(f, '__name__', f)!r}")
        file, line = _where(f)
        d = MissionDef(name or f.__name__, f, file, line)
        c = COLLECTING.get()
        if c is not None:
            c.missions.append(d)
        f.__sfc_mission__ = d  # type: ignore[attr-defined]
        return f

    return deco(fn) if fn is not None else deco


class Variable(Generic[T]):
    """A named value shared by every Task and Mission of the engine.

    Declared in any script with its initial value; every script that declares (or
    reads through ``api.vars``) the same name sees the same value. Outside a running
    engine it holds its own value, so a script can be tested alone.
    """

    __slots__ = ("_local", "_store", "file", "initial", "line", "name")

    def __init__(self, name: str, initial: T) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a Variable needs a non-empty name")
        self.name = name
        self.initial = initial
        self._local = initial
        self._store: Any = None
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        self.file = caller.f_code.co_filename if caller is not None else "<unknown>"
        self.line = caller.f_lineno if caller is not None else 0
        c = COLLECTING.get()
        if c is not None:
            c.variables.append(self)

    def bind(self, store: Any) -> None:
        """Attach to the engine's variable store (done by the build)."""
        self._store = store

    def get(self) -> T:
        if self._store is None:
            return self._local
        return self._store[self.name]

    def set(self, value: T) -> None:
        if self._store is None:
            self._local = value
        else:
            self._store[self.name] = value

    @property
    def value(self) -> T:
        return self.get()

    @value.setter
    def value(self, v: T) -> None:
        self.set(v)

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, {self.get()!r})"
