//! Retention: removing superseded generations, and retiring runs that ended long ago.
//!
//! This module decides what may be deleted from the bucket and deletes it. It never deletes a
//! run's lease, its `recovered-by` claim, its tombstone, its hint, a recovery record
//! (`recoveries/...`), or the first generation of any epoch: those are small and live forever,
//! so a run ID, an epoch, a slot or a recovery ID is never used twice (see the retention
//! contract in ARCHITECTURE.md). gc lists the bucket: it is a maintenance command, never part
//! of a hot loop.
//!
//! Architecture invariant: gc never frees a slot a stale writer could reuse. A stale writer
//! can only aim at the slot right after the last generation it knew, which is always the
//! first generation of some later epoch (the fence its successor wrote) — or a slot it wrote
//! itself, whose content is already part of a later snapshot. gc therefore keeps, for every
//! run, the newest snapshot and everything after it, plus the first generation of every epoch
//! (listed in each generation's `epoch_starts`); it deletes the other generations below the
//! snapshot, and only once that snapshot is older than the grace period.
//!
//! Architecture invariant: gc deletes a generation only below a snapshot the hint already
//! points at, or after the hint was marked retired; the hint only moves forward. That is what
//! makes `Chain::locate`'s second hint read sufficient (see there) and lets `load` restart
//! from the new hint when a generation vanishes under it.
//!
//! Architecture invariant: retention never resurrects a run, and nothing is acknowledged into
//! a retired one. A run that ended longer ago than the retention period (terminal, lease
//! released, not in the index), or one an operator retires (`runs rm`), is retired in an order
//! that a crash between any two steps leaves finishable ([`retire`]): (0) its lease reserved
//! at a new epoch and marked retired, by compare-and-swap on the version judged, so no holder
//! takes it again; (1) a run that has not ended fenced at that epoch (generation 1 if it has
//! none); (2) its tombstone, create-if-absent, recording outcome, that epoch, final generation
//! and epoch starts; (3) the hint marked retired; (4) deletion of its other generations and
//! loop checkpoints. The next gc finishes from a reserved lease or a tombstone; `load`
//! refuses the run as retired from (3) on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::core::epoch::Epoch;
use crate::core::fact::RunId;
use crate::core::layout;
use crate::store::generation::{self, Chain, GenerationError, RunWriter, SnapshotPolicy};
use crate::store::lease::LeaseError;
use crate::store::tombstone::{self, RetiredBy, Tombstone, TombstoneError};
use crate::store::{ETag, Store, StoreError};

/// How long things stay.
#[derive(Clone, Copy, Debug)]
pub struct GcPolicy {
    /// A run that ended is retired this long after its final generation.
    pub retention: Duration,
    /// Nothing is deleted because of a snapshot younger than this, and no run is retired
    /// sooner than this after its final generation. It must be much longer than any request
    /// deadline (with its retries) plus the clock skew between writers and gc: it is what
    /// keeps a slow reader's in-flight requests away from what gc deletes. Correctness does
    /// not rest on it (see `Chain::locate` and `generation::load`); it makes the retry paths
    /// rare.
    pub grace: Duration,
}

/// The default grace period: an hour, against request deadlines of seconds.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

impl Default for GcPolicy {
    /// A week of retention (as `rekindle gc` defaults to) and the default grace period.
    fn default() -> Self {
        GcPolicy {
            retention: Duration::from_secs(168 * 3600),
            grace: DEFAULT_GRACE,
        }
    }
}

impl GcPolicy {
    /// `retention`, with the default grace period.
    pub fn retention(retention: Duration) -> Self {
        GcPolicy {
            retention,
            grace: DEFAULT_GRACE,
        }
    }
}

