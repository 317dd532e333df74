"""Writes the server's namespace 0 file, ``Opc.Ua.NodeSet2.Base.xml``: the part of the
OPC Foundation's ``Opc.Ua.NodeSet2.xml`` that the server and the NodeSets it loads need.
The full file is 4 MB and 5,000 nodes a server would parse at each start; most of it
(diagnostics, history, alarms, security administration) the server never offers.

    python tools/base_nodeset.py Opc.Ua.NodeSet2.xml [--out FILE] [--needs NODESET ...]

(``Opc.Ua.NodeSet2.xml`` ships in the node-opcua-nodesets npm package, under
``nodesets/``.) What is kept, each node with its supertypes, type definition, data
type, modelling rule and "Default Binary" encoding, closed over again for each node
kept: every ReferenceType; the built-in DataTypes; the namespace 0 nodes that the
``--needs`` NodeSets name (by default the product's ISA-95 Job Control and PackML
files); the folders Root, Objects, Types, Views and the type folders with their
subtype roots; BaseEventType; the Server object with the children a server fills in;
the structures that describe types and methods; and the InstanceDeclarations of every
ObjectType and VariableType kept (but of the diagnostics, file and role types:
``BARE_TYPES``). References to nodes left out are dropped, and the
``Category``, ``Documentation`` and ``RolePermissions`` of each node.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "sfc_host" / "opcua_server" / "nodeset" / "Opc.Ua.NodeSet2.Base.xml"
NEEDS = (ROOT / "src" / "sfc_host" / "opcua" / "nodeset" /
         "opc.ua.isa95-jobcontrol.nodeset2.xml",
         ROOT / "src" / "sfc_host" / "equipment" / "opcua" / "nodeset" /
         "Opc.Ua.PackML.NodeSet2.xml")

UA = "http://opcfoundation.org/UA/2011/03/UANodeSet.xsd"
TYPES = "http://opcfoundation.org/UA/2008/02/Types.xsd"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
N = f"{{{UA}}}"

HAS_SUBTYPE, HAS_TYPE_DEFINITION, HAS_MODELLING_RULE, HAS_ENCODING = (
    "i=45", "i=40", "i=37", "i=38")
HIERARCHICAL = "i=33"

# folders, type roots and the structures that describe types and methods
SEEDS = [
    84, 85, 86, 87, 88, 89, 90, 91, 3048,       # Root, Objects, Types, Views, type folders
    58, 62, 24, 31, 2041,                       # the subtype roots and BaseEventType
    99, 100, 101, 102, 296, 7594, 887, 884,     # Structure/EnumDefinition, -Field, Argument,
    338, 862, 8912,                             # EnumValueType, EUInformation, Range,
    78, 80, 11508, 11510, 83,                   # BuildInfo, ServerStatus, TimeZone; rules
    *range(1, 26),                              # the built-in DataTypes
]
SERVER = 2253
# the Server's children a server fills in (Part 5 §8.3.2), each with all below it
SERVER_CHILDREN = ("ServerArray", "NamespaceArray", "ServerStatus", "ServiceLevel",
                   "Auditing")
CAPABILITIES, DIAGNOSTICS, REDUNDANCY = 2268, 2274, 2296
DIAGNOSTICS_CHILDREN = ("EnabledFlag",)
REDUNDANCY_CHILDREN = ("RedundancySupport",)
# types kept without their InstanceDeclarations: the server offers no session or
# subscription diagnostics, files or roles, so their members would be dead weight
# (the types stay: kept nodes have them as type definitions)
BARE_TYPES = {f"i={i}" for i in (
    2020, 2150, 2164, 2171, 2172, 2026, 2029, 2196, 2197, 2243, 2244,   # diagnostics
    11575, 11595,                                                       # FileType, ...
    15607, 15620)}                                                      # RoleSet, Role
DROPPED_CHILDREN = ("Category", "Documentation", "RolePermissions")
NOTE = """<!--
  Namespace 0 of the sfc-fast OPC UA server: {kept} of the {total} nodes of
  Opc.Ua.NodeSet2.xml {version} ({published}) as the OPC Foundation publishes
  them, less the references to the nodes left out and each node's Category,
  Documentation and RolePermissions. Kept: every ReferenceType, the built-in
  DataTypes, the folders Root, Objects, Types, Views and the type folders with
  their subtype roots, BaseEventType, the Server object's children that a
  server fills in, the structures that describe types and methods, and the
  namespace 0 nodes named by
    {needs};
  each with its supertypes, type definition, data type, modelling rule,
  Default Binary encoding and InstanceDeclarations (but those of the
  diagnostics, file and role types). Do not edit: regenerate with
    python tools/base_nodeset.py Opc.Ua.NodeSet2.xml
