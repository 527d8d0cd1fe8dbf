//! The one tracing setup of the library and the CLI: diagnostics go to stderr, filtered by
//! `SOFTRDMA_LOG` (tracing's env-filter syntax, e.g. `debug` or `softrdma_roce=trace`).

use crate::settings::LOG;
use tracing_subscriber::EnvFilter;

/// Who is logging: the filter when `SOFTRDMA_LOG` is unset differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogUser {
    /// The drop-in library inside someone else's program: nothing unless `SOFTRDMA_LOG` asks.
    Library,
    /// The `softrdma` tool: `SOFTRDMA_LOG`, else `RUST_LOG`, else warnings and errors.
    Tool,
}

/// Installs the stderr subscriber once (a program that installed its own keeps it).
pub fn init(user: LogUser) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = LOG.text().or_else(|| match user {
            LogUser::Library => None,
            LogUser::Tool => Some(
                std::env::var("RUST_LOG")
                    .ok()
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| "warn".into()),
            ),
        });
        if let Some(filter) = filter {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
}