/// What one gc pass did, for the operator and `rekindle gc --json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Runs whose generation chains were examined.
    pub runs_scanned: u64,
    /// Superseded generations deleted below a snapshot older than the grace period.
    pub generations_deleted: u64,
    /// Superseded generations kept because their snapshot is younger than the grace period.
    pub generations_in_grace: u64,
    /// Finished runs retired in this pass: tombstone written, checkpoint removed but for the
    /// epochs' first slots; lease, claim and recovery records kept.
    pub runs_retired: u64,
    /// Heartbeats of processes gone for longer than their TTL plus the grace period, and
    /// named by no index entry, deleted (a dead worker's registration and inbox with it), and
    /// the memberships of coordinators whose heartbeat is gone.
    pub heartbeats_deleted: u64,
    /// Registrations (with their inboxes) of such dead workers, or of workers whose
    /// heartbeat is gone, deleted; and inboxes of workers no longer registered.
    pub workers_deleted: u64,
    /// Objects that could not be read, with the reason; they were left alone.
    pub skipped: Vec<String>,
}

/// Why a gc pass stopped; what it deleted before stopping stays deleted and is safe.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The store failed underneath; the next gc pass picks up where this one stopped.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A run's tombstone could not be written or read; the run was left as it was.
    #[error(transparent)]
    Tombstone(#[from] TombstoneError),
    /// A run's lease could not be read or reserved for its retirement (it changed since it
    /// was judged, or does not decode); the run was left as it was.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// A run could not be retired: it is already marked retired, or the fence that stops its
    /// last writer could not be written; the run keeps its generations. `error` names the run
    /// already, and is part of the message rather than its `source`.
    #[error("cannot retire: {error}")]
    Retire {
        /// The run gc was retiring.
        run: RunId,
        /// What refused: the chain was already retired, or the fence write failed.
        error: GenerationError,
    },
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How gc tells an object's age: on the store's own clock where the store reports
/// modification times, so a writer whose clock lags cannot make what it wrote look old.
///
/// Each pass rewrites `gc/clock` and lists it back: its modification time is the store's
/// "now" at that moment, and `now_ms` (gc's own clock, which a caller may set ahead to ask
/// what a later pass would do) moves it on by gc's own elapsed time, so no two machines'
/// clocks are ever compared. An object's age is then that "now" minus the modification time
/// the store listed for it. Where either time is missing (a store that reports none, or a dry
/// run, which writes nothing), the age falls back to gc's clock against the `at_ms` the writer
/// recorded, as before.
#[derive(Clone, Copy, Debug)]
struct StoreClock {
    /// gc's clock for this pass.
    now_ms: u64,
    /// The store's clock for this pass: the marker's modification time, moved on by what gc's
    /// clock says passed since it was written.
    store_now_ms: Option<u64>,
}

impl StoreClock {
    /// Reads the store's clock by rewriting the marker (nothing, in a dry run).
    async fn read(store: &Store, now_ms: u64, dry_run: bool) -> Result<StoreClock, StoreError> {
        if dry_run {
            return Ok(StoreClock {
                now_ms,
                store_now_ms: None,
            });
        }
        let key = layout::gc_clock();
        let written_at_ms = store.clock().wall_ms();
        let marker = layout::encode_object(&serde_json::json!({
            "format": layout::FORMAT_VERSION,
            "kind": "gc.clock",
            "at_ms": written_at_ms,
        }));
        match store.put(key, marker).await {
            Ok(_) => {}
            // Credentials that may delete but not write this one key: ages as before.
            Err(error @ StoreError::Denied { .. }) => {
                tracing::warn!(%error, "cannot write the gc clock marker; judging ages by the writers' clocks");
                return Ok(StoreClock {
                    now_ms,
                    store_now_ms: None,
                });
            }
            Err(error) => return Err(error),
        }
        let marker = store
            .list("gc/", None, 16)
            .await?
            .into_iter()
            .find(|listed| listed.key == key)
            .and_then(|listed| listed.modified_ms);
        Ok(StoreClock {
            now_ms,
            store_now_ms: marker
                .map(|marker| marker.saturating_add(now_ms.saturating_sub(written_at_ms))),
        })
    }

    /// How old an object is: on the store's clock if the listing gave its modification time,
    /// else by `at_ms`, the time its writer recorded.
    /// An object the listing did not hold, on a store that reports times, was written after
    /// the listing: it is new.
    fn age_ms(&self, modified_ms: Option<u64>, at_ms: u64) -> u64 {
        match (self.store_now_ms, modified_ms) {
            (Some(now), Some(modified)) => now.saturating_sub(modified),
            (Some(_), None) => 0,
            (None, _) => self.now_ms.saturating_sub(at_ms),
        }
    }
}

/// Whether gc retires `run` now, and on which lease version (see [`retire`]): a run whose
/// lease a retirement already reserved (one that crashed before its tombstone), or one that
/// ended (terminal fact), is not leased, not in the index, and whose newest generation is
/// older than both the retention and the grace period. A lease that does not read keeps the
/// run as it is.
async fn retirement_due(
    store: &Store,
    run: &RunId,
    policy: &GcPolicy,
    clock: &StoreClock,
    modified: &BTreeMap<String, Option<u64>>,
) -> Result<Option<Option<ETag>>, StoreError> {
    let lease = match crate::store::lease::read_lease(store, run).await {
        Ok(lease) => lease,
        Err(_) => return Ok(None),
    };
    if let Some(view) = &lease
        && view.lease.retired
    {
        return Ok(Some(Some(view.etag.clone())));
    }
    if lease.as_ref().is_some_and(|view| !view.lease.released) {
        return Ok(None);
    }
    let Ok(loaded) = generation::load(store, run, None).await else {
        return Ok(None);
    };
    if loaded.state.terminal().is_none() {
        return Ok(None);
    }
    if store
        .head(&layout::index_entry(run.as_str()))
        .await?
        .is_some()
    {
        return Ok(None);
    }
    let newest = Chain::new(store, layout::run_base(run.as_str()));
    let at_ms = match store.read(&newest.key(loaded.generation)).await? {
        Some(object) => generation::decode_with(
            store.sealer(),
            &newest.key(loaded.generation),
            run,
            &object.bytes,
        )
        .map_or(u64::MAX, |g| g.at_ms),
        None => u64::MAX,
    };
    let keep_ms = millis(policy.retention.max(policy.grace));
    let age_ms = clock.age_ms(
        modified
            .get(&newest.key(loaded.generation))
            .copied()
            .flatten(),
        at_ms,
    );
    Ok((at_ms != u64::MAX && age_ms > keep_ms).then(|| lease.map(|view| view.etag)))
}

/// Every key under `prefix`.
async fn list_all(store: &Store, prefix: &str) -> Result<Vec<String>, StoreError> {
    let listed = store.list_all(prefix).await?;
    Ok(listed.into_iter().map(|listed| listed.key).collect())
}

/// The keys under a retired run's `base` that retirement deletes: everything but the lease,
/// the recovery claim, the tombstone, the hint and each epoch's first generation.
fn retirable<'a>(
    base: &str,
    tombstone: &Tombstone,
    keys: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    let kept: BTreeSet<String> = [
        layout::lease(tombstone.run_id.as_str()),
        layout::recovered_by(tombstone.run_id.as_str()),
        layout::tombstone(tombstone.run_id.as_str()),
        layout::head(base),
    ]
    .into_iter()
    .chain(
        tombstone
            .epoch_starts
            .iter()
            .map(|&(_, n)| layout::generation(base, n)),
    )
    .collect();
    let under = format!("{base}/");
    keys.into_iter()
        .filter(|key| key.starts_with(&under) && !kept.contains(*key))
        .cloned()
        .collect()
}

