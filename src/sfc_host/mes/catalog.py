"""What an MES configures for a scope, and the job acceptance checks that use it.

Config messages (``com.github.aschamberger.ISA95-JOBCONTROL_V2.config.{kind}.v1``, CE
extension ``method`` ``PUT`` (default) or ``DELETE``) add or remove an id of
equipment, material class, material definition, personnel or physical asset to the
scope's set in Redis, or set the scope's ``max_downloadable_job_orders``. Work Masters
are stored whole by the control side (they carry recipes).

A Store, StoreAndStart or Update is accepted only when every id it names is
configured for the scope (each check switchable with ``mes_acceptance``) and, for a
new order, the scope holds fewer live orders than its maximum: all read in one round
trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sfc_host import isa95 as model
from sfc_host.config import MES_ACCEPTANCE_CHECKS
from sfc_host.mes.codec import Invalid, typed
from sfc_host.store.keys import ScopeKeys

CHECKS = MES_ACCEPTANCE_CHECKS
# config kind -> the id field its payload names it by
ID_FIELD = {"equipment": "ID", "personnel": "ID", "physicalasset": "ID",
            "materialclass": "MaterialClassID", "materialdefinition": "MaterialDefinitionID"}
MAX_ID = 256


def config_id(kind: str, data: Any) -> str:
    """The id a config message names (``Invalid`` without one)."""
    item = typed(data, model.ConfigItem)
    value = getattr(item, ID_FIELD[kind])
    if not value or len(value) > MAX_ID:
        raise Invalid(f"config.{kind} needs a {ID_FIELD[kind]} of 1-{MAX_ID} characters")
    return value


def max_orders(data: Any) -> int:
    if not isinstance(data, dict):
        raise Invalid("data is not an object")
    try:
        cfg = typed(data, model.ConfigJobAcceptance)
    except Invalid:
        raise Invalid("config.jobacceptance needs max_downloadable_job_orders, an "
                      "integer") from None
    if cfg.max_downloadable_job_orders < 0:
        raise Invalid("max_downloadable_job_orders must not be negative")
    return cfg.max_downloadable_job_orders


# reads several Redis commands in one round trip: their replies in order
Reads = Callable[[list[tuple[Any, ...]]], Awaitable[list[Any]]]


class Acceptance:
    """The checks of one order against one scope's configuration."""

    def __init__(self, reads: Reads, checks: list[str], default_max: int) -> None:
        self.reads = reads
        self.checks = frozenset(checks)
        self.default_max = default_max

    async def check(self, k: ScopeKeys, order: model.JobOrderData, *,
                    new: bool) -> str | None:
        """The Work Master that runs (the first one listed that the scope knows; None
        when none is), or ``Invalid`` (UNABLE_TO_ACCEPT_JOB_ORDER) naming what is not
        accepted."""
        c = self.checks
        asks: list[tuple[str, str]] = []     # (what, id) per command read
        cmds: list[tuple[Any, ...]] = []
        if new and "max_job_orders" in c:
            cmds += [("GET", k.acceptance), ("SCARD", k.live)]
        for field, kind, check, items in (
                ("ID", "equipment", "equipment", order.EquipmentRequirements),
                ("MaterialClassID", "materialclass", "material_class",
                 order.MaterialRequirements),
                ("MaterialDefinitionID", "materialdefinition", "material_definition",
                 order.MaterialRequirements),
                ("ID", "personnel", "personnel", order.PersonnelRequirements),
                ("ID", "physicalasset", "physical_asset", order.PhysicalAssetRequirements)):
            if check not in c:
                continue
            for item in items or ():
                value = getattr(item, field)
                if value:
                    asks.append((kind, value))
                    cmds.append(("SISMEMBER", k.catalog(kind), value))
        wms = [w.ID for w in order.WorkMasterID or () if w.ID]
        cmds += [("EXISTS", k.work_master(wm)) for wm in wms]
        if not cmds:
            return None
        got = await self.reads(cmds)
        i = 0
        if new and "max_job_orders" in c:
            scoped, live = got[0], int(got[1])
            limit = int(scoped) if scoped is not None else self.default_max
            if live >= limit:
                raise Invalid(f"scope {k.scope!r} holds the maximum of {limit} live job "
                              "orders", model.UNABLE_TO_ACCEPT_JOB_ORDER)
            i = 2
        for kind, value in asks:
            if not got[i]:
                raise Invalid(f"{kind} {value!r} is not configured for scope {k.scope!r}",
                              model.UNABLE_TO_ACCEPT_JOB_ORDER)
            i += 1
        known = [wm for wm, ok in zip(wms, got[i:], strict=True) if ok]
        if "work_master" in c:
            missing = [wm for wm in wms if wm not in known]
            if missing:
                raise Invalid(f"Work Master {missing[0]!r} is not known in scope "
                              f"{k.scope!r}", model.UNABLE_TO_ACCEPT_JOB_ORDER)
        return known[0] if known else None
