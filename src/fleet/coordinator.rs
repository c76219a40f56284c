//! The coordinator: finds interrupted runs and assigns their recoveries to live workers.
//!
//! This module owns leadership (one active coordinator, by a lease; a standby takes over when
//! the leader stops beating), observing the fleet through the bucket (the index, worker
//! registrations, heartbeats, recovery records) and the pure [`crate::core::placement::decide`] that turns an
//! observation into actions. Polling stays cheap: per tick, one LIST each of the index and
//! the heartbeats (liveness comes from the listed ETags), a LIST of registrations only when
//! the set of processes changed, and GETs only for index entries that changed and for runs
//! being recovered. It never executes a run.
//!
//! Architecture invariant: a coordinator restart never admits a run twice — recovery IDs are
//! derived from the source run ([`recovery_id_for`]) and admission is idempotent.

use crate::core::epoch::Epoch;
use crate::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryState};
use crate::error::Error;
use crate::fleet::admission;
use crate::fleet::admission::Takeover;
use crate::fleet::lifecycle;
use crate::fleet::lifecycle::LifecycleError;
use crate::fleet::wake::Wakeup;
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::core::assignment::{Inbox, Offer, Registration, recovery_id_for};
use crate::core::fact::{RecoveryId, RunId};
use crate::core::layout::{self, FORMAT_VERSION};
use crate::core::lifecycle::Event;
use crate::core::liveness::{self, ExpiryWatch, Judge, Seen};
use crate::core::placement::{self, Action, RunView, WorkerView};
use crate::store::index::{IndexError, IndexScan};
use crate::store::lease::{Attempt, Held, Holder, LeaseError};
use crate::store::recovery::{self, RecoveryError};
use crate::store::{ETag, Store, StoreError};

/// The inbox of `worker`: the recoveries assigned to it and where the leading coordinator
/// takes wake-ups (empty if it has no inbox, or an unreadable one).
pub async fn read_inbox(store: &Store, worker: &str) -> Result<Inbox, StoreError> {
    let key = layout::inbox(worker);
    Ok(match store.read(&key).await? {
        Some(object) => {
            layout::decode_object::<Inbox>(&key, "inbox", &object.bytes).unwrap_or_default()
        }
        None => Inbox::default(),
    })
}

/// How a coordinator identifies itself, judges liveness and paces its ticks.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// This coordinator's holder ID, on its heartbeat and on the leadership lease.
    pub id: String,
    /// The TTL of its own lease and heartbeat, and the shortest silence after which it judges
    /// any holder gone.
    pub ttl: Duration,
    /// How long it waits between ticks (scans of the index and heartbeats).
    pub scan_interval: Duration,
    /// Failed attempts (errors, or workers that died mid-attempt) before a recovery is
    /// dead-lettered. Yields, parks and graceful hand-backs do not count.
    pub max_attempts: u32,
    /// How long it waits between ticks while the last one found no run to watch (an idle
    /// fleet); a wake-up (a new run, an admission) cuts the wait short.
    pub idle_scan_interval: Duration,
    /// Between ticks, while some live process holds runs, how often it lists only the
    /// heartbeats to see one fall silent (and exactly when a silent one's TTL runs out), so
    /// a dead holder's runs are admitted within its TTL plus this interval. At least the
    /// scan interval turns the watch off.
    pub watch_interval: Duration,
    /// Wake-ups that cut a wait between ticks short (see `fleet::wake`), and the address
    /// that reaches them, advertised in its heartbeat and in the workers' inboxes.
    pub wake: Option<(Wakeup, Option<String>)>,
    /// What the process's `/readyz` answers, kept up to date by the loop.
    pub readiness: Option<Arc<crate::fleet::readiness::Readiness>>,
}

impl CoordinatorOptions {
    /// Options with the defaults of `rekindle-coordinator`, no wake-ups.
    pub fn new(id: impl Into<String>, ttl: Duration) -> Self {
        CoordinatorOptions {
            id: id.into(),
            ttl,
            scan_interval: Duration::from_secs(10),
            max_attempts: placement::DEFAULT_MAX_ATTEMPTS,
            idle_scan_interval: Duration::from_secs(60),
            watch_interval: Duration::from_secs(1),
            wake: None,
            readiness: None,
        }
    }

    fn wake_url(&self) -> Option<String> {
        self.wake.as_ref().and_then(|(_, url)| url.clone())
    }
}

/// What one tick saw and did, for the loop's pacing.
#[derive(Debug, Default)]
pub struct TickReport {
    /// The actions decided.
    pub actions: Vec<Action>,
    /// Whether any run is being watched or recovered (the fleet is not idle).
    pub busy: bool,
    /// Whether some live process holds runs whose silence the coordinator must notice.
    pub watching: bool,
    /// Something changed that another tick should act on now (an admission to assign, a
    /// hand-back to re-offer, a worker that did not answer its wake-up).
    pub again: bool,
    /// When the freshest record of a running recovery this tick took from its cache (rather
    /// than reading it) is due to be read again: a worker that hands a recovery back changes
    /// only its record, so a wake-up it sent is acted on once that record is read.
    pub recheck: Option<Duration>,
}

/// The coordinator's memory between ticks: caches and liveness observations.
#[derive(Default)]
struct Observer {
    index: IndexScan,
    // Ordered maps: the order of store calls must not depend on a hasher's random seed, so a
    // seeded simulation replays exactly.
    registrations: BTreeMap<String, (Option<ETag>, Registration)>,
    liveness: Judge,
    inboxes: BTreeMap<String, Vec<RecoveryId>>,
    /// Workers that did not answer a wake-up, with the heartbeat version they had then: not
    /// offered new recoveries until their heartbeat changes (a worker that died while idle
    /// is judged by its long idle TTL, and must not hold up a recovery that long).
    unreachable: BTreeMap<String, ETag>,
    /// Workers judged with their full-rate TTL last tick (they ran a recovery).
    judged_busy: std::collections::BTreeSet<String>,
    /// Heartbeats judged silent, at the version judged: they stay judged gone until they
    /// change, whatever TTL applies next (a worker judged dead mid-attempt is idle once its
    /// attempt is handed back, and its long idle TTL must not bring it back to life).
    gone: BTreeMap<String, ETag>,
    /// Where the next batch of admissions starts among the runs waiting for one.
    admit_cursor: usize,
    /// Recoveries offered to a worker and not started yet: to whom, and since when. An offer
    /// not taken within the worker's full TTL moves on (the worker answered its wake-up but
    /// died, or has no wake-up address and died while idle, judged by its long idle TTL).
    offered: BTreeMap<RecoveryId, (String, crate::clock::Stopwatch)>,
    /// Recoveries seen declined (admitted, offered to nobody, `declined_by` set) last tick.
    declines: std::collections::BTreeSet<RecoveryId>,
    /// Recovery records as last read, by source run, with the index entry they were read for
    /// and when: a record is read again when its entry changed, while it is offered and not
    /// started, while it is a fresh admission named to a worker (`forwarded`), every
    /// [`unclaimed_refresh`] while it is any other fresh admission, every [`RUNNING_REFRESH`]
    /// while it runs, after a tick acted on it, and on every sweep.
    records: BTreeMap<RunId, (IndexEntry, (RecoveryRecord, ETag), crate::clock::Stopwatch)>,
    /// The TTLs holders declared as of the last tick, by heartbeat key, for the watch.
    declared: Vec<(String, u64)>,
    /// Heartbeats of live processes that held runs at the last tick (hosts of running runs,
    /// workers running a recovery): if one falls silent, the next tick must come now.
    watched: std::collections::BTreeSet<String>,
    /// Ticks since the last sweep (every record read again, every inbox rewritten).
    ticks_since_sweep: u32,
    /// When this leader first saw each interrupted run so, for the oldest-interrupted gauge.
    interrupted_since: BTreeMap<RunId, u64>,
    /// The workers and runs as the last full tick saw them (with the assignments named
    /// wake-ups made since, and the fresh admissions forwarded to a worker that claims them,
    /// counted as its), and when that tick was: what [`assign_named`] places on.
    last_view: Option<(Vec<WorkerView>, Vec<RunView>, crate::clock::Stopwatch)>,
    /// The recoveries `last_view` counts as a worker's only because they were forwarded to
    /// it to claim: no offer, so they are never written to an inbox. Cleared with the view.
    claims: std::collections::BTreeSet<RecoveryId>,
    /// Every recovery this leader named to a worker without a landed assignment (a forwarded
    /// name; an inbox entry of an assignment whose swap did not land), with when it was last
    /// named or seen still fresh: a worker may claim such a fresh admission whenever a slot
    /// of its frees, long after, behind this leader's back, so its cached record is read
    /// again on every tick while it stays a fresh admission. Any other fresh admission is
    /// started only through this leader's assignment, and its record is cached up to
    /// [`unclaimed_refresh`] (re-reading every waiting record on every tick cost a 1-worker
    /// bench 68 GETs per recovery). One named by an earlier leader, or by a forged wake-up,
    /// is not here: a stale cache of it lasts at most that long, and an assignment decided
    /// on it fails its swap (an assignment is never re-applied to a record that changed).
    forwarded: BTreeMap<RecoveryId, crate::clock::Stopwatch>,
    /// Workers that did not answer the wake-up of a named assignment, marked unreachable by
    /// the next full tick.
    unanswered: Vec<String>,
    /// When the heartbeats were last listed and judged (by a tick or the watch).
    liveness_at: Option<crate::clock::Stopwatch>,
}

/// Every this many ticks, a sweep: records that are otherwise cached are read again, and every
/// inbox is rewritten.
const SWEEP_TICKS: u32 = 30;