/// Steps (3) and (4) of a retirement: marks the hint retired, then deletes what
/// [`retirable`] names. Safe to repeat.
async fn retire_chain(
    store: &Store,
    base: &str,
    tombstone: &Tombstone,
    keys: &[String],
) -> Result<u64, GcError> {
    let doomed = retirable(base, tombstone, keys);
    // Marked even when nothing is left to delete: a run whose every generation starts an
    // epoch must still stop loading as a live run.
    Chain::new(store, base.to_owned())
        .retire_hint(tombstone.final_generation)
        .await?;
    for key in &doomed {
        store.delete(key).await?;
    }
    Ok(doomed.len() as u64)
}

/// The writer a retirement's fence names (`<this>/<nonce>`): whoever finishes a retirement
/// at its reserved epoch, gc or `runs rm`, holds the same holding, so a retirement that
/// crashed after its fence is finished on the fence it wrote.
pub const RETIREMENT_WRITER: &str = "(retirement)";

/// The tombstone to retire `run` with: the existing one, or a new one written now, after the
/// lease is reserved and the run fenced at the reserved epoch (see [`retire`]).
async fn tombstone_for(
    store: &Store,
    run: &RunId,
    retired_by: RetiredBy,
    judged: Option<&ETag>,
    keys: &[String],
) -> Result<Tombstone, GcError> {
    if let Some(existing) = tombstone::read(store, run).await? {
        return Ok(existing);
    }
    let retire_error = |error| GcError::Retire {
        run: run.clone(),
        error,
    };
    // What the chain holds decides where the fence goes and the lowest epoch it may take.
    let found = match generation::load(store, run, None).await {
        Ok(loaded) => Found::Loaded(Box::new(loaded)),
        Err(GenerationError::NotFound { .. }) => Found::Empty,
        Err(error @ GenerationError::Retired { .. }) => {
            // Another retirement wrote the tombstone meanwhile: finish from it.
            return match tombstone::read(store, run).await? {
                Some(existing) => Ok(existing),
                None => Err(retire_error(error)),
            };
        }
        // A damaged chain can still be retired (that is what `runs rm` is for), keeping every
        // generation whose epoch starts cannot be read from the others.
        Err(error) if error.is_damage() => {
            tracing::warn!(run_id = %run, %error, "retiring a chain that does not load");
            let base = layout::run_base(run.as_str());
            let (_, last_epoch, final_generation, epoch_starts) =
                damaged_chain_starts(store, run, &base, keys).await?;
            Found::Damaged {
                last_epoch,
                final_generation,
                epoch_starts,
            }
        }
        Err(error) => return Err(retire_error(error)),
    };
    let floor = match &found {
        Found::Loaded(loaded) => loaded.epoch.next(),
        Found::Empty => Epoch(1),
        Found::Damaged { last_epoch, .. } => last_epoch.next(),
    };
    // The lease next: one compare-and-swap on the version the caller judged takes the epoch
    // after it (at least `floor`) and marks the lease retired, so no holder takes the run from
    // here on, and the fence below is the only holding at that epoch.
    let epoch = crate::store::lease::reserve_for_retirement(store, run, judged, floor).await?;
    let fencing = store.writing_as(RETIREMENT_WRITER);
    let policy = SnapshotPolicy::default();
    let fenced = |fence: RunWriter| {
        (
            fence.state().terminal().map(|terminal| terminal.outcome),
            fence.generation(),
            fence.epoch_starts().to_vec(),
        )
    };
    let (outcome, final_generation, epoch_starts) = match found {
        // A run that ended has no writer left: its last holder stopped at the terminal fact,
        // and every earlier one aims at a slot a later epoch's fence already holds.
        Found::Loaded(loaded) if loaded.state.terminal().is_some() => (
            loaded.state.terminal().map(|terminal| terminal.outcome),
            loaded.generation,
            loaded.epoch_starts,
        ),
        // The fence goes into the slot after the newest generation, at the reserved epoch: a
        // holder that only seemed gone aims at that slot and finds it taken.
        Found::Loaded(loaded) => fenced(
            RunWriter::resume_from(&fencing, run, epoch, policy, Some(*loaded))
                .await
                .map_err(retire_error)?,
        ),
        // No generation yet: a host that took the lease may still write generation 1 and
        // everything after. An empty fence there makes its first commit fail.
        Found::Empty => {
            match RunWriter::create_as(&fencing, run.clone(), Vec::new(), epoch, policy).await {
                Ok(fence) => fenced(fence),
                Err(GenerationError::AlreadyExists { .. }) => fenced(
                    RunWriter::resume(&fencing, run, epoch, policy)
                        .await
                        .map_err(retire_error)?,
                ),
                Err(error) => return Err(retire_error(error)),
            }
        }
        // Its next slot is not known, so it cannot be fenced: the reserved lease stops every
        // new holder, and only the lease check of `runs rm` (overridden by --force, the
        // operator's word that the holder is gone) stands between an old live writer and it.
        Found::Damaged {
            final_generation,
            epoch_starts,
            ..
        } => (None, final_generation, epoch_starts),
    };
    let fresh = Tombstone::new(
        run,
        outcome,
        epoch,
        final_generation,
        epoch_starts,
        retired_by,
        store.clock().wall_ms(),
    );
    Ok(tombstone::write(store, &fresh).await?)
}

