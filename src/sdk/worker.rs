//! A worker in a package's process: a full fleet member, as `rekindle-worker` is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{Endpoint, Failure, Result, lift};
use crate::fleet::Agent;
use crate::fleet::worker::{WorkerOptions, WorkerStats};
use crate::store::Store;
use crate::store::log::LogDir;

/// How a package's worker runs; the defaults are `rekindle-worker`'s.
#[derive(Clone, Debug)]
pub struct WorkerSetup {
    /// The worker's ID (its registration, inbox and lease holder).
    pub id: String,
    /// Recoveries run at once.
    pub concurrency: u32,
    /// More that may wait assigned to it (default: as many as run).
    pub queue: Option<u32>,
    /// The TTL of its heartbeat and of its recoveries' leases.
    pub ttl: Duration,
    /// How often it reads its inbox when nothing wakes it (default: 30 s when others can
    /// reach its wake-ups, 2 s otherwise).
    pub poll_interval: Option<Duration>,
    /// Serve `/healthz`, `/readyz`, `/metrics` and `POST /wake` here; without it, wake-ups
    /// are served on an ephemeral loopback port (coordinators on this machine reach it).
    pub listen: Option<SocketAddr>,
    /// The address the coordinator reaches `/wake` at (default: the listen address when it
    /// names a host).
    pub advertise: Option<String>,
}

impl WorkerSetup {
    /// A setup with `id`, `concurrency` and `ttl` and the rest at the defaults.
    pub fn new(id: String, concurrency: u32, ttl: Duration) -> Self {
        WorkerSetup {
            id,
            concurrency,
            queue: None,
            ttl,
            poll_interval: None,
            listen: None,
            advertise: None,
        }
    }

    /// Sets the listen address from its text (`0.0.0.0:9090`); refused when it is not one.
    pub fn listen_on(&mut self, text: Option<String>) -> Result<()> {
        self.listen = text
            .map(|text| {
                text.parse().map_err(|e| {
                    Failure::invalid(format!("listen address '{text}': {e} (e.g. 0.0.0.0:9090)"))
                })
            })
            .transpose()?;
        Ok(())
    }

    /// Refuses what `rekindle-worker` refuses: no slot, a zero TTL or poll interval.
    pub fn check(&self) -> Result<()> {
        if self.concurrency == 0
            || self.ttl.is_zero()
            || self.poll_interval.is_some_and(|p| p.is_zero())
        {
            return Err(Failure::invalid(format!(
                "worker '{}': the concurrency, the TTL and the poll interval must be at least 1",
                self.id
            )));
        }
        Ok(())
    }
}

/// Registers, heartbeats and executes assigned recoveries until `stop` is set; then lets the
/// running recoveries finish their step, hands them back and returns. Its endpoint is up
/// while it runs.
pub async fn run_worker(
    store: Store,
    agent: Agent,
    logs: LogDir,
    setup: WorkerSetup,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
) -> Result<()> {
    setup.check()?;
    let endpoint = Endpoint::open(setup.listen, setup.advertise.as_deref(), "worker")
        .await
        .map_err(|f| f.context(format!("worker '{}'", setup.id)))?;
    let poll = setup.poll_interval.unwrap_or(if endpoint.reachable {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(2)
    });
    let mut options = WorkerOptions::new(setup.id, setup.concurrency, setup.ttl);
    options.queue = setup.queue.unwrap_or(setup.concurrency);
    options.poll_interval = poll;
    options.wake = Some(endpoint.wake());
    options.readiness = Some(Arc::clone(&endpoint.readiness));
    let outcome = crate::fleet::worker::run(store, agent, logs, options, stop, stats).await;
    drop(endpoint);
    lift(outcome)
}
