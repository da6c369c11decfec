//! The tracing set-up: `RUST_LOG` filters (default `info`), lines go to stderr, as JSON or text.

use crate::cli::LogFormat;

/// Installs the global subscriber. Call once, early in `main`, after the flags are parsed.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second call (a test harness that already set one up) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