/// What a retirement found in the chain it is about to fence.
enum Found {
    Loaded(Box<generation::Loaded>),
    Empty,
    Damaged {
        last_epoch: Epoch,
        final_generation: u64,
        epoch_starts: Vec<(Epoch, u64)>,
    },
}

/// For a chain that does not load: the union of the epoch starts recorded in every
/// generation that decodes, plus every generation that does not (it cannot be judged, so it
/// is kept as if it started an epoch).
async fn damaged_chain_starts(
    store: &Store,
    run: &RunId,
    base: &str,
    keys: &[String],
) -> Result<
    (
        Option<crate::core::fact::Outcome>,
        Epoch,
        u64,
        Vec<(Epoch, u64)>,
    ),
    GcError,
> {
    let prefix = format!("{base}/gen/");
    let mut starts: BTreeSet<(Epoch, u64)> = BTreeSet::new();
    let (mut last_epoch, mut final_generation) = (Epoch::ZERO, 0);
    for key in keys.iter().filter(|key| key.starts_with(&prefix)) {
        let Some(n) = layout::generation_number(key) else {
            continue;
        };
        final_generation = final_generation.max(n);
        let decoded = match store.read(key).await? {
            Some(object) => generation::decode_with(store.sealer(), key, run, &object.bytes).ok(),
            None => continue,
        };
        match decoded {
            Some(generation) => {
                last_epoch = last_epoch.max(generation.epoch);
                starts.extend(generation.epoch_starts);
            }
            None => {
                starts.insert((Epoch::ZERO, n));
            }
        }
    }
    Ok((
        None,
        last_epoch,
        final_generation,
        starts.into_iter().collect(),
    ))
}