/// Runs a coordinator until `stop` is set: stands by until it leads, then ticks.
#[tracing::instrument(name = "coordinator", skip_all, fields(coordinator_id = %options.id))]
pub async fn run(
    store: Store,
    options: CoordinatorOptions,
    stop: Arc<AtomicBool>,
) -> crate::Result<()> {
    let holder = Holder::with_role(&store, options.id.clone(), options.ttl, "coordinator");
    holder.set_wake(options.wake_url());
    let beating = holder.spawn_heartbeat(Arc::clone(&stop));
    if let Some(readiness) = &options.readiness {
        readiness.started(&holder);
    }
    let lease_run = RunId::new(layout::COORDINATOR_LEASE_RUN);
    // The leader this coordinator last logged it stands by for.
    let mut standing_by: Option<String> = None;
    let mut observer = Observer::default();
    let mut leading: Option<Held> = None;
    // Kept across ticks: a standby judges the leader dead only after a whole TTL of silence.
    let mut standby = ExpiryWatch::default();
    // Ticks may follow each other at once while they make progress (admissions to assign),
    // up to a bound.
    let mut followed_up = 0;
    // Whether the wait before this tick was cut short by a wake-up.
    let mut woken = false;
    // Whether the next turn must be a full tick (the last one asked for another at once).
    let mut tick_due = false;
    while !stop.load(Ordering::SeqCst) {
        if leading.is_none() {
            match holder
                .try_acquire(&lease_run, Epoch::ZERO, &mut standby)
                .await
            {
                Ok(Attempt::Held(held)) => {
                    tracing::info!(coordinator = %options.id, epoch = %held.epoch, "leading");
                    // Another leader may have written the inboxes since this one last did,
                    // and changed the fleet (and the records) since this one last looked.
                    observer.inboxes.clear();
                    observer.last_view = None;
                    observer.records.clear();
                    leading = Some(held);
                    standing_by = None;
                    set_leading(&options, true);
                }
                Ok(Attempt::Alive { holder: leader }) => {
                    if standing_by.as_ref() != Some(&leader) {
                        tracing::info!(coordinator = %options.id, leader = %leader, "standing by: another coordinator leads");
                        standing_by = Some(leader);
                    }
                    set_leading(&options, false);
                }
                Err(error) => tracing::warn!(%error, "cannot take the coordinator lease"),
            }
        }
        // A standby looks at the leader's lease at least once per TTL: taking over needs two
        // looks a TTL apart, so a scan interval longer than the TTL would double the wait.
        let mut pause = if leading.is_some() {
            options.scan_interval
        } else {
            options.scan_interval.min(options.ttl)
        };
        let mut watching = false;
        // Recoveries a wake-up named (just admitted) are assigned on the last full tick's
        // view of the workers, without waiting for their index entries and a scan (a worker
        // that died since does not answer its wake-up, and what was offered to it is looked
        // at again after the full tick that follows). The full tick runs first when one is
        // due: the last asked for another at once, a wake-up named nothing (a freed slot, a
        // hand-back, a new run), or the view is older than a scan interval (a watch interval
        // while processes hold runs, whose silence the full tick looks for): a stream of
        // named wake-ups, forged or not, never holds the scans off. Names it could not place
        // are looked at again on the full tick's view: their index entries may not have been
        // written when it listed the index.
        let (named, plain) = options
            .wake
            .as_ref()
            .map(|(wakeup, _)| (wakeup.take_named(), wakeup.take_plain()))
            .unwrap_or_default();
        // The view is fresh for a scan interval; while processes hold runs, only as long as
        // their heartbeats were listed (by a tick or the watch) within a watch interval.
        let view_age = observer.last_view.as_ref().map(|(_, _, at)| at.elapsed());
        let listed_age = observer.liveness_at.as_ref().map(|at| at.elapsed());
        let fresh_for = |age: Duration, listed: Duration| {
            let view_left = options.scan_interval.saturating_sub(age);
            if observer.watched.is_empty() {
                view_left
            } else {
                view_left.min(options.watch_interval.saturating_sub(listed))
            }
        };
        let fresh = match (view_age, listed_age) {
            (Some(age), Some(listed)) => fresh_for(age, listed),
            _ => Duration::ZERO,
        };
        let fast = !tick_due && !plain && !fresh.is_zero();
        // Woken with nothing named and nothing plain: a wake-up whose names an assignment
        // already took while it read. Nothing to look at: wait on.
        if leading.is_some() && woken && named.is_empty() && fast {
            let watching = !observer.watched.is_empty();
            woken =
                wait_for_next_tick(&store, &options, &mut observer, fresh, watching, &stop).await;
            continue;
        }
        let mut after_tick = Vec::new();
        if let Some(held) = &leading
            && !named.is_empty()
        {
            if !fast {
                after_tick = named;
            } else {
                let looking = named.clone();
                match assign_named(&store, &holder, &options, &mut observer, held, named).await {
                    Err(TickError::NotLeading(error)) => {
                        leading = lost_leadership(&options, &error);
                        continue;
                    }
                    Ok(outcome) if outcome.again.is_empty() => {
                        let watching = !observer.watched.is_empty();
                        woken = wait_for_next_tick(
                            &store,
                            &options,
                            &mut observer,
                            fresh,
                            watching,
                            &stop,
                        )
                        .await;
                        continue;
                    }
                    Ok(outcome) => after_tick = outcome.again,
                    Err(error) => {
                        tracing::debug!(%error, "named assignment failed; scanning");
                        after_tick = looking;
                    }
                }
            }
        }
        if let Some(held) = &leading {
            tick_due = false;
            let ticked = tick(&store, &holder, &options, &mut observer, Some(held)).await;
            let mut named_offered = false;
            if ticked.is_ok() && !after_tick.is_empty() {
                let named = std::mem::take(&mut after_tick);
                match assign_named(&store, &holder, &options, &mut observer, held, named).await {
                    Err(TickError::NotLeading(error)) => {
                        leading = lost_leadership(&options, &error);
                        continue;
                    }
                    // What still could not be placed waits for a worker's wake-up or the
                    // next scan (a scan interval, not the idle one: see below); what was
                    // offered to a worker that did not answer, for the tick that follows at
                    // once and marks it.
                    Ok(outcome) => {
                        named_offered = outcome.offered || !outcome.again.is_empty();
                        if outcome.unanswered && followed_up < MAX_IMMEDIATE_TICKS {
                            followed_up += 1;
                            tick_due = true;
                            // Still owed a look: after the tick that follows.
                            if let Some((wakeup, _)) = &options.wake
                                && !outcome.again.is_empty()
                            {
                                wakeup.name(outcome.again);
                            }
                            continue;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, "named assignment failed");
                        named_offered = true;
                    }
                }
            }
            match ticked {
                Err(TickError::NotLeading(error)) => {
                    leading = lost_leadership(&options, &error);
                    continue;
                }
                Ok(report) if report.again && followed_up < MAX_IMMEDIATE_TICKS => {
                    followed_up += 1;
                    tick_due = true;
                    continue;
                }
                Ok(report) => {
                    watching = report.watching || !observer.watched.is_empty();
                    // A named recovery assigned (or still waiting) after this tick is work the
                    // index may not have shown it: not an idle fleet.
                    if !report.busy && !named_offered {
                        pause = options.idle_scan_interval;
                    }
                    // Woken (a worker that handed a recovery back wakes it), but the running
                    // records were taken from the cache: look again once they are due, not
                    // a scan interval later.
                    if woken && let Some(due) = report.recheck {
                        pause = pause.min(due + Duration::from_millis(5));
                    }
                }
                Err(error) => tracing::warn!(%error, "coordinator tick failed"),
            }
        }
        followed_up = 0;
        woken = wait_for_next_tick(&store, &options, &mut observer, pause, watching, &stop).await;
    }
    if let Some(readiness) = &options.readiness {
        readiness.draining();
    }
    if let Some(held) = &leading {
        let _ = holder.release(held).await;
    }
    let _ = beating.await;
    let _ = holder.retire().await;
    Ok(())
}

/// Waits `pause` for the next tick, cut short by a wake-up or a stop; while `watching`,
/// lists the heartbeats every watch interval (and when a silent holder's TTL runs out) and
/// ends the wait as soon as a watched holder is judged gone. Returns whether a wake-up (or
/// the stop) cut the wait short.
async fn wait_for_next_tick(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    pause: Duration,
    watching: bool,
    stop: &AtomicBool,
) -> bool {
    let wakeup = options.wake.as_ref().map(|(wakeup, _)| wakeup.notify());
    let started = crate::clock::Stopwatch::start();
    loop {
        let left = pause.saturating_sub(started.elapsed());
        if left.is_zero() {
            return false;
        }
        let mut wait = left;
        if watching && options.watch_interval < options.scan_interval {
            wait = wait.min(options.watch_interval);
            let now = store.clock().monotonic();
            let watched = &observer.watched;
            if let Some(due) = observer
                .liveness
                .next_expiry(|key| watched.contains(key), now)
            {
                // A few ms past the expiry, so the look lands after it.
                let until = due.saturating_sub(now) + Duration::from_millis(5);
                wait = wait.min(until);
            }
        }
        let cut_short = crate::clock::sleep_unless(wait, stop, wakeup).await;
        if cut_short || wait == left {
            return cut_short;
        }
        match watch(store, options, observer).await {
            Ok(true) => return false,
            Ok(false) => {}
            Err(error) => tracing::debug!(%error, "cannot list the heartbeats"),
        }
    }
}

/// Logs that this coordinator no longer leads and says so to `/readyz` and the metrics;
/// returns the leadership it holds now (none).
fn lost_leadership(options: &CoordinatorOptions, error: &LeaseError) -> Option<Held> {
    tracing::info!(coordinator = %options.id, %error, "no longer leading");
    set_leading(options, false);
    None
}

/// Tells `/readyz` and the metrics whether this coordinator leads. A coordinator that stops
/// leading zeroes its view of the fleet, so dashboards summing over coordinators count only
/// the leader's.
fn set_leading(options: &CoordinatorOptions, leading: bool) {
    match &options.readiness {
        Some(readiness) => readiness.leading(leading),
        None => crate::metrics::set(
            crate::metrics::COORDINATOR_LEADING,
            if leading { 1.0 } else { 0.0 },
        ),
    }
    if !leading {
        publish_fleet(
            &RUN_STATES.map(|s| (s, 0.0)),
            &RECOVERY_PHASES.map(|p| (p, 0.0)),
            0.0,
            0.0,
        );
    }
}

const RUN_STATES: [&str; 5] = [
    "running",
    "interrupted",
    "recovering",
    "parked",
    "dead_lettered",
];
const RECOVERY_PHASES: [&str; 3] = ["admitted", "assigned", "running"];

/// The leader's view of the fleet as gauges: runs by state, recoveries by phase, the oldest
/// interrupted run's age, live workers. `interrupted_since` remembers when this leader first
/// saw each run interrupted (an index entry's time is when its host started it).
fn export_fleet(
    runs: &[RunView],
    workers: &[WorkerView],
    now_ms: u64,
    interrupted_since: &mut BTreeMap<RunId, u64>,
) {
    let mut states = RUN_STATES.map(|s| (s, 0.0));
    let mut phases = RECOVERY_PHASES.map(|p| (p, 0.0));
    let mut oldest: Option<u64> = None;
    let mut still = BTreeMap::new();
    for run in runs {
        let (state, waiting_since) = match run.entry.phase {
            Phase::Running if run.holder_alive => (0, None),
            Phase::Running => {
                let since = interrupted_since
                    .get(&run.entry.run_id)
                    .copied()
                    .unwrap_or(now_ms);
                still.insert(run.entry.run_id.clone(), since);
                (1, Some(since))
            }
            Phase::Recovering => (2, None),
            Phase::Parked => (3, None),
            Phase::Dead => (4, None),
        };
        states[state].1 += 1.0;
        let waiting_since = match &run.recovery {
            Some(record) if !record.state.is_terminal() => {
                let phase = match (record.state, &record.assigned_to) {
                    (RecoveryState::Admitted, None) => Some(0),
                    (RecoveryState::Admitted, Some(_)) => Some(1),
                    (RecoveryState::Running, _) => Some(2),
                    _ => None,
                };
                if let Some(phase) = phase {
                    phases[phase].1 += 1.0;
                }
                // Waiting for a worker counts as still interrupted, since the record last
                // changed (its admission, or the attempt that handed it back).
                (record.state == RecoveryState::Admitted)
                    .then_some(record.updated_at_ms)
                    .or(waiting_since)
            }
            _ => waiting_since,
        };
        if let Some(since) = waiting_since {
            oldest = Some(oldest.map_or(since, |o| o.min(since)));
        }
    }
    *interrupted_since = still;
    let age = oldest.map_or(0.0, |since| now_ms.saturating_sub(since) as f64 / 1000.0);
    let live = workers.iter().filter(|w| w.alive).count() as f64;
    publish_fleet(&states, &phases, age, live);
}

