//! `rekindle-coordinator`: finds interrupted runs and assigns them to workers.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use rekindle::fleet::coordinator::{self, CoordinatorOptions};
use shared::StoreArgs;

// The plumbing the three binaries share; not part of the library (see src/cli/mod.rs). Each
// binary uses a different part of it.
#[path = "../src/cli/shared.rs"]
#[allow(dead_code)]
mod shared;

/// Finds interrupted agent runs and assigns their recoveries to live workers. Several may
/// run: one leads (by a lease), the others stand by and take over when it stops.
#[derive(Parser)]
#[command(name = "rekindle-coordinator", version)]
struct Args {
    #[command(flatten)]
    store: StoreArgs,
    /// This coordinator's ID (default: coordinator-<hostname>-<pid>).
    #[arg(long, env = "REKINDLE_COORDINATOR_ID")]
    id: Option<String>,
    /// How long a silent heartbeat means a dead process.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    lease_ttl_ms: u64,
    /// How often the coordinator scans the index and heartbeats.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    scan_interval_ms: u64,
    /// Failed attempts (errors, or a worker dying mid-attempt) before a recovery is
    /// dead-lettered. Step-cap yields, parks and graceful hand-backs do not count.
    #[arg(long, default_value_t = rekindle::core::placement::DEFAULT_MAX_ATTEMPTS)]
    max_attempts: u32,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Serve /healthz, /readyz and /metrics (Prometheus) on this address, e.g. 0.0.0.0:9090.
    #[arg(long, env = "REKINDLE_LISTEN")]
    listen: Option<std::net::SocketAddr>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    shared::init_tracing(args.log_json, "info");
    shared::run_async(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let stop = shared::stop_on_signals();
    let store = args.store.open(false).await.context("open the store")?;
    let options = CoordinatorOptions {
        id: args.id.unwrap_or_else(|| shared::default_id("coordinator")),
        ttl: Duration::from_millis(args.lease_ttl_ms),
        scan_interval: Duration::from_millis(args.scan_interval_ms),
        max_attempts: args.max_attempts,
    };
    if let Some(listen) = args.listen {
        let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let extra: rekindle::serve::Extra = std::sync::Arc::new(Vec::new);
        let server = store.clone();
        tokio::spawn(async move {
            if let Err(error) =
                rekindle::serve::serve(listen, server, "coordinator", ready, extra).await
            {
                tracing::error!(%listen, %error, "cannot serve health and metrics");
            }
        });
    }
    coordinator::run(store, options, stop)
        .await
        .context("run the coordinator")
}