-->
"""
DROPPED_ATTRIBUTES = ("AccessRestrictions", "ReleaseStatus", "DesignToolOnly")


class Model:
    """The full NodeSet as a graph of its nodes' references, both ways."""

    def __init__(self, root: ET.Element) -> None:
        self.aliases = {a.get("Alias"): (a.text or "").strip()
                        for a in root.iter(f"{N}Alias")}
        self.nodes: dict[str, ET.Element] = {}
        for el in root:
            if el.tag.startswith(f"{N}UA") and el.get("NodeId"):
                self.nodes[el.get("NodeId", "")] = el
        # (reference type, other end, forward) of each node, both ends of each reference
        self.refs: dict[str, set[tuple[str, str, bool]]] = {nid: set() for nid in self.nodes}
        for nid, el in self.nodes.items():
            for r in el.iter(f"{N}Reference"):
                rtype = self.resolve(r.get("ReferenceType", ""))
                target = self.resolve(r.text or "")
                forward = r.get("IsForward", "true").lower() != "false"
                self.refs[nid].add((rtype, target, forward))
                self.refs.setdefault(target, set()).add((rtype, nid, not forward))
        self.hierarchical = self.below(HIERARCHICAL)

    def resolve(self, text: str) -> str:
        text = text.strip()
        return self.aliases.get(text, text)

    def below(self, base: str) -> set[str]:
        seen, todo = {base}, [base]
        while todo:
            for rtype, target, forward in self.refs.get(todo.pop(), ()):
                if rtype == HAS_SUBTYPE and forward and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    def targets(self, nid: str, rtypes: Iterable[str], forward: bool = True) -> list[str]:
        kinds = set(rtypes)
        return sorted(t for rt, t, f in self.refs.get(nid, ()) if rt in kinds and f == forward)

    def children(self, nid: str) -> list[str]:
        return self.targets(nid, self.hierarchical - {HAS_SUBTYPE})

    def name(self, nid: str) -> str:
        el = self.nodes.get(nid)
        return el.get("BrowseName", "") if el is not None else ""

    def child(self, nid: str, name: str) -> str:
        found = [c for c in self.children(nid) if self.name(c) == name]
        if not found:
            raise SystemExit(f"{nid} has no child {name!r} in this NodeSet")
        return found[0]

    def descendants(self, nid: str) -> list[str]:
        out, todo = [nid], [nid]
        while todo:
            for c in self.children(todo.pop()):
                if c not in out:
                    out.append(c)
                    todo.append(c)
        return out


def ns0_ids(path: Path) -> set[str]:
    """The namespace 0 node ids another NodeSet names (attributes, references, values,
    definitions), aliases resolved."""
    root = ET.parse(path).getroot()
    aliases = {a.get("Alias"): (a.text or "").strip() for a in root.iter(f"{N}Alias")}
    out: set[str] = set()

    def note(text: str | None) -> None:
        if text:
            text = aliases.get(text.strip(), text.strip())
            if re.fullmatch(r"i=\d+", text):
                out.add(text)

    out.update(v for v in aliases.values() if re.fullmatch(r"i=\d+", v))
    for el in root.iter():
        for attr in ("DataType", "ReferenceType", "ParentNodeId"):
            note(el.get(attr))
        tag = el.tag.rsplit("}", 1)[-1]
        if tag in ("Reference", "Identifier"):
            note(el.text)
    return out


def closure(model: Model, seeds: Iterable[str]) -> set[str]:
    keep: set[str] = set()
    todo = [s for s in seeds if s in model.nodes]
    types = ("UAObjectType", "UAVariableType")
    while todo:
        nid = todo.pop()
        if nid in keep:
            continue
        keep.add(nid)
        el = model.nodes[nid]
        kind = el.tag[len(N):]
        more = model.targets(nid, [HAS_SUBTYPE], forward=False)
        more += model.targets(nid, [HAS_TYPE_DEFINITION, HAS_MODELLING_RULE])
        if el.get("DataType"):
            more.append(model.resolve(el.get("DataType", "")))
        if kind == "UADataType":
            more += [e for e in model.targets(nid, [HAS_ENCODING])
                     if model.name(e) == "Default Binary"]
            more += [model.resolve(f.get("DataType", "i=24"))
                     for f in el.iter(f"{N}Field")]
        # a type's InstanceDeclarations, a declaration's own, a method's arguments
        declaration = bool(model.targets(nid, [HAS_MODELLING_RULE]))
        if (kind in types and nid not in BARE_TYPES) or declaration or kind == "UAMethod":
            for c in model.children(nid):
                arguments = kind == "UAMethod" and \
                    model.name(c) in ("InputArguments", "OutputArguments")
                if arguments or model.targets(c, [HAS_MODELLING_RULE]):
                    more.append(c)
        todo += [m for m in more if m in model.nodes and m not in keep]
    return keep


