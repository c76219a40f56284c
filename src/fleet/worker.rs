//! The worker: registers, heartbeats, and executes the recoveries assigned to it.
//!
//! Per poll it reads one object, its inbox. For each new assignment (up to its concurrency)
//! it starts an attempt (the lifecycle's `Start`, a compare-and-swap that only succeeds on a
//! recovery offered to this worker and waiting, or on a fresh admission nobody was offered
//! that a coordinator forwarded to it and it may run) and executes it on this node; how the attempt
//! ended is reported as one lifecycle event: `Finish`, `Park`, `Yield` (step cap or stop; not
//! a failure) or `Fail`. The coordinator dead-letters a recovery that keeps failing. On stop
//! (SIGTERM) it takes no new work, lets each running recovery finish its current step and
//! commit, hands the recoveries back, releases the leases and exits.
//!
//! A worker ID is owned by one live process at a time: a worker that finds another live
//! process beating under its ID refuses to start (`Holder::claim_identity`).

use crate::core::record::{RecoveryRecord, RecoveryResult, RecoveryState};
use crate::fleet::lifecycle;
use crate::fleet::lifecycle::LifecycleError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::core::assignment::Registration;
use crate::core::fact::RecoveryId;
use crate::core::layout;
use crate::core::lifecycle::{self as lifecycle_rules, Event};
use crate::error::{ErrorKind, Result};
use crate::fleet::coordinator::read_inbox;
use crate::fleet::runner::Stopped;
use crate::fleet::wake::Wakeup;
use crate::fleet::{Agent, Node};
use crate::store::lease::Holder;
use crate::store::log::LogDir;
use crate::store::recovery::{self};
use crate::store::{ETag, Store};

/// How a worker identifies itself, how much it runs at once, and how it paces and stops.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The worker's ID: its registration, its inbox and its holder ID on leases.
    pub id: String,
    /// How many recoveries it executes at once.
    pub concurrency: u32,
    /// How many more may wait assigned to it, so that a freed slot starts the next one at
    /// once instead of at the coordinator's next tick (see `Registration::queue`).
    pub queue: u32,
    /// The TTL of its heartbeat and of the leases it takes on recovery runs.
    pub ttl: Duration,
    /// How often the worker reads its inbox for newly assigned recoveries.
    pub poll_interval: Duration,
    /// On stop, how long running recoveries get to finish their current step and commit;
    /// any still running then are abandoned (their leases expire and another worker resumes
    /// them) so the process exits in time.
    pub shutdown_deadline: Duration,
    /// When set, the worker dies on the spot, as if killed -9: its recoveries are abandoned
    /// mid-step, nothing is released, heartbeats just stop. For the demo and tests.
    pub crash: Option<Arc<AtomicBool>>,
    /// While it runs no recovery, the worker beats every third of this instead of `ttl`
    /// (and is judged by it); `None` keeps the full rate. Idle processes need not prove
    /// liveness as often: a dead idle worker delays nothing, since an offer it does not
    /// answer moves to another worker.
    pub idle_ttl: Option<Duration>,
    /// Wake-ups that cut the wait between inbox reads short (see `fleet::wake`), and the
    /// address that reaches them, advertised in the registration and heartbeat.
    pub wake: Option<(Wakeup, Option<String>)>,
    /// What the process's `/readyz` answers, kept up to date by the loop.
    pub readiness: Option<Arc<crate::fleet::readiness::Readiness>>,
}

impl WorkerOptions {
    /// Options with the defaults of `rekindle-worker`, no wake-ups and no idle pace.
    pub fn new(id: impl Into<String>, concurrency: u32, ttl: Duration) -> Self {
        WorkerOptions {
            id: id.into(),
            concurrency,
            queue: concurrency,
            ttl,
            poll_interval: Duration::from_secs(2),
            shutdown_deadline: Duration::from_secs(60),
            crash: None,
            idle_ttl: None,
            wake: None,
            readiness: None,
        }
    }
}

/// Counts of what a worker did, for the demo and tests.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Recovery attempts started (the lifecycle's `Start` succeeded).
    pub started: std::sync::atomic::AtomicU64,
    /// Distinct recoveries finished (an attempt that finds its run already ended, because a
    /// killed worker committed the terminal fact, counts once).
    pub finished: std::sync::atomic::AtomicU64,
    /// Attempts that failed with an error other than being fenced, reported as `Fail`.
    pub failed: std::sync::atomic::AtomicU64,
    /// Attempts that lost their recovery run's lease to a later epoch: the worker was judged
    /// gone, or the run was retired. A healthy worker's count stays 0 outside retirements.
    pub fenced: std::sync::atomic::AtomicU64,
    /// The most recent finished recovery IDs (bounded: a repeat comes soon after, if at all).
    finished_ids: std::sync::Mutex<std::collections::VecDeque<RecoveryId>>,
}

