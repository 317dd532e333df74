"""The Job Control methods over OPC UA: each call checked, turned into the request the
MQTT face would have received, and run by the same job control (``MesControl``).

What a caller gets back:

- done: Good, with ``ReturnStatus`` 1 (a UInt64, as the model declares it);
- refused by the job control (an unknown id, a state that does not allow the method,
  an order the scope cannot accept, an order that breaks a rule): **Uncertain**, with
  the ``ReturnStatus`` bits the MQTT face returns, so the output still reaches the
  client (the model's way);
- an argument of the wrong type or count: **BadInvalidArgument**, with a result per
  input argument (``BadTypeMismatch`` where it is wrong);
- a method called on another scope's object: **BadMethodInvalid**.

asyncua checks none of this itself: a callback gets the raw Variants.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncua import ua

from sfc_host import isa95 as model
from sfc_host.errors import SfcHostError
from sfc_host.mes.codec import Invalid
from sfc_host.opcua.convert import (
    ConvertError,
    state_of,
    texts_to_json,
    to_json,
    ua_class,
)
from sfc_host.opcua.encode import extension_object
from sfc_host.opcua.security import user_name
from sfc_host.store.orders import OrderError

if TYPE_CHECKING:
    from sfc_host.mes.control import MesControl

log = logging.getLogger("sfc_host.opcua")

# the methods on a stored order: (JobOrderID, Comment)
ID_METHODS = ("Start", "RevokeStart", "Pause", "Resume", "Stop", "Abort", "Cancel", "Clear")
ORDER_METHODS = ("Store", "StoreAndStart", "Update")
QUERIES = ("RequestJobResponseByJobOrderID", "RequestJobResponseByJobOrderState")


def _status(rs: int) -> ua.Variant:
    return ua.Variant(rs, ua.VariantType.UInt64)


def _refused(rs: int, *more: ua.Variant) -> ua.CallMethodResult:
    return ua.CallMethodResult(StatusCode=ua.StatusCode(ua.StatusCodes.Uncertain),
                               OutputArguments=[*more, _status(rs)])


def _done(*more: ua.Variant) -> ua.CallMethodResult:
    return ua.CallMethodResult(OutputArguments=[*more, _status(model.NO_ERROR)])


def _bad_arguments(results: Sequence[int]) -> ua.CallMethodResult:
    return ua.CallMethodResult(
        StatusCode=ua.StatusCode(ua.StatusCodes.BadInvalidArgument),
        InputArgumentResults=[ua.StatusCode(r) for r in results])


class BadArgument(SfcHostError, ValueError):
    """An input argument of the wrong type: which one, and why."""

    def __init__(self, index: int, count: int, why: str) -> None:
        super().__init__(why)
        self.index = index
        self.count = count

    def result(self) -> ua.CallMethodResult:
        codes = [ua.StatusCodes.Good] * self.count
        if 0 <= self.index < self.count:
            codes[self.index] = ua.StatusCodes.BadTypeMismatch
        return _bad_arguments(codes)


def _values(args: Sequence[Any], count: int, optional: int = 0) -> list[Any]:
    """The Variants' values; BadArgument for a missing one (the last ``optional`` may
    be absent or null)."""
    if not count - optional <= len(args) <= count:
        raise BadArgument(-1, max(len(args), count),
                          f"{len(args)} input arguments, {count} expected")
    out = [a.Value if isinstance(a, ua.Variant) else a for a in args]
    return out + [None] * (count - len(out))


class JobControlCalls:
    """Runs the calls of one host's OPC UA face through its MES job control."""

    def __init__(self, control: MesControl) -> None:
        self.control = control
        self.metrics = control.metrics

    async def call(self, scope: str, method: str, args: Sequence[Any]
                   ) -> ua.CallMethodResult:
        """One call of ``method`` on ``scope``'s objects, by the session's user (logged
        with it: a query at DEBUG); never raises."""
        user = user_name()
        try:
            if method in ORDER_METHODS:
                result = await self._order(scope, method, args)
            elif method in ID_METHODS:
                result = await self._by_id_call(scope, method, args)
            elif method == "RequestJobResponseByJobOrderID":
                result = await self._response(scope, args)
            elif method == "RequestJobResponseByJobOrderState":
                result = await self._responses(scope, args)
            else:
                return ua.CallMethodResult(
                    StatusCode=ua.StatusCode(ua.StatusCodes.BadMethodInvalid))
        except BadArgument as e:
            self.metrics.inc("bad_opcua_calls")
            log.warning("OPC UA %s in %s by %s refused: %s", method, scope, user, e,
                        extra={"scope": scope})
            return e.result()
        except Exception:
            self.metrics.inc("bad_opcua_calls")
            log.exception("OPC UA %s in %s by %s failed", method, scope, user,
                          extra={"scope": scope})
            return ua.CallMethodResult(
                StatusCode=ua.StatusCode(ua.StatusCodes.BadInternalError))
        self.metrics.inc("opcua_calls")
        rs = result.OutputArguments[-1].Value if result.OutputArguments else None
        # what changes an order is the operators' record; a query, which an MES may
        # poll, only at DEBUG (counted either way)
        log.log(logging.DEBUG if method in QUERIES else logging.INFO,
                "OPC UA %s in %s by %s: ReturnStatus %s", method, scope, user, rs,
                extra={"scope": scope})
        return result

    async def _run(self, scope: str, method: str, data: dict[str, Any]
                   ) -> ua.CallMethodResult:
        try:
            await self.control.job_control(scope, method, data)
        except Invalid as e:
            self.metrics.inc("bad_mes_requests")
            log.warning("OPC UA %s in %s refused: %s", method, scope, e,
                        extra={"scope": scope})
            return _refused(e.status)
        except OrderError as e:
            self.metrics.inc("mes_requests_refused")
            log.info("OPC UA %s in %s refused: %s", method, scope, e, extra={"scope": scope})
            return _refused(e.status)
        return _done()

    async def _order(self, scope: str, method: str, args: Sequence[Any]
                     ) -> ua.CallMethodResult:
        order, comment = _values(args, 2, optional=1)
        try:
            doc = to_json("JobOrder", order, "JobOrder")
        except ConvertError as e:
            raise BadArgument(0, 2, str(e)) from None
        try:
            texts = texts_to_json(comment)
        except ConvertError as e:
            raise BadArgument(1, 2, str(e)) from None
        return await self._run(scope, method, {"JobOrder": doc, "Comment": texts})

    async def _by_id_call(self, scope: str, method: str, args: Sequence[Any]
                          ) -> ua.CallMethodResult:
        job, comment = _values(args, 2, optional=1)
        if not isinstance(job, str):
            raise BadArgument(0, 2, "JobOrderID: not a String")
        try:
            texts = texts_to_json(comment)
        except ConvertError as e:
            raise BadArgument(1, 2, str(e)) from None
        return await self._run(scope, method, {"JobOrderID": job, "Comment": texts})

    async def _response(self, scope: str, args: Sequence[Any]) -> ua.CallMethodResult:
        (job,) = _values(args, 1)
        if not isinstance(job, str):
            raise BadArgument(0, 1, "JobOrderID: not a String")
        none = ua.Variant(None, ua.VariantType.ExtensionObject)
        try:
            served, _ = await self.control.job_response(scope, job)
        except OrderError as e:
            return _refused(e.status, none)
        return _done(ua.Variant(_encoded_response(served), ua.VariantType.ExtensionObject))

    async def _responses(self, scope: str, args: Sequence[Any]) -> ua.CallMethodResult:
        (states,) = _values(args, 1)
        if not isinstance(states, list) or not all(
                isinstance(s, ua_class("State")) for s in states):
            raise BadArgument(0, 1, "JobOrderState: not an ISA95StateDataType array")
        empty = ua.Variant([], ua.VariantType.ExtensionObject, is_array=True)
        try:
            want = state_of(states)
        except ConvertError:
            # a state the machine does not know: the MQTT face's INVALID_REQUEST
            return _refused(model.INVALID_REQUEST, empty)
        served = await self.control.responses_in(scope, want)
        responses = [_encoded_response(r) for r in served]
        return _done(ua.Variant(responses, ua.VariantType.ExtensionObject, is_array=True))


def _encoded_response(served: bytes) -> ua.ExtensionObject:
    """A stored job response as the JobResponse structure goes out, encoded from its
    JSON at once: building asyncua's objects only for asyncua to encode them was most
    of a query's own cost."""
    return extension_object("JobResponse", json.loads(served))