/// Retires `run` now, in an order a crash between any two steps leaves finishable:
/// (1) reserves the lease (`lease::reserve_for_retirement`: the next epoch, marked retired,
/// by compare-and-swap on `judged`, the lease version the caller decided on; `None` when it
/// found no lease); (2) fences the run at that epoch in the slot after its newest generation,
/// or with an empty generation 1 if it has none; (3) writes its tombstone; (4) marks its hint
/// retired; (5) deletes its generations and loop checkpoints except each epoch's first. A
/// retirement already reserved or tombstoned is finished whatever `judged` says. The lease,
/// the recovery claim, recovery records and the tombstone stay, so the run cannot be resumed,
/// created again or recovered again, and its stale writers stay fenced. Returns the number of
/// objects deleted. Used by gc and by `rekindle runs rm` ("retire now").
pub async fn retire(
    store: &Store,
    run: &RunId,
    retired_by: RetiredBy,
    judged: Option<&ETag>,
) -> Result<u64, GcError> {
    let base = layout::run_base(run.as_str());
    let keys = list_all(store, &format!("{base}/")).await?;
    let tombstone = tombstone_for(store, run, retired_by, judged, &keys).await?;
    // The fence is not in this listing, and is an epoch's first slot anyway; a generation
    // that landed after the listing, before the fence, is left for the next gc to delete.
    retire_chain(store, &base, &tombstone, &keys).await
}

/// Runs one gc pass at `now_ms` (the gc process's wall clock; later to ask what a later pass
/// would do).
///
/// Ages are judged on the store's own clock where the store reports modification times (see
/// `StoreClock`): the pass rewrites `gc/clock`, reads the store's "now" from its listing, and
/// compares it with the modification times the store listed, so neither gc's clock nor a
/// writer's enters. Without them it falls back to `at_ms` recorded by the writer, whose skew
/// against gc shifts a deletion by the skew. Correctness never rests on the grace period: a
/// probe rereads the hint, a load restarts from it.
pub async fn collect(store: &Store, policy: &GcPolicy, now_ms: u64) -> Result<GcReport, GcError> {
    collect_or_count(store, policy, now_ms, false).await
}

