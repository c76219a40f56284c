//! The worker: registers, heartbeats, and executes the recoveries assigned to it.
//!
//! Per poll it reads one object, its inbox. For each new assignment (up to its concurrency)
//! it marks the recovery running (compare-and-swap, counting the attempt) and executes it on
//! this node. A failed attempt is recorded with its error and handed back; the coordinator
//! dead-letters a recovery that keeps failing. On stop (SIGTERM) it takes no new work, lets
//! each running recovery finish its current step and commit, releases the leases and exits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::coordinator::{Registration, read_inbox};
use crate::fact::RecoveryId;
use crate::fleet::{Agent, Node};
use crate::layout;
use crate::lease::Holder;
use crate::log::LogDir;
use crate::recovery::{self, RecoveryState};
use crate::runner::Stopped;
use crate::store::{Store, StoreError};

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub id: String,
    pub concurrency: u32,
    pub ttl: Duration,
    pub poll_interval: Duration,
    /// On stop, how long running recoveries get to finish their current step and commit;
    /// any still running then are abandoned (their leases expire and another worker resumes
    /// them) so the process exits in time.
    pub shutdown_deadline: Duration,
    /// When set, the worker dies on the spot, as if killed -9: its recoveries are abandoned
    /// mid-step, nothing is released, heartbeats just stop. For the demo and tests.
    pub crash: Option<Arc<AtomicBool>>,
}

/// Counts of what a worker did, for the demo and tests.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub started: std::sync::atomic::AtomicU64,
    /// Distinct recoveries finished (an attempt that finds its run already ended, because a
    /// killed worker committed the terminal fact, counts once).
    pub finished: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
    finished_ids: std::sync::Mutex<std::collections::HashSet<RecoveryId>>,
}

/// Runs a worker until `stop` is set.
pub async fn run(
    store: Store,
    agent: Agent,
    logs: LogDir,
    options: WorkerOptions,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
) -> Result<(), StoreError> {
    let holder = Holder::with_role(&store, options.id.clone(), options.ttl, "worker");
    // Heartbeats stop only after the running recoveries are done and released.
    let beating_stop = Arc::new(AtomicBool::new(false));
    holder.beat().await.ok();
    let beating = holder.spawn_heartbeat(Arc::clone(&beating_stop));
    let registration = Registration::new(
        &options.id,
        holder.heartbeat_key(),
        options.concurrency,
        agent.fingerprint_sha256(),
    );
    store
        .put(
            &layout::worker(&options.id),
            Bytes::from(serde_json::to_vec(&registration).unwrap_or_default()),
        )
        .await?;
    tracing::info!(worker_id = %options.id, concurrency = options.concurrency, "worker registered");
    let node = Node {
        store: store.clone(),
        agent,
        logs,
        holder: Arc::clone(&holder),
        stop: Arc::clone(&stop),
    };
    // Ordered, so aborts and shutdown waits happen in the same order on every replay.
    let mut running: BTreeMap<RecoveryId, tokio::task::JoinHandle<()>> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        if options
            .crash
            .as_ref()
            .is_some_and(|c| c.load(Ordering::SeqCst))
        {
            for (_, task) in running {
                task.abort();
            }
            beating.abort();
            tracing::info!(worker_id = %options.id, "worker crashed (simulated)");
            return Ok(());
        }
        running.retain(|_, task| !task.is_finished());
        match read_inbox(&store, &options.id).await {
            Ok(assigned) => {
                for id in assigned {
                    if running.len() >= options.concurrency as usize || running.contains_key(&id) {
                        continue;
                    }
                    let node = node.clone();
                    let stats = Arc::clone(&stats);
                    let worker = options.id.clone();
                    let task_id = id.clone();
                    running.insert(
                        id,
                        tokio::spawn(
                            async move { attempt(&node, &worker, &task_id, &stats).await },
                        ),
                    );
                }
            }
            Err(error) => tracing::warn!(worker_id = %options.id, %error, "cannot read the inbox"),
        }
        tokio::time::sleep(options.poll_interval).await;
    }
    let deadline = tokio::time::Instant::now() + options.shutdown_deadline;
    for (id, mut task) in running {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            tracing::warn!(recovery_id = %id, "still running at the shutdown deadline; abandoned to another worker");
            task.abort();
        }
    }
    beating_stop.store(true, Ordering::SeqCst);
    let _ = beating.await;
    let _ = store.delete(&layout::worker(&options.id)).await;
    let _ = holder.retire().await;
    tracing::info!(worker_id = %options.id, "worker stopped");
    Ok(())
}

/// One attempt at one recovery.
async fn attempt(node: &Node, worker: &str, id: &RecoveryId, stats: &WorkerStats) {
    let store = &node.store;
    let Ok(Some((record, etag))) = recovery::read(store, id).await else {
        return;
    };
    if !matches!(
        record.state,
        RecoveryState::Admitted | RecoveryState::Running
    ) || record.assigned_to.as_deref() != Some(worker)
    {
        return;
    }
    let Ok((record, _)) = recovery::update(store, &record, &etag, |r| {
        r.state = RecoveryState::Running;
        r.attempts += 1;
    })
    .await
    else {
        return;
    };
    stats.started.fetch_add(1, Ordering::Relaxed);
    let outcome = node.execute_recovery(&record).await;
    let (error, finished) = match &outcome {
        Ok(Stopped::Finished(_)) => (None, true),
        Ok(_) => (None, false),
        Err(error) if error_is_fenced(error) => {
            tracing::info!(recovery_id = %id, %error, "another worker owns this recovery now");
            return;
        }
        Err(error) => {
            tracing::warn!(recovery_id = %id, %error, "recovery attempt failed");
            (Some(error.to_string()), false)
        }
    };
    if finished {
        // The run's history is in the bucket; the local log was only its journal.
        if let Err(error) = node.logs.remove_log(id.as_str()) {
            tracing::warn!(recovery_id = %id, %error, "cannot remove the local fact log");
        }
        let new = stats
            .finished_ids
            .lock()
            .map(|mut ids| ids.insert(id.clone()))
            .unwrap_or(true);
        if new {
            stats.finished.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    if error.is_some() {
        stats.failed.fetch_add(1, Ordering::Relaxed);
    }
    // Hand the recovery back: yielded (step cap, stop), parked, or failed.
    if let Ok(Some((current, etag))) = recovery::read(store, id).await
        && current.state == RecoveryState::Running
    {
        let _ = recovery::update(store, &current, &etag, |r| {
            r.state = RecoveryState::Admitted;
            if let Some(error) = error {
                r.last_error = Some(error);
            }
        })
        .await;
    }
}

fn error_is_fenced(error: &crate::fleet::FleetError) -> bool {
    match error {
        crate::fleet::FleetError::Run(run) => run.is_fenced(),
        crate::fleet::FleetError::Generation(crate::generation::GenerationError::Fenced {
            ..
        }) => true,
        crate::fleet::FleetError::Lease(crate::lease::LeaseError::Lost { .. }) => true,
        _ => false,
    }
}
