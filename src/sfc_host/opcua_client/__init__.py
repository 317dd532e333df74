"""OPC UA for the host's equipment, on a client of our own: ``Client`` (``client``:
endpoints, the session, Read, Write, Call, Browse, TranslateBrowsePaths) on a
``channel`` (the TCP connection, its chunks and its secure channel, whose crypto is
``security``: None and Basic256Sha256, Sign and SignAndEncrypt) and the compiled codec
``sfc_fast.wire.uabinary``; ``services`` (the bodies of the services it uses, and
the numbers of attributes and reference types);
``subscription`` (subscriptions and the publish loop). The secure channel's crypto
serves our OPC UA server too (``sfc_host.opcua_server``), with the roles turned. Values
are the codec's (``NodeId``, ``Variant``, ``DataValue``, ...). Why a client of our own:
docs/design.md, "Equipment over OPC UA"."""

from sfc_fast.wire.uabinary import DataValue, ExtensionObject, LocalizedText, NodeId, Variant
from sfc_host.opcua_client import services
from sfc_host.opcua_client.client import Client, find_endpoint, get_endpoints
from sfc_host.opcua_client.errors import BadStatus, ChannelError, OpcUaError, status_name
from sfc_host.opcua_client.security import (
    BASIC256SHA256,
    MODE_NONE,
    MODE_SIGN,
    MODE_SIGN_AND_ENCRYPT,
    POLICY_NONE,
    ChannelSecurity,
    SecurityError,
    decrypt_secret,
    first_certificate,
    open_header,
    thumbprint,
    verify_signature,
)
from sfc_host.opcua_client.services import (
    Argument,
    CallResult,
    Endpoint,
    Reference,
)
from sfc_host.opcua_client.subscription import Subscription

__all__ = ["BASIC256SHA256", "MODE_NONE", "MODE_SIGN", "MODE_SIGN_AND_ENCRYPT", "POLICY_NONE",
           "Argument", "BadStatus", "CallResult", "ChannelError", "ChannelSecurity", "Client",
           "DataValue", "Endpoint", "ExtensionObject", "LocalizedText", "NodeId", "OpcUaError",
           "Reference", "SecurityError", "Subscription", "Variant", "decrypt_secret",
           "find_endpoint", "first_certificate", "get_endpoints", "open_header", "services",
           "status_name", "thumbprint", "verify_signature"]
