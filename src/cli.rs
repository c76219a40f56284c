//! Pieces every binary shares: store arguments, logging setup, and stopping on SIGTERM.
//! Binaries stay thin: parse settings, call these, call the library's `run`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::SystemClock;
use crate::store::{Store, StoreError, StoreOptions};

/// Where the bucket is, and how to reach it.
#[derive(clap::Args, Clone, Debug)]
pub struct StoreArgs {
    /// Store URL: s3://bucket/prefix, file:///abs/path (or a plain path), or memory://.
    /// S3 credentials, region and endpoint come from the standard AWS environment.
    #[arg(long, env = "REKINDLE_STORE")]
    pub store: String,
    /// S3 endpoint (e.g. http://127.0.0.1:9000 for MinIO); overrides AWS_ENDPOINT_URL.
    #[arg(long, env = "REKINDLE_S3_ENDPOINT")]
    pub endpoint: Option<String>,
    /// Allow plain-HTTP S3 endpoints (also AWS_ALLOW_HTTP=true).
    #[arg(long)]
    pub allow_http: bool,
    /// Use virtual-hosted-style S3 requests instead of path-style.
    #[arg(long)]
    pub virtual_hosted_style: bool,
    /// S3 region (default: from the AWS environment or profile).
    #[arg(long)]
    pub region: Option<String>,
    /// Deadline for one store request; a stalled request is retried after it.
    #[arg(long, env = "REKINDLE_STORE_TIMEOUT_MS", default_value_t = 30_000)]
    pub store_timeout_ms: u64,
}

impl StoreArgs {
    /// Opens the store; `read_only` skips the capability probe.
    pub async fn open(&self, read_only: bool) -> Result<Store, StoreError> {
        let options = StoreOptions {
            endpoint: self.endpoint.clone(),
            allow_http: self.allow_http,
            virtual_hosted_style: self.virtual_hosted_style,
            region: self.region.clone(),
            skip_probe: read_only,
            retry: crate::store::RetryPolicy {
                attempt_timeout: std::time::Duration::from_millis(self.store_timeout_ms.max(1)),
                ..crate::store::RetryPolicy::default()
            },
        };
        Store::open(&self.store, &options, SystemClock::shared()).await
    }
}

/// Logs to stderr, as JSON when `json` (for Kubernetes) or `REKINDLE_LOG_FORMAT=json`.
/// `RUST_LOG` selects what is logged (default: `default_level`).
pub fn init_tracing(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let json = json || std::env::var("REKINDLE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A flag set on SIGTERM or SIGINT, for a graceful stop.
pub fn stop_on_signals() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stop requested: finishing the current step");
        flag.store(true, Ordering::SeqCst);
    });
    stop
}

/// A process identity: the given one, else the pod or host name plus the process ID.
pub fn default_id(role: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into());
    format!("{role}-{host}-{}", std::process::id())
}

/// The state directory for local fact logs: the given one or the XDG default.
pub fn state_dir(given: Option<PathBuf>) -> Result<PathBuf, crate::store::log::LogError> {
    match given {
        Some(dir) => Ok(dir),
        None => crate::store::log::default_dir(),
    }
}

/// Runs a binary's async main on a multi-threaded runtime and turns its result into the exit
/// code, printing an error as one line (with its causes, for errors that format them with
/// `{:#}`).
pub fn run_async<E: std::fmt::Display>(
    future: impl std::future::Future<Output = Result<(), E>>,
) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(future) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
