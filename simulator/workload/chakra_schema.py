"""The Chakra execution-trace schema (``et_def.proto``), built in Python.

Chakra (MLCommons) stores an execution trace as protobuf messages of the
``ChakraProtoMsg`` package. The field numbers and enum values below are Chakra's public
wire format, taken from ``schema/protobuf/et_def.proto`` of github.com/mlcommons/chakra
at commit 21585d8f2d65603d791d2121e3d4632351120262 (identical in ASTRA-sim's fork,
github.com/astra-sim/chakra at bf222b23caf7b6972da17ab7b419d02083c2d2e0). The message
classes are made at run time from a ``FileDescriptorProto`` assembled here, in a private
descriptor pool, so no ``protoc`` and no generated ``_pb2`` module are needed and an
installed copy of Chakra's own classes cannot clash with them.

The ``protobuf`` package is optional (``pip install ccsim[chakra]``): this module imports
it only inside :func:`messages`, and the enum tables need nothing.

>>> NODE_TYPES["COMM_COLL_NODE"], COMM_TYPES["REDUCE_SCATTER"]
(7, 7)
"""

from __future__ import annotations

from functools import cache
from types import ModuleType, SimpleNamespace

from ..errors import CcsimError

#: ``enum NodeType`` of et_def.proto.
NODE_TYPES = {
    "INVALID_NODE": 0,
    "METADATA_NODE": 1,
    "MEM_LOAD_NODE": 2,
    "MEM_STORE_NODE": 3,
    "COMP_NODE": 4,
    "COMM_SEND_NODE": 5,
    "COMM_RECV_NODE": 6,
    "COMM_COLL_NODE": 7,
}

#: ``enum CollectiveCommType`` of et_def.proto.
COMM_TYPES = {
    "ALL_REDUCE": 0,
    "REDUCE": 1,
    "ALL_GATHER": 2,
    "GATHER": 3,
    "SCATTER": 4,
    "BROADCAST": 5,
    "ALL_TO_ALL": 6,
    "REDUCE_SCATTER": 7,
    "REDUCE_SCATTER_BLOCK": 8,
    "BARRIER": 9,
}

#: The scalar kinds of ``AttributeProto``'s ``value`` oneof, in field order: kind k has
#: ``<kind>_val`` as field 3 + 2k and ``<kind>_list`` (a ``<Kind>List`` message whose
#: ``repeated values = 1``) as field 4 + 2k, from double_val = 3 to bytes_list = 32.
ATTR_KINDS = (
    "double",
    "float",
    "int32",
    "int64",
    "uint32",
    "uint64",
    "sint32",
    "sint64",
    "fixed32",
    "fixed64",
    "sfixed32",
    "sfixed64",
    "bool",
    "string",
    "bytes",
)

INSTALL_HINT = "pip install ccsim[chakra]"


def protobuf() -> ModuleType:
    """The ``google.protobuf`` package, or a one-line error saying how to install it.

    Imported on every call (a dictionary look-up once loaded), so that a missing package
    is reported wherever Chakra support is first used.
    """
    try:
        import google.protobuf as package
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: F401
    except ImportError:
        raise CcsimError(
            f"Chakra execution traces need the protobuf package: {INSTALL_HINT}"
        ) from None
    return package


