"""The script engine: user scripts with periodic Tasks and long-running Missions.

Scripts declare ``@task``, ``@mission`` and ``Variable`` (``sfc_host.engine.script``);
the ``Engine`` (``sfc_host.engine.manager``) builds a scripts folder and runs it
under the Engine, Task and Mission machines of ``sfc_fast.machines``.
"""

from sfc_host.engine.api import (
    Handler,
    JobsNotConnected,
    LocalBus,
    Props,
    ScriptAPI,
    ScriptAPIError,
    VariableStore,
    topic_matches,
    wants_properties,
)
from sfc_host.engine.build import BuildFailed, BuildProblem, build_scripts
from sfc_host.engine.manager import Engine, EngineFault, EngineStateError
from sfc_host.engine.missions import (
    MemoryMissionStore,
    MissionInstance,
    MissionStore,
    RedisMissionStore,
    mission_prefix,
    summarize,
)
from sfc_host.engine.ports import (
    EngineControl,
    JobAPI,
    MissionHandle,
    MqttLink,
    TaskHandle,
    Variables,
)
from sfc_host.engine.script import (
    MissionDef,
    TaskDef,
    UnknownMission,
    Variable,
    check_mission_call,
    mission,
    task,
)
from sfc_host.engine.tasks import TaskDisposed, TaskRunner

__all__ = [
    "BuildFailed",
    "BuildProblem",
    "Engine",
    "EngineControl",
    "EngineFault",
    "EngineStateError",
    "Handler",
    "JobAPI",
    "JobsNotConnected",
    "LocalBus",
    "MemoryMissionStore",
    "MissionDef",
    "MissionHandle",
    "MissionInstance",
    "MissionStore",
    "MqttLink",
    "Props",
    "RedisMissionStore",
    "ScriptAPI",
    "ScriptAPIError",
    "TaskDef",
    "TaskDisposed",
    "TaskHandle",
    "TaskRunner",
    "UnknownMission",
    "Variable",
    "VariableStore",
    "Variables",
    "build_scripts",
    "check_mission_call",
    "mission",
    "mission_prefix",
    "summarize",
    "task",
    "topic_matches",
    "wants_properties",
]
