//! Logs and metrics: subscriber set-up, metric names and the Prometheus recorder.
//!
//! Logging rules are in `docs/LOGGING.md`. Every metric name is a constant in [`metrics`];
//! the Grafana dashboard uses only those.

pub mod metrics;
pub mod privacy;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global tracing subscriber. `RUST_LOG` filters (default `info`).
///
/// Safe to call more than once; later calls do nothing.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: a log file or collector gets plain text (and formatting
    // every span's fields with escape codes is work on every request).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _already_set = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