def file_descriptor():
    """The ``FileDescriptorProto`` of et_def.proto (proto3, package ``ChakraProtoMsg``)."""
    protobuf()
    from google.protobuf import descriptor_pb2

    field = descriptor_pb2.FieldDescriptorProto
    scalar = {
        "double": field.TYPE_DOUBLE,
        "float": field.TYPE_FLOAT,
        "int32": field.TYPE_INT32,
        "int64": field.TYPE_INT64,
        "uint32": field.TYPE_UINT32,
        "uint64": field.TYPE_UINT64,
        "sint32": field.TYPE_SINT32,
        "sint64": field.TYPE_SINT64,
        "fixed32": field.TYPE_FIXED32,
        "fixed64": field.TYPE_FIXED64,
        "sfixed32": field.TYPE_SFIXED32,
        "sfixed64": field.TYPE_SFIXED64,
        "bool": field.TYPE_BOOL,
        "string": field.TYPE_STRING,
        "bytes": field.TYPE_BYTES,
    }
    proto = descriptor_pb2.FileDescriptorProto(
        name="chakra/et_def.proto", package="ChakraProtoMsg", syntax="proto3"
    )

    def message(name: str, fields: list[tuple], oneof: str | None = None) -> None:
        msg = proto.message_type.add(name=name)
        if oneof:
            msg.oneof_decl.add(name=oneof)
        for entry in fields:
            fname, number, ftype, *rest = entry
            repeated = bool(rest and rest[0] == "repeated")
            type_name = rest[1] if len(rest) > 1 else ""
            added = msg.field.add(
                name=fname,
                number=number,
                type=ftype,
                label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL,
            )
            if type_name:
                added.type_name = f".ChakraProtoMsg.{type_name}"
            if oneof and number >= 3:
                added.oneof_index = 0

    def list_name(kind: str) -> str:
        return kind[0].upper() + kind[1:] + "List"

    attr_fields: list[tuple] = [
        ("name", 1, field.TYPE_STRING),
        ("doc_string", 2, field.TYPE_STRING),
    ]
    for k, kind in enumerate(ATTR_KINDS):
        attr_fields.append((f"{kind}_val", 3 + 2 * k, scalar[kind]))
        attr_fields.append((f"{kind}_list", 4 + 2 * k, field.TYPE_MESSAGE, "", list_name(kind)))
    message("AttributeProto", attr_fields, oneof="value")
    for kind in ATTR_KINDS:
        message(list_name(kind), [("values", 1, scalar[kind], "repeated")])
    message(
        "GlobalMetadata",
        [
            ("version", 1, field.TYPE_STRING),
            ("attr", 2, field.TYPE_MESSAGE, "repeated", "AttributeProto"),
        ],
    )
    message(
        "Node",
        [
            ("id", 1, field.TYPE_UINT64),
            ("name", 2, field.TYPE_STRING),
            ("type", 3, field.TYPE_ENUM, "", "NodeType"),
            ("ctrl_deps", 4, field.TYPE_UINT64, "repeated"),
            ("data_deps", 5, field.TYPE_UINT64, "repeated"),
            ("start_time_micros", 6, field.TYPE_UINT64),
            ("duration_micros", 7, field.TYPE_UINT64),
            ("inputs", 8, field.TYPE_MESSAGE, "", "IOInfo"),
            ("outputs", 9, field.TYPE_MESSAGE, "", "IOInfo"),
            ("attr", 10, field.TYPE_MESSAGE, "repeated", "AttributeProto"),
        ],
    )
    message(
        "IOInfo",
        [
            ("values", 1, field.TYPE_STRING),
            ("shapes", 2, field.TYPE_STRING),
            ("types", 3, field.TYPE_STRING),
        ],
    )
    message(
        "Tensor",
        [
            ("tensor_id", 1, field.TYPE_UINT64),
            ("storage_id", 2, field.TYPE_UINT64),
            ("offset", 3, field.TYPE_UINT64),
            ("num_elem", 4, field.TYPE_UINT64),
            ("elem_bytes", 5, field.TYPE_UINT64),
            ("device", 6, field.TYPE_STRING),
        ],
    )
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COMM_TYPES)):
        enum = proto.enum_type.add(name=name)
        for value_name, number in values.items():
            enum.value.add(name=value_name, number=number)
    return proto


@cache  # one set of immutable classes per process: building them takes milliseconds
def _classes() -> SimpleNamespace:
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()  # private: never the default pool
    pool.AddSerializedFile(file_descriptor().SerializeToString())
    if hasattr(message_factory, "GetMessageClass"):
        make = message_factory.GetMessageClass
    else:  # protobuf before 4.22 (tolerated; the extra asks for 4.22)
        make = message_factory.MessageFactory(pool).GetPrototype
    names = ["AttributeProto", "GlobalMetadata", "Node", "IOInfo", "Tensor"]
    names += [kind[0].upper() + kind[1:] + "List" for kind in ATTR_KINDS]
    return SimpleNamespace(
        **{name: make(pool.FindMessageTypeByName(f"ChakraProtoMsg.{name}")) for name in names}
    )


def messages() -> SimpleNamespace:
    """The Chakra message classes (``Node``, ``GlobalMetadata``, ``AttributeProto``,
    ``IOInfo``, ``Tensor`` and the ``<Kind>List`` messages), built once per process.

    Raises a :class:`~simulator.errors.CcsimError` saying ``pip install ccsim[chakra]``
    when protobuf is missing.
    """
    protobuf()
    return _classes()
