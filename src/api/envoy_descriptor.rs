//! gRPC server reflection of the rate limit service, for grpcurl, grpcio and Postman.
//!
//! The messages of `envoy::proto` are written by hand (no `protoc`), so their descriptors
//! are too: each file below declares the messages and fields Palisade reads and writes, with
//! Envoy's package names, file names and field numbers, and nothing else (a reflection
//! client sees exactly what this server understands). `grpc.health.v1` and the reflection
//! service itself come with their crates' descriptors.

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto, ServiceDescriptorProto,
};

/// One field: `(name, number, type, message or enum type name for Message/Enum)`.
type Field = (&'static str, i32, Type, &'static str);

fn field((name, number, kind, type_name): Field, repeated: bool) -> FieldDescriptorProto {
    let json_name = {
        let mut out = String::new();
        let mut upper = false;
        for ch in name.chars() {
            if ch == '_' {
                upper = true;
            } else if upper {
                out.push(ch.to_ascii_uppercase());
                upper = false;
            } else {
                out.push(ch);
            }
        }
        out
    };
    FieldDescriptorProto {
        name: Some(name.to_owned()),
        number: Some(number),
        label: Some(if repeated {
            Label::Repeated
        } else {
            Label::Optional
        } as i32),
        r#type: Some(kind as i32),
        type_name: (!type_name.is_empty()).then(|| type_name.to_owned()),
        json_name: Some(json_name),
        ..FieldDescriptorProto::default()
    }
}

fn message(
    name: &str,
    fields: &[(Field, bool)],
    nested: Vec<DescriptorProto>,
    enums: Vec<EnumDescriptorProto>,
) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.to_owned()),
        field: fields
            .iter()
            .map(|(f, repeated)| field(*f, *repeated))
            .collect(),
        nested_type: nested,
        enum_type: enums,
        ..DescriptorProto::default()
    }
}

fn enumeration(name: &str, values: &[(&str, i32)]) -> EnumDescriptorProto {
    EnumDescriptorProto {
        name: Some(name.to_owned()),
        value: values
            .iter()
            .map(|(name, number)| EnumValueDescriptorProto {
                name: Some((*name).to_owned()),
                number: Some(*number),
                ..EnumValueDescriptorProto::default()
            })
            .collect(),
        ..EnumDescriptorProto::default()
    }
}

fn file(
    name: &str,
    package: &str,
    dependency: &[&str],
    messages: Vec<DescriptorProto>,
    enums: Vec<EnumDescriptorProto>,
) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(name.to_owned()),
        package: Some(package.to_owned()),
        dependency: dependency.iter().map(|d| (*d).to_owned()).collect(),
        message_type: messages,
        enum_type: enums,
        syntax: Some("proto3".to_owned()),
        ..FileDescriptorProto::default()
    }
}

const UNITS: &[(&str, i32)] = &[
    ("UNKNOWN", 0),
    ("SECOND", 1),
    ("MINUTE", 2),
    ("HOUR", 3),
    ("DAY", 4),
    ("MONTH", 5),
    ("YEAR", 6),
    ("WEEK", 7),
];

