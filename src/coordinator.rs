//! The coordinator: finds interrupted runs and assigns their recoveries to live workers.
//!
//! This module owns leadership (one active coordinator, by a lease; a standby takes over when
//! the leader stops beating), observing the fleet through the bucket (the index, worker
//! registrations, heartbeats, recovery records) and the pure [`decide`] that turns an
//! observation into actions. Polling stays cheap: per tick, one LIST each of the index and
//! the heartbeats (liveness comes from the listed ETags), a LIST of registrations only when
//! the set of processes changed, and GETs only for index entries that changed and for runs
//! being recovered. It never executes a run.
//!
//! Architecture invariant: a coordinator restart never admits a run twice — recovery IDs are
//! derived from the source run ([`recovery_id_for`]) and admission is idempotent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::fact::{RecoveryId, RunId};
use crate::generation::{GenerationError, RunWriter, SnapshotPolicy};
use crate::index::{self, IndexEntry, IndexScan, Phase};
use crate::layout::{self, FORMAT_VERSION};
use crate::lease::{Attempt, ExpiryWatch, Held, Holder, Verdict};
use crate::recovery::{self, RecoveryRecord, RecoveryState};
use crate::store::{ETag, Store, StoreError};

/// Default number of failed attempts before a recovery is dead-lettered.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// The deterministic recovery ID of a source run.
pub fn recovery_id_for(source: &RunId) -> RecoveryId {
    RecoveryId::new(format!("recovery-of-{source}"))
}

/// A worker's registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub format: u32,
    pub kind: String,
    pub worker: String,
    pub heartbeat: String,
    pub capacity: u32,
    pub fingerprint_sha256: String,
}

impl Registration {
    pub fn new(worker: &str, heartbeat: String, capacity: u32, fingerprint_sha256: String) -> Self {
        Registration {
            format: FORMAT_VERSION,
            kind: "worker".into(),
            worker: worker.to_owned(),
            heartbeat,
            capacity,
            fingerprint_sha256,
        }
    }
}

/// The recoveries assigned to one worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbox {
    pub format: u32,
    pub kind: String,
    pub worker: String,
    pub recoveries: Vec<RecoveryId>,
}

pub async fn read_inbox(store: &Store, worker: &str) -> Result<Vec<RecoveryId>, StoreError> {
    let key = layout::inbox(worker);
    Ok(match store.read(&key).await? {
        Some(object) => layout::decode_object::<Inbox>(&key, "inbox", &object.bytes)
            .map(|inbox| inbox.recoveries)
            .unwrap_or_default(),
        None => Vec::new(),
    })
}

/// A worker as the coordinator sees it.
#[derive(Clone, Debug)]
pub struct WorkerView {
    pub registration: Registration,
    pub alive: bool,
}

/// A run being tracked, with its recovery record if it has one.
#[derive(Clone, Debug)]
pub struct RunView {
    pub entry: IndexEntry,
    pub holder_alive: bool,
    pub recovery: Option<RecoveryRecord>,
}

/// What the coordinator does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Admit a recovery of an interrupted run.
    Admit { source: RunId },
    /// Give a recovery to a worker.
    Assign {
        recovery: RecoveryId,
        worker: String,
    },
    /// Give up on a recovery after too many failed attempts.
    DeadLetter { source: RunId, recovery: RecoveryId },
    /// Forget a run whose recovery finished.
    Forget { source: RunId },
}

