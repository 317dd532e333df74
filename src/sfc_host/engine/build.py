"""Building the scripts folder: compile, execute, extract Tasks, Missions and Variables.

Every problem of every script is collected (file and line), so one build shows
them all. A script is executed as a fresh module named ``sfc_scripts.<stem>``;
files whose names start with ``_`` or ``.`` are not scripts (helpers, editor files).
"""

from __future__ import annotations

import re
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sfc_host.engine.script import COLLECTING, Declarations, MissionDef, TaskDef
from sfc_host.errors import SfcHostError

MODULE_PREFIX = "sfc_scripts."
SCRIPT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\.py$")


@dataclass(frozen=True)
class BuildProblem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "message": self.message}


class BuildFailed(SfcHostError):
    """The scripts do not build; ``problems`` says where and why."""

    def __init__(self, problems: list[BuildProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(map(str, problems)))


@dataclass
class Build:
    """The result of a successful build."""

    files: list[str]
    tasks: dict[str, TaskDef] = field(default_factory=dict)
    missions: dict[str, MissionDef] = field(default_factory=dict)
    variables: dict[str, Any] = field(default_factory=dict)      # name -> initial
    declared: list[Any] = field(default_factory=list)            # Variable objects
    modules: list[str] = field(default_factory=list)

    def unload(self) -> None:
        for name in self.modules:
            sys.modules.pop(name, None)
        self.modules.clear()


def script_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if SCRIPT_NAME.match(p.name))


def _short(path: str, folder: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(folder.resolve()))
    except ValueError:
        return path


def _line_in(tb: types.TracebackType | None, filename: str) -> int:
    """The innermost line of ``filename`` in a traceback (where the script went wrong)."""
    line = 0
    for frame, lineno in traceback.walk_tb(tb):
        if frame.f_code.co_filename == filename:
            line = lineno
    return line


def build_scripts(folder: Path, builtin_tasks: list[TaskDef] | None = None) -> Build:
    """Build every script of ``folder``; raise ``BuildFailed`` with all problems."""
    folder = Path(folder)
    problems: list[BuildProblem] = []
    if not folder.is_dir():
        raise BuildFailed([BuildProblem(str(folder), 0, "scripts folder does not exist")])
    files = script_files(folder)
    build = Build(files=[p.name for p in files])
    for t in builtin_tasks or ():
        build.tasks[t.name] = t
    for path in files:
        short = path.name
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            problems.append(BuildProblem(short, 0, f"cannot read: {e}"))
            continue
        filename = str(path.resolve())
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except SyntaxError as e:
            problems.append(BuildProblem(short, e.lineno or 0, f"syntax error: {e.msg}"))
            continue
        modname = MODULE_PREFIX + path.stem
        module = types.ModuleType(modname)
        module.__file__ = filename
        sys.modules[modname] = module   # dataclasses, pickle and typing look modules up
        build.modules.append(modname)
        found = Declarations()
        token = COLLECTING.set(found)
        try:
            exec(code, module.__dict__)
        except BaseException as e:  # a script's SystemExit is a build problem too
            if isinstance(e, KeyboardInterrupt):
                raise
            kind = "import error" if isinstance(e, ImportError) else type(e).__name__
            problems.append(BuildProblem(short, _line_in(e.__traceback__, filename),
                                         f"{kind}: {e}"))
            continue
        finally:
            COLLECTING.reset(token)
        _collect(build, found, folder, problems)
    if problems:
        build.unload()
        raise BuildFailed(problems)
    return build


def _collect(build: Build, found: Declarations, folder: Path,
             problems: list[BuildProblem]) -> None:
    for t in found.tasks:
        if t.name in build.tasks:
            other = build.tasks[t.name]
            problems.append(BuildProblem(_short(t.file, folder), t.line,
                                         f"task {t.name!r} is already declared at "
                                         f"{_short(other.file, folder)}:{other.line}"))
        else:
            build.tasks[t.name] = t
    for m in found.missions:
        if m.name in build.missions:
            other = build.missions[m.name]
            problems.append(BuildProblem(_short(m.file, folder), m.line,
                                         f"mission {m.name!r} is already declared at "
                                         f"{_short(other.file, folder)}:{other.line}"))
        else:
            build.missions[m.name] = m
    for v in found.variables:
        if v.name in build.variables and build.variables[v.name] != v.initial:
            problems.append(BuildProblem(
                _short(v.file, folder), v.line,
                f"variable {v.name!r} is declared elsewhere with initial value "
                f"{build.variables[v.name]!r}, here with {v.initial!r}"))
            continue
        build.variables.setdefault(v.name, v.initial)
        build.declared.append(v)
