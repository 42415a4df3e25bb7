"""A grpcio client that knows nothing of Palisade's protos: it learns them by server
reflection (as grpcurl does), then calls ShouldRateLimit and the health check.

Usage: reflect.py HOST:PORT TOKEN. Prints one JSON document on stdout.
"""

import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
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

print(
    json.dumps(
        {
            "services": services,
            "answer": json_format.MessageToDict(answer),
            "health": json_format.MessageToDict(status),
        }
    )
)