/// The descriptors of `envoy.service.ratelimit.v3` and the files it imports.
pub fn rate_limit_service() -> FileDescriptorSet {
    let wrappers = file(
        "google/protobuf/wrappers.proto",
        "google.protobuf",
        &[],
        vec![message(
            "UInt64Value",
            &[(("value", 1, Type::Uint64, ""), false)],
            vec![],
            vec![],
        )],
        vec![],
    );
    let duration = file(
        "google/protobuf/duration.proto",
        "google.protobuf",
        &[],
        vec![message(
            "Duration",
            &[
                (("seconds", 1, Type::Int64, ""), false),
                (("nanos", 2, Type::Int32, ""), false),
            ],
            vec![],
            vec![],
        )],
        vec![],
    );
    let unit = file(
        "envoy/type/v3/ratelimit_unit.proto",
        "envoy.type.v3",
        &[],
        vec![],
        vec![enumeration("RateLimitUnit", UNITS)],
    );
    let base = file(
        "envoy/config/core/v3/base.proto",
        "envoy.config.core.v3",
        &[],
        vec![message(
            "HeaderValue",
            &[
                (("key", 1, Type::String, ""), false),
                (("value", 2, Type::String, ""), false),
            ],
            vec![],
            vec![],
        )],
        vec![],
    );
    let descriptor = file(
        "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        "envoy.extensions.common.ratelimit.v3",
        &[
            "envoy/type/v3/ratelimit_unit.proto",
            "google/protobuf/wrappers.proto",
        ],
        vec![message(
            "RateLimitDescriptor",
            &[
                (
                    (
                        "entries",
                        1,
                        Type::Message,
                        ".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry",
                    ),
                    true,
                ),
                (
                    (
                        "limit",
                        2,
                        Type::Message,
                        ".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride",
                    ),
                    false,
                ),
                (
                    (
                        "hits_addend",
                        3,
                        Type::Message,
                        ".google.protobuf.UInt64Value",
                    ),
                    false,
                ),
            ],
            vec![
                message(
                    "Entry",
                    &[
                        (("key", 1, Type::String, ""), false),
                        (("value", 2, Type::String, ""), false),
                    ],
                    vec![],
                    vec![],
                ),
                message(
                    "RateLimitOverride",
                    &[
                        (("requests_per_unit", 1, Type::Uint32, ""), false),
                        (
                            ("unit", 2, Type::Enum, ".envoy.type.v3.RateLimitUnit"),
                            false,
                        ),
                    ],
                    vec![],
                    vec![],
                ),
            ],
            vec![],
        )],
        vec![],
    );
    let response = "envoy.service.ratelimit.v3.RateLimitResponse";
    let mut rls = file(
        "envoy/service/ratelimit/v3/rls.proto",
        "envoy.service.ratelimit.v3",
        &[
            "envoy/config/core/v3/base.proto",
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
            "google/protobuf/duration.proto",
        ],
        vec![
            message(
                "RateLimitRequest",
                &[
                    (("domain", 1, Type::String, ""), false),
                    (
                        (
                            "descriptors",
                            2,
                            Type::Message,
                            ".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
                        ),
                        true,
                    ),
                    (("hits_addend", 3, Type::Uint32, ""), false),
                ],
                vec![],
                vec![],
            ),
            message(
                "RateLimitResponse",
                &[
                    (
                        (
                            "overall_code",
                            1,
                            Type::Enum,
                            ".envoy.service.ratelimit.v3.RateLimitResponse.Code",
                        ),
                        false,
                    ),
                    (
                        (
                            "statuses",
                            2,
                            Type::Message,
                            ".envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus",
                        ),
                        true,
                    ),
                    (
                        (
                            "response_headers_to_add",
                            3,
                            Type::Message,
                            ".envoy.config.core.v3.HeaderValue",
                        ),
                        true,
                    ),
                    (
                        (
                            "request_headers_to_add",
                            4,
                            Type::Message,
                            ".envoy.config.core.v3.HeaderValue",
                        ),
                        true,
                    ),
                ],
                vec![
                    message(
                        "RateLimit",
                        &[
                            (("requests_per_unit", 1, Type::Uint32, ""), false),
                            (
                                (
                                    "unit",
                                    2,
                                    Type::Enum,
                                    ".envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
                                ),
                                false,
                            ),
                            (("name", 3, Type::String, ""), false),
                        ],
                        vec![],
                        vec![enumeration("Unit", UNITS)],
                    ),
                    message(
                        "DescriptorStatus",
                        &[
                            (
                                (
                                    "code",
                                    1,
                                    Type::Enum,
                                    ".envoy.service.ratelimit.v3.RateLimitResponse.Code",
                                ),
                                false,
                            ),
                            (
                                (
                                    "current_limit",
                                    2,
                                    Type::Message,
                                    ".envoy.service.ratelimit.v3.RateLimitResponse.RateLimit",
                                ),
                                false,
                            ),
                            (("limit_remaining", 3, Type::Uint32, ""), false),
                            (
                                (
                                    "duration_until_reset",
                                    4,
                                    Type::Message,
                                    ".google.protobuf.Duration",
                                ),
                                false,
                            ),
                        ],
                        vec![],
                        vec![],
                    ),
                ],
                vec![enumeration(
                    "Code",
                    &[("UNKNOWN", 0), ("OK", 1), ("OVER_LIMIT", 2)],
                )],
            ),
        ],
        vec![],
    );
    rls.service = vec![ServiceDescriptorProto {
        name: Some("RateLimitService".to_owned()),
        method: vec![MethodDescriptorProto {
            name: Some("ShouldRateLimit".to_owned()),
            input_type: Some(".envoy.service.ratelimit.v3.RateLimitRequest".to_owned()),
            output_type: Some(format!(".{response}")),
            ..MethodDescriptorProto::default()
        }],
        ..ServiceDescriptorProto::default()
    }];
    FileDescriptorSet {
        file: vec![wrappers, duration, unit, base, descriptor, rls],
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::api::envoy::proto;

    /// A message encoded by the hand-written prost structs decodes, field by field, as the
    /// descriptor says: every declared field's number and wire type agree.
    #[test]
    fn the_descriptors_match_the_messages() {
        let set = rate_limit_service();
        let rls = set.file.last().expect("rls.proto");
        assert_eq!(rls.service[0].method[0].name(), "ShouldRateLimit");
        let request = proto::RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![proto::RateLimitDescriptor {
                entries: vec![proto::Entry {
                    key: "k".to_owned(),
                    value: "v".to_owned(),
                }],
                limit: Some(proto::RateLimitOverride {
                    requests_per_unit: 3,
                    unit: 2,
                }),
                hits_addend: Some(proto::UInt64Value { value: 4 }),
            }],
            hits_addend: 5,
        };
        // Field numbers and wire types of the top-level message, read off the encoding.
        let bytes = request.encode_to_vec();
        let tags: Vec<u8> = [bytes[0], bytes[3]].to_vec();
        assert_eq!(tags[0] >> 3, 1, "domain is field 1");
        assert_eq!(tags[0] & 7, 2, "length-delimited");
        assert_eq!(tags[1] >> 3, 2, "descriptors is field 2");
        let declared: Vec<(i32, Type)> = rls.message_type[0]
            .field
            .iter()
            .map(|f| (f.number(), f.r#type()))
            .collect();
        assert_eq!(
            declared,
            [(1, Type::String), (2, Type::Message), (3, Type::Uint32)]
        );
        // The set is consistent: every type named is declared in a file it depends on.
        let declared_names: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                let package = f.package().to_owned();
                let mut names = Vec::new();
                fn walk(prefix: &str, m: &DescriptorProto, out: &mut Vec<String>) {
                    let name = format!("{prefix}.{}", m.name());
                    for e in &m.enum_type {
                        out.push(format!("{name}.{}", e.name()));
                    }
                    for n in &m.nested_type {
                        walk(&name, n, out);
                    }
                    out.push(name);
                }
                for m in &f.message_type {
                    walk(&format!(".{package}"), m, &mut names);
                }
                for e in &f.enum_type {
                    names.push(format!(".{package}.{}", e.name()));
                }
                names
            })
            .collect();
        for f in &set.file {
            let mut stack: Vec<&DescriptorProto> = f.message_type.iter().collect();
            while let Some(m) = stack.pop() {
                stack.extend(m.nested_type.iter());
                for field in m.field.iter().filter(|f| f.type_name.is_some()) {
                    assert!(
                        declared_names.contains(&field.type_name().to_owned()),
                        "{} names an undeclared {}",
                        field.name(),
                        field.type_name()
                    );
                }
            }
        }
    }
}
