"""The Call service's half that is the server's, not the owner's: which method of which
object, whether the user may, and whether the arguments are what the method declares
(their count, and each one's built-in type and rank against its Argument structure),
before the owner's callback sees them (IEC 62541 Part 4 §5.11.2).

Wrong arguments are BadInvalidArgument, with a result per argument: BadTypeMismatch,
BadArgumentsMissing, BadTooManyArguments. An Array argument may come as a null Variant
or be left out at the end (an empty array: a JobOrder's Comment). The declared
arguments are read from the method's InputArguments property once and kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sfc_fast.wire.uabinary import EXTENSION_OBJECT, INT32, NodeId, QualifiedName, Variant
from sfc_host.opcua_client.services import Argument, Unexpected, read_arguments
from sfc_host.opcua_server.bodies import CallMethodResult
from sfc_host.opcua_server.nodes import METHOD, AddressSpace, Node

BAD_NODE_ID_UNKNOWN = 0x80340000
BAD_METHOD_INVALID = 0x80750000
BAD_NOT_IMPLEMENTED = 0x80400000
BAD_USER_ACCESS_DENIED = 0x801F0000
BAD_INVALID_ARGUMENT = 0x80AB0000
BAD_TYPE_MISMATCH = 0x80740000
BAD_ARGUMENTS_MISSING = 0x80760000
BAD_TOO_MANY_ARGUMENTS = 0x80E50000
BAD_NOT_EXECUTABLE = 0x81110000

HAS_COMPONENT = NodeId(47)
HAS_PROPERTY = NodeId(46)
BASE_DATA_TYPE, STRUCTURE, ENUMERATION = NodeId(24), NodeId(22), NodeId(29)
NUMBER, INTEGER, UINTEGER = NodeId(26), NodeId(27), NodeId(28)
EXECUTABLE = 21
_NUMBERS = {NUMBER.identifier: set(range(2, 12)), INTEGER.identifier: {2, 4, 6, 8},
            UINTEGER.identifier: {3, 5, 7, 9}}

Callback = Callable[[Any, NodeId, list[Variant | None]],
                    CallMethodResult | Awaitable[CallMethodResult]]
"""(the session, the object, the arguments) -> the result (or a coroutine of it)."""


class MethodTable:
    """The owner's callbacks by method node id, and the checks before them."""

    def __init__(self, space: AddressSpace) -> None:
        self.space = space
        self._callbacks: dict[NodeId, Callback] = {}
        self._declared: dict[NodeId, list[Argument] | None] = {}

    def add(self, method: NodeId, callback: Callback) -> None:
        self._callbacks[method] = callback
        self._declared.pop(method, None)

    def remove(self, method: NodeId) -> None:
        self._callbacks.pop(method, None)
        self._declared.pop(method, None)

    def call(self, session: Any, object_id: NodeId, method_id: NodeId,
             args: Sequence[Variant | None],
             allowed: Callable[[Any, str, NodeId], bool]
             ) -> CallMethodResult | Awaitable[CallMethodResult]:
        space = self.space
        obj = space.get(object_id)
        if obj is None:
            return CallMethodResult(BAD_NODE_ID_UNKNOWN)
        method = space.get(method_id)
        if method is None or method.node_class != METHOD or \
                not self._belongs(obj, method_id):
            return CallMethodResult(BAD_METHOD_INVALID)
        if method.attributes.get(EXECUTABLE) is False:
            return CallMethodResult(BAD_NOT_EXECUTABLE)
        callback = self._callbacks.get(method_id)
        if callback is None:
            return CallMethodResult(BAD_NOT_IMPLEMENTED)
        if not allowed(session.user, "call", method_id):
            return CallMethodResult(BAD_USER_ACCESS_DENIED)
        checked = self._check(method_id, args)
        if isinstance(checked, CallMethodResult):
            return checked
        return callback(session, object_id, checked)

    def _belongs(self, obj: Node, method_id: NodeId) -> bool:
        """The method is a component of the object or of its type (or a supertype)."""
        if any(r.forward and r.target == method_id for r in obj.references):
            return True
        kind = self.space.type_definition(obj.node_id)
        while kind is not None:
            type_node = self.space.get(kind)
            if type_node is None:
                return False
            if any(r.forward and r.target == method_id for r in type_node.references):
                return True
            kind = next((r.target for r in type_node.references
                         if not r.forward and r.type_id == NodeId(45)), None)
        return False

    def declared(self, method_id: NodeId) -> list[Argument] | None:
        """The method's InputArguments (None where it declares none)."""
        if method_id in self._declared:
            return self._declared[method_id]
        prop = self.space.child(method_id, _INPUT_ARGUMENTS)
        out = None
        if prop is not None:
            dv = self.space.read(prop, 13)
            try:
                out = read_arguments(dv.value.value if dv.value is not None else [])
            except Unexpected:
                out = None
        self._declared[method_id] = out
        return out

    def _check(self, method_id: NodeId, args: Sequence[Variant | None]
               ) -> CallMethodResult | list[Variant | None]:
        """The arguments padded to the declared count (an Array argument left out is
        null), or the result that refuses them: BadInvalidArgument, with a result per
        argument (BadTypeMismatch, BadArgumentsMissing, BadTooManyArguments)."""
        declared = self.declared(method_id)
        if declared is None:
            return list(args)
        results = []
        for i, a in enumerate(declared):
            if i < len(args):
                results.append(0 if self.fits_argument(args[i], a) else BAD_TYPE_MISMATCH)
            else:
                results.append(0 if a.value_rank != -1 else BAD_ARGUMENTS_MISSING)
        results += [BAD_TOO_MANY_ARGUMENTS] * (len(args) - len(declared))
        if any(results):
            return CallMethodResult(BAD_INVALID_ARGUMENT, results)
        return list(args) + [None] * (len(declared) - len(args))

    def fits_argument(self, v: Variant | None, a: Argument) -> bool:
        if v is None or v.type == 0:
            # a null Variant: an empty array, or BaseDataType's null
            return a.value_rank != -1 or a.data_type == BASE_DATA_TYPE
        if (a.value_rank == -1 and v.is_array) or (a.value_rank >= 1 and not v.is_array):
            return False
        return self.fits_type(v, a.data_type)

    def fits(self, v: Variant | None, node: Node) -> bool:
        """A value written to a variable fits its DataType and ValueRank."""
        dtype = node.attributes.get(14)
        rank = node.attributes.get(15, -2)
        if v is None or dtype is None:
            return True
        return self.fits_argument(v, Argument("", dtype, rank, []))

    def fits_type(self, v: Variant, data_type: NodeId) -> bool:
        if data_type == BASE_DATA_TYPE:
            return True
        space = self.space
        if data_type.namespace == 0 and isinstance(data_type.identifier, int):
            ident = data_type.identifier
            if ident <= 25:
                return v.type == ident
            if ident in _NUMBERS:
                return v.type in _NUMBERS[ident]
        if space.is_subtype(data_type, ENUMERATION):
            return v.type == INT32
        if space.is_subtype(data_type, STRUCTURE):
            return v.type == EXTENSION_OBJECT and self._structure_of(v, data_type)
        base = self._builtin(data_type)
        return base is None or v.type == base

    def _structure_of(self, v: Variant, data_type: NodeId) -> bool:
        """Each ExtensionObject's type is an encoding of ``data_type`` or a subtype."""
        values = v.value if v.is_array else [v.value]
        for obj in values:
            if obj is None:
                continue
            encoded_type = self.space.encoding_of(obj.type_id)
            if encoded_type is None or not self.space.is_subtype(encoded_type, data_type):
                return False
        return True

    def _builtin(self, data_type: NodeId) -> int | None:
        """The built-in type a simple data type derives from (a String subtype: 12)."""
        for t in self.space.supertypes(data_type):
            if t.namespace == 0 and isinstance(t.identifier, int) and t.identifier <= 25:
                return t.identifier
        return None


_INPUT_ARGUMENTS = QualifiedName("InputArguments", 0)
