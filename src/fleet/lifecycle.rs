//! The lifecycle's executor: writes the events `core::lifecycle::apply` allows, with
//! compare-and-swap, record first and index entry second, and the index entries of a host's own
//! run. The only code that changes a recovery record or an index entry.

use crate::core::epoch::Epoch;
use crate::core::fact::{RecoveryId, RunId};
use crate::core::lifecycle::{Event, Refused, apply, entry_for, index_phase};
use crate::core::record::{IndexEntry, Phase, RecoveryRecord};
use crate::store::generation::GenerationError;
use crate::store::index::{self, IndexError};
use crate::store::lease::LeaseError;
use crate::store::recovery::{self, RecoveryError};
use crate::store::{ETag, Store};

/// Bound on compare-and-swap rounds when a record keeps changing under an event.
const CAS_ATTEMPTS: usize = 8;

/// Why a lifecycle event or a host's index change was not written. The pass-through variants
/// carry the module error that stopped it.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The lifecycle's rules do not allow the event in the recovery's current state.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// Reading or swapping the recovery record failed.
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    /// Writing the source run's index entry failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// Reading the source run's lease, or taking it over to fence the run, failed.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The event names a recovery that has no record.
    #[error("recovery '{recovery_id}' does not exist")]
    Missing {
        /// The recovery that was not found.
        recovery_id: RecoveryId,
    },
    /// The record changed under every one of the bounded compare-and-swap rounds.
    #[error("recovery '{recovery_id}' kept changing; gave up after {CAS_ATTEMPTS} attempts")]
    Contended {
        /// The recovery whose record kept changing.
        recovery_id: RecoveryId,
    },
    /// Fencing the source run before its recovery was admitted failed. `error` names the run
    /// (or its object) already, and is part of the message rather than its `source`, so the
    /// message names both once.
    #[error("cannot fence the source run before admitting its recovery: {error}")]
    Fence {
        /// The source run that could not be fenced.
        run: RunId,
        /// Why fencing it failed.
        error: Box<LifecycleError>,
    },
    /// Loading the source run, or writing its fence generation, failed.
    #[error(transparent)]
    Generation(#[from] GenerationError),
    /// Admission without a takeover saw the source run's holder show a sign of life: its
    /// lease or heartbeat changed while it was watched.
    #[error(
        "run \"{run}\" is held by '{holder}' at epoch {epoch}, whose heartbeat changed within its {ttl_ms} ms TTL: it is alive. Wait for it, or take it over explicitly with the takeover option; then its in-flight tool call may run twice"
    )]
    HolderAlive {
        /// The source run whose holder is alive.
        run: RunId,
        /// The holder ID on the source run's lease.
        holder: String,
        /// The epoch the holder writes at.
        epoch: Epoch,
        /// The TTL the holder declared, which it beat within.
        ttl_ms: u64,
    },
}

/// Brings the source run's index entry in line with `record` (the record is the truth).
pub async fn sync_index(store: &Store, record: &RecoveryRecord) -> Result<(), IndexError> {
    match entry_for(record) {
        Some(entry) => index::put(store, &entry).await.map(|_| ()),
        None => index::remove(store, &record.source_run).await,
    }
}

/// Applies `event` to recovery `id` with compare-and-swap, rereading and re-deciding if the
/// record changed meanwhile; then updates the index entry if the run's phase changed. `known`
/// is a version the caller just read (saves a GET). A refused event changes nothing.
pub async fn transition(
    store: &Store,
    id: &RecoveryId,
    known: Option<(RecoveryRecord, ETag)>,
    event: Event,
) -> Result<(RecoveryRecord, ETag), LifecycleError> {
    let mut current = known;
    for _ in 0..CAS_ATTEMPTS {
        let observed = match current.take() {
            Some(known) => known,
            None => recovery::read(store, id)
                .await?
                .ok_or_else(|| LifecycleError::Missing {
                    recovery_id: id.clone(),
                })?,
        };
        if let Some(changed) = transition_as_observed(store, id, observed, event.clone()).await? {
            return Ok(changed);
        }
    }
    Err(LifecycleError::Contended {
        recovery_id: id.clone(),
    })
}

