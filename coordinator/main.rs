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
/// run: in a bucket of one partition one leads (by a lease) and the others stand by; in a
/// bucket split into partitions (--partitions) each owns a share, and the others take a
/// stopped one's share over.
#[derive(Parser)]
#[command(name = "rekindle-coordinator", version)]
struct Args {
    #[command(flatten)]
    store: StoreArgs,
    /// This coordinator's ID (default: coordinator-<hostname>-<pid>).
    #[arg(long, env = "REKINDLE_COORDINATOR_ID")]
    id: Option<String>,
    /// How long a silent heartbeat means a dead process.
    #[arg(long, default_value_t = 30_000, value_parser = shared::at_least_one::<u64>)]
    lease_ttl_ms: u64,
    /// How often the coordinator scans the index and heartbeats while runs are in flight.
    #[arg(long, default_value_t = 10_000, value_parser = shared::at_least_one::<u64>)]
    scan_interval_ms: u64,
    /// How often it scans while the last scan found no run (an idle fleet). A new run or
    /// admission wakes it at once when it can reach the coordinator's /wake.
    #[arg(long, default_value_t = 60_000, value_parser = shared::at_least_one::<u64>)]
    idle_scan_interval_ms: u64,
    /// While processes hold runs, how often it lists the heartbeats between scans (and it
    /// looks again exactly when a silent holder's TTL runs out), so a killed host's or
    /// worker's runs resume within their TTL plus this. One LIST each; set it to the scan
    /// interval to turn the watch off.
    #[arg(long, default_value_t = 1_000, value_parser = shared::at_least_one::<u64>)]
    watch_interval_ms: u64,
    /// Failed attempts (errors, or a worker dying mid-attempt) before a recovery is
    /// dead-lettered. Step-cap yields, parks and graceful hand-backs do not count.
    #[arg(long, default_value_t = rekindle::core::placement::DEFAULT_MAX_ATTEMPTS, value_parser = shared::at_least_one::<u32>)]
    max_attempts: u32,
    /// Split the bucket's coordination into this many partitions (1 to 256), if it is not
    /// split yet; every replica then owns a share, each partition through a lease of its own.
    /// The count is fixed once set: a bucket split into another count refuses to start.
    /// Default: the bucket's own count (one partition if it names none: one replica leads,
    /// the others stand by).
    #[arg(long, env = "REKINDLE_PARTITIONS", value_parser = clap::value_parser!(u32).range(1..=256))]
    partitions: Option<u32>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Serve /healthz, /readyz, /metrics (Prometheus) and /wake on this address, e.g.
    /// 0.0.0.0:9090. Without it, /wake is served on an ephemeral loopback port.
    #[arg(long, env = "REKINDLE_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// The address hosts and workers reach /wake at: a URL, or a host (with the --listen
    /// port), e.g. the pod IP. Default: the --listen address when it names a host.
    #[arg(long, env = "REKINDLE_ADVERTISE")]
    advertise: Option<String>,
}

fn main() -> ExitCode {
    shared::help_markdown::<Args>();
    let args = Args::parse();
    shared::init_tracing(args.log_json, "info");
    shared::run_async(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let stop = shared::stop_on_signals();
    let endpoint = shared::endpoint(args.listen, args.advertise.as_deref(), "coordinator").await?;
    let store = args.store.open(false).await.context("open the store")?;
    let options = CoordinatorOptions {
        id: args.id.unwrap_or_else(|| shared::default_id("coordinator")),
        ttl: Duration::from_millis(args.lease_ttl_ms),
        scan_interval: Duration::from_millis(args.scan_interval_ms),
        max_attempts: args.max_attempts,
        idle_scan_interval: Duration::from_millis(args.idle_scan_interval_ms),
        watch_interval: Duration::from_millis(args.watch_interval_ms),
        wake: Some((endpoint.wakeup, endpoint.url)),
        readiness: Some(endpoint.readiness),
        partitions: args.partitions,
    };
    coordinator::run(store, options, stop)
        .await
        .context("run the coordinator")
}
