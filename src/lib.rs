//! Palisade: an abuse-signal and reputation engine for mobile backends.
//!
//! Signals (failed logins, reputation, attestation, anomalies) become per-key multipliers
//! that scale layered token buckets. Crate map, where to start reading:
//!
//! - [`cli`]: the sub-commands; [`app`]: [`app::App`], the wiring diagram.
//! - [`api`]: the HTTP edge (routes, roles, error envelope, OpenAPI).
//! - [`limiter`]: layered token buckets (Lua in Redis, or in-process); [`model`]: shared nouns.
//! - [`ingest`]: auth-event batches; [`lockout`]: login velocity, challenges, lockouts.
//! - [`reputation`]: IP/ASN range sources, ASN databases, the lookup table, hot reload.
//! - [`scoring`]: factors → multipliers with reasons, anomalies, repeat offenders, alerts.
//! - [`attestation`]: challenges, Play Integrity and App Attest, verdict levels.
//! - [`integrations`]: what other tools read and write (CrowdSec's decision stream,
//!   envoyproxy/ratelimit's descriptor rules, CDN rules).
//! - [`access`]: API tokens and roles; [`audit`]: who did what.
//! - [`store`]: durable (Postgres/SQLite) and hot (Redis/in-process) backends.
//! - [`config`]: settings; [`telemetry`]: logs and metrics; [`clock`]: time, passed in.

pub mod access;
pub mod analyst;
pub mod api;
pub mod app;
pub mod attestation;
pub mod audit;
pub mod cli;
#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod config;
pub mod ingest;
pub mod integrations;
pub mod limiter;
pub mod lockout;
pub mod login_replay;
pub mod messaging;
pub mod model;
pub mod policy;
pub mod recovery;
pub mod regions;
pub mod reputation;
pub mod scoring;
pub mod store;
pub mod telemetry;

pub use api::serve;
pub use app::{App, AppState};
pub use config::Settings;