/// [`transition`] for a decision made on `observed`: one compare-and-swap on that version.
/// `None` if the record changed since (the decision is void: the caller decides again on a
/// fresh read), never re-applied to a version the decision did not see.
pub async fn transition_as_observed(
    store: &Store,
    id: &RecoveryId,
    observed: (RecoveryRecord, ETag),
    event: Event,
) -> Result<Option<(RecoveryRecord, ETag)>, LifecycleError> {
    let (record, etag) = observed;
    let next = apply(&record, &event, store.clock().wall_ms())?;
    match recovery::swap(store, &next, &etag).await {
        Ok(etag) => {
            tracing::info!(
                recovery_id = %id,
                event = event.name(),
                from = record.state.describe(),
                to = next.state.describe(),
                worker_id = next.assigned_to.as_deref().unwrap_or("-"),
                "recovery changed"
            );
            if index_phase(record.state) != index_phase(next.state) {
                sync_index(store, &next).await?;
            }
            Ok(Some((next, etag)))
        }
        Err(RecoveryError::Changed { .. }) => Ok(None),
        Err(other) => Err(other.into()),
    }
}

/// The index entry of a host's own run when it starts (before its first commit, so a host
/// that dies right after is found by the coordinator). Returns the entry's version, which
/// the host's later index changes are conditional on.
pub async fn host_started(store: &Store, entry: &IndexEntry) -> Result<ETag, IndexError> {
    index::put(store, entry).await
}

/// A host's own run parked: the entry says so and names no holder — unless the entry moved
/// on since the host wrote it (a coordinator judged the host dead and admitted a recovery
/// while it was paused): then the run is the recovery's, and the entry stays as it is.
pub async fn host_parked(
    store: &Store,
    entry: &IndexEntry,
    written: &ETag,
) -> Result<(), IndexError> {
    let mut entry = entry.clone();
    entry.phase = Phase::Parked;
    entry.holder = None;
    entry.holder_ttl_ms = None;
    if !index::swap(store, &entry, written).await? {
        tracing::info!(run_id = %entry.run_id, "the run was taken over while it parked; its index entry is the recovery's now");
    }
    Ok(())
}

/// A host stopped driving its own run before it ended (asked to stop, or at its step cap):
/// the entry names no holder, so every judge sees the run interrupted at once (an absent
/// heartbeat is watched for a TTL: it may be one removed as a dead process's under a process
/// that came back). Unless the entry moved on since the host wrote it: then it stays.
pub async fn host_let_go(
    store: &Store,
    entry: &IndexEntry,
    written: &ETag,
) -> Result<(), IndexError> {
    let mut entry = entry.clone();
    entry.holder = None;
    entry.holder_ttl_ms = None;
    entry.updated_at_ms = store.clock().wall_ms();
    if !index::swap(store, &entry, written).await? {
        tracing::info!(run_id = %entry.run_id, "the run was taken over as its host stopped; its index entry is the recovery's now");
    }
    Ok(())
}

/// A host's own run ended (its terminal fact is committed): it leaves the index.
pub async fn host_finished(store: &Store, run: &RunId) -> Result<(), IndexError> {
    index::remove(store, run).await
}

/// A host's own parked run was answered: with no holder, the coordinator admits a recovery
/// that continues it.
pub async fn host_answered(store: &Store, entry: &IndexEntry) -> Result<(), IndexError> {
    let mut entry = entry.clone();
    entry.phase = Phase::Running;
    entry.holder = None;
    entry.holder_ttl_ms = None;
    entry.updated_at_ms = store.clock().wall_ms();
    index::put(store, &entry).await.map(|_| ())
}
