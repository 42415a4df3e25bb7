"""A grpcio client that knows nothing of Palisade's protos: it learns them by server
reflection (as grpcurl does), then calls ShouldRateLimit and the health check.

Usage: reflect.py HOST:PORT TOKEN. Prints one JSON document on stdout: the services, the
answers, and every file of the rate limit service's descriptor set as served (name to
base64 of the encoded FileDescriptorProto), fetched file by file from the service's own.
"""

import base64
import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

address, token = sys.argv[1], sys.argv[2]
channel = grpc.insecure_channel(address)
database = ProtoReflectionDescriptorDatabase(channel)
services = sorted(database.get_services())
pool = descriptor_pool.DescriptorPool(database)

service = pool.FindServiceByName("envoy.service.ratelimit.v3.RateLimitService")
method = service.FindMethodByName("ShouldRateLimit")
Request = message_factory.GetMessageClass(method.input_type)
Response = message_factory.GetMessageClass(method.output_type)
request = json_format.ParseDict(
    {
        "domain": "edge",
        "descriptors": [
            {"entries": [{"key": "remote_address", "value": "198.51.100.9"}]},
            {"entries": [{"key": "path", "value": "/auth/login"}, {"key": "method", "value": "POST"}]},
        ],
    },
    Request(),
)
call = channel.unary_unary(
    f"/{service.full_name}/{method.name}",
    request_serializer=Request.SerializeToString,
    response_deserializer=Response.FromString,
)
answer = call(request, metadata=[("authorization", f"Bearer {token}")])

health = pool.FindServiceByName("grpc.health.v1.Health").FindMethodByName("Check")
HealthRequest = message_factory.GetMessageClass(health.input_type)
HealthResponse = message_factory.GetMessageClass(health.output_type)
check = channel.unary_unary(
    "/grpc.health.v1.Health/Check",
    request_serializer=HealthRequest.SerializeToString,
    response_deserializer=HealthResponse.FromString,
)
status = check(json_format.ParseDict({"service": service.full_name}, HealthRequest()))


def served_files(root_symbol):
    """Every file the server serves for `root_symbol`, its imports followed one by one."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    files, wanted = {}, []

    def take(response):
        for raw in response.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(raw)
            if file.name not in files:
                files[file.name] = base64.b64encode(raw).decode()
                wanted.extend(file.dependency)

    first = reflection_pb2.ServerReflectionRequest(file_containing_symbol=root_symbol)
    take(next(stub.ServerReflectionInfo(iter([first]))))
    while wanted:
        name = wanted.pop()
        if name in files:
            continue
        ask = reflection_pb2.ServerReflectionRequest(file_by_filename=name)
        answer = next(stub.ServerReflectionInfo(iter([ask])))
        if answer.HasField("error_response"):
            raise SystemExit(f"reflection has no {name}: {answer.error_response}")
        take(answer)
    return files


print(
    json.dumps(
        {
            "services": services,
            "files": served_files(service.full_name),
            "answer": json_format.MessageToDict(answer),
            "health": json_format.MessageToDict(status),
        }
    )
)
