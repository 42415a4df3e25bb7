//! Envoy's rate limit service as generated in `build.rs`, under Palisade's short names.
//!
//! Generated from the vendored `proto/` (upstream's `rls.proto` and its imports); the service
//! (`envoy`) and the descriptor rules (`envoy_rules`) both speak it.

/// Everything `rls.proto` declares and imports, one module per protobuf package.
#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/rls.rs"));
}

pub use generated::envoy::config::core::v3::HeaderValue;
pub use generated::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use generated::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
pub use generated::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
pub use generated::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
pub use generated::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use generated::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
pub use generated::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
pub use prost_types::Duration;

/// The encoded `FileDescriptorSet` of `rls.proto` and every file it imports, with their
/// comments: what gRPC reflection serves.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/rls_descriptor_set.bin"));

/// A wait in milliseconds as a protobuf `Duration`.
pub(super) fn duration(ms: u64) -> Duration {
    Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}
