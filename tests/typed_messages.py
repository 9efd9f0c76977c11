"""A protobuf message class built at run time (no protoc), for the typed-message tests.

``Tx`` is what ``protoc`` would make of::

    syntax = "proto3";
    package mconn.test;
    message Tx { bytes data = 1; uint64 nonce = 2; string sender = 3; }
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def _build_tx():
    proto = descriptor_pb2.FileDescriptorProto(name="mconn_test_tx.proto", package="mconn.test", syntax="proto3")
    message = proto.message_type.add(name="Tx")
    for number, (name, kind) in enumerate(
        [
            ("data", descriptor_pb2.FieldDescriptorProto.TYPE_BYTES),
            ("nonce", descriptor_pb2.FieldDescriptorProto.TYPE_UINT64),
            ("sender", descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
        ],
        start=1,
    ):
        message.field.add(name=name, number=number, type=kind, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("mconn.test.Tx")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf 4.21


Tx = _build_tx()

#: Bytes protobuf refuses for any message: a varint cut short (field 1, wire type 0).
NOT_PROTOBUF = b"\x08\xff\xff"
