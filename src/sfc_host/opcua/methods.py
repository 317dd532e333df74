"""The Job Control methods over OPC UA: each call checked, turned into the request the
MQTT face would have received, and run by the same job control (``MesControl``).

What a caller gets back:

- done: Good, with ``ReturnStatus`` 1 (a UInt64, as the model declares it);
- refused by the job control (an unknown id, a state that does not allow the method,
  an order the scope cannot accept, an order that breaks a rule): **Uncertain**, with
  the ``ReturnStatus`` bits the MQTT face returns, so the output still reaches the
  client (the model's way);
- an argument of the wrong type or count: **BadInvalidArgument**, with a result per
  input argument (``BadTypeMismatch`` where it is wrong): the server checks each
  against the method's declared InputArguments before the call gets here, and a
  structure's fields are checked here as it is decoded;
- a method called on another scope's object: **BadMethodInvalid** (the server's check).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sfc_fast.wire.uabinary import EXTENSION_OBJECT, UINT64, Variant
from sfc_host import isa95 as model
from sfc_host.errors import SfcHostError
from sfc_host.mes.codec import Invalid
from sfc_host.opcua.security import user_name
from sfc_host.opcua.structures import ConvertError, Structures, state_of, texts_to_json
from sfc_host.opcua_server import CallMethodResult
from sfc_host.store.orders import OrderError

if TYPE_CHECKING:
    from sfc_host.mes.control import MesControl

log = logging.getLogger("sfc_host.opcua")

# the methods on a stored order: (JobOrderID, Comment)
ID_METHODS = ("Start", "RevokeStart", "Pause", "Resume", "Stop", "Abort", "Cancel", "Clear")
ORDER_METHODS = ("Store", "StoreAndStart", "Update")
QUERIES = ("RequestJobResponseByJobOrderID", "RequestJobResponseByJobOrderState")


UNCERTAIN = 0x40000000
BAD_INVALID_ARGUMENT = 0x80AB0000
BAD_TYPE_MISMATCH = 0x80740000
BAD_METHOD_INVALID = 0x80750000
BAD_INTERNAL_ERROR = 0x80020000


def _status(rs: int) -> Variant:
    return Variant(UINT64, rs)


def _refused(rs: int, *more: Variant | None) -> CallMethodResult:
    return CallMethodResult(UNCERTAIN, (), [*more, _status(rs)])


def _done(*more: Variant | None) -> CallMethodResult:
    return CallMethodResult(0, (), [*more, _status(model.NO_ERROR)])


class BadArgument(SfcHostError, ValueError):
    """An input argument of the wrong type: which one, and why."""

    def __init__(self, index: int, count: int, why: str) -> None:
        super().__init__(why)
        self.index = index
        self.count = count

    def result(self) -> CallMethodResult:
        codes = [0] * self.count
        if 0 <= self.index < self.count:
            codes[self.index] = BAD_TYPE_MISMATCH
        return CallMethodResult(BAD_INVALID_ARGUMENT, codes)


def _values(args: Sequence[Variant | None], count: int) -> list[Any]:
    """The Variants' values (None for a null one); the server gave ``count``."""
    if len(args) != count:
        raise BadArgument(-1, max(len(args), count),
                          f"{len(args)} input arguments, {count} expected")
    return [a.value if a is not None else None for a in args]


class JobControlCalls:
    """Runs the calls of one host's OPC UA face through its MES job control."""

    def __init__(self, control: MesControl) -> None:
        self.control = control
        self.metrics = control.metrics
        self.structures: Structures | None = None     # once the NodeSet is loaded

    async def call(self, scope: str, method: str, args: Sequence[Variant | None],
                   user: object = None) -> CallMethodResult:
        """One call of ``method`` on ``scope``'s objects, by the session's user (logged
        with it: a query at DEBUG); never raises."""
        who = user_name(user)
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
                return CallMethodResult(BAD_METHOD_INVALID)
        except BadArgument as e:
            self.metrics.inc("bad_opcua_calls")
            log.warning("OPC UA %s in %s by %s refused: %s", method, scope, who, e,
                        extra={"scope": scope})
            return e.result()
        except Exception:
            self.metrics.inc("bad_opcua_calls")
            log.exception("OPC UA %s in %s by %s failed", method, scope, who,
                          extra={"scope": scope})
            return CallMethodResult(BAD_INTERNAL_ERROR)
        self.metrics.inc("opcua_calls")
        last = result.outputs[-1] if result.outputs else None
        rs = last.value if last is not None else None
        # what changes an order is the operators' record; a query, which an MES may
        # poll, only at DEBUG (counted either way)
        if method not in QUERIES or log.isEnabledFor(logging.DEBUG):
            log.log(logging.DEBUG if method in QUERIES else logging.INFO,
                    "OPC UA %s in %s by %s: ReturnStatus %s", method, scope, who, rs,
                    extra={"scope": scope})
        return result

    async def _run(self, scope: str, method: str, data: dict[str, Any]
                   ) -> CallMethodResult:
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

    async def _order(self, scope: str, method: str, args: Sequence[Variant | None]
                     ) -> CallMethodResult:
        assert self.structures is not None
        if len(args) != 2:
            raise BadArgument(-1, max(len(args), 2), f"{len(args)} input arguments")
        order, comment = args
        try:
            doc = self.structures.decode_object(
                "JobOrder", order.value if order is not None else None, "JobOrder")
        except ConvertError as e:
            raise BadArgument(0, 2, str(e)) from None
        try:
            texts = texts_to_json(comment)
        except ConvertError as e:
            raise BadArgument(1, 2, str(e)) from None
        return await self._run(scope, method, {"JobOrder": doc, "Comment": texts})

    async def _by_id_call(self, scope: str, method: str, args: Sequence[Variant | None]
                          ) -> CallMethodResult:
        job, _ = _values(args, 2)
        if not isinstance(job, str):
            raise BadArgument(0, 2, "JobOrderID: not a String")
        try:
            texts = texts_to_json(args[1])
        except ConvertError as e:
            raise BadArgument(1, 2, str(e)) from None
        return await self._run(scope, method, {"JobOrderID": job, "Comment": texts})

    async def _response(self, scope: str, args: Sequence[Variant | None]
                        ) -> CallMethodResult:
        (job,) = _values(args, 1)
        if not isinstance(job, str):
            raise BadArgument(0, 1, "JobOrderID: not a String")
        try:
            served, _ = await self.control.job_response(scope, job)
        except OrderError as e:
            return _refused(e.status, Variant(EXTENSION_OBJECT, None))
        return _done(Variant(EXTENSION_OBJECT, self._encoded_response(served)))

    async def _responses(self, scope: str, args: Sequence[Variant | None]
                         ) -> CallMethodResult:
        assert self.structures is not None
        if len(args) != 1 or args[0] is None or args[0].type != EXTENSION_OBJECT:
            raise BadArgument(0, 1, "JobOrderState: not an ISA95StateDataType array")
        empty = Variant(EXTENSION_OBJECT, [])
        try:
            want = state_of(self.structures, args[0])
        except ConvertError:
            # a state the machine does not know: the MQTT face's INVALID_REQUEST
            return _refused(model.INVALID_REQUEST, empty)
        served = await self.control.responses_in(scope, want)
        return _done(Variant(EXTENSION_OBJECT,
                             [self._encoded_response(r) for r in served]))

    def _encoded_response(self, served: bytes) -> Any:
        """A stored job response as the JobResponse structure goes out, encoded straight
        from its JSON."""
        assert self.structures is not None
        return self.structures.extension_object("JobResponse", json.loads(served))
