"""OPC UA for the host's equipment, on a client of our own: ``Client`` (``client``:
endpoints, the session, Read, Write, Call, Browse, TranslateBrowsePaths) on a
``channel`` (the TCP connection, its chunks and its secure channel, whose crypto is
``security``: None and Basic256Sha256, Sign and SignAndEncrypt) and the compiled codec
``sfc_fast.wire.uabinary``; ``services`` (the bodies of the services it uses, and
the numbers of attributes and reference types);
``subscription`` (subscriptions and the publish loop). Values are the codec's
(``NodeId``, ``Variant``, ``DataValue``, ...). Why a client of our own: docs/design.md,
"Equipment over OPC UA"."""

from sfc_fast.wire.uabinary import DataValue, ExtensionObject, LocalizedText, NodeId, Variant
from sfc_host.opcua_client import services
from sfc_host.opcua_client.client import Client, find_endpoint, get_endpoints
from sfc_host.opcua_client.errors import BadStatus, ChannelError, OpcUaError, status_name
from sfc_host.opcua_client.security import (
    MODE_NONE,
    MODE_SIGN,
    MODE_SIGN_AND_ENCRYPT,
    SecurityError,
    first_certificate,
)
from sfc_host.opcua_client.services import (
    Argument,
    CallResult,
    Endpoint,
    Reference,
)
from sfc_host.opcua_client.subscription import Subscription

__all__ = ["MODE_NONE", "MODE_SIGN", "MODE_SIGN_AND_ENCRYPT", "Argument", "BadStatus",
           "CallResult", "ChannelError", "Client", "DataValue", "Endpoint", "ExtensionObject",
           "LocalizedText", "NodeId", "OpcUaError", "Reference", "SecurityError",
           "Subscription", "Variant", "find_endpoint", "first_certificate", "get_endpoints",
           "services", "status_name"]