def server_nodes(model: Model) -> list[str]:
    server = f"i={SERVER}"
    out = [server]
    for name in SERVER_CHILDREN:
        out += model.descendants(model.child(server, name))
    caps = f"i={CAPABILITIES}"
    out.append(caps)
    for c in model.children(caps):
        el = model.nodes[c]
        if el.tag == f"{N}UAVariable" or model.name(c) in (
                "OperationLimits", "ModellingRules", "AggregateFunctions"):
            out.append(c)
            if model.name(c) == "OperationLimits":
                out += model.children(c)
    for parent, names in ((DIAGNOSTICS, DIAGNOSTICS_CHILDREN),
                          (REDUNDANCY, REDUNDANCY_CHILDREN)):
        out.append(f"i={parent}")
        out += [model.child(f"i={parent}", n) for n in names]
    return out


def trimmed(model: Model, root: ET.Element, keep: set[str]) -> ET.Element:
    out = ET.Element(f"{N}UANodeSet")
    for part in ("Models", "Aliases"):
        el = root.find(f"{N}{part}")
        if el is not None:
            out.append(el)
    for nid, el in model.nodes.items():
        if nid not in keep:
            continue
        for c in [c for c in el if c.tag[len(N):] in DROPPED_CHILDREN]:
            el.remove(c)
        for attr in DROPPED_ATTRIBUTES:
            el.attrib.pop(attr, None)
        if el.get("ParentNodeId") and model.resolve(el.get("ParentNodeId", "")) not in keep:
            del el.attrib["ParentNodeId"]
        refs = el.find(f"{N}References")
        if refs is not None:
            for r in list(refs):
                if model.resolve(r.text or "") not in keep:
                    refs.remove(r)
        out.append(el)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nodeset", type=Path, help="the OPC Foundation's Opc.Ua.NodeSet2.xml")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--needs", type=Path, nargs="*", default=list(NEEDS),
                    help="NodeSets whose namespace 0 references are kept")
    args = ap.parse_args(argv)

    text = args.nodeset.read_text(encoding="utf-8")
    licence = re.search(r"<!--.*?-->", text, re.DOTALL)
    if licence is None or "MIT License" not in licence.group(0):
        raise SystemExit(f"{args.nodeset}: no OPC Foundation MIT licence header")
    root = ET.fromstring(text)
    model = Model(root)
    model_el = root.find(f"{N}Models/{N}Model")
    version = model_el.get("Version", "?") if model_el is not None else "?"
    published = model_el.get("PublicationDate", "?") if model_el is not None else "?"

    needed: set[str] = set()
    for path in args.needs:
        needed |= ns0_ids(path)
    missing = sorted(n for n in needed if n not in model.nodes)
    if missing:
        print(f"not in {args.nodeset.name}: {', '.join(missing)}", file=sys.stderr)
    seeds = [f"i={i}" for i in SEEDS]
    seeds += [nid for nid, el in model.nodes.items() if el.tag == f"{N}UAReferenceType"]
    seeds += sorted(needed) + server_nodes(model)
    keep = closure(model, seeds)

    out = trimmed(model, root, keep)
    ET.register_namespace("", UA)
    ET.register_namespace("uax", TYPES)
    ET.register_namespace("xsi", XSI)
    ET.indent(out, "  ")
    needs = ", ".join(p.name for p in args.needs)
    note = NOTE.format(kept=len(keep), total=len(model.nodes), version=version,
                       published=published, needs=needs)
    body = ET.tostring(out, encoding="unicode")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text('<?xml version="1.0" encoding="utf-8"?>\n' + licence.group(0) +
                        "\n" + note + body + "\n", encoding="utf-8")
    print(f"{args.out.name}: {len(keep)} nodes, {args.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