/// Runs a worker until `stop` is set.
#[tracing::instrument(name = "worker", skip_all, fields(worker_id = %options.id))]
pub async fn run(
    store: Store,
    agent: Agent,
    logs: LogDir,
    options: WorkerOptions,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
) -> Result<()> {
    let holder = Holder::with_role(&store, options.id.clone(), options.ttl, "worker");
    let wake_url = options.wake.as_ref().and_then(|(_, url)| url.clone());
    let wakeup = options.wake.as_ref().map(|(wakeup, _)| Arc::clone(wakeup));
    holder.set_wake(wake_url.clone());
    if let Some(idle) = options.idle_ttl {
        holder.set_idle_ttl(idle);
    }
    // Claiming the ID may watch an earlier incarnation's heartbeat for its TTL (its idle TTL,
    // minutes, if it died idle): a stop cuts that short, as it does every other wait.
    let stopped = async {
        while !crate::clock::sleep_unless(crate::clock::STOP_CHECK * 50, &stop, None).await {}
    };
    tokio::select! {
        biased;
        claimed = holder.claim_identity() => claimed?,
        () = stopped => {
            tracing::info!(worker_id = %options.id, "stopped while waiting to take the worker ID over");
            return Ok(());
        }
    }
    // Heartbeats stop only after the running recoveries are done and released.
    let beating_stop = Arc::new(AtomicBool::new(false));
    holder.beat().await.ok();
    let beating = holder.spawn_heartbeat(Arc::clone(&beating_stop));
    let mut registration = Registration::new(
        &options.id,
        holder.heartbeat_key(),
        options.concurrency,
        agent.fingerprint_sha256(),
    );
    registration.queue = Some(options.queue).filter(|queue| *queue > 0);
    registration.ttl_ms = Some(options.ttl.as_millis() as u64);
    registration.idle_ttl_ms = options
        .idle_ttl
        .filter(|idle| *idle > options.ttl)
        .map(|idle| idle.as_millis() as u64);
    registration.wake = wake_url;
    let registration_key = layout::worker(&options.id);
    store
        .put(&registration_key, layout::encode_object(&registration))
        .await?;
    tracing::info!(worker_id = %options.id, concurrency = options.concurrency, queue = options.queue, "worker registered");
    // Recoveries may be waiting for a worker (the last one stopped): the coordinator is told
    // now rather than at its next scan.
    let waking = store.clone();
    tokio::spawn(async move { crate::fleet::wake::wake_coordinator(&waking).await });
    if let Some(readiness) = &options.readiness {
        readiness.started(&holder);
    }
    crate::metrics::set(
        crate::metrics::WORKER_CAPACITY,
        f64::from(options.concurrency),
    );
    let node = Node {
        store: store.clone(),
        agent,
        logs,
        holder: Arc::clone(&holder),
        stop: Arc::clone(&stop),
    };
    // Ordered, so aborts and shutdown waits happen in the same order on every replay.
    let mut running: BTreeMap<RecoveryId, tokio::task::JoinHandle<()>> = BTreeMap::new();
    // The versions of the inbox's offers already used for a start (kept while the inbox
    // carries them).
    let mut used_offers: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    // Where the coordinators take wake-ups, as the last inbox said.
    let mut coordinators: Vec<String> = Vec::new();
    // Recoveries that ended for good (finished or dead-lettered): the inbox may still list
    // them until the coordinator rewrites it, and re-reading each record per wake-up would
    // cost a GET each time for nothing. Nothing else is remembered: a recovery handed back
    // (a failure, a yield) may be offered to this worker again under the same inbox.
    let ended: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>> = Arc::default();
    // Recoveries the inbox lists whose record, read, said they are not this worker's to run
    // (a stale entry: parked, moved on): launched again only once the inbox changes (an offer
    // to this worker rewrites it) or a wake-up names them. Without this, each such attempt's
    // end woke the loop, which read the inbox and launched it again at once: three requests
    // a round trip for as long as the inbox stayed stale.
    let passed: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>> = Arc::default();
    let mut inbox_seen: Option<(Vec<RecoveryId>, Vec<String>)> = None;
    // Set when an attempt that ran ends, so the loop wakes the coordinator to fill the slot.
    let freed = Arc::new(AtomicBool::new(false));
    // Attempts whose run has stopped and which only record the outcome now: they hold no
    // slot, so the next recovery waiting on this worker starts without waiting for those
    // writes.
    let reporting: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>> = Arc::default();
    let turns: Arc<Turns> = Arc::default();
    let attempts = Launcher {
        node: node.clone(),
        worker: options.id.clone(),
        stats: Arc::clone(&stats),
        holder: Arc::clone(&holder),
        wakeup: wakeup.clone(),
        ended: Arc::clone(&ended),
        passed: Arc::clone(&passed),
        freed: Arc::clone(&freed),
        turns: Arc::clone(&turns),
        reporting: Arc::clone(&reporting),
    };
    let mut since_check = crate::clock::Stopwatch::start();
    // Recoveries wake-ups named that no slot has taken yet.
    let mut unstarted: std::collections::BTreeSet<RecoveryId> = std::collections::BTreeSet::new();
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
        if freed.swap(false, Ordering::SeqCst) && !coordinators.is_empty() {
            // A slot an attempt held freed: the coordinator may have recoveries waiting for
            // one. (A task that started nothing, for a stale inbox entry, wakes nobody: an
            // offer that keeps failing must not bounce between worker and coordinator.)
            let urls = coordinators.clone();
            tokio::spawn(async move {
                if let Err(error) = crate::fleet::wake::poke_all(&urls, &[]).await {
                    tracing::debug!(%error, "cannot wake the coordinator");
                }
            });
        }
        // The coordinator (after three TTLs of silence) and gc (after its grace period) remove
        // the registration of a worker whose heartbeat stayed unchanged (a worker killed -9).
        // One that was only paused that long, or judged on a heartbeat read just before this
        // worker beat again, registers again: its registration is looked at once per TTL it
        // declares (one HEAD; every ten minutes while idle at the default idle TTL).
        // Only a look that succeeded counts: after a partition the next one comes at once.
        if since_check.elapsed() > holder.declared_ttl() {
            match store.head(&registration_key).await {
                Ok(Some(_)) => since_check = crate::clock::Stopwatch::start(),
                Ok(None) => {
                    if store
                        .put(&registration_key, layout::encode_object(&registration))
                        .await
                        .is_ok()
                    {
                        since_check = crate::clock::Stopwatch::start();
                        tracing::info!(worker_id = %options.id, "the registration was gone (removed as a dead worker's); registered again");
                    }
                }
                Err(error) => {
                    tracing::debug!(worker_id = %options.id, %error, "cannot look at the registration")
                }
            }
        }
        // Recoveries a wake-up named (the coordinator names the ones it just offered this
        // worker, while it writes the inbox): started at once, each from its record as read
        // now (a named ID is only a hint: `attempt` runs only a recovery that its record says
        // is offered to this worker and waiting, or a fresh admission nobody was offered that
        // it may run, which it claims). The inbox is read as usual beside them.
        // Names not started yet are kept (up to `MAX_NAMED`) until a slot takes them: the
        // inbox read beside them may be older than the offer. While the inbox holds
        // recoveries waiting for a slot, a freed slot goes to the oldest of them (read from
        // the inbox), not to a name that came later.
        if let Some(wakeup) = &wakeup {
            let named = wakeup.take_named();
            if !named.is_empty() {
                let mut passed = passed.lock().unwrap_or_else(|e| e.into_inner());
                passed.retain(|id| !named.contains(id));
            }
            unstarted.extend(named);
            if !unstarted.is_empty() {
                let skip = ended.lock().unwrap_or_else(|e| e.into_inner());
                unstarted.retain(|id| !running.contains_key(id) && !skip.contains(id));
            }
            while unstarted.len() > crate::fleet::wake::MAX_NAMED {
                unstarted.pop_last();
            }
            if !unstarted.is_empty() && !turns.waiting.load(Ordering::SeqCst) {
                let free =
                    (options.concurrency as usize).saturating_sub(occupied(&running, &reporting));
                for _ in 0..free {
                    let Some(id) = unstarted.pop_first() else {
                        break;
                    };
                    running.insert(id.clone(), launch(&attempts, id, None));
                }
            }
        }
        match read_inbox(&store, &options.id).await {
            Ok(inbox) => {
                coordinators = inbox.wakes();
                let mut done = ended.lock().unwrap_or_else(|e| e.into_inner());
                // Only what the inbox still lists needs remembering.
                done.retain(|id| inbox.recoveries.contains(id));
                let mut skip: Vec<RecoveryId> = done.iter().cloned().collect();
                drop(done);
                let seen = (
                    inbox.recoveries.clone(),
                    inbox
                        .offers
                        .iter()
                        .map(|offer| offer.etag.clone())
                        .collect(),
                );
                let mut looked = passed.lock().unwrap_or_else(|e| e.into_inner());
                if inbox_seen.as_ref() != Some(&seen) {
                    looked.clear();
                    inbox_seen = Some(seen);
                }
                skip.extend(looked.iter().cloned());
                drop(looked);
                // Each offer is used once: a start that did not land on it changed nothing, and
                // the record is read from then on (no conditional PUT bound to fail per poll).
                used_offers.retain(|etag| inbox.offers.iter().any(|offer| offer.etag == *etag));
                // An offer for a recovery already running here (started by name, from its
                // record) is used: a later attempt reads the record.
                for offer in &inbox.offers {
                    if running.contains_key(&offer.record.recovery_id) {
                        used_offers.insert(offer.etag.clone());
                    }
                }
                let mut offers: Vec<_> = inbox
                    .offers
                    .into_iter()
                    .filter(|offer| !used_offers.contains(&offer.etag))
                    .collect();
                // In inbox order (oldest admission first), except that recoveries which gave
                // their slot up at a step cap come after the others.
                let mut candidates: Vec<RecoveryId> = inbox
                    .recoveries
                    .into_iter()
                    .filter(|id| !running.contains_key(id) && !skip.contains(id))
                    .collect();
                let yielded = turns.yielded(&candidates);
                candidates.sort_by_key(|id| yielded.contains(id));
                let free =
                    (options.concurrency as usize).saturating_sub(occupied(&running, &reporting));
                turns
                    .waiting
                    .store(candidates.len() > free, Ordering::SeqCst);
                for id in candidates.into_iter().take(free) {
                    let offer = offers
                        .iter()
                        .position(|offer| offer.record.recovery_id == id)
                        .map(|at| offers.swap_remove(at))
                        .map(|offer| {
                            used_offers.insert(offer.etag.clone());
                            (offer.record, ETag(offer.etag))
                        });
                    running.insert(id.clone(), launch(&attempts, id, offer));
                }
            }
            Err(error) => tracing::warn!(worker_id = %options.id, %error, "cannot read the inbox"),
        }
        // A coordinator leaves fresh admissions it forwards to this worker only as many as it
        // says it claims: its slots free beyond the names waiting, none while its inbox holds
        // recoveries waiting for a slot (they go first).
        if let Some(wakeup) = &wakeup {
            let free = (options.concurrency as usize)
                .saturating_sub(occupied(&running, &reporting))
                .saturating_sub(unstarted.len());
            let waiting = turns.waiting.load(Ordering::SeqCst) || stop.load(Ordering::SeqCst);
            wakeup.set_free_slots(if waiting { 0 } else { free });
        }
        let in_flight = occupied(&running, &reporting) as f64;
        crate::metrics::set(crate::metrics::WORKER_IN_FLIGHT, in_flight);
        crate::metrics::set(
            crate::metrics::WORKER_UTILIZATION,
            in_flight / f64::from(options.concurrency.max(1)),
        );
        crate::clock::sleep_unless(
            options.poll_interval,
            &stop,
            wakeup.as_deref().map(|w| w.notify()),
        )
        .await;
    }
    if let Some(wakeup) = &wakeup {
        wakeup.set_claims(0);
    }
    if let Some(readiness) = &options.readiness {
        readiness.draining();
    }
    tracing::info!(worker_id = %options.id, running = running.len(), "stopping: taking no new work");
    let handing_back = !running.is_empty();
    let stopped_at = crate::clock::Stopwatch::start();
    let deadline = stopped_at.deadline(options.shutdown_deadline);
    // The registration says the worker drains: the coordinator offers it nothing more and
    // moves what waits for it. Recoveries waiting in the inbox go back to the coordinator
    // now, and any offered before it saw the registration as they come: declined, not left
    // waiting for this worker's exit.
    registration.draining = true;
    if let Err(error) = store
        .put(&registration_key, layout::encode_object(&registration))
        .await
    {
        tracing::debug!(worker_id = %options.id, %error, "cannot mark the registration draining");
    }
    // Names no slot took go back to the coordinator, once the registration says this worker
    // drains: it places them again (this worker no longer claims them, and declines any it
    // is offered while it drains).
    if let Some(wakeup) = &wakeup {
        unstarted.extend(wakeup.take_named());
        if !coordinators.is_empty() && !unstarted.is_empty() {
            let names: Vec<RecoveryId> = std::mem::take(&mut unstarted).into_iter().collect();
            if let Err(error) = crate::fleet::wake::poke_all(&coordinators, &names).await {
                tracing::debug!(%error, "cannot hand the named recoveries back to the coordinator");
            }
        }
    }
    let declining = DECLINE_CHECK.min(options.poll_interval);
    let mut declined = std::collections::BTreeSet::new();
    let mut poked: Option<crate::clock::Stopwatch> = None;
    loop {
        running.retain(|_, task| !task.is_finished());
        let skip: Vec<RecoveryId> = ended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let (new, listed) =
            decline_waiting(&store, &options.id, &running, &skip, &mut declined).await;
        // Woken for new declines, and again while the inbox still lists declined ones a
        // while later (the coordinator may have decided on a record read just before).
        let again = listed && poked.as_ref().is_some_and(|at| at.elapsed() >= declining);
        if (new || again) && !coordinators.is_empty() {
            poked = Some(crate::clock::Stopwatch::start());
            if let Err(error) = crate::fleet::wake::poke_all(&coordinators, &[]).await {
                tracing::debug!(%error, "cannot wake the coordinator");
            }
        }
        if running.is_empty() || stopped_at.elapsed() >= options.shutdown_deadline {
            break;
        }
        let woken = async {
            match wakeup.as_deref() {
                Some(wake) => wake.notify().notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = woken => {}
            () = crate::clock::sleep(declining) => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
    for (id, mut task) in running {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            tracing::warn!(recovery_id = %id, "still running at the shutdown deadline; handed back to another worker");
            task.abort();
            // Our decision, not a failure: the step in flight may run again, as after any
            // stop, and the next worker waits out this attempt's lease.
            // The attempt this process ran is the one the record names, if it still names
            // this worker.
            if let Ok(Some((record, etag))) = recovery::read(&store, &id).await {
                let event = Event::Yield {
                    worker: options.id.clone(),
                    attempt: record.attempts,
                    keep_assignment: false,
                };
                let known = Some((record, etag));
                if let Err(error) = lifecycle::transition(&store, &id, known, event).await {
                    tracing::debug!(recovery_id = %id, %error, "hand-back at the deadline");
                }
            }
        }
    }
    beating_stop.store(true, Ordering::SeqCst);
    let _ = beating.await;
    // Only our own inbox, registration and heartbeat are removed: another process may have
    // taken the ID over after this one was judged gone. (An inbox the coordinator writes
    // after this, from a tick that began before, it removes itself once it sees the
    // registration gone.)
    if holder.owns_heartbeat().await.unwrap_or(false) {
        let _ = store.delete(&layout::inbox(&options.id)).await;
        let _ = store.delete(&layout::worker(&options.id)).await;
    }
    let _ = holder.retire().await;
    // The recoveries this worker handed back on its way out go to others now, not at the
    // coordinator's next scan (after its registration and heartbeat are gone, so they are
    // not offered back to it).
    if handing_back && let Err(error) = crate::fleet::wake::poke_all(&coordinators, &[]).await {
        tracing::debug!(%error, "cannot wake the coordinator");
    }
    tracing::info!(worker_id = %options.id, "worker stopped");
    Ok(())
}

/// How often a stopping worker looks for new offers to decline while its recoveries finish.
const DECLINE_CHECK: Duration = Duration::from_secs(1);

/// Declines every recovery its inbox offers this stopping worker and that it does not run
/// (`running`), has not seen end (`ended`) and has not tried to decline already (`tried`,
/// which this extends): the lifecycle's `Decline`, so the coordinator offers it elsewhere.
/// Returns whether it declined any now, and whether the inbox still lists one tried before.
async fn decline_waiting(
    store: &Store,
    worker: &str,
    running: &BTreeMap<RecoveryId, tokio::task::JoinHandle<()>>,
    ended: &[RecoveryId],
    tried: &mut std::collections::BTreeSet<RecoveryId>,
) -> (bool, bool) {
    let inbox = match read_inbox(store, worker).await {
        Ok(inbox) => inbox,
        Err(error) => {
            tracing::debug!(worker_id = %worker, %error, "cannot read the inbox to decline its offers");
            return (false, false);
        }
    };
    let listed = inbox.recoveries.iter().any(|id| tried.contains(id));
    let waiting: Vec<RecoveryId> = inbox
        .recoveries
        .into_iter()
        .filter(|id| !running.contains_key(id) && !ended.contains(id) && !tried.contains(id))
        .collect();
    let mut declined = false;
    for id in waiting {
        tried.insert(id.clone());
        let decline = Event::Decline {
            worker: worker.to_owned(),
        };
        match lifecycle::transition(store, &id, None, decline).await {
            Ok(_) => {
                tracing::info!(worker_id = %worker, recovery_id = %id, "declined an offer: stopping");
                crate::metrics::count(crate::metrics::OFFERS_DECLINED);
                declined = true;
            }
            // Not offered to this worker any more (moved, started elsewhere, ended).
            Err(LifecycleError::Refused(_)) => {}
            Err(error) => {
                // Tried again at the next round.
                tried.remove(&id);
                tracing::debug!(worker_id = %worker, recovery_id = %id, %error, "cannot decline an offer")
            }
        }
    }
    (declined, listed)
}

/// Whose turn a freed slot is, shared by the worker's loop and its attempts: a recovery at
/// its step cap gives its slot up when another waits in the inbox, and goes after the others.
#[derive(Debug, Default)]
struct Turns {
    /// Whether an inbox entry waits for a slot on this worker (as of the last inbox read).
    waiting: AtomicBool,
    /// Recoveries that gave their slot up at a step cap and were not started since.
    yielded: std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>,
}

impl Turns {
    /// The yielded among `listed`; forgets those no longer listed.
    fn yielded(&self, listed: &[RecoveryId]) -> std::collections::BTreeSet<RecoveryId> {
        let mut yielded = self.yielded.lock().unwrap_or_else(|e| e.into_inner());
        yielded.retain(|id| listed.contains(id));
        yielded.clone()
    }

    fn started(&self, id: &RecoveryId) {
        let mut yielded = self.yielded.lock().unwrap_or_else(|e| e.into_inner());
        yielded.remove(id);
    }

    /// At a step cap: whether to give the slot up (another recovery waits for one).
    fn give_up_slot(&self, id: &RecoveryId) -> bool {
        if !self.waiting.load(Ordering::SeqCst) {
            return false;
        }
        let mut yielded = self.yielded.lock().unwrap_or_else(|e| e.into_inner());
        yielded.insert(id.clone());
        true
    }
}

/// Attempts at one recovery offered to this worker: start, execute, report how it ended.
/// Returns whether the recovery has ended for good (nothing to offer this worker again), and
/// whether an attempt ran at all (a stale inbox entry starts none).
/// At the step cap the recovery is yielded and, still offered to this worker, started again
/// at once (each resume is bounded; none counts as a failure), unless another recovery waits
/// in the inbox: then the slot is its, and this one waits its turn after it.
/// `offer` is the record as the inbox carried it: the first start swaps that version without
/// reading the record; if it was stale, the record is read and judged as usual.
/// The record as this worker's own start left it, when a start answered an error but landed
/// (its response lost and the retries failed, or the index write after it failed): running on
/// this worker at the attempt after `before`. A worker ID belongs to one live process
/// (`Holder::claim_identity`), so no one else started that attempt, and it is ours to run;
/// taken for an earlier incarnation's, it would be handed back, a failure counted for nothing.
async fn landed_start(
    store: &Store,
    id: &RecoveryId,
    worker: &str,
    before: u32,
) -> Option<(RecoveryRecord, ETag)> {
    let (record, etag) = recovery::read(store, id).await.ok()??;
    let ours = record.state == RecoveryState::Running
        && record.assigned_to.as_deref() == Some(worker)
        && record.attempts == before.saturating_add(1);
    if ours {
        tracing::info!(recovery_id = %id, attempt = record.attempts, "a start answered an error but landed; running it");
    }
    ours.then_some((record, etag))
}

#[tracing::instrument(name = "worker_attempt", skip_all, fields(worker_id = %worker, recovery_id = %id))]
async fn attempt(
    node: &Node,
    worker: &str,
    id: &RecoveryId,
    stats: &WorkerStats,
    offer: Option<(RecoveryRecord, ETag)>,
    turns: &Turns,
    slot: &Slot,
) -> (Left, bool) {
    let store = &node.store;
    let mut ran = false;
    // Looked at, and nothing run: the record says it is not this worker's to run now.
    let passed = |ran: bool| if ran { Left::Open } else { Left::NotOurs };
    // Only an offer to this worker waiting for its attempt is a shortcut; anything else is
    // judged from the record as read.
    let mut offer = offer.filter(|(record, _)| {
        record.recovery_id == *id
            && record.state == RecoveryState::Admitted
            && record.assigned_to.as_deref() == Some(worker)
    });
    loop {
        let from_offer = offer.is_some();
        let (record, etag) = match offer.take() {
            Some(offered) => offered,
            None => {
                let Ok(Some(read)) = recovery::read(store, id).await else {
                    return (Left::Open, ran);
                };
                read
            }
        };
        if record.state.is_terminal() {
            return (Left::Over, ran);
        }
        // Running on this worker ID but not in this process: an earlier incarnation of this
        // worker died mid-attempt (its ID is ours now, so the coordinator still sees it
        // alive). Hand it back as the coordinator would; it is then offered again.
        if record.state == RecoveryState::Running && record.assigned_to.as_deref() == Some(worker) {
            let abandon = Event::Abandon {
                worker: worker.to_owned(),
                attempt: record.attempts,
            };
            if let Err(error) =
                lifecycle::transition(store, id, Some((record, etag)), abandon).await
            {
                tracing::debug!(recovery_id = %id, %error, "cannot hand back an earlier incarnation's attempt");
            }
            return (passed(ran), ran);
        }
        // Only a recovery offered to this worker and waiting for an attempt (a stale inbox
        // also lists parked and finished ones, which must not run again), or a fresh admission
        // nobody was offered yet that this worker may run: the coordinator forwards those
        // names before it reads the records (see `coordinator::named::assign_named`).
        let offered = record.state == RecoveryState::Admitted
            && record.assigned_to.as_deref() == Some(worker);
        let claimable = lifecycle_rules::unclaimed(&record)
            && (record.force || record.fingerprint_sha256 == node.agent.fingerprint_sha256())
            && !node.stop.load(Ordering::SeqCst);
        if !offered && !claimable {
            return (passed(ran), ran);
        }
        let start = Event::Start {
            worker: worker.to_owned(),
        };
        let before = record.attempts;
        // A first attempt seeds from the pinned source: read it (immutable generations,
        // checked against the pin's digest) while the start is being recorded.
        let source = record.source_run.clone();
        let seeding: futures::future::OptionFuture<_> = (record.attempts == 0)
            .then(|| {
                let (generation, base) = (record.source_generation, record.source_base);
                async move {
                    crate::store::generation::load_pinned(store, &source, generation, base).await
                }
            })
            .into();
        let (started, seed) = futures::join!(
            lifecycle::transition(store, id, Some((record, etag)), start),
            seeding
        );
        let started = match started {
            Ok(started) => Some(started),
            Err(error) => {
                tracing::debug!(recovery_id = %id, %error, "not started, as answered");
                landed_start(store, id, worker, before).await
            }
        };
        let (record, started_etag) = match started {
            Some(started) => started,
            // The offer was stale: judge the record as it is now.
            None if from_offer => continue,
            None => return (passed(ran), ran),
        };
        ran = true;
        stats.started.fetch_add(1, Ordering::Relaxed);
        crate::metrics::count(crate::metrics::ATTEMPTS_STARTED);
        let attempt = record.attempts;
        let outcome = node.execute_recovery_seeded(&record, seed).await;
        let worker = worker.to_owned();
        let (event, again) = match outcome {
            Ok((Stopped::Finished(terminal), final_generation)) => (
                Event::Finish {
                    worker,
                    attempt,
                    result: RecoveryResult {
                        outcome: terminal.outcome,
                        message: terminal.message.clone(),
                        final_generation,
                    },
                },
                false,
            ),
            Ok((Stopped::Parked(_) | Stopped::WaitingForInput, generation)) => {
                let park = Event::Park {
                    worker,
                    attempt,
                    generation,
                };
                (park, false)
            }
            Ok((Stopped::StepCap, _)) => (
                Event::Yield {
                    worker,
                    attempt,
                    keep_assignment: true,
                },
                !node.stop.load(Ordering::SeqCst) && !turns.give_up_slot(id),
            ),
            Ok((Stopped::StopRequested, _)) => (
                Event::Yield {
                    worker,
                    attempt,
                    keep_assignment: false,
                },
                false,
            ),
            Err(error) if error.kind() == ErrorKind::Fenced => {
                // Someone with a higher epoch owns the recovery run now (this worker was
                // judged dead and its attempt abandoned). If the record still says this
                // attempt runs, hand it back rather than leave it to a timeout.
                tracing::info!(recovery_id = %id, %error, "another attempt owns this recovery now");
                stats.fenced.fetch_add(1, Ordering::Relaxed);
                (
                    Event::Yield {
                        worker,
                        attempt,
                        keep_assignment: false,
                    },
                    false,
                )
            }
            Err(error) => {
                tracing::warn!(recovery_id = %id, %error, "recovery attempt failed");
                stats.failed.fetch_add(1, Ordering::Relaxed);
                crate::metrics::count(crate::metrics::RECOVERIES_FAILED);
                (
                    Event::Fail {
                        worker,
                        attempt,
                        error: error.to_string(),
                    },
                    false,
                )
            }
        };
        if !again {
            // Nothing more runs in this attempt: only its outcome is left to write.
            slot.free();
        }
        let finished = matches!(event, Event::Finish { .. });
        // The record as this attempt's start left it: nobody else changes a running attempt's
        // record but the coordinator abandoning it, and then the swap fails and is re-read.
        let started = Some((record, started_etag));
        match lifecycle::transition(store, id, started, event).await {
            Ok(_) => {}
            Err(LifecycleError::Refused(refused)) => {
                tracing::info!(recovery_id = %id, %refused, "attempt outcome not recorded");
                return (Left::Open, ran);
            }
            Err(error) => {
                // The record stays Running on this worker; while it lives the next scan leaves
                // it alone, so report it loudly.
                tracing::error!(recovery_id = %id, %error, "cannot record the attempt's outcome");
                return (Left::Open, ran);
            }
        }
        if finished {
            recovery_finished(node, id, stats);
            return (Left::Over, ran);
        }
        // A stop that came while the yield was recorded: no new attempt.
        if !again || node.stop.load(Ordering::SeqCst) {
            return (Left::Open, ran);
        }
    }
}

/// How an attempt's task left its recovery, for the worker loop.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Left {
    /// Ended for good (finished, dead-lettered): never launched again here.
    Over,
    /// Looked at and not this worker's to run (its record says another worker's, parked,
    /// an earlier incarnation's handed back), nothing run: not launched again from the same
    /// inbox, or every end would wake the loop to launch it again at once.
    NotOurs,
    /// Anything else: it ran and stopped, or its record could not be read.
    Open,
}