fn publish_fleet(
    states: &[(&'static str, f64)],
    phases: &[(&'static str, f64)],
    age: f64,
    live: f64,
) {
    use crate::metrics::{
        OLDEST_INTERRUPTED_AGE, RECOVERIES, RUNS, WORKERS_LIVE, set, set_labelled,
    };
    for (state, count) in states {
        set_labelled(RUNS, "state", state, *count);
    }
    for (phase, count) in phases {
        set_labelled(RECOVERIES, "phase", phase, *count);
    }
    set(OLDEST_INTERRUPTED_AGE, age);
    set(WORKERS_LIVE, live);
}

/// One look at the heartbeats between ticks: whether a holder that held runs at the last
/// tick is now judged gone (one LIST).
async fn watch(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
) -> Result<bool, StoreError> {
    let Listing {
        heartbeats, seen, ..
    } = list_heartbeats_seen(store).await?;
    let heartbeats = liveness::with_absent(heartbeats, observer.watched.iter().map(String::as_str));
    let listed: BTreeMap<String, ETag> = heartbeats.iter().cloned().collect();
    let mut alive = liveness::judge_heartbeats(
        &mut observer.liveness,
        options.ttl,
        observer
            .declared
            .iter()
            .map(|(key, ttl)| (key.as_str(), *ttl)),
        heartbeats,
        seen,
    );
    let running_keys = observer.watched.clone();
    remember_the_gone(&mut observer.gone, &listed, &mut alive, &running_keys);
    observer.liveness_at = Some(crate::clock::Stopwatch::start());
    let gone = observer
        .watched
        .iter()
        .find(|key| !alive.get(key.as_str()).copied().unwrap_or(false));
    if let Some(key) = gone {
        tracing::info!(heartbeat = %key, "a holder fell silent; looking now");
        return Ok(true);
    }
    Ok(false)
}

/// One observation and its actions. Public so tests and the demo can drive it directly.
pub async fn tick_once(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
) -> crate::Result<Vec<Action>> {
    let mut observer = Observer::default();
    match tick(store, holder, options, &mut observer, None).await {
        Ok(report) => Ok(report.actions),
        Err(TickError::Store(error)) => Err(error.into()),
        Err(TickError::NotLeading(error)) => Err(error.into()),
    }
}

/// Why a tick stopped before acting.
#[derive(Debug, thiserror::Error)]
enum TickError {
    /// Observing the bucket or writing failed; the next tick tries again.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The leadership lease is lost: nothing of this tick is acted on.
    #[error(transparent)]
    NotLeading(LeaseError),
}

/// One look at the bucket and the actions it calls for. With `leading`, the leadership lease
/// is checked while the index is read (one round trip fewer), and nothing is acted on if it
/// is lost.
async fn tick(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    leading: Option<&Held>,
) -> Result<TickReport, TickError> {
    // The index is read before the heartbeats: a host beats before it writes its entry, so
    // every holder named by an entry seen here is in the heartbeat listing that follows, and
    // a missing heartbeat really means the holder is gone.
    let checking = async {
        match leading {
            Some(held) => holder.check(held).await,
            None => Ok(()),
        }
    };
    // A tick that fails part-way leaves no view to place named recoveries on. The records
    // read now say who claimed what.
    observer.last_view = None;
    observer.claims.clear();
    let (checked, scanned) = futures::join!(checking, observer.index.scan(store));
    checked.map_err(TickError::NotLeading)?;
    let (entries, bad) = scanned?;
    // The holders every index entry names; unknown while an entry is unreadable (it might
    // name any heartbeat), and then no heartbeat is removed this tick.
    let named: Option<std::collections::BTreeSet<String>> = bad
        .is_empty()
        .then(|| entries.iter().filter_map(|e| e.holder.clone()).collect());
    for bad in bad {
        tracing::warn!(key = %bad.key, error = %bad.error, "ignoring a bad index entry");
    }
    // Judged as seen when the listing went out, however long the rest of the tick takes
    // (registration and record reads, a slow request, a pause): see `Seen`.
    let Listing {
        heartbeats,
        registrations,
        seen,
    } = list_heartbeats_seen(store).await?;
    refresh_registrations(store, observer, &registrations).await;
    if observer.ticks_since_sweep == 0 {
        // Inboxes are written only when they change from what this leader wrote last; a
        // stale leader that woke after losing the lease may have overwritten them since.
        // Rewrite them all now and then (one PUT per worker per sweep).
        observer.inboxes.clear();
    }
    let versions: BTreeMap<String, ETag> = heartbeats.iter().cloned().collect();
    for worker in std::mem::take(&mut observer.unanswered) {
        if let Some(etag) = registration_beat(observer, &worker, &versions) {
            observer.unreachable.insert(worker, etag);
        }
    }
    // Records first: which workers run a recovery decides the TTL they are judged by.
    let (runs, recheck) = observe_runs(store, observer, entries, options.ttl).await;
    observer.ticks_since_sweep = (observer.ticks_since_sweep + 1) % SWEEP_TICKS;
    // A decline not seen before: its worker is stopping and has said so in its registration
    // (it writes that first), which is read now, so it is offered nothing more this tick.
    let declines: std::collections::BTreeSet<RecoveryId> = runs
        .iter()
        .filter_map(|run| run.recovery.as_ref())
        .filter(|record| record.state == RecoveryState::Admitted && record.declined_by.is_some())
        .map(|record| record.recovery_id.clone())
        .collect();
    let declined_now = declines.iter().any(|id| !observer.declines.contains(id));
    observer.declines = declines;
    if declined_now {
        let registrations = store.list_all(layout::workers_prefix()).await?;
        let registrations: Vec<(String, Option<ETag>)> = registrations
            .into_iter()
            .map(|listed| (listed.key, listed.etag))
            .collect();
        refresh_registrations(store, observer, &registrations).await;
    }
    let alive = judge_liveness(options, observer, &runs, heartbeats, seen);
    pass_over_untaken_offers(observer, &runs, &versions, options.ttl);
    let still: BTreeMap<String, ETag> = observer
        .unreachable
        .iter()
        .filter(|(worker, etag)| {
            registration_beat(observer, worker, &versions).as_ref() == Some(*etag)
        })
        .map(|(worker, etag)| (worker.clone(), etag.clone()))
        .collect();
    observer.unreachable = still;
    let workers: Vec<WorkerView> = observer
        .registrations
        .values()
        .map(|(_, registration)| WorkerView {
            alive: alive.get(&registration.heartbeat).copied().unwrap_or(false),
            offer: !observer.unreachable.contains_key(&registration.worker),
            registration: registration.clone(),
        })
        .collect();

    let runs: Vec<RunView> = runs
        .into_iter()
        .map(|mut run| {
            run.holder_alive = run
                .entry
                .holder
                .as_ref()
                .is_some_and(|key| alive.get(key).copied().unwrap_or(false));
            run
        })
        .collect();
    export_fleet(
        &runs,
        &workers,
        store.clock().wall_ms(),
        &mut observer.interrupted_since,
    );
    let mut actions = placement::decide(&workers, &runs, options.max_attempts);
    // Admissions go in batches: after an outage every run needs one, and the first ones are
    // assigned (by the tick that follows at once) while the rest are still being admitted.
    // The window moves on every tick, so sources whose admission keeps failing (a corrupt
    // chain, a newer format) cannot hold the batch and starve the rest.
    let total = actions
        .iter()
        .filter(|action| matches!(action, Action::Admit { .. }))
        .count();
    if total > ADMISSION_BATCH {
        let start = observer.admit_cursor % total;
        let mut nth = 0;
        actions.retain(|action| {
            if !matches!(action, Action::Admit { .. }) {
                return true;
            }
            let keep = (nth + total - start) % total < ADMISSION_BATCH;
            nth += 1;
            keep
        });
        observer.admit_cursor = observer.admit_cursor.wrapping_add(ADMISSION_BATCH);
    }
    // Leadership was checked as the tick began; a pause or a slow read since may have cost it,
    // and an admission fences a host on this tick's verdict. Checked again before admitting
    // (one GET, only in a tick that admits; other actions are compare-and-swaps on records,
    // which two leaders at once only make cost requests).
    if let Some(held) = leading
        && actions
            .iter()
            .any(|action| matches!(action, Action::Admit { .. }))
    {
        holder.check(held).await.map_err(TickError::NotLeading)?;
    }
    // Each action is one lifecycle event on its own recovery: run them side by side (an
    // admission fences and loads its source, which takes several round trips).
    let observed = &runs;
    // The records as read this tick, by recovery: an assignment swaps the version observed
    // (one GET fewer per assignment; a record changed since fails the swap and is reread).
    let known: BTreeMap<&RecoveryId, &(RecoveryRecord, ETag)> = observer
        .records
        .values()
        .map(|(_, known, _)| (&known.0.recovery_id, known))
        .collect();
    let known = &known;
    let executed = futures::stream::iter(actions.clone())
        .map(|action| async move {
            match execute(store, holder, options, &action, observed, known).await {
                Ok((progress, offer)) => (Some(progress), action, offer),
                Err(error) => {
                    tracing::warn!(?action, %error, "coordinator action failed");
                    (None, action, None)
                }
            }
        })
        .buffer_unordered(ACTION_CONCURRENCY)
        .collect::<Vec<(Option<bool>, Action, Option<Offer>)>>()
        .await;
    // A landed assignment is not progress for the loop (the worker is woken instead).
    let progressed = executed.iter().any(|(progress, action, _)| {
        *progress == Some(true) && !matches!(action, Action::Assign { .. })
    });
    // An assignment refused because the record changed since it was read (a cached record:
    // a worker started or handed it back meanwhile) is decided again at once, on the record
    // read afresh, not at the next scan: a worker that died right after starting a queued
    // recovery is then handed back within its TTL. (Not a failed one: a failing store must
    // not spin the loop.)
    let stale = executed.iter().any(|(progress, action, _)| {
        *progress == Some(false) && matches!(action, Action::Assign { .. })
    });
    // Workers whose offer landed this tick, with the records as the offers left them: woken
    // even if their inbox already listed it, and told the records.
    let mut offered: BTreeMap<String, Vec<Offer>> = BTreeMap::new();
    let mut moved = std::collections::BTreeSet::new();
    for (landed, action, offer) in executed {
        if let (Some(true), Action::Assign { worker, recovery }) = (landed, action) {
            offered.entry(worker).or_default().extend(offer);
            moved.insert(recovery);
        }
    }
    // A record this tick acted on is read afresh next tick (dropped before the inboxes are
    // written: a failed inbox write ends the tick, and must not leave a landed assignment's
    // record cached as it was before).
    for action in &actions {
        if let Some(source) = action_source(action, &runs) {
            observer.records.remove(source);
        }
    }
    let assigned = Assigned {
        decided: &actions,
        landed: &moved,
        offered: &offered,
    };
    let unanswered = write_inboxes(store, observer, options, &workers, &runs, assigned).await?;
    let newly_unreachable = !unanswered.is_empty();
    // The view named assignments place on offers these workers nothing more.
    let mut workers = workers;
    for view in workers.iter_mut() {
        if unanswered.contains(&view.registration.worker) {
            view.offer = false;
        }
    }
    for worker in unanswered {
        if let Some(etag) = registration_beat(observer, &worker, &versions) {
            observer.unreachable.insert(worker, etag);
        }
    }
    // Another tick at once only after progress (an admission, a hand-back, an answer that
    // made a recovery assignable; a worker to offer around): a failing action cannot spin.
    let again = newly_unreachable || progressed || stale;
    judge_offered_busy(observer, &offered);
    // The heartbeats whose silence would need action: hosts of running runs and workers
    // running (or offered) a recovery, while they live.
    observer.watched = runs
        .iter()
        .filter(|run| run.entry.phase == Phase::Running && run.holder_alive)
        .filter_map(|run| run.entry.holder.clone())
        .chain(
            workers
                .iter()
                .filter(|w| w.alive && observer.judged_busy.contains(&w.registration.worker))
                .map(|w| w.registration.heartbeat.clone()),
        )
        .collect();
    if let Some(named) = &named {
        remove_the_dead(store, holder, observer, &versions, &alive, named).await;
    }
    let busy = !runs.is_empty();
    let mut runs = runs;
    apply_offers(&mut runs, &offered);
    observer.last_view = Some((workers, runs, crate::clock::Stopwatch::start()));
    observer.liveness_at = Some(crate::clock::Stopwatch::start());
    Ok(TickReport {
        busy,
        watching: !observer.watched.is_empty(),
        again,
        actions,
        recheck,
    })
}

/// A worker offered a recovery is judged and watched at its full rate from now on, not from
/// the next scan: if it dies before or right after starting, its silence is seen within its
/// TTL plus the watch interval.
fn judge_offered_busy(observer: &mut Observer, offered: &BTreeMap<String, Vec<Offer>>) {
    for (_, registration) in observer.registrations.values() {
        if offered.contains_key(&registration.worker)
            && observer.judged_busy.insert(registration.worker.clone())
        {
            observer.liveness.forget(&registration.heartbeat);
            if let Some(ttl) = registration.ttl_ms {
                observer
                    .declared
                    .retain(|(key, _)| *key != registration.heartbeat);
                observer
                    .declared
                    .push((registration.heartbeat.clone(), ttl));
            }
        }
        if offered.contains_key(&registration.worker) {
            observer.watched.insert(registration.heartbeat.clone());
        }
    }
}

/// What a named assignment did: the names to look at again after a full tick (none if every
/// named recovery that waits for a worker was offered one), and whether any offer landed.
#[derive(Debug, Default)]
struct NamedOutcome {
    again: Vec<RecoveryId>,
    offered: bool,
    /// A worker offered one did not answer its wake-up.
    unanswered: bool,
}

/// Assigns the recoveries a wake-up `named` (an admission names the one it admitted) without a
/// scan: their records are read while the leadership lease is checked, and placed by the same
/// [`placement::decide`] on the last full tick's view of the workers and their loads. The
/// assignment is the usual compare-and-swap on the record as read, and the workers' inboxes
/// are written and the workers woken as a tick does. Names that arrive while the records are
/// read join in (up to [`NAMED_ROUNDS`] rounds of reads). A named recovery waits for a worker
/// if its record is admitted and offered to nobody, or to a worker the view does not show
/// alive and answering (`decide` moves it). Whatever could not be placed, read or woken is
/// returned to look at again after a full tick. Named IDs are only hints: one whose record
/// does not exist, or that is not waiting for a worker, costs its read (and its forward: the
/// worker's read, and a slot for that read) and nothing else.
///
/// Before any record is read, each name is forwarded to a worker with an idle slot
/// ([`placement::forward_targets`]), which reads the record and starts a fresh admission
/// nobody was offered yet by compare-and-swap (`lifecycle::unclaimed`): an admission's first
/// start waits for neither this read nor an assignment swap nor an inbox. A forwarded record
/// that is such a fresh admission, and that its worker may run (its fingerprint), is left to
/// that worker; every other record is placed as above. Whoever swaps first wins: the worker's
/// start, or a later assignment (then the worker's start is refused).
async fn assign_named(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    leading: &Held,
    named: Vec<RecoveryId>,
) -> Result<NamedOutcome, TickError> {
    let read = |batch: Vec<RecoveryId>| {
        futures::stream::iter(batch)
            .map(|id| async move { (recovery::read(store, &id).await, id) })
            .buffered(ACTION_CONCURRENCY)
            .collect::<Vec<_>>()
    };
    let wakeup = options.wake.as_ref().map(|(wakeup, _)| wakeup);
    let mut looked: std::collections::BTreeSet<RecoveryId> = named.iter().cloned().collect();
    let Some((workers, last_runs, _)) = observer.last_view.as_ref() else {
        return Ok(NamedOutcome {
            again: looked.into_iter().collect(),
            offered: false,
            unanswered: false,
        });
    };
    // Only workers still registered: one removed as dead since the view was taken gets no
    // inbox written again.
    let workers: Vec<WorkerView> = workers
        .iter()
        .filter(|w| {
            observer
                .registrations
                .values()
                .any(|(_, r)| r.worker == w.registration.worker)
        })
        .cloned()
        .collect();
    let answering = |name: &str| {
        workers.iter().any(|w| {
            w.registration.worker == name && w.alive && w.offer && !w.registration.draining
        })
    };
    // Each name forwarded to the worker that answered for it; the forwards so far, in order.
    let mut forwarded: BTreeMap<RecoveryId, String> = BTreeMap::new();
    let mut forwards: Vec<String> = Vec::new();
    let forward = |batch: &[RecoveryId], forwards: &mut Vec<String>| {
        let targets = placement::forward_targets(&workers, last_runs, forwards, batch.len());
        forwards.extend(targets.iter().flatten().cloned());
        forward_to(&workers, batch.to_vec(), targets)
    };
    let forwarding = forward(&named, &mut forwards);
    let (checked, mut results, answered) =
        futures::join!(holder.check(leading), read(named), forwarding);
    note_forwarded(&mut observer.forwarded, answered.sent);
    checked.map_err(TickError::NotLeading)?;
    let mut deaf: std::collections::BTreeSet<String> = answered.deaf.into_iter().collect();
    forwarded.extend(answered.claimed);
    let mut waiting: BTreeMap<RecoveryId, (RecoveryRecord, ETag)> = BTreeMap::new();
    let mut claimed: BTreeMap<RecoveryId, RecoveryRecord> = BTreeMap::new();
    let mut unread: Vec<RecoveryId> = Vec::new();
    for round in 1..=NAMED_ROUNDS {
        for (result, id) in results {
            match result {
                Ok(Some((record, etag))) => {
                    let claimer = forwarded.get(&id).filter(|worker| {
                        crate::core::lifecycle::unclaimed(&record)
                            && workers.iter().any(|w| {
                                w.registration.worker == **worker
                                    && (record.force
                                        || w.registration.fingerprint_sha256
                                            == record.fingerprint_sha256)
                            })
                    });
                    let started_there = record.state == RecoveryState::Running
                        && record.assigned_to.is_some()
                        && record.assigned_to.as_ref() == forwarded.get(&id);
                    if started_there {
                        // Claimed before this read: counted against its worker.
                        claimed.insert(id, record);
                    } else if let Some(worker) = claimer {
                        // Left to the worker it was forwarded to; counted against it.
                        let mut theirs = record;
                        theirs.assigned_to = Some(worker.clone());
                        claimed.insert(id, theirs);
                    } else if record.state == RecoveryState::Admitted
                        && record.declined_by.is_none()
                        && !record.assigned_to.as_deref().is_some_and(answering)
                    {
                        waiting.insert(record.recovery_id.clone(), (record, etag));
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(recovery_id = %id, %error, "cannot read a named recovery");
                    unread.push(id);
                }
            }
        }
        // Names that came while these were read (a batch of admissions lands over a few
        // round trips) join this assignment rather than wait for the next. One named again is
        // read again: its record may have changed since (an answer names a recovery it just
        // made waiting again); the fresher read replaces the older in `waiting`.
        let more: Vec<RecoveryId> = wakeup.map(|wakeup| wakeup.take_named()).unwrap_or_default();
        if more.is_empty() {
            break;
        }
        if round == NAMED_ROUNDS {
            // Kept for the loop's next turn (naming them wakes it again).
            if let Some(wakeup) = wakeup {
                wakeup.name(more);
            }
            break;
        }
        for id in &more {
            // A record read before and no longer waiting is judged on the fresher read.
            waiting.remove(id);
            claimed.remove(id);
            forwarded.remove(id);
        }
        looked.extend(more.iter().cloned());
        let forwarding = forward(&more, &mut forwards);
        let (read_now, answered) = futures::join!(read(more), forwarding);
        results = read_now;
        note_forwarded(&mut observer.forwarded, answered.sent);
        deaf.extend(answered.deaf);
        forwarded.extend(answered.claimed);
    }
    let claimed_any = !claimed.is_empty();
    // Every name read here is judged on this read: one left to a claim before and assigned
    // now goes into inboxes again.
    for id in &looked {
        observer.claims.remove(id);
    }
    // A worker that did not answer a forward is offered nothing on this view, and is marked
    // by the full tick that follows, as one that did not answer an offer's wake-up.
    let workers: Vec<WorkerView> = workers
        .into_iter()
        .map(|mut w| {
            if deaf.contains(&w.registration.worker) {
                w.offer = false;
            }
            w
        })
        .collect();
    observer.claims.extend(
        claimed
            .values()
            .filter(|record| record.state == RecoveryState::Admitted)
            .map(|record| record.recovery_id.clone()),
    );
    // The view the next named assignment places on counts the forwarded recoveries against
    // the workers that claim them.
    let mut runs: Vec<RunView> = last_runs
        .iter()
        .filter(|run| {
            !waiting
                .values()
                .map(|(record, _)| record)
                .chain(claimed.values())
                .any(|record| record.source_run == run.entry.run_id)
        })
        .cloned()
        .collect();
    for record in claimed.into_values() {
        if let Some(entry) = crate::core::lifecycle::entry_for(&record) {
            runs.push(RunView {
                entry,
                holder_alive: false,
                recovery: Some(record),
                answered: false,
            });
        }
    }
    let claimers: BTreeMap<String, Vec<Offer>> = runs
        .iter()
        .filter_map(|run| run.recovery.as_ref())
        .filter(|record| forwarded.get(&record.recovery_id) == record.assigned_to.as_ref())
        .filter_map(|record| Some((record.assigned_to.clone()?, Vec::new())))
        .collect();
    if waiting.is_empty() {
        judge_offered_busy(observer, &claimers);
        if let Some((view_workers, view, _)) = observer.last_view.as_mut() {
            *view = runs;
            *view_workers = workers;
        }
        let unanswered = !deaf.is_empty();
        observer.unanswered.extend(deaf);
        return Ok(NamedOutcome {
            again: unread,
            offered: claimed_any,
            unanswered,
        });
    }
    // The last view, with each named recovery's run as its record says (its index entry may
    // not say recovering yet: the admission writes it after the record).
    for (record, _) in waiting.values() {
        let Some(entry) = crate::core::lifecycle::entry_for(record) else {
            continue;
        };
        runs.push(RunView {
            entry,
            holder_alive: false,
            recovery: Some(record.clone()),
            answered: false,
        });
    }
    let actions: Vec<Action> = placement::decide(&workers, &runs, options.max_attempts)
        .into_iter()
        .filter(|action| {
            matches!(action, Action::Assign { recovery, .. } if waiting.contains_key(recovery))
        })
        .collect();
    let known: BTreeMap<&RecoveryId, &(RecoveryRecord, ETag)> = waiting.iter().collect();
    let known = &known;
    let observed = &runs;
    let executed = futures::stream::iter(actions.clone())
        .map(|action| async move {
            match execute(store, holder, options, &action, observed, known).await {
                Ok((landed, offer)) => (landed, action, offer),
                Err(error) => {
                    tracing::debug!(?action, %error, "named assignment failed");
                    (false, action, None)
                }
            }
        })
        .buffer_unordered(ACTION_CONCURRENCY)
        .collect::<Vec<(bool, Action, Option<Offer>)>>()
        .await;
    let mut offered: BTreeMap<String, Vec<Offer>> = BTreeMap::new();
    let mut moved = std::collections::BTreeSet::new();
    for (landed, action, offer) in executed {
        if let (true, Action::Assign { worker, recovery }) = (landed, action) {
            offered.entry(worker).or_default().extend(offer);
            moved.insert(recovery);
        }
    }
    // The tick's cached copies of the records assigned here are stale now.
    observer
        .records
        .retain(|_, (_, (record, _), _)| !moved.contains(&record.recovery_id));
    // The view the next named assignment places on.
    apply_offers(&mut runs, &offered);
    let assigned = Assigned {
        decided: &actions,
        landed: &moved,
        offered: &offered,
    };
    let mut unanswered = write_inboxes(store, observer, options, &workers, &runs, assigned).await?;
    unanswered.extend(
        deaf.into_iter()
            .filter(|w| !unanswered.contains(w))
            .collect::<Vec<_>>(),
    );
    judge_offered_busy(observer, &offered);
    judge_offered_busy(observer, &claimers);
    if let Some((_, view, _)) = observer.last_view.as_mut() {
        *view = runs;
    }
    // A worker that did not answer is marked unreachable by the full tick that follows (it
    // lists the heartbeat versions that mark needs); what was offered to it is looked at
    // again on that tick's view, as is what could not be placed or read.
    let mut again = unread;
    let offered_to_unanswered = |id: &RecoveryId| {
        offered.iter().any(|(worker, offers)| {
            unanswered.contains(worker) && offers.iter().any(|o| o.record.recovery_id == *id)
        })
    };
    again.extend(
        waiting
            .keys()
            .filter(|id| !moved.contains(*id) || offered_to_unanswered(id))
            .cloned(),
    );
    // The view offers the workers that did not answer nothing more until a tick marks them.
    if let Some((view, _, _)) = observer.last_view.as_mut() {
        for worker in view.iter_mut() {
            if unanswered.contains(&worker.registration.worker) {
                worker.offer = false;
            }
        }
    }
    let deaf = !unanswered.is_empty();
    observer.unanswered.extend(unanswered);
    Ok(NamedOutcome {
        again,
        offered: !moved.is_empty() || claimed_any,
        unanswered: deaf,
    })
}

/// Rounds of record reads one named assignment makes, taking the names that came meanwhile.
const NAMED_ROUNDS: usize = 3;

/// Wakes each worker `targets` names (one target per name of `batch`, `None`: not forwarded)
/// naming the recoveries forwarded to it, all at once. A name whose worker did not answer
/// that it claims it (full, stopping, an older build, or no answer) is placed from its record
/// as usual.
async fn forward_to(
    workers: &[WorkerView],
    batch: Vec<RecoveryId>,
    targets: Vec<Option<String>>,
) -> Forwarded {
    let mut by_worker: BTreeMap<String, Vec<RecoveryId>> = BTreeMap::new();
    for (id, target) in batch.into_iter().zip(targets) {
        if let Some(worker) = target {
            by_worker.entry(worker).or_default().push(id);
        }
    }
    let mut sent = Vec::new();
    let wakes = by_worker.into_iter().filter_map(|(worker, ids)| {
        let url = workers
            .iter()
            .find(|w| w.registration.worker == worker)?
            .registration
            .wake
            .clone()?;
        sent.extend(crate::fleet::wake::sent(&ids));
        Some(async move {
            match crate::fleet::wake::forward(&url, &ids).await {
                Ok(claimed) => Ok(claimed
                    .into_iter()
                    .map(|id| (id, worker.clone()))
                    .collect::<Vec<_>>()),
                Err(error) => {
                    tracing::debug!(worker_id = %worker, %error, "a worker did not answer a forwarded name");
                    Err(worker)
                }
            }
        })
    });
    let wakes: Vec<_> = wakes.collect();
    let mut claimed = Vec::new();
    let mut deaf = Vec::new();
    for answer in futures::future::join_all(wakes).await {
        match answer {
            Ok(ids) => claimed.extend(ids),
            Err(worker) => deaf.push(worker),
        }
    }
    Forwarded {
        claimed,
        deaf,
        sent,
    }
}

/// What forwarding names did: each name a worker claims, with that worker; the workers that
/// did not answer; the names sent.
struct Forwarded {
    claimed: Vec<(RecoveryId, String)>,
    deaf: Vec<String>,
    /// Every name a wake-up carried to a worker, answered or not (a lost answer may follow a
    /// delivered wake-up).
    sent: Vec<RecoveryId>,
}

/// Puts the records as the landed offers left them into `runs`, so that the next named
/// assignment counts those recoveries against their workers.
fn apply_offers(runs: &mut [RunView], offered: &BTreeMap<String, Vec<Offer>>) {
    let left: BTreeMap<&RecoveryId, &RecoveryRecord> = offered
        .values()
        .flatten()
        .map(|offer| (&offer.record.recovery_id, &offer.record))
        .collect();
    for run in runs {
        if let Some(record) = run.recovery.as_mut()
            && let Some(&after) = left.get(&record.recovery_id)
        {
            *record = after.clone();
        }
    }
}

/// A heartbeat unchanged for this many TTLs (on the coordinator's own clock, the larger of
/// the TTL it judges the holder by and the one the heartbeat declares) is removed once no
/// index entry names its holder.
pub const DEAD_AFTER_TTLS: u32 = 3;

/// Removes the heartbeats of hosts and coordinators that are gone: judged silent for
/// [`DEAD_AFTER_TTLS`] TTLs, and named by no index entry (their runs were finished, or fenced
/// and handed to recoveries), so the heartbeat listing stays bounded by live processes, not by
/// every host that ever crashed. Up to [`ACTION_CONCURRENCY`] per tick.
///
/// A workers' heartbeat, registration and inbox are gc's (`gc::sweep_dead_processes`, after
/// its grace period): a registration deleted just as its worker came back under the same ID
/// would be missed for one idle TTL, and its worker offered nothing.
///
/// Safe against a process that was only paused, or a new one under the same ID: removing a
/// heartbeat fences nothing (leases carry the epochs), every judge watches an absent heartbeat
/// for a TTL like any version (`core::liveness::Sighting::Gone`), and a process writes its
/// heartbeat again within a third of its TTL. Each heartbeat is read (for its role and
/// declared TTL) and the heartbeats listed once more just before the deletions: one that
/// changed since it was judged is left alone.
async fn remove_the_dead(
    store: &Store,
    holder: &Arc<Holder>,
    observer: &mut Observer,
    versions: &BTreeMap<String, ETag>,
    alive: &HashMap<String, bool>,
    named: &std::collections::BTreeSet<String>,
) {
    let now = store.clock().monotonic();
    let own = holder.heartbeat_key();
    let registered: std::collections::BTreeSet<&str> = observer
        .registrations
        .values()
        .map(|(_, registration)| registration.heartbeat.as_str())
        .collect();
    let due: Vec<Due> = versions
        .iter()
        .filter(|(key, _)| {
            **key != own
                && !named.contains(*key)
                && !registered.contains(key.as_str())
                && alive.get(*key) == Some(&false)
        })
        .filter_map(|(key, etag)| {
            let (silent, ttl) = observer.liveness.silence(key, now)?;
            (silent >= ttl * DEAD_AFTER_TTLS).then(|| Due {
                key: key.clone(),
                judged: etag.clone(),
                silent,
            })
        })
        .take(ACTION_CONCURRENCY)
        .collect();
    if due.is_empty() {
        return;
    }
    match remove_dead(store, due).await {
        Ok(removed) => {
            for key in removed {
                observer.liveness.forget(&key);
                observer.gone.remove(&key);
            }
        }
        Err(error) => tracing::warn!(%error, "cannot remove dead processes' heartbeats"),
    }
}

/// A heartbeat due for removal: its key, the version judged, and how long it was silent.
struct Due {
    key: String,
    judged: ETag,
    silent: Duration,
}

/// Removes the heartbeats in `due` that are still at the version judged, are no worker's, and
/// declare no TTL that their silence falls short of. A heartbeat that does not read (a newer
/// format, a foreign object) is skipped, not allowed to stop the others. Returns the keys
/// removed.
async fn remove_dead(store: &Store, due: Vec<Due>) -> Result<Vec<String>, StoreError> {
    use crate::store::lease::{LeaseError, read_heartbeat};
    let mut beats = Vec::new();
    for due in due {
        match read_heartbeat(store, &due.key).await {
            Ok(Some((beat, _))) => {
                let declared = Duration::from_millis(beat.ttl_ms);
                if beat.role != "worker" && due.silent >= declared * DEAD_AFTER_TTLS {
                    beats.push((due, beat));
                }
            }
            Ok(None) => {}
            Err(LeaseError::Store(error)) => return Err(error),
            Err(error) => {
                tracing::warn!(heartbeat = %due.key, %error, "not removing a heartbeat that does not read");
            }
        }
    }
    if beats.is_empty() {
        return Ok(Vec::new());
    }
    // Versions as listed now, comparable with those judged (a read's version need not be:
    // a local directory's are content hashes).
    let listed: BTreeMap<String, ETag> = list_heartbeats(store).await?.into_iter().collect();
    let mut removed = Vec::new();
    for (due, beat) in beats {
        if listed.get(&due.key) != Some(&due.judged) {
            continue;
        }
        store.delete(&due.key).await?;
        tracing::info!(
            heartbeat = %due.key,
            role = %beat.role,
            silent_s = due.silent.as_secs(),
            "removed the heartbeat of a process that is gone"
        );
        crate::metrics::count(crate::metrics::DEAD_PROCESSES_REMOVED);
        removed.push(due.key);
    }
    Ok(removed)
}

/// Keeps a heartbeat judged silent judged so until its version changes, for the keys in
/// `remembered` (workers that ran a recovery): `gone` remembers the version judged, `alive`
/// is corrected for it, and versions that moved on (or heartbeats no longer listed) are
/// forgotten.
fn remember_the_gone(
    gone: &mut BTreeMap<String, ETag>,
    listed: &BTreeMap<String, ETag>,
    alive: &mut HashMap<String, bool>,
    remembered: &std::collections::BTreeSet<String>,
) {
    gone.retain(|key, etag| listed.get(key) == Some(etag));
    for (key, etag) in listed {
        match alive.get_mut(key) {
            Some(judged) if !*judged && remembered.contains(key) => {
                gone.insert(key.clone(), etag.clone());
            }
            Some(judged) if *judged && gone.contains_key(key) => *judged = false,
            _ => {}
        }
    }
}

/// Marks as not answering a worker that left an offer untaken for its full TTL (it answered
/// its wake-up, or has no wake-up address, but never started the recovery: it died, maybe
/// while idle and judged by its long idle TTL), so the offer moves to another worker.
fn pass_over_untaken_offers(
    observer: &mut Observer,
    runs: &[RunView],
    versions: &BTreeMap<String, ETag>,
    own_ttl: Duration,
) {
    let offers: BTreeMap<&RecoveryId, &str> = runs
        .iter()
        .filter_map(|run| run.recovery.as_ref())
        .filter(|record| record.state == RecoveryState::Admitted)
        .filter_map(|record| Some((&record.recovery_id, record.assigned_to.as_deref()?)))
        .collect();
    observer
        .offered
        .retain(|id, (worker, _)| offers.get(id) == Some(&worker.as_str()));
    // An offer waiting on a worker whose slots all run is queued, not untaken: its clock
    // starts when the worker has a slot free.
    let mut running: BTreeMap<&str, u32> = BTreeMap::new();
    for run in runs {
        if let Some(record) = &run.recovery
            && record.state == RecoveryState::Running
            && let Some(worker) = record.assigned_to.as_deref()
        {
            *running.entry(worker).or_default() += 1;
        }
    }
    let full = |worker: &str| {
        observer
            .registrations
            .values()
            .find(|(_, r)| r.worker == worker)
            .is_some_and(|(_, r)| running.get(worker).copied().unwrap_or(0) >= r.capacity)
    };
    for (id, worker) in &offers {
        let waiting = full(worker);
        let since = observer
            .offered
            .entry((*id).clone())
            .or_insert_with(|| ((*worker).to_owned(), crate::clock::Stopwatch::start()));
        if waiting {
            since.1 = crate::clock::Stopwatch::start();
        }
    }
    let mut untaken = Vec::new();
    for (worker, since) in observer.offered.values() {
        let ttl = observer
            .registrations
            .values()
            .find(|(_, r)| r.worker == *worker)
            .and_then(|(_, r)| r.ttl_ms)
            .map_or(own_ttl, Duration::from_millis);
        if since.elapsed() > ttl.max(own_ttl) {
            untaken.push(worker.clone());
        }
    }
    for worker in untaken {
        if let Some(etag) = registration_beat(observer, &worker, versions)
            && !observer.unreachable.contains_key(&worker)
        {
            tracing::warn!(worker_id = %worker, "an offer stayed untaken for the worker's TTL; offering its recoveries elsewhere");
            observer.unreachable.insert(worker, etag);
        }
    }
}

/// The source run an action is about.
fn action_source<'a>(action: &'a Action, runs: &'a [RunView]) -> Option<&'a RunId> {
    match action {
        Action::Admit { source }
        | Action::DeadLetter { source, .. }
        | Action::Reconcile { source, .. } => Some(source),
        Action::Assign { recovery, .. }
        | Action::Abandon { recovery, .. }
        | Action::Answered { recovery } => runs
            .iter()
            .find(|run| run.entry.recovery_id.as_ref() == Some(recovery))
            .map(|run| &run.entry.run_id),
    }
}

/// Ticks that may follow each other without a pause while each makes progress.
const MAX_IMMEDIATE_TICKS: u32 = 64;

/// How stale a cached record of a running recovery may be: a worker hands one back (a yield,
/// a failure) without touching the index, and the coordinator sees it within this. (A
/// decision on a stale record is safe: its compare-and-swap fails and the record is read
/// again.)
const RUNNING_REFRESH: Duration = Duration::from_secs(1);

/// How stale a cached fresh admission this leader never named to a worker may be (at most;
/// see [`unclaimed_refresh`]). Only this leader's assignment starts one, except a claim by a
/// worker an earlier leader (or a forged wake-up) named it to: the view then counts it as
/// waiting while it runs, until an assignment's swap fails on it, or this long. Read on every
/// tick, a thousand admissions waiting for slots cost the 1-worker bench 68 GETs per
/// recovery.
const UNCLAIMED_REFRESH: Duration = Duration::from_secs(5);

/// Actions (admissions, lifecycle events) executed at once per tick, and records read at once.
/// After an outage every index entry changes at once; with S3's 20–30 ms per request, 16 at a
/// time made a tick over 200 recoveries take over a second before the first worker was told.
/// (Admissions are batched by [`ADMISSION_BATCH`] on top.)
const ACTION_CONCURRENCY: usize = 256;

/// Admissions the coordinator starts per tick: the first ones are assigned by the tick that
/// follows at once while the rest wait their turn, and sources whose admission keeps failing
/// cannot hold the others back (the window moves on every tick).
const ADMISSION_BATCH: usize = 64;

/// The listed version of `worker`'s heartbeat, if it is registered and beating.
fn registration_beat(
    observer: &Observer,
    worker: &str,
    versions: &BTreeMap<String, ETag>,
) -> Option<ETag> {
    observer
        .registrations
        .values()
        .find(|(_, r)| r.worker == worker)
        .and_then(|(_, r)| versions.get(&r.heartbeat).cloned())
}

/// One LIST of the heartbeats' prefix: every process's heartbeat and every worker's
/// registration, each with its listed version, and when the listing was issued and returned.
struct Listing {
    heartbeats: Vec<(String, ETag)>,
    registrations: Vec<(String, Option<ETag>)>,
    seen: Seen,
}

async fn list_heartbeats_seen(store: &Store) -> Result<Listing, StoreError> {
    let issued = store.clock().monotonic();
    let listed = store.list_all(layout::heartbeats_prefix()).await?;
    let seen = Seen {
        issued,
        returned: store.clock().monotonic(),
    };
    let (registrations, heartbeats): (Vec<_>, Vec<_>) = listed
        .into_iter()
        .partition(|listed| layout::is_registration(&listed.key));
    Ok(Listing {
        heartbeats: heartbeats
            .into_iter()
            .map(|listed| {
                let etag = listed.etag.unwrap_or_else(|| ETag(String::new()));
                (listed.key, etag)
            })
            .collect(),
        registrations: registrations
            .into_iter()
            .map(|listed| (listed.key, listed.etag))
            .collect(),
        seen,
    })
}

async fn list_heartbeats(store: &Store) -> Result<Vec<(String, ETag)>, StoreError> {
    Ok(list_heartbeats_seen(store).await?.heartbeats)
}

/// Brings the registrations up to the versions `listed` (every tick's heartbeat listing
/// carries them): an entry whose version is unchanged keeps what was read before, one that
/// changed or is new is read, one no longer listed goes. Versions say what changed, so a
/// worker restarted under its ID with another configuration is seen at the next tick, and so
/// is a worker whose registration landed after its heartbeat was listed.
async fn refresh_registrations(
    store: &Store,
    observer: &mut Observer,
    listed: &[(String, Option<ETag>)],
) {
    let mut registrations = BTreeMap::new();
    for (key, etag) in listed {
        let cached = observer.registrations.remove(key);
        if let Some(cached) = cached.as_ref().filter(|(cached, _)| cached == etag) {
            registrations.insert(key.clone(), cached.clone());
            continue;
        }
        match store.read(key).await {
            // A read that failed after its retries (a brownout, an expired credential) keeps
            // the registration as read before, at its old version, so it is read again next
            // tick: a partial map would leave the workers it misses unregistered, their
            // recoveries abandoned and themselves fenced.
            Err(error) => {
                tracing::warn!(%key, %error, "cannot read a worker registration; keeping the one read before");
                if let Some(cached) = cached {
                    registrations.insert(key.clone(), cached);
                }
            }
            Ok(Some(object)) => match layout::decode_object::<Registration>(
                key,
                crate::core::assignment::REGISTRATION_KIND,
                &object.bytes,
            ) {
                Ok(registration) => {
                    registrations.insert(key.clone(), (etag.clone(), registration));
                }
                Err(error) => tracing::warn!(%error, "ignoring a bad worker registration"),
            },
            Ok(None) => {}
        }
    }
    // A worker whose registration is gone (it stopped, or gc removed a dead worker's) gets no
    // more inbox writes; the inbox it had goes too, so inboxes follow the registered workers.
    let departed: Vec<String> = observer
        .registrations
        .values()
        .map(|(_, registration)| registration.worker.clone())
        .collect();
    observer.registrations = registrations;
    for worker in departed {
        if observer
            .registrations
            .values()
            .any(|(_, registration)| registration.worker == worker)
        {
            continue;
        }
        observer.inboxes.remove(&worker);
        observer.unreachable.remove(&worker);
        if let Err(error) = store.delete(&layout::inbox(&worker)).await {
            tracing::debug!(worker_id = %worker, %error, "cannot remove a departed worker's inbox");
        }
    }
}

/// Liveness of every listed heartbeat, judged by [`liveness::judge_heartbeats`] with the TTL
/// each holder declared in its index entry or registration. A worker running a recovery is
/// judged by its full-rate TTL, an idle one by its idle TTL; when a worker turns busy its
/// watch starts over (its last idle beat may be older than the full-rate TTL, and it beat
/// at once when it turned busy, which this observation may not show yet).
fn judge_liveness(
    options: &CoordinatorOptions,
    observer: &mut Observer,
    runs: &[RunView],
    heartbeats: Vec<(String, ETag)>,
    seen: Seen,
) -> HashMap<String, bool> {
    // Workers running a recovery, or offered one (a worker beats at its full rate from the
    // moment it takes an offer up, before it starts): judged by their full-rate TTL.
    let running: std::collections::BTreeSet<&str> = runs
        .iter()
        .filter_map(|run| run.recovery.as_ref())
        .filter(|record| {
            matches!(
                record.state,
                RecoveryState::Running | RecoveryState::Admitted
            )
        })
        .filter_map(|record| record.assigned_to.as_deref())
        .collect();
    let mut busy = std::collections::BTreeSet::new();
    let mut declared: Vec<(String, u64)> = runs
        .iter()
        .filter_map(|run| Some((run.entry.holder.clone()?, run.entry.holder_ttl_ms?)))
        .collect();
    for (_, registration) in observer.registrations.values() {
        let is_busy = running.contains(registration.worker.as_str());
        let ttl = if is_busy {
            busy.insert(registration.worker.clone());
            if !observer.judged_busy.contains(&registration.worker) {
                observer.liveness.forget(&registration.heartbeat);
            }
            registration.ttl_ms
        } else {
            registration.idle_ttl_ms.or(registration.ttl_ms)
        };
        if let Some(ttl) = ttl {
            declared.push((registration.heartbeat.clone(), ttl));
        }
    }
    observer.judged_busy = busy;
    // A named heartbeat that is not listed is judged at the absent version, for a TTL like any
    // other: one removed as a dead process's just as its process came back is written again
    // within a third of its TTL.
    let named = runs
        .iter()
        .filter_map(|run| run.entry.holder.as_deref())
        .chain(
            observer
                .registrations
                .values()
                .map(|(_, registration)| registration.heartbeat.as_str()),
        );
    let heartbeats = liveness::with_absent(heartbeats, named);
    let listed: BTreeMap<String, ETag> = heartbeats.iter().cloned().collect();
    let mut alive = liveness::judge_heartbeats(
        &mut observer.liveness,
        options.ttl,
        declared.iter().map(|(key, ttl)| (key.as_str(), *ttl)),
        heartbeats,
        seen,
    );
    // Only a worker judged gone while it ran a recovery is held to that judgement: its
    // attempt is handed back, and it must not look alive again by its idle TTL. (A worker
    // judged by the coordinator's own TTL before its registration was listed is not.)
    let running_keys: std::collections::BTreeSet<String> = observer
        .registrations
        .values()
        .filter(|(_, r)| observer.judged_busy.contains(&r.worker))
        .map(|(_, r)| r.heartbeat.clone())
        .collect();
    remember_the_gone(&mut observer.gone, &listed, &mut alive, &running_keys);
    // A heartbeat neither listed nor named needs no watch (and must not hold memory).
    observer.liveness.retain(|key| listed.contains_key(key));
    observer.declared = declared;
    alive
}

/// Pairs each entry with, where it has a recovery, the record (the holder's liveness is
/// filled in once heartbeats are judged). Records of recovering runs are read every tick;
/// those of parked runs only every [`SWEEP_TICKS`] ticks (a crash between an
/// answer's record and index writes is repaired then); dead-lettered records never change.
/// The reads go side by side.
async fn observe_runs(
    store: &Store,
    observer: &mut Observer,
    entries: Vec<IndexEntry>,
    ttl: Duration,
) -> (Vec<RunView>, Option<Duration>) {
    let sweep = observer.ticks_since_sweep == 0;
    let cache = &observer.records;
    let forwarded = &observer.forwarded;
    let refresh = unclaimed_refresh(observer, ttl);
    let mut recheck: Option<Duration> = None;
    let observed = futures::stream::iter(entries)
        .map(|entry| {
            // A cached record still describes the run unless its entry changed, it waits to
            // be started (this coordinator assigns it; a worker starts it, and may fail or
            // hand it back at once: the tick its wake-up brings must see that), or it has
            // been running for a while (a worker may have handed it back).
            let cached = cache
                .get(&entry.run_id)
                .filter(|(seen, (record, _), read_at)| {
                    *seen == entry
                        && !sweep
                        && match record.state {
                            // Only the coordinator offers it, and a worker starts an offered
                            // one; but a worker this leader named a fresh admission to (see
                            // `Observer::forwarded`) may claim it (`lifecycle::unclaimed`), so
                            // that is read again; any other after `unclaimed_refresh`.
                            RecoveryState::Admitted => {
                                record.assigned_to.is_none()
                                    && (!crate::core::lifecycle::unclaimed(record)
                                        || (!forwarded.contains_key(&record.recovery_id)
                                            && read_at.elapsed() < refresh))
                            }
                            RecoveryState::Running => read_at.elapsed() < RUNNING_REFRESH,
                            _ => true,
                        }
                })
                .map(|(_, known, read_at)| (known.clone(), *read_at));
            if let Some(((record, _), read_at)) = &cached
                && record.state == RecoveryState::Running
            {
                let due = RUNNING_REFRESH.saturating_sub(read_at.elapsed());
                recheck = Some(recheck.map_or(due, |other| other.min(due)));
            }
            observe_run(store, sweep, entry, cached)
        })
        .buffered(ACTION_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut records = BTreeMap::new();
    let mut runs = Vec::with_capacity(observed.len());
    for (run, known) in observed.into_iter().flatten() {
        if let (Some(record), Some((etag, read_at))) = (&run.recovery, known) {
            records.insert(
                run.entry.run_id.clone(),
                (run.entry.clone(), (record.clone(), etag), read_at),
            );
        }
        runs.push(run);
    }
    // A named recovery is forgotten once its record, just read, is no longer a fresh
    // admission (claimed, assigned, ended); one still fresh is remembered anew; one not seen
    // (not listed yet, or its read failed) is kept for a while after it was last named or
    // seen (a name whose admission never wrote its entry is then forgotten).
    if !observer.forwarded.is_empty() {
        let fresh: BTreeMap<&RecoveryId, bool> = records
            .values()
            .map(|(_, (record, _), _)| {
                (
                    &record.recovery_id,
                    crate::core::lifecycle::unclaimed(record),
                )
            })
            .collect();
        observer.forwarded.retain(|id, at| match fresh.get(id) {
            Some(true) => {
                *at = crate::clock::Stopwatch::start();
                true
            }
            Some(false) => false,
            None => at.elapsed() < FORWARD_REMEMBERED,
        });
    }
    // Only runs still in the index are remembered.
    observer.records = records;
    (runs, recheck)
}

/// How long a named recovery not seen since is remembered (its admission writes the index
/// entry after the record, a moment after the name went out; a record read can fail).
const FORWARD_REMEMBERED: Duration = Duration::from_secs(60);

/// The most named recoveries remembered: forged wake-ups name what they like, and names are
/// forwarded before they are read. Past it the longest unseen are forgotten, which costs only
/// a cache that may be [`unclaimed_refresh`] stale.
const FORWARDED_MAX: usize = 8192;

/// Remembers recoveries named to workers (see `Observer::forwarded`).
fn note_forwarded(
    forwarded: &mut BTreeMap<RecoveryId, crate::clock::Stopwatch>,
    named: impl IntoIterator<Item = RecoveryId>,
) {
    for id in named {
        forwarded.insert(id, crate::clock::Stopwatch::start());
    }
    if forwarded.len() > FORWARDED_MAX {
        // The longest unseen first; exactly the excess goes.
        let mut by_age: Vec<(Duration, RecoveryId)> = forwarded
            .iter()
            .map(|(id, at)| (at.elapsed(), id.clone()))
            .collect();
        by_age.sort_unstable_by_key(|(age, _)| std::cmp::Reverse(*age));
        let excess = forwarded.len() - FORWARDED_MAX;
        for (_, id) in by_age.into_iter().take(excess) {
            forwarded.remove(&id);
        }
    }
}

/// How long a cached fresh admission nobody was named may be trusted: [`UNCLAIMED_REFRESH`],
/// or half the shortest TTL this leader judges a holder by if that is shorter (an offer's
/// clock and a worker's liveness are judged on the view this cache feeds).
fn unclaimed_refresh(observer: &Observer, ttl: Duration) -> Duration {
    observer
        .registrations
        .values()
        .filter_map(|(_, registration)| registration.ttl_ms)
        .map(Duration::from_millis)
        .chain(std::iter::once(ttl))
        .map(|ttl| ttl / 2)
        .fold(UNCLAIMED_REFRESH, Duration::min)
}

/// One run's view, and its record's version and when it was read; `None` if its record
/// cannot be read now (the next tick tries again).
async fn observe_run(
    store: &Store,
    sweep: bool,
    entry: IndexEntry,
    cached: Option<((RecoveryRecord, ETag), crate::clock::Stopwatch)>,
) -> Option<(RunView, Option<(ETag, crate::clock::Stopwatch)>)> {
    let read_record = match entry.phase {
        Phase::Recovering => true,
        Phase::Parked => sweep,
        Phase::Running | Phase::Dead => false,
    };
    let (recovery, known) = match (&entry.recovery_id, cached) {
        (Some(_), Some(((record, etag), read_at))) => (Some(record), Some((etag, read_at))),
        (Some(id), None) if read_record => match recovery::read(store, id).await {
            Ok(Some((record, etag))) => {
                (Some(record), Some((etag, crate::clock::Stopwatch::start())))
            }
            Ok(None) => (None, None),
            Err(error) => {
                tracing::warn!(recovery_id = %id, %error, "cannot read the recovery record");
                return None;
            }
        },
        _ => (None, None),
    };
    // One HEAD per parked recovery per sweep: the slot after the generation it parked at.
    let answered = match &recovery {
        Some(record) if sweep && record.state == RecoveryState::Parked => match record.parked_at {
            Some(parked_at) => {
                let chain = crate::store::generation::Chain::new(
                    store,
                    layout::run_base(record.recovery_id.as_str()),
                );
                matches!(store.head(&chain.key(parked_at + 1)).await, Ok(Some(_)))
            }
            None => false,
        },
        _ => false,
    };
    Some((
        RunView {
            entry,
            holder_alive: false,
            recovery,
            answered,
        },
        known,
    ))
}

/// A tick's assignments, for the inboxes: those decided, the recoveries whose assignment
/// landed, and the records those offers left, by worker.
#[derive(Clone, Copy)]
struct Assigned<'a> {
    decided: &'a [Action],
    landed: &'a std::collections::BTreeSet<RecoveryId>,
    offered: &'a BTreeMap<String, Vec<Offer>>,
}

/// Each live worker's inbox: the recoveries assigned to it and not yet finished. Written
/// only when it changed (side by side); a worker whose inbox gained a recovery is woken.
/// Returns the workers that did not answer their wake-up.
async fn write_inboxes(
    store: &Store,
    observer: &mut Observer,
    options: &CoordinatorOptions,
    workers: &[WorkerView],
    runs: &[RunView],
    assigned: Assigned<'_>,
) -> Result<Vec<String>, StoreError> {
    let Assigned {
        decided: actions,
        landed,
        offered,
    } = assigned;
    let mut inboxes: BTreeMap<String, Vec<RecoveryId>> = workers
        .iter()
        .map(|w| (w.registration.worker.clone(), Vec::new()))
        .collect();
    for run in runs {
        if let Some((recovery, worker)) = run.assignment()
            && !observer.claims.contains(recovery)
            && let Some(list) = inboxes.get_mut(worker)
        {
            list.push(recovery.clone());
        }
    }
    // An assignment that did not land (its swap failed or its outcome is unknown) is still
    // written to the inbox below, and a worker that reads it there may claim a fresh
    // admission: its record is read again on every tick while it stays fresh.
    note_forwarded(
        &mut observer.forwarded,
        actions.iter().filter_map(|action| match action {
            Action::Assign { recovery, .. } if !landed.contains(recovery) => Some(recovery.clone()),
            _ => None,
        }),
    );
    for action in actions {
        if let Action::Assign { recovery, worker } = action {
            // A recovery moved from one worker to another leaves the first one's inbox once
            // the move landed (if it did not, the first one may have started it).
            if landed.contains(recovery) {
                for (other, list) in inboxes.iter_mut() {
                    if other != worker {
                        list.retain(|id| id != recovery);
                    }
                }
            }
            if let Some(list) = inboxes.get_mut(worker)
                && !list.contains(recovery)
            {
                list.push(recovery.clone());
            }
        }
    }
    // Oldest admission first: the worker starts its inbox in order as slots free, so a
    // recovery waiting on it is not passed by ones admitted after it.
    let admitted: BTreeMap<&RecoveryId, u64> = runs
        .iter()
        .filter_map(|run| run.recovery.as_ref())
        .map(|record| (&record.recovery_id, record.admitted_at_ms))
        .collect();
    for list in inboxes.values_mut() {
        list.sort_by_key(|id| (admitted.get(id).copied().unwrap_or(u64::MAX), id.clone()));
    }
    // Workers whose offer landed this tick (`offered`) are woken even when their inbox already
    // listed the recovery (one handed back and offered to the same worker again leaves the
    // inbox as it was, and the worker would otherwise find it only at its next poll). Only
    // landed offers: an assignment that keeps failing must not wake a worker every tick.
    // A landed offer is written with its record, so the worker starts it without a read.
    // (worker, its inbox, whether to write it, where to wake it)
    let changed: Vec<(String, Vec<RecoveryId>, bool, Option<String>)> = inboxes
        .into_iter()
        .filter_map(|(worker, recoveries)| {
            let before = observer.inboxes.get(&worker);
            let landed = offered.contains_key(&worker);
            let write = before != Some(&recoveries) || landed;
            let gained = recoveries
                .iter()
                .any(|id| !before.is_some_and(|list| list.contains(id)));
            if !write {
                return None;
            }
            let wake = workers
                .iter()
                .find(|w| w.registration.worker == worker)
                .and_then(|w| w.registration.wake.clone())
                .filter(|_| gained || landed);
            Some((worker, recoveries, write, wake))
        })
        .collect();
    let coordinator_wake = options.wake_url();
    let written = futures::stream::iter(changed)
        .map(|(worker, recoveries, write, wake)| {
            let coordinator_wake = coordinator_wake.clone();
            // The offers that landed this tick are named in the wake-up, which then goes out
            // beside the inbox's PUT: the worker starts them from their records without
            // waiting for the inbox. Without one to name, the wake-up follows the PUT, so the
            // woken worker reads the inbox as written.
            let mut named: Vec<RecoveryId> = offered
                .get(&worker)
                .map(|offers| {
                    offers
                        .iter()
                        .map(|offer| offer.record.recovery_id.clone())
                        .filter(|id| recoveries.contains(id))
                        .collect()
                })
                .unwrap_or_default();
            // An offer a wake-up cannot name reaches the worker through the inbox only: then
            // the wake-up follows the PUT.
            if !named.iter().all(crate::fleet::wake::carried) {
                named.clear();
            }
            async move {
                let poke = async {
                    match &wake {
                        Some(url) => match crate::fleet::wake::poke_naming(url, &named).await {
                            Ok(()) => true,
                            Err(error) => {
                                tracing::info!(worker_id = %worker, %error, "worker did not answer its wake-up; offering its new recoveries elsewhere");
                                false
                            }
                        },
                        None => true,
                    }
                };
                let put = async {
                    if !write {
                        return Ok(());
                    }
                    let inbox = Inbox {
                        format: FORMAT_VERSION,
                        kind: "inbox".into(),
                        worker: worker.clone(),
                        recoveries: recoveries.clone(),
                        coordinator_wake,
                        offers: offered
                            .get(&worker)
                            .map(|offers| {
                                offers
                                    .iter()
                                    .filter(|offer| recoveries.contains(&offer.record.recovery_id))
                                    .cloned()
                                    .collect()
                            })
                            .unwrap_or_default(),
                    };
                    store
                        .put(&layout::inbox(&worker), layout::encode_object(&inbox))
                        .await
                        .map(|_| ())
                };
                let answered = if named.is_empty() {
                    put.await?;
                    poke.await
                } else {
                    let (put, answered) = futures::join!(put, poke);
                    put?;
                    answered
                };
                Ok::<_, StoreError>((worker, recoveries, answered))
            }
        })
        .buffer_unordered(ACTION_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut unanswered = Vec::new();
    for result in written {
        let (worker, recoveries, answered) = result?;
        observer.inboxes.insert(worker.clone(), recoveries);
        if !answered {
            unanswered.push(worker);
        }
    }
    Ok(unanswered)
}

/// Whether the run's index entry is still the one the decision was made on. A tick can take
/// long (a slow store, a paused process): a host may have finished or parked since its entry
/// was listed, and retired its heartbeat, which then looks like death. One GET keeps such a
/// stale decision from fencing a run that is no longer interrupted; the next tick decides
/// again from fresh observations.
async fn still_as_observed(
    store: &Store,
    source: &RunId,
    observed: Option<&IndexEntry>,
) -> Result<bool, IndexError> {
    let current = crate::store::index::read(store, source).await?;
    let same = current.is_some() && current.as_ref() == observed;
    if !same {
        tracing::debug!(source_run = %source, "index entry changed since it was observed; not admitting now");
    }
    Ok(same)
}

/// Admits a recovery of an interrupted source under its deterministic ID, or under the ID
/// that already claimed it (an operator's `rekindle recover` that crashed before indexing).
async fn admit_interrupted(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
) -> crate::Result<bool> {
    let mut id = recovery_id_for(source);
    for _ in 0..2 {
        match admission::admit(store, holder, source, &id, false, Takeover::Now).await {
            Ok(admitted) => {
                tracing::info!(source_run = %source, recovery_id = %id, created = admitted.created, "interrupted run admitted");
                return Ok(true);
            }
            Err(Error::Recovery(RecoveryError::AlreadyRecovered { existing, .. })) => {
                id = existing;
            }
            Err(Error::Recovery(RecoveryError::NothingToRecover { .. })) => {
                // The host committed the end of its run, then died before leaving the index.
                lifecycle::host_finished(store, source).await?;
                return Ok(false);
            }
            Err(error) if admission::nothing_to_continue(&error) => {
                // The host died before its first commit (nothing was acknowledged), or the
                // run was retired: there is nothing to recover.
                tracing::warn!(source_run = %source, "interrupted before its first commit; forgetting it");
                lifecycle::host_finished(store, source).await?;
                return Ok(false);
            }
            Err(other) => return Err(other),
        }
    }
    Ok(false)
}

/// Executes one action; returns whether it changed something another tick should act on
/// at once (an admission, a hand-back, an answer recorded) or, for an assignment, whether the
/// offer landed. A refused, stale or no-op action returns false, so ticks that change nothing
/// never follow each other without a pause.
async fn execute(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    action: &Action,
    runs: &[RunView],
    known: &BTreeMap<&RecoveryId, &(RecoveryRecord, ETag)>,
) -> crate::Result<(bool, Option<Offer>)> {
    let event = |recovery: &RecoveryId, event: Event| {
        let recovery = recovery.clone();
        let observed = known.get(&recovery).map(|&known| known.clone());
        async move {
            match lifecycle::transition(store, &recovery, observed, event).await {
                // Decided on a record that changed since: the next tick decides again.
                Err(LifecycleError::Refused(refused)) => {
                    tracing::debug!(%refused, "stale decision");
                    Ok(None)
                }
                Ok(changed) => Ok(Some(changed)),
                Err(other) => Err(other),
            }
        }
    };
    let progress = match action {
        Action::Admit { source } => {
            let observed = runs.iter().find(|r| r.entry.run_id == *source);
            if still_as_observed(store, source, observed.map(|r| &r.entry)).await? {
                admit_interrupted(store, holder, source).await?
            } else {
                false
            }
        }
        Action::Assign { recovery, worker } => {
            // Decided on the record as observed: if it changed since (a worker claimed it, an
            // attempt failed, another assignment landed), the decision is void and the next
            // tick decides again, rather than re-applying it to a record it never saw.
            let assign = Event::Assign {
                worker: worker.clone(),
            };
            // No version observed (no caller decides so today): decided on a fresh read, still
            // one swap.
            let observed = match known.get(recovery) {
                Some(&observed) => Some(observed.clone()),
                None => recovery::read(store, recovery).await?,
            };
            let assigned = match observed {
                Some(observed) => {
                    match lifecycle::transition_as_observed(store, recovery, observed, assign).await
                    {
                        Err(LifecycleError::Refused(refused)) => {
                            tracing::debug!(%refused, "stale decision");
                            None
                        }
                        other => other?,
                    }
                }
                None => None,
            };
            if assigned.is_some() {
                crate::metrics::count(crate::metrics::RECOVERIES_ASSIGNED);
            }
            // Whether the offer landed (the caller wakes the worker; the tick loop does not
            // count it as progress), and the record as it left it, for the worker's inbox.
            return Ok((
                assigned.is_some(),
                assigned.map(|(record, etag)| Offer {
                    record,
                    etag: etag.0,
                }),
            ));
        }
        Action::Abandon {
            recovery,
            worker,
            attempt,
        } => {
            let record = event(
                recovery,
                Event::Abandon {
                    worker: worker.clone(),
                    attempt: *attempt,
                },
            )
            .await?;
            if let Some((record, _)) = &record {
                tracing::warn!(recovery_id = %recovery, worker_id = %worker, failures = record.failures, "worker died mid-attempt; recovery handed back");
            }
            record.is_some()
        }
        Action::DeadLetter { source, recovery } => {
            if let Some((record, _)) = event(
                recovery,
                Event::DeadLetter {
                    max_failures: options.max_attempts,
                },
            )
            .await?
            {
                crate::metrics::count(crate::metrics::RECOVERIES_DEAD_LETTERED);
                tracing::error!(source_run = %source, recovery_id = %recovery, failures = record.failures, last_error = record.last_error.as_deref().unwrap_or(""), "recovery dead-lettered");
            }
            false
        }
        Action::Answered { recovery } => {
            let answered = event(recovery, Event::Answer).await?.is_some();
            if answered {
                tracing::warn!(recovery_id = %recovery, "an answer was committed but not recorded; the recovery continues");
            }
            answered
        }
        Action::Reconcile { recovery, .. } => {
            if let Some((record, _)) = recovery::read(store, recovery).await? {
                lifecycle::sync_index(store, &record).await?;
            }
            false
        }
    };
    Ok((progress, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::store::faults::FaultyStore;

    /// One memory bucket seen two ways: directly (everyone else), and through a fault
    /// injector with `retry` (the process under test, whose reads a test can hold or fail).
    fn two_views(retry: crate::store::RetryPolicy) -> (Store, Store, Arc<FaultyStore>) {
        let bucket = Arc::new(object_store::memory::InMemory::new());
        let faulty = FaultyStore::new(bucket.clone(), Default::default(), 0);
        let open = |inner: Arc<dyn object_store::ObjectStore>, url: &str| {
            Store::from_parts(
                inner,
                crate::store::Backend::Memory,
                url,
                "",
                retry,
                SystemClock::shared(),
            )
        };
        let direct = open(bucket, "memory://direct");
        let slow = open(faulty.clone(), "memory://faulty");
        (direct, slow, faulty)
    }

    /// Indexes `run` as running under `host`, which declared a 300 ms TTL.
    async fn index_running(store: &Store, run: &RunId, host: &Holder) {
        let mut entry = IndexEntry::new(run.clone(), None, Phase::Running, "f".into(), 0);
        entry.holder = Some(host.heartbeat_key());
        entry.holder_ttl_ms = Some(300);
        crate::store::index::put(store, &entry).await.unwrap();
    }

    /// Registers worker `worker` with `capacity` slots.
    async fn register(store: &Store, worker: &str, capacity: u32) {
        let registration =
            Registration::new(worker, layout::heartbeat(worker), capacity, "f".into());
        store
            .put(
                &layout::worker(worker),
                layout::encode_object(&registration),
            )
            .await
            .unwrap();
    }

    /// Reviewer's finding: the cap on remembered names measured each entry's age twice, so
    /// it kept more than its bound (all of them when ages tie). Exactly the excess goes, the
    /// longest unseen first, and a name named again is kept.
    #[test]
    fn remembered_names_stay_within_their_cap() {
        let mut forwarded = BTreeMap::new();
        let names = |range: std::ops::Range<usize>| {
            range
                .map(|i| RecoveryId::new(format!("named-{i:05}")))
                .collect::<Vec<_>>()
        };
        note_forwarded(&mut forwarded, names(0..FORWARDED_MAX));
        assert_eq!(forwarded.len(), FORWARDED_MAX);
        let again = RecoveryId::new(format!("named-{:05}", 0));
        note_forwarded(
            &mut forwarded,
            std::iter::once(again.clone()).chain(names(FORWARDED_MAX..FORWARDED_MAX + 10)),
        );
        assert_eq!(forwarded.len(), FORWARDED_MAX);
        assert!(forwarded.contains_key(&again));
    }

    /// Regression (issue 30's third scenario): registrations were listed again only when the
    /// set of heartbeat keys changed. A worker restarted under its ID with another
    /// configuration kept its old fingerprint in the coordinator's view (offers matched to it
    /// failed the worker's resume guard), and a worker whose heartbeat was listed before its
    /// registration landed got no work until some other process came or went. The heartbeat
    /// listing carries every registration's version, so both are seen at the next tick.
    #[tokio::test]
    async fn a_registration_that_changed_is_seen_at_the_next_tick() {
        let store = Store::memory(SystemClock::shared());
        let ttl = Duration::from_millis(300);
        let coordinator = Holder::new(&store, "c", ttl);
        let options = CoordinatorOptions::new("c", ttl);
        let mut observer = Observer::default();
        let fingerprints = |observer: &Observer| -> Vec<String> {
            observer
                .registrations
                .values()
                .map(|(_, registration)| registration.fingerprint_sha256.clone())
                .collect()
        };
        // The worker's heartbeat is listed before its registration lands.
        let worker = Holder::with_role(&store, "w", ttl, "worker");
        worker.beat().await.unwrap();
        tick(&store, &coordinator, &options, &mut observer, None)
            .await
            .unwrap();
        assert!(observer.registrations.is_empty());
        let registration = Registration::new("w", worker.heartbeat_key(), 1, "f-old".into());
        store
            .put(&layout::worker("w"), layout::encode_object(&registration))
            .await
            .unwrap();
        tick(&store, &coordinator, &options, &mut observer, None)
            .await
            .unwrap();
        assert_eq!(
            fingerprints(&observer),
            ["f-old"],
            "a late registration not seen"
        );
        // Restarted under its ID with another configuration: the same heartbeat keys.
        let restarted = Holder::with_role(&store, "w", ttl, "worker");
        restarted.beat().await.unwrap();
        let registration = Registration::new("w", restarted.heartbeat_key(), 1, "f-new".into());
        store
            .put(&layout::worker("w"), layout::encode_object(&registration))
            .await
            .unwrap();
        tick(&store, &coordinator, &options, &mut observer, None)
            .await
            .unwrap();
        assert_eq!(
            fingerprints(&observer),
            ["f-new"],
            "the old configuration kept"
        );
        // Unchanged: read from the cache, not again.
        let gets = store.metrics().get;
        tick(&store, &coordinator, &options, &mut observer, None)
            .await
            .unwrap();
        assert_eq!(
            store.metrics().get,
            gets,
            "an unchanged registration read again"
        );
    }

    /// Regression (stale evidence, issue 30's first scenario): the tick listed the heartbeats,
    /// then read registrations and records, and only then read the clock to judge what it had
    /// listed. One slow read inside the tick made a host that keeps beating look silent for
    /// the whole delay, and its run was admitted and fenced. The listing is judged as seen
    /// when it was issued now.
    #[tokio::test]
    async fn a_slow_read_inside_a_tick_does_not_fence_a_beating_host() {
        let (direct, slow, faulty) = two_views(crate::store::RetryPolicy::default());
        let ttl = Duration::from_millis(300);
        let host = Holder::new(&direct, "host", ttl);
        host.beat().await.unwrap();
        let run = RunId::new("beating-host-run");
        let held = host.acquire_new(&run).await.unwrap();
        index_running(&direct, &run, &host).await;
        let coordinator = Holder::new(&slow, "c", ttl);
        let options = CoordinatorOptions::new("c", ttl);
        let mut observer = Observer::default();
        let first = tick(&slow, &coordinator, &options, &mut observer, None)
            .await
            .unwrap();
        assert!(first.actions.is_empty(), "{:?}", first.actions);
        // A worker comes up between the ticks, so the next tick reads its registration; that
        // read's answer takes three TTLs, while the host beats all along.
        let worker = Holder::with_role(&direct, "w", ttl, "worker");
        worker.beat().await.unwrap();
        register(&direct, "w", 1).await;
        let gate = faulty.pause_after_read(&layout::worker("w"));
        let ticking = tokio::spawn(async move {
            let report = tick(&slow, &coordinator, &options, &mut observer, None).await;
            report.map(|report| report.actions)
        });
        gate.reached().await;
        for _ in 0..9 {
            crate::clock::sleep(ttl / 3).await;
            host.beat().await.unwrap();
        }
        gate.release();
        let actions = ticking.await.unwrap().unwrap();
        assert!(
            actions.is_empty(),
            "a host that kept beating was judged gone after one slow read: {actions:?}"
        );
        host.check(&held).await.unwrap();
    }

    /// Regression (issue 30: leadership checked once per tick): a leader that lost its lease
    /// during a slow read inside a tick still admitted (and fenced) what that tick judged.
    /// It checks again before admitting now, and acts on nothing.
    #[tokio::test]
    async fn a_leader_that_lost_its_lease_mid_tick_admits_nothing() {
        let (direct, slow, faulty) = two_views(crate::store::RetryPolicy::default());
        let ttl = Duration::from_millis(300);
        // A run whose host is gone (its heartbeat silent for a TTL since the first tick):
        // the second tick admits it.
        let run = RunId::new("orphaned-run");
        let host = Holder::new(&direct, "host", ttl);
        host.beat().await.unwrap();
        host.acquire_new(&run).await.unwrap();
        index_running(&direct, &run, &host).await;
        let leadership = RunId::new(layout::COORDINATOR_LEASE_RUN);
        let coordinator = Holder::new(&slow, "c", ttl);
        let held = coordinator.acquire(&leadership).await.unwrap();
        let options = CoordinatorOptions::new("c", ttl);
        let mut observer = Observer::default();
        let first = tick(&slow, &coordinator, &options, &mut observer, Some(&held))
            .await
            .unwrap();
        assert!(first.actions.is_empty(), "{:?}", first.actions);
        crate::clock::sleep(ttl + ttl / 3).await;
        // A worker is registered, so the tick reads its registration: that read stalls
        // while another coordinator takes the leadership over.
        let worker = Holder::with_role(&direct, "w", ttl, "worker");
        worker.beat().await.unwrap();
        register(&direct, "w", 1).await;
        let gate = faulty.pause_after_read(&layout::worker("w"));
        let ticking = tokio::spawn(async move {
            tick(&slow, &coordinator, &options, &mut observer, Some(&held))
                .await
                .map(|report| report.actions)
        });
        gate.reached().await;
        let other = Holder::new(&direct, "c2", ttl);
        let view = crate::store::lease::read_lease(&direct, &leadership)
            .await
            .unwrap()
            .unwrap();
        other.take_over(&view).await.unwrap();
        gate.release();
        let ticked = ticking.await.unwrap();
        assert!(
            matches!(ticked, Err(TickError::NotLeading(_))),
            "a leader that lost its lease acted on its tick: {ticked:?}"
        );
        assert!(
            recovery::read(&direct, &recovery_id_for(&run))
                .await
                .unwrap()
                .is_none(),
            "a deposed leader admitted a recovery"
        );
    }

    /// Regression (issue 30's second scenario): one registration read that failed after its
    /// retries returned from the refresh half-way, after the registrations read so far had
    /// been taken out of the map, and after the refresh was marked done: the coordinator knew
    /// only some workers for up to 30 ticks. The failed one keeps what was read before now,
    /// at its old version, so it is read again at the next listing.
    #[tokio::test]
    async fn a_failed_registration_read_keeps_the_map_of_workers_whole() {
        use crate::store::faults::FaultPlan;
        let (_, store, faulty) = two_views(crate::store::RetryPolicy {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            max_retries: 2,
            attempt_timeout: Duration::from_secs(1),
        });
        register(&store, "w1", 1).await;
        register(&store, "w2", 1).await;
        let listing = |store: Store| async move {
            store
                .list_all(layout::workers_prefix())
                .await
                .unwrap()
                .into_iter()
                .map(|listed| (listed.key, listed.etag))
                .collect::<Vec<_>>()
        };
        let mut observer = Observer::default();
        refresh_registrations(&store, &mut observer, &listing(store.clone()).await).await;
        assert_eq!(observer.registrations.len(), 2);
        // Both change; the first is read again, then the store fails every request.
        register(&store, "w1", 2).await;
        register(&store, "w2", 2).await;
        let mut keys = [layout::worker("w1"), layout::worker("w2")];
        keys.sort();
        let gate = faulty.pause_after_read(&keys[0]);
        let listed = listing(store.clone()).await;
        let refreshing = tokio::spawn(async move {
            refresh_registrations(&store, &mut observer, &listed).await;
            (store, observer)
        });
        gate.reached().await;
        faulty.set_plan(FaultPlan {
            error_per_mille: 1000,
            ..FaultPlan::default()
        });
        gate.release();
        let (store, mut observer) = refreshing.await.unwrap();
        let workers: Vec<&str> = observer
            .registrations
            .values()
            .map(|(_, registration)| registration.worker.as_str())
            .collect();
        assert_eq!(
            workers.len(),
            2,
            "the map of workers lost some: {workers:?}"
        );
        // The store is back: the one kept at its old version is read again.
        faulty.set_plan(FaultPlan::default());
        refresh_registrations(&store, &mut observer, &listing(store.clone()).await).await;
        let capacities: Vec<u32> = observer
            .registrations
            .values()
            .map(|(_, registration)| registration.capacity)
            .collect();
        assert_eq!(capacities, [2, 2], "a registration kept stale");
    }

    /// A heartbeat an index entry names but the listing does not show is judged at the absent
    /// version for a TTL, like any version: a process whose heartbeat was removed (as a dead
    /// process's, just as it came back under its ID) writes it again within a third of its
    /// TTL. Only absent for a whole TTL is its holder gone.
    #[tokio::test]
    async fn an_absent_named_heartbeat_is_gone_only_after_a_ttl() {
        let store = Store::memory(SystemClock::shared());
        let ttl = Duration::from_millis(300);
        let options = CoordinatorOptions::new("c", ttl);
        let mut observer = Observer::default();
        let host = Holder::new(&store, "host", ttl);
        let mut entry = IndexEntry::new(RunId::new("r"), None, Phase::Running, "f".into(), 0);
        entry.holder = Some(host.heartbeat_key());
        entry.holder_ttl_ms = Some(300);
        let runs = [RunView {
            entry,
            holder_alive: false,
            recovery: None,
            answered: false,
        }];
        let key = host.heartbeat_key();
        let judge = |observer: &mut Observer| {
            let seen = Seen::at(store.clock().monotonic());
            judge_liveness(&options, observer, &runs, Vec::new(), seen)
                .get(&key)
                .copied()
        };
        assert_eq!(
            judge(&mut observer),
            Some(true),
            "gone at first sight of absence"
        );
        crate::clock::sleep(Duration::from_millis(150)).await;
        assert_eq!(judge(&mut observer), Some(true), "gone within its TTL");
        crate::clock::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            judge(&mut observer),
            Some(false),
            "absent for a TTL, still alive"
        );
    }

    /// An offer waiting on a worker whose slots all run is queued, not untaken: however long
    /// the worker's recoveries take, it is not passed over for it. Once the worker has a slot
    /// free and still leaves the offer for its TTL, it is.
    #[tokio::test(start_paused = true)]
    async fn a_queued_offer_is_not_untaken_while_its_worker_is_full() {
        let key = layout::heartbeat("w");
        let mut registration = Registration::new("w", key.clone(), 1, "f".into());
        registration.queue = Some(1);
        registration.ttl_ms = Some(30_000);
        let mut observer = Observer::default();
        observer
            .registrations
            .insert(layout::worker("w"), (None, registration));
        let versions = BTreeMap::from([(key, ETag("v1".into()))]);
        let ttl = Duration::from_secs(30);
        let view = |name: &str, state: RecoveryState| {
            let source = RunId::new(name);
            let recovery_id = recovery_id_for(&source);
            let mut entry = IndexEntry::new(source.clone(), None, Phase::Recovering, "f".into(), 0);
            entry.recovery_id = Some(recovery_id.clone());
            let record: RecoveryRecord = serde_json::from_value(serde_json::json!({
                "format": 1, "kind": "recovery", "recovery_id": recovery_id,
                "source_run": source, "source_generation": 3, "source_digest": "d",
                "source_epoch": 1, "state": state, "force": false, "attempts": 0,
                "failures": 0, "assigned_to": "w", "fingerprint_sha256": "f",
                "admitted_at_ms": 0, "updated_at_ms": 0,
            }))
            .expect("a record");
            RunView {
                entry,
                holder_alive: false,
                recovery: Some(record),
                answered: false,
            }
        };
        let full = [
            view("running", RecoveryState::Running),
            view("waiting", RecoveryState::Admitted),
        ];
        for _ in 0..4 {
            pass_over_untaken_offers(&mut observer, &full, &versions, ttl);
            tokio::time::advance(Duration::from_secs(20)).await;
        }
        pass_over_untaken_offers(&mut observer, &full, &versions, ttl);
        assert!(observer.unreachable.is_empty(), "passed over while full");
        // The running one ended: the slot is free, and the offer is left for a TTL.
        let free = [view("waiting", RecoveryState::Admitted)];
        pass_over_untaken_offers(&mut observer, &free, &versions, ttl);
        tokio::time::advance(Duration::from_secs(31)).await;
        pass_over_untaken_offers(&mut observer, &free, &versions, ttl);
        assert!(observer.unreachable.contains_key("w"), "never passed over");
    }
}
