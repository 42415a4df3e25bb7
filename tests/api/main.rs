//! Behaviour tests: one binary, one module per area. Most tests run on both backends
//! through `on_both_backends!` (see `helpers.rs`).

mod helpers;

mod analyst;
mod architecture;
mod attestation;
mod auth_events;
mod bouncers;
mod caddy;
mod cli;
mod clients;
mod console;
mod deploy;
mod docs;
mod edge;
mod envoy_rules;
mod export;
mod failover;
mod fairness;
mod faults;
mod foundation;
mod fuzz;
mod gateways;
mod limiter;
mod lists;
mod lockout;
mod messaging;
mod nginx;
mod policy;
mod recorder;
mod recovery;
mod refusals;
mod regions;
mod replay;
mod reputation;
mod scaleout;
mod scenarios;
mod scoring;
mod security;
mod suggest;
mod trust;
mod window;