/// What the worker loop hands each attempt it launches.
struct Launcher {
    node: Node,
    worker: String,
    stats: Arc<WorkerStats>,
    holder: Arc<Holder>,
    wakeup: Option<Wakeup>,
    ended: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>>,
    passed: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>>,
    freed: Arc<AtomicBool>,
    turns: Arc<Turns>,
    reporting: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>>,
}

/// Launches the attempts at recovery `id` on this worker (see [`attempt`]), holding a slot
/// until its run stops; `offer` is the record as the inbox carried it, if it did.
fn launch(
    with: &Launcher,
    id: RecoveryId,
    offer: Option<(RecoveryRecord, ETag)>,
) -> tokio::task::JoinHandle<()> {
    with.turns.started(&id);
    let node = with.node.clone();
    let stats = Arc::clone(&with.stats);
    let worker = with.worker.clone();
    // Beats at the full rate from before the attempt starts until it ends.
    let busy = with.holder.busy();
    let done = with.wakeup.clone();
    let ended = Arc::clone(&with.ended);
    let passed = Arc::clone(&with.passed);
    let freed = Arc::clone(&with.freed);
    let turns = Arc::clone(&with.turns);
    let slot = Slot {
        id: id.clone(),
        reporting: Arc::clone(&with.reporting),
        wakeup: with.wakeup.clone(),
    };
    tokio::spawn(async move {
        let (left, ran) = attempt(&node, &worker, &id, &stats, offer, &turns, &slot).await;
        // A later attempt of the same recovery holds a slot again.
        drop(slot);
        match left {
            Left::Over => {
                ended.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
            }
            Left::NotOurs => {
                passed.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
            }
            Left::Open => {}
        }
        if ran {
            freed.store(true, Ordering::SeqCst);
        }
        drop(busy);
        // Back to the loop at once, to take the next assignment.
        if let Some(done) = done {
            done.notify_one();
        }
    })
}

