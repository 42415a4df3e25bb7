//! Schema pieces of the OpenAPI document that the derive attributes cannot write
//! themselves: what the handlers accept, so generated clients and fuzzers send valid data.

use utoipa::openapi::schema::{
    KnownFormat, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat, SchemaType, Type,
};

fn string_of(format: KnownFormat) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .format(Some(SchemaFormat::KnownFormat(format)))
}

/// Parameters whose schema comes from a function (`schema_with`) lose the `required` that
/// their type implies: every path parameter, and these required query parameters.
const REQUIRED_QUERY: &[(&str, &str)] = &[("/v1/accounts/{account}/status", "ip")];

pub(super) fn require_custom_parameters(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::Required;
    use utoipa::openapi::path::ParameterIn;
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            for parameter in operation.parameters.iter_mut().flatten() {
                let query_required = parameter.parameter_in == ParameterIn::Query
                    && REQUIRED_QUERY.contains(&(path.as_str(), parameter.name.as_str()));
                if parameter.parameter_in == ParameterIn::Path || query_required {
                    parameter.required = Required::True;
                }
            }
        }
    }
}

/// Forward-auth's status of a block: 429, 403 or 401.
pub(super) fn deny_status() -> Schema {
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::Integer))
            .enum_values(Some([429, 403, 401]))
            .build(),
    )
}

/// An IPv4 or IPv6 address (IPv4-mapped IPv6 included).
pub(super) fn ip() -> Schema {
    Schema::OneOf(
        OneOfBuilder::new()
            .item(string_of(KnownFormat::Ipv4))
            .item(string_of(KnownFormat::Ipv6))
            .description(Some("An IPv4 or IPv6 address"))
            .build(),
    )
}

/// An IPv4 or IPv6 address, or a network in CIDR notation.
pub(super) fn ip_or_network() -> Schema {
    Schema::OneOf(
        OneOfBuilder::new()
            .item(string_of(KnownFormat::Ipv4))
            .item(string_of(KnownFormat::Ipv6))
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::new(Type::String))
                    .pattern(Some(r"^[0-9A-Fa-f:.]{2,45}/[0-9]{1,3}$")),
            )
            .description(Some(
                "An IPv4 or IPv6 address, or a network in CIDR notation (192.0.2.0/24)",
            ))
            .build(),
    )
}

#[cfg(test)]
mod tests {
    /// What the handlers require, the document requires: generated clients and fuzzers
    /// (schemathesis) send what is accepted.
    #[test]
    fn custom_schemas_keep_their_parameters_required() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let params = |path: &str| doc["paths"][path]["get"]["parameters"].clone();
        let status = params("/v1/accounts/{account}/status");
        let ip = status
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "ip")
            .unwrap();
        assert_eq!(ip["required"], true, "{ip}");
        assert_eq!(ip["schema"]["oneOf"][1]["format"], "ipv6", "{ip}");
        let reputation = params("/v1/reputation/{ip}");
        assert_eq!(reputation[0]["required"], true, "{reputation}");
        assert_eq!(reputation[0]["in"], "path", "{reputation}");
    }
}