/// Decides from one observation. Pure: the same observation gives the same actions.
pub fn decide(workers: &[WorkerView], runs: &[RunView], max_attempts: u32) -> Vec<Action> {
    let mut actions = Vec::new();
    // Free capacity of each live worker, counting recoveries already assigned to it.
    let mut free: BTreeMap<&str, i64> = workers
        .iter()
        .filter(|w| w.alive)
        .map(|w| {
            (
                w.registration.worker.as_str(),
                i64::from(w.registration.capacity),
            )
        })
        .collect();
    for run in runs {
        if let Some(record) = &run.recovery
            && matches!(
                record.state,
                RecoveryState::Admitted | RecoveryState::Running
            )
            && let Some(worker) = &record.assigned_to
            && let Some(slots) = free.get_mut(worker.as_str())
        {
            *slots -= 1;
        }
    }
    for run in runs {
        match run.entry.phase {
            Phase::Parked | Phase::Dead => {}
            Phase::Running => {
                if !run.holder_alive {
                    actions.push(Action::Admit {
                        source: run.entry.run_id.clone(),
                    });
                }
            }
            Phase::Recovering => {
                let Some(record) = &run.recovery else {
                    actions.push(Action::Admit {
                        source: run.entry.run_id.clone(),
                    });
                    continue;
                };
                match record.state {
                    RecoveryState::Finished => actions.push(Action::Forget {
                        source: run.entry.run_id.clone(),
                    }),
                    RecoveryState::DeadLettered => {}
                    RecoveryState::Admitted | RecoveryState::Running => {
                        let failed_out = record.attempts >= max_attempts
                            && record.state == RecoveryState::Admitted;
                        if failed_out {
                            actions.push(Action::DeadLetter {
                                source: run.entry.run_id.clone(),
                                recovery: record.recovery_id.clone(),
                            });
                            continue;
                        }
                        let assigned_alive = record
                            .assigned_to
                            .as_deref()
                            .is_some_and(|w| free.contains_key(w));
                        if assigned_alive {
                            continue;
                        }
                        let eligible = workers.iter().filter(|w| {
                            w.alive
                                && (record.force
                                    || w.registration.fingerprint_sha256
                                        == run.entry.fingerprint_sha256)
                        });
                        let best = eligible
                            .map(|w| {
                                (
                                    free.get(w.registration.worker.as_str())
                                        .copied()
                                        .unwrap_or(0),
                                    &w.registration.worker,
                                )
                            })
                            .filter(|(slots, _)| *slots > 0)
                            .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)));
                        if let Some((_, worker)) = best {
                            if let Some(slots) = free.get_mut(worker.as_str()) {
                                *slots -= 1;
                            }
                            actions.push(Action::Assign {
                                recovery: record.recovery_id.clone(),
                                worker: worker.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    actions
}

#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    pub id: String,
    pub ttl: Duration,
    pub scan_interval: Duration,
    pub max_attempts: u32,
}

/// The coordinator's memory between ticks: caches and liveness observations.
#[derive(Default)]
struct Observer {
    index: IndexScan,
    // Ordered maps: the order of store calls must not depend on a hasher's random seed, so a
    // seeded simulation replays exactly.
    registrations: BTreeMap<String, (Option<ETag>, Registration)>,
    liveness: ExpiryWatch,
    inboxes: BTreeMap<String, Vec<RecoveryId>>,
    /// The heartbeat keys seen last tick, and ticks since registrations were last listed.
    holders: std::collections::BTreeSet<String>,
    ticks_since_registrations: u32,
}

/// Registrations are re-listed at least this often even when no process came or went.
const REGISTRATIONS_REFRESH_TICKS: u32 = 30;

/// Runs a coordinator until `stop` is set: stands by until it leads, then ticks.
pub async fn run(
    store: Store,
    options: CoordinatorOptions,
    stop: Arc<AtomicBool>,
) -> Result<(), StoreError> {
    let holder = Holder::with_role(&store, options.id.clone(), options.ttl, "coordinator");
    let beating = holder.spawn_heartbeat(Arc::clone(&stop));
    let lease_run = RunId::new(layout::COORDINATOR_LEASE_RUN);
    let mut observer = Observer::default();
    let mut leading: Option<Held> = None;
    // Kept across ticks: a standby judges the leader dead only after a whole TTL of silence.
    let mut standby = ExpiryWatch::default();
    while !stop.load(Ordering::SeqCst) {
        if leading.is_none() {
            match holder.try_acquire(&lease_run, 0, &mut standby).await {
                Ok(Attempt::Held(held)) => {
                    tracing::info!(coordinator = %options.id, epoch = held.epoch, "leading");
                    leading = Some(held);
                }
                Ok(Attempt::Alive { .. }) => {}
                Err(error) => tracing::warn!(%error, "cannot take the coordinator lease"),
            }
        }
        if let Some(held) = &leading {
            if let Err(error) = holder.check(held).await {
                tracing::info!(coordinator = %options.id, %error, "no longer leading");
                leading = None;
                continue;
            }
            if let Err(error) = tick(&store, &holder, &options, &mut observer).await {
                tracing::warn!(%error, "coordinator tick failed");
            }
        }
        tokio::time::sleep(options.scan_interval).await;
    }
    if let Some(held) = &leading {
        let _ = holder.release(held).await;
    }
    let _ = beating.await;
    let _ = holder.retire().await;
    Ok(())
}

/// One observation and its actions. Public so tests and the demo can drive it directly.
pub async fn tick_once(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
) -> Result<Vec<Action>, StoreError> {
    let mut observer = Observer::default();
    tick(store, holder, options, &mut observer).await
}

async fn tick(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
) -> Result<Vec<Action>, StoreError> {
    // The index is read before the heartbeats: a host beats before it writes its entry, so
    // every holder named by an entry seen here is in the heartbeat listing that follows, and
    // a missing heartbeat really means the holder is gone.
    let (entries, bad) = observer.index.scan(store).await?;
    for bad in bad {
        tracing::warn!(key = %bad.key, error = %bad.error, "ignoring a bad index entry");
    }
    let now = store.clock().monotonic();
    // Liveness: a heartbeat whose listed ETag stays the same for a TTL is dead.
    let mut alive: HashMap<String, bool> = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(layout::heartbeats_prefix(), after.as_deref(), 1000)
            .await?;
        for listed in &page {
            let etag = listed.etag.clone().unwrap_or_else(|| ETag(String::new()));
            let verdict = observer.liveness.observe(
                &RunId::new(listed.key.clone()),
                &etag,
                None,
                options.ttl,
                now,
            );
            alive.insert(listed.key.clone(), verdict == Verdict::Alive);
        }
        let full = page.len() == 1000;
        after = page.last().map(|l| l.key.clone());
        if !full {
            break;
        }
    }
    // Registrations change only when a worker starts or stops, and a worker beats before it
    // registers: list them only when the set of heartbeats changed (or now and then), and
    // re-read only the entries whose ETag changed.
    let holders: std::collections::BTreeSet<String> = alive.keys().cloned().collect();
    observer.ticks_since_registrations += 1;
    let relist = holders != observer.holders
        || observer.ticks_since_registrations >= REGISTRATIONS_REFRESH_TICKS;
    observer.holders = holders;
    let listed = if relist {
        observer.ticks_since_registrations = 0;
        store.list(layout::workers_prefix(), None, 10_000).await?
    } else {
        observer
            .registrations
            .iter()
            .map(|(key, (etag, _))| crate::store::Listed {
                key: key.clone(),
                etag: etag.clone(),
                size: 0,
            })
            .collect()
    };
    let mut registrations = BTreeMap::new();
    for entry in listed {
        let cached = observer
            .registrations
            .remove(&entry.key)
            .filter(|(etag, _)| *etag == entry.etag);
        let registration = match cached {
            Some((_, registration)) => registration,
            None => match store.read(&entry.key).await? {
                Some(object) => {
                    match layout::decode_object::<Registration>(&entry.key, "worker", &object.bytes)
                    {
                        Ok(registration) => registration,
                        Err(error) => {
                            tracing::warn!(%error, "ignoring a bad worker registration");
                            continue;
                        }
                    }
                }
                None => continue,
            },
        };
        registrations.insert(entry.key.clone(), (entry.etag.clone(), registration));
    }
    observer.registrations = registrations;
    let workers: Vec<WorkerView> = observer
        .registrations
        .values()
        .map(|(_, registration)| WorkerView {
            alive: alive.get(&registration.heartbeat).copied().unwrap_or(false),
            registration: registration.clone(),
        })
        .collect();

    let mut runs = Vec::with_capacity(entries.len());
    for entry in entries {
        let holder_alive = entry
            .holder
            .as_ref()
            .is_some_and(|key| alive.get(key).copied().unwrap_or(false));
        let recovery = match (&entry.phase, &entry.recovery_id) {
            (Phase::Recovering, Some(id)) => recovery::read(store, id)
                .await
                .ok()
                .flatten()
                .map(|(r, _)| r),
            _ => None,
        };
        runs.push(RunView {
            entry,
            holder_alive,
            recovery,
        });
    }
    let actions = decide(&workers, &runs, options.max_attempts);
    for action in &actions {
        if let Err(error) = execute(store, holder, action, &runs).await {
            tracing::warn!(?action, %error, "coordinator action failed");
        }
    }
    // Each live worker's inbox: the recoveries assigned to it and not yet finished.
    let mut inboxes: BTreeMap<String, Vec<RecoveryId>> = workers
        .iter()
        .map(|w| (w.registration.worker.clone(), Vec::new()))
        .collect();
    for run in &runs {
        if let Some(record) = &run.recovery
            && matches!(
                record.state,
                RecoveryState::Admitted | RecoveryState::Running
            )
            && let Some(worker) = &record.assigned_to
            && let Some(list) = inboxes.get_mut(worker)
        {
            list.push(record.recovery_id.clone());
        }
    }
    for action in &actions {
        if let Action::Assign { recovery, worker } = action
            && let Some(list) = inboxes.get_mut(worker)
            && !list.contains(recovery)
        {
            list.push(recovery.clone());
        }
    }
    for (worker, recoveries) in inboxes {
        if observer.inboxes.get(&worker) == Some(&recoveries) {
            continue;
        }
        let inbox = Inbox {
            format: FORMAT_VERSION,
            kind: "inbox".into(),
            worker: worker.clone(),
            recoveries: recoveries.clone(),
        };
        store
            .put(
                &layout::inbox(&worker),
                Bytes::from(serde_json::to_vec(&inbox).unwrap_or_default()),
            )
            .await?;
        observer.inboxes.insert(worker, recoveries);
    }
    Ok(actions)
}

/// Fences an interrupted source run before its recovery is pinned: takes its lease over
/// (epoch + 1) and writes the fence generation, so a host that only seemed dead can never
/// commit to it again, and the pin covers everything it ever acknowledged.
pub async fn fence_source(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let held = match crate::lease::read_lease(store, source).await? {
        Some(view) if !view.lease.released => holder.take_over(&view).await?,
        _ => holder.acquire(source).await?,
    };
    let fenced = RunWriter::resume(store, source, held.epoch, SnapshotPolicy::default()).await;
    holder.release(&held).await?;
    match fenced {
        Ok(_) | Err(GenerationError::NotFound { .. }) => Ok(()),
        Err(other) => Err(other.into()),
    }
}

async fn execute(
    store: &Store,
    holder: &Arc<Holder>,
    action: &Action,
    runs: &[RunView],
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match action {
        Action::Admit { source } => {
            let id = recovery_id_for(source);
            if recovery::read(store, &id).await?.is_none() {
                fence_source(store, holder, source).await?;
            }
            let admission = match recovery::admit(store, source, &id, false).await {
                Ok(admission) => Some(admission),
                Err(recovery::RecoveryError::NothingToRecover { .. }) => {
                    index::remove(store, source).await?;
                    return Ok(());
                }
                Err(recovery::RecoveryError::Source {
                    source: crate::generation::GenerationError::NotFound { .. },
                    ..
                }) => {
                    // The host died before its first commit: nothing was acknowledged, so
                    // there is nothing to recover.
                    tracing::warn!(source_run = %source, "interrupted before its first commit; forgetting it");
                    index::remove(store, source).await?;
                    return Ok(());
                }
                Err(other) => return Err(other.into()),
            };
            if let Some(run) = runs.iter().find(|r| r.entry.run_id == *source) {
                let mut entry = run.entry.clone();
                entry.phase = Phase::Recovering;
                entry.recovery_id = Some(id.clone());
                entry.holder = None;
                entry.updated_at_ms = store.clock().wall_ms();
                index::put(store, &entry).await?;
            }
            if let Some(admission) = admission {
                tracing::info!(source_run = %source, recovery_id = %id, created = admission.created, "interrupted run admitted");
            }
        }
        Action::Assign {
            recovery: id,
            worker,
        } => {
            if let Some((record, etag)) = recovery::read(store, id).await? {
                recovery::update(store, &record, &etag, |r| {
                    r.assigned_to = Some(worker.clone());
                    r.state = RecoveryState::Admitted;
                })
                .await?;
                tracing::info!(recovery_id = %id, worker = %worker, "assigned");
            }
        }
        Action::DeadLetter {
            source,
            recovery: id,
        } => {
            if let Some((record, etag)) = recovery::read(store, id).await? {
                recovery::update(store, &record, &etag, |r| {
                    r.state = RecoveryState::DeadLettered
                })
                .await?;
            }
            if let Some(run) = runs.iter().find(|r| r.entry.run_id == *source) {
                let mut entry = run.entry.clone();
                entry.phase = Phase::Dead;
                index::put(store, &entry).await?;
            }
            tracing::error!(source_run = %source, recovery_id = %id, "recovery dead-lettered");
        }
        Action::Forget { source } => index::remove(store, source).await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(name: &str, capacity: u32, fingerprint: &str, alive: bool) -> WorkerView {
        WorkerView {
            registration: Registration::new(
                name,
                format!("hb/{name}"),
                capacity,
                fingerprint.into(),
            ),
            alive,
        }
    }

    fn run(
        name: &str,
        phase: Phase,
        holder_alive: bool,
        recovery: Option<RecoveryRecord>,
    ) -> RunView {
        let mut entry = IndexEntry::new(RunId::new(name), None, phase, "fp".into(), 0);
        entry.recovery_id = recovery.as_ref().map(|r| r.recovery_id.clone());
        RunView {
            entry,
            holder_alive,
            recovery,
        }
    }

    fn record(
        name: &str,
        state: RecoveryState,
        assigned: Option<&str>,
        attempts: u32,
    ) -> RecoveryRecord {
        RecoveryRecord {
            format: 1,
            kind: "recovery".into(),
            recovery_id: recovery_id_for(&RunId::new(name)),
            source_run: RunId::new(name),
            source_generation: 3,
            source_digest: "d".into(),
            source_epoch: 1,
            state,
            force: false,
            attempts,
            last_error: None,
            assigned_to: assigned.map(str::to_owned),
            result: None,
            admitted_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    // Proves the decisions: admit runs whose holder is dead, leave live and parked ones,
    // assign by free capacity (counting what each worker already holds; ties go to the first
    // name) to matching workers only, reassign a dead worker's recovery,
    // dead-letter after too many attempts, and forget finished ones.
    #[test]
    fn decide_assigns_by_capacity_and_fingerprint() {
        let workers = [
            worker("busy", 1, "fp", true),
            worker("roomy", 3, "fp", true),
            worker("other-config", 9, "other", true),
            worker("dead", 9, "fp", false),
        ];
        let runs = [
            run("alive", Phase::Running, true, None),
            run("crashed", Phase::Running, false, None),
            run("parked", Phase::Parked, false, None),
            run(
                "orphaned",
                Phase::Recovering,
                false,
                Some(record("orphaned", RecoveryState::Running, Some("dead"), 1)),
            ),
            run(
                "new",
                Phase::Recovering,
                false,
                Some(record("new", RecoveryState::Admitted, None, 0)),
            ),
            run(
                "failing",
                Phase::Recovering,
                false,
                Some(record("failing", RecoveryState::Admitted, Some("roomy"), 5)),
            ),
            run(
                "done",
                Phase::Recovering,
                false,
                Some(record("done", RecoveryState::Finished, Some("roomy"), 1)),
            ),
        ];
        let actions = decide(&workers, &runs, 5);
        assert_eq!(
            actions,
            vec![
                Action::Admit {
                    source: RunId::new("crashed")
                },
                Action::Assign {
                    recovery: recovery_id_for(&RunId::new("orphaned")),
                    worker: "roomy".into()
                },
                Action::Assign {
                    recovery: recovery_id_for(&RunId::new("new")),
                    worker: "busy".into()
                },
                Action::DeadLetter {
                    source: RunId::new("failing"),
                    recovery: recovery_id_for(&RunId::new("failing"))
                },
                Action::Forget {
                    source: RunId::new("done")
                },
            ]
        );
        // With no matching live worker, nothing is assigned (and nothing goes to a mismatch).
        let only_other = [worker("other-config", 9, "other", true)];
        let actions = decide(&only_other, &runs[4..5], 5);
        assert!(actions.is_empty(), "{actions:?}");
    }
}