/// An attempt's slot on its worker, given up once its run has stopped. Dropped when the
/// attempt's task ends, however it ends (a panic too): a later attempt of the same recovery
/// then holds a slot again.
struct Slot {
    id: RecoveryId,
    reporting: Arc<std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>>,
    wakeup: Option<Wakeup>,
}

impl Slot {
    /// The attempt's run stopped and only its outcome is being written: the slot may take
    /// the next recovery now (the loop is woken to start it).
    fn free(&self) {
        self.reporting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.id.clone());
        if let Some(wakeup) = &self.wakeup {
            wakeup.notify_one();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.reporting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// The slots taken: attempts in flight, less those only writing their outcome.
fn occupied(
    running: &BTreeMap<RecoveryId, tokio::task::JoinHandle<()>>,
    reporting: &std::sync::Mutex<std::collections::BTreeSet<RecoveryId>>,
) -> usize {
    let reporting = reporting.lock().unwrap_or_else(|e| e.into_inner());
    running
        .iter()
        .filter(|(id, task)| !task.is_finished() && !reporting.contains(*id))
        .count()
}

/// How many finished recovery IDs a worker remembers to count each once: enough for the
/// repeats that happen (an attempt that finds its run ended by a killed attempt before it),
/// bounded so a long-lived worker's memory does not grow with every recovery it finished.
const FINISHED_IDS_KEPT: usize = 1024;

/// After a finished recovery: the run's history is in the bucket, the local log was only its
/// journal.
fn recovery_finished(node: &Node, id: &RecoveryId, stats: &WorkerStats) {
    if let Err(error) = node.logs.remove_log(id.as_str()) {
        tracing::warn!(recovery_id = %id, %error, "cannot remove the local fact log");
    }
    let new = stats
        .finished_ids
        .lock()
        .map(|mut ids| {
            if ids.contains(id) {
                return false;
            }
            if ids.len() >= FINISHED_IDS_KEPT {
                ids.pop_front();
            }
            ids.push_back(id.clone());
            true
        })
        .unwrap_or(true);
    if new {
        stats.finished.fetch_add(1, Ordering::Relaxed);
        crate::metrics::count(crate::metrics::RECOVERIES_FINISHED);
    }
}