/// What [`collect`] would do now, doing nothing: the same scan and decisions, counted, with
/// no delete, no tombstone and no retirement finished (`rekindle gc --dry-run`).
pub async fn dry_run(store: &Store, policy: &GcPolicy, now_ms: u64) -> Result<GcReport, GcError> {
    collect_or_count(store, policy, now_ms, true).await
}

/// Deletes what processes that died long ago left behind: their heartbeats (last written
/// longer ago than their declared TTL plus the grace period, and at least eleven TTLs, on gc's
/// clock, and named by no index entry), and, for a worker whose heartbeat goes, its registration and inbox. A
/// process killed -9 cannot clean up after itself; without this, every LIST of heartbeats
/// and registrations grows with every process that ever died. A process that was only
/// paused that long was judged dead long before (its runs recovered); its next beat writes
/// its heartbeat again, and a worker registers again (`worker::run` after a long pause).
async fn sweep_dead_processes(
    store: &Store,
    policy: &GcPolicy,
    clock: &StoreClock,
    dry_run: bool,
    report: &mut GcReport,
) -> Result<(), GcError> {
    let (entries, bad) = crate::store::index::IndexScan::default()
        .scan(store)
        .await?;
    if let Some(bad) = bad.first() {
        // An unreadable entry might name any heartbeat: keep them all this pass.
        report.skipped.push(format!("{}: {}", bad.key, bad.error));
        return Ok(());
    }
    let named: BTreeSet<String> = entries.into_iter().filter_map(|e| e.holder).collect();
    // Listed in this order, each before what it depends on: a worker beats before it
    // registers, and the coordinator writes an inbox only for a registered worker, so a
    // registration listed here has its heartbeat in the later listing unless it is gone,
    // and an inbox its registration.
    let inboxes = list_all(store, layout::inbox_prefix()).await?;
    let registrations = list_all(store, layout::workers_prefix()).await?;
    let listed = store.list_all(layout::heartbeats_prefix()).await?;
    let members: Vec<String> = listed
        .iter()
        .filter(|listed| layout::is_member(&listed.key))
        .map(|listed| listed.key.clone())
        .collect();
    let heartbeats: BTreeMap<String, Option<u64>> = listed
        .into_iter()
        .filter(|listed| layout::is_heartbeat(&listed.key))
        .map(|listed| (listed.key, listed.modified_ms))
        .collect();
    let grace = millis(policy.grace);
    // Judged on the store's clock where it reports times (`StoreClock`), else on gc's against
    // the writer's: the margin (the grace period, and never less than ten TTLs) must then
    // dwarf the clock skew between machines.
    let dead_after = |ttl_ms: u64| ttl_ms.saturating_add(grace.max(ttl_ms.saturating_mul(10)));
    let mut dead = BTreeSet::new();
    for (key, modified_ms) in heartbeats.iter() {
        let key = key.clone();
        match crate::store::lease::read_heartbeat(store, &key).await {
            Ok(Some((beat, _)))
                if !named.contains(&key)
                    && clock.age_ms(*modified_ms, beat.at_ms) > dead_after(beat.ttl_ms) =>
            {
                if !dry_run {
                    store.delete(&key).await?;
                }
                report.heartbeats_deleted += 1;
                dead.insert(key);
            }
            Ok(_) => {}
            Err(error) => report.skipped.push(error.to_string()),
        }
    }
    // A coordinator's membership goes with its heartbeat (a coordinator beats before it joins,
    // and one listing shows both): a crashed coordinator's share is the others' already.
    for key in members {
        let beat = layout::member_heartbeat(&key).unwrap_or_default();
        if dead.contains(&beat) || !heartbeats.contains_key(&beat) {
            if !dry_run {
                store.delete(&key).await?;
            }
            report.heartbeats_deleted += 1;
        }
    }
    let registered: BTreeSet<String> = registrations.iter().cloned().collect();
    for key in registrations {
        let Some(object) = store.read(&key).await? else {
            continue;
        };
        let registration = match layout::decode_object::<crate::core::assignment::Registration>(
            &key,
            crate::core::assignment::REGISTRATION_KIND,
            &object.bytes,
        ) {
            Ok(registration) => registration,
            Err(error) => {
                report.skipped.push(error.to_string());
                continue;
            }
        };
        // Dead now, or gone already (removed by the coordinator, whose crash or a stopping
        // worker's left the registration behind).
        if dead.contains(&registration.heartbeat)
            || !heartbeats.contains_key(&registration.heartbeat)
        {
            if !dry_run {
                store.delete(&layout::inbox(&registration.worker)).await?;
                store.delete(&key).await?;
            }
            report.workers_deleted += 1;
        }
    }
    // Registrations where they lived before they moved beside the heartbeats: no worker of
    // this build reads or writes them.
    for key in list_all(store, layout::legacy_workers_prefix()).await? {
        if !dry_run {
            store.delete(&key).await?;
        }
        report.workers_deleted += 1;
    }
    // An inbox whose worker was not registered (one a stale leader wrote after its worker
    // stopped): nothing reads it. (A deleted registration's inbox went with it.)
    for key in inboxes {
        let registration = key
            .strip_prefix(layout::inbox_prefix())
            .map(|rest| format!("{}{rest}", layout::workers_prefix()));
        if registration.is_some_and(|registration| !registered.contains(&registration)) {
            if !dry_run {
                store.delete(&key).await?;
            }
            report.workers_deleted += 1;
        }
    }
    Ok(())
}

