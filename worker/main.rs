//! `rekindle-worker`: executes recoveries of interrupted runs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use rekindle::fleet::Agent;
use rekindle::fleet::worker::{self, WorkerOptions, WorkerStats};
use rekindle::host::config::Config;
use rekindle::store::log::LogDir;
use shared::StoreArgs;

// The plumbing the three binaries share; not part of the library (see src/cli/mod.rs). Each
// binary uses a different part of it.
#[path = "../src/cli/shared.rs"]
#[allow(dead_code)]
mod shared;

/// Executes recoveries of interrupted agent runs assigned by the coordinator.
#[derive(Parser)]
#[command(name = "rekindle-worker", version)]
struct Args {
    #[command(flatten)]
    store: StoreArgs,
    /// The agent configuration (model, tools, budgets); runs started with another
    /// configuration are not given to this worker.
    #[arg(long, env = "REKINDLE_CONFIG")]
    config: PathBuf,
    /// This worker's ID (default: worker-<hostname>-<pid>).
    #[arg(long, env = "REKINDLE_WORKER_ID")]
    id: Option<String>,
    /// Recoveries executed at once (at least 1).
    #[arg(long, default_value_t = 4, value_parser = shared::at_least_one::<u32>)]
    concurrency: u32,
    /// Recoveries that may wait assigned to this worker beyond --concurrency, so that a freed
    /// slot starts the next one at once instead of at the coordinator's next tick (default:
    /// the --concurrency). A waiting recovery moves to another worker as soon as one has a
    /// free slot; 0 keeps nothing waiting here.
    #[arg(long, allow_negative_numbers = true)]
    queue: Option<u32>,
    /// How long this worker's heartbeat may stay unchanged before the fleet judges it dead
    /// and hands its recoveries to others (at least 1).
    #[arg(long, default_value_t = 30_000, value_parser = shared::at_least_one::<u64>)]
    lease_ttl_ms: u64,
    /// How often the worker reads its inbox when nothing wakes it (default: 30 000 with
    /// --listen and an address to advertise, since the coordinator wakes it for each
    /// assignment; 2 000 otherwise, where only a coordinator on this machine could wake it).
    #[arg(long, value_parser = shared::at_least_one::<u64>)]
    poll_interval_ms: Option<u64>,
    /// While it runs no recovery, the worker beats only every third of this TTL (and the
    /// fleet judges it by it): an idle fleet costs little. 0, or a value not above
    /// --lease-ttl-ms, keeps the full rate.
    #[arg(long, default_value_t = 600_000)]
    idle_ttl_ms: u64,
    /// On SIGTERM, how long running recoveries get to finish their step and commit; those
    /// still running then are handed back (0: hand them back at once).
    #[arg(long, default_value_t = 60_000)]
    shutdown_deadline_ms: u64,
    /// Directory for local fact logs (default: $XDG_STATE_HOME/rekindle/runs).
    #[arg(long, env = "REKINDLE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Serve /healthz, /readyz, /metrics (Prometheus) and /wake on this address, e.g.
    /// 0.0.0.0:9090. Without it, /wake is served on an ephemeral loopback port.
    #[arg(long, env = "REKINDLE_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// The address the coordinator reaches /wake at: a URL, or a host (with the --listen
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
    let endpoint = shared::endpoint(args.listen, args.advertise.as_deref(), "worker").await?;
    let config = Config::load(&args.config).context("load the configuration")?;
    let agent = Agent::from_config(config).context("set up the model")?;
    let store = args.store.open(false).await.context("open the store")?;
    let logs =
        LogDir::open(shared::state_dir(args.state_dir)?).context("open the state directory")?;
    // A loopback wake-up address (no --listen) reaches only a coordinator on this machine.
    let reachable = args.listen.is_some() && endpoint.url.is_some();
    let poll = args
        .poll_interval_ms
        .unwrap_or(if reachable { 30_000 } else { 2_000 });
    let options = WorkerOptions {
        id: args.id.unwrap_or_else(|| shared::default_id("worker")),
        concurrency: args.concurrency,
        queue: args.queue.unwrap_or(args.concurrency),
        ttl: Duration::from_millis(args.lease_ttl_ms),
        poll_interval: Duration::from_millis(poll),
        shutdown_deadline: Duration::from_millis(args.shutdown_deadline_ms),
        crash: None,
        idle_ttl: (args.idle_ttl_ms > 0).then(|| Duration::from_millis(args.idle_ttl_ms)),
        wake: Some((endpoint.wakeup, endpoint.url)),
        readiness: Some(endpoint.readiness),
    };
    worker::run(
        store,
        agent,
        logs,
        options,
        stop,
        Arc::new(WorkerStats::default()),
    )
    .await
    .context("run the worker")
}