async fn collect_or_count(
    store: &Store,
    policy: &GcPolicy,
    now_ms: u64,
    dry_run: bool,
) -> Result<GcReport, GcError> {
    let mut report = GcReport::default();
    let clock = StoreClock::read(store, now_ms, dry_run).await?;
    sweep_dead_processes(store, policy, &clock, dry_run, &mut report).await?;
    let listed = store.list_all(layout::runs_prefix()).await?;
    let modified: BTreeMap<String, Option<u64>> = listed
        .iter()
        .map(|listed| (listed.key.clone(), listed.modified_ms))
        .collect();
    let keys: Vec<String> = listed.into_iter().map(|listed| listed.key).collect();
    // Group keys by the run they belong to ("runs/<shard>/<run>"): runs with generations,
    // and retired runs (tombstone), whose retirement a crash may have left unfinished.
    let mut runs: BTreeSet<String> = BTreeSet::new();
    let mut leased: BTreeSet<String> = BTreeSet::new();
    for key in &keys {
        if let Some((base, _)) = key.split_once("/gen/")
            && !base.ends_with("/loop")
        {
            runs.insert(base.to_owned());
        } else if let Some(base) = key.strip_suffix("/tombstone") {
            runs.insert(base.to_owned());
        } else if let Some(base) = key.strip_suffix("/lease") {
            leased.insert(base.to_owned());
        }
    }
    // A run with a lease and nothing else: it never committed, or a retirement reserved its
    // lease and stopped before its fence (a crash). That one is finished here; the lease names
    // the run, which its key does not.
    for base in leased.difference(&runs) {
        let key = format!("{base}/lease");
        let Some(object) = store.read(&key).await? else {
            continue;
        };
        match layout::decode_object::<crate::store::lease::Lease>(
            &key,
            crate::store::lease::LEASE_KIND,
            &object.bytes,
        ) {
            Ok(lease) if lease.retired && !layout::is_coordinator_lease(lease.run_id.as_str()) => {
                if !dry_run {
                    retire(store, &lease.run_id, RetiredBy::Removal, None).await?;
                }
                report.runs_retired += 1;
            }
            Ok(_) => {}
            Err(error) => report.skipped.push(error.to_string()),
        }
    }
    for base in runs {
        report.runs_scanned += 1;
        let under = format!("{base}/");
        let run_keys: Vec<String> = keys
            .iter()
            .filter(|key| key.starts_with(&under))
            .cloned()
            .collect();
        let tombstone_key = format!("{base}/tombstone");
        if run_keys.contains(&tombstone_key) {
            if dry_run {
                continue;
            }
            // Retired: finish what a crashed retirement left (usually nothing to do).
            let Some(object) = store.read(&tombstone_key).await? else {
                continue;
            };
            match tombstone::decode(&tombstone_key, &object.bytes) {
                Ok(tombstone) => match retire_chain(store, &base, &tombstone, &run_keys).await {
                    Ok(deleted) => report.generations_deleted += deleted,
                    Err(GcError::Store(StoreError::Object(error))) => {
                        report.skipped.push(error.to_string());
                    }
                    Err(error) => return Err(error),
                },
                Err(error) => report.skipped.push(error.to_string()),
            }
            continue;
        }
        let chain = Chain::new(store, base.clone());
        // No hint: the run never snapshotted past its first generation (a hint at 1 is never
        // written), which is then its snapshot. A hint that does not decode stops this run,
        // not the pass (`runs rm --force` retires such a chain).
        let snapshot = match chain.hint().await {
            Ok(Some((snapshot, _))) => snapshot,
            Ok(None) => 1,
            Err(StoreError::Object(error)) => {
                report.skipped.push(error.to_string());
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let snapshot_key = chain.key(snapshot);
        let Some(object) = store.read(&snapshot_key).await? else {
            report
                .skipped
                .push(format!("{snapshot_key}: hinted snapshot missing"));
            continue;
        };
        // The run ID is inside the object; decode without knowing it first.
        let run_id = serde_json::from_slice::<serde_json::Value>(&object.bytes)
            .ok()
            .and_then(|v| v.get("run_id").and_then(|r| r.as_str()).map(RunId::new));
        let Some(run_id) = run_id else {
            report
                .skipped
                .push(format!("{snapshot_key}: not a run generation"));
            continue;
        };
        let snapshot_generation =
            match generation::decode_with(store.sealer(), &snapshot_key, &run_id, &object.bytes) {
                Ok(generation) if generation.snapshot => generation,
                Ok(_) => {
                    report.skipped.push(format!(
                        "{snapshot_key}: hinted generation is not a snapshot"
                    ));
                    continue;
                }
                Err(error) => {
                    report.skipped.push(error.to_string());
                    continue;
                }
            };
        if let Some(judged) = retirement_due(store, &run_id, policy, &clock, &modified).await? {
            if !dry_run {
                match retire(store, &run_id, RetiredBy::Retention, judged.as_ref()).await {
                    Ok(_) => {}
                    // Taken meanwhile (an answer, a recovery): not finished long ago after all.
                    Err(GcError::Lease(error @ LeaseError::ChangedSinceJudged { .. })) => {
                        report.skipped.push(error.to_string());
                        continue;
                    }
                    Err(error) => return Err(error),
                }
            }
            report.runs_retired += 1;
            continue;
        }
        let keep: BTreeSet<u64> = snapshot_generation
            .epoch_starts
            .iter()
            .map(|&(_, generation)| generation)
            .collect();
        let superseded: Vec<&String> = run_keys
            .iter()
            .filter(|key| key.starts_with(&format!("{base}/gen/")))
            .filter(|key| {
                layout::generation_number(key).is_some_and(|n| n < snapshot && !keep.contains(&n))
            })
            .collect();
        // Every superseded generation was created before its snapshot (slots are created in
        // order), so once the snapshot is older than the grace period, so are they: one age
        // check, on an object gc has read anyway (its age on the store's clock, see
        // `StoreClock`).
        let snapshot_age = clock.age_ms(
            modified.get(&snapshot_key).copied().flatten(),
            snapshot_generation.at_ms,
        );
        if snapshot_age <= millis(policy.grace) {
            report.generations_in_grace += superseded.len() as u64;
            continue;
        }
        for key in superseded {
            if !dry_run {
                store.delete(key).await?;
            }
            report.generations_deleted += 1;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::StoreClock;

    // Proves ages: on the store's clock when it reports one (an object the listing did not
    // hold is new), on the writer's `at_ms` against gc's clock otherwise.
    #[test]
    fn ages_on_the_store_clock() {
        let timed = StoreClock {
            now_ms: 10_000,
            store_now_ms: Some(50_000),
        };
        assert_eq!(timed.age_ms(Some(20_000), 1), 30_000);
        assert_eq!(timed.age_ms(None, 1), 0);
        let untimed = StoreClock {
            now_ms: 10_000,
            store_now_ms: None,
        };
        assert_eq!(untimed.age_ms(Some(20_000), 4_000), 6_000);
    }
}
