//! The recovery lifecycle: every change to a recovery record, and to the index entry of the
//! run it continues, goes through this module.
//!
//! It owns the states ([`RecoveryState`]), the events ([`Event`], each sent by one kind of
//! process), the pure transition function [`apply`] that says which event may happen in which
//! state, and one executor ([`transition`]) that writes the result with compare-and-swap and
//! then brings the index entry in line. Admission (claim the source, fence it, create the
//! record, index it) and the index entries of runs that have no recovery (a host's own run)
//! live here too. The coordinator, the worker, the fleet, workflows and the CLI call only
//! this module to change either object. It never executes a run and never decides placement.
//!
//! ```text
//!              Admit (coordinator, CLI, library)
//!                  |
//!                  v          Assign (coordinator)
//!   +------------> Admitted <-------------------+
//!   |               |   ^  ^                    |
//!   | Answer (CLI)  |   |  | Yield / Fail (worker), Abandon (coordinator: worker died)
//!   |        Start  |   |  +--------------------+
//!   |      (worker) v   |                       |
//! Parked <------- Running ----------------------+
//!         Park      |
//!       (worker)    | Finish (worker)             Admitted --DeadLetter (coordinator,
//!                   v                                         failures >= max)--> DeadLettered
//!                Finished
//! ```
//!
//! Architecture invariant: a terminal record never changes — [`apply`] refuses every event
//! on `Finished` and `DeadLettered`, so a stale coordinator cannot reopen a finished recovery
//! and a recovery ID never executes twice (brief, invariant 5).
//!
//! Architecture invariant: only failures count toward dead-lettering, and dead-lettering
//! never preempts a live attempt — `Fail` and `Abandon` are the only events that raise
//! `failures`; `DeadLetter` is refused unless the record is `Admitted` (no attempt runs), and
//! the executor's compare-and-swap refuses it if an attempt started since it was decided.
//!
//! Architecture invariant: the record is the truth and the index entry follows it — every
//! multi-object change writes the record first, then the index entry; a crash in between
//! leaves an entry the coordinator repairs from the record on its next scan ([`entry_for`]),
//! so no record is stranded by a crash between two writes.

use std::sync::Arc;
use std::time::Duration;

use crate::fact::{RecoveryId, RunId};
use crate::generation::{GenerationError, RunWriter, SnapshotPolicy};
use crate::index::{self, IndexEntry, IndexError, Phase};
use crate::lease::{self, ExpiryWatch, Holder, LeaseError, Verdict};
use crate::recovery::{self, RecoveryError, RecoveryRecord, RecoveryResult, RecoveryState};
use crate::store::{ETag, Store};

/// Bound on compare-and-swap rounds when a record keeps changing under an event.
const CAS_ATTEMPTS: usize = 8;

/// What happens to a recovery, and who says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The coordinator offers the recovery to a live worker.
    Assign { worker: String },
    /// The worker it was offered to starts an attempt.
    Start { worker: String },
    /// The attempt stopped with everything committed (step cap, or a graceful stop) and hands
    /// the recovery back; `keep_assignment` lets the same worker continue at once.
    Yield {
        worker: String,
        attempt: u32,
        keep_assignment: bool,
    },
    /// The attempt stopped because the run waits for a human; `generation` is the recovery
    /// run's newest generation then.
    Park {
        worker: String,
        attempt: u32,
        generation: u64,
    },
    /// A human's answer was committed to the run; it may continue.
    Answer,
    /// The attempt failed with an error.
    Fail {
        worker: String,
        attempt: u32,
        error: String,
    },
    /// The coordinator saw the attempt's worker die (heartbeat silent for its TTL).
    Abandon { worker: String, attempt: u32 },
    /// The attempt ended the run; its terminal fact is committed.
    Finish {
        worker: String,
        attempt: u32,
        result: RecoveryResult,
    },
    /// The coordinator gives up after `max_failures` failed attempts.
    DeadLetter { max_failures: u32 },
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Assign { .. } => "assign",
            Event::Start { .. } => "start",
            Event::Yield { .. } => "yield",
            Event::Park { .. } => "park",
            Event::Answer => "answer",
            Event::Fail { .. } => "fail",
            Event::Abandon { .. } => "abandon",
            Event::Finish { .. } => "finish",
            Event::DeadLetter { .. } => "dead-letter",
        }
    }
}

/// An event that does not apply to the record as it is now: an expected outcome of a race
/// (a stale decision, a lost attempt), never a bug to panic over.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("recovery '{recovery_id}' is {state}{holder}; cannot {event} it: {reason}", state = state.describe(), holder = assigned.as_ref().map(|w| format!(" on '{w}'")).unwrap_or_default())]
pub struct Refused {
    pub recovery_id: RecoveryId,
    pub state: RecoveryState,
    pub assigned: Option<String>,
    pub event: &'static str,
    pub reason: &'static str,
}

/// The pure transition: the record after `event`, or why the event does not apply. `now_ms`
/// is data, so the same inputs always give the same output.
pub fn apply(
    record: &RecoveryRecord,
    event: &Event,
    now_ms: u64,
) -> Result<RecoveryRecord, Refused> {
    let refuse = |reason: &'static str| Refused {
        recovery_id: record.recovery_id.clone(),
        state: record.state,
        assigned: record.assigned_to.clone(),
        event: event.name(),
        reason,
    };
    if record.state.is_terminal() {
        return Err(refuse("the recovery has ended"));
    }
    // An attempt's outcome counts only for that very attempt: `attempt` is the number its
    // `Start` gave it, so a paused earlier attempt (even of a process with the same worker
    // ID) cannot hand back, park, fail or finish the attempt that replaced it.
    let running_on = |worker: &str, attempt: u32| {
        record.state == RecoveryState::Running
            && record.assigned_to.as_deref() == Some(worker)
            && record.attempts == attempt
    };
    let mut next = record.clone();
    next.updated_at_ms = now_ms;
    match event {
        Event::Assign { worker } => {
            if record.state != RecoveryState::Admitted {
                return Err(refuse("only an admitted recovery is assigned"));
            }
            next.assigned_to = Some(worker.clone());
        }
        Event::Start { worker } => {
            if record.state != RecoveryState::Admitted
                || record.assigned_to.as_deref() != Some(worker.as_str())
            {
                return Err(refuse("it is not offered to this worker"));
            }
            next.state = RecoveryState::Running;
            next.attempts = record.attempts.saturating_add(1);
        }
        Event::Yield {
            worker,
            attempt,
            keep_assignment,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Admitted;
            if !keep_assignment {
                next.assigned_to = None;
            }
        }
        Event::Park {
            worker,
            attempt,
            generation,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Parked;
            next.assigned_to = None;
            next.parked_at = Some(*generation);
        }
        Event::Answer => {
            if record.state != RecoveryState::Parked {
                return Err(refuse("it is not waiting for an answer"));
            }
            next.state = RecoveryState::Admitted;
            next.parked_at = None;
        }
        Event::Fail {
            worker,
            attempt,
            error,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Admitted;
            next.assigned_to = None;
            next.failures = record.failures.saturating_add(1);
            next.last_error = Some(error.clone());
        }
        Event::Abandon { worker, attempt } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("its attempt is not on that worker"));
            }
            next.state = RecoveryState::Admitted;
            next.assigned_to = None;
            next.failures = record.failures.saturating_add(1);
            next.last_error = Some(format!(
                "worker '{worker}' stopped heartbeating during attempt {}",
                record.attempts
            ));
        }
        Event::Finish {
            worker,
            attempt,
            result,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Finished;
            next.result = Some(result.clone());
        }
        Event::DeadLetter { max_failures } => {
            if record.state != RecoveryState::Admitted {
                return Err(refuse("an attempt is live or it is parked"));
            }
            if record.failures < *max_failures {
                return Err(refuse("it has not failed often enough"));
            }
            next.state = RecoveryState::DeadLettered;
            next.assigned_to = None;
        }
    }
    Ok(next)
}

/// Where the index says a run with a recovery in `state` stands; `None`: no entry (done).
pub fn index_phase(state: RecoveryState) -> Option<Phase> {
    match state {
        RecoveryState::Admitted | RecoveryState::Running => Some(Phase::Recovering),
        RecoveryState::Parked => Some(Phase::Parked),
        RecoveryState::DeadLettered => Some(Phase::Dead),
        RecoveryState::Finished => None,
    }
}

/// The index entry of the source run as `record` says it should be; `None`: no entry.
pub fn entry_for(record: &RecoveryRecord) -> Option<IndexEntry> {
    let phase = index_phase(record.state)?;
    let mut entry = IndexEntry::new(
        record.source_run.clone(),
        record.session_id.clone(),
        phase,
        record.fingerprint_sha256.clone(),
        record.updated_at_ms,
    );
    entry.recovery_id = Some(record.recovery_id.clone());
    Some(entry)
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("recovery '{recovery_id}' does not exist")]
    Missing { recovery_id: RecoveryId },
    #[error("recovery '{recovery_id}' kept changing; gave up after {CAS_ATTEMPTS} attempts")]
    Contended { recovery_id: RecoveryId },
    #[error("cannot fence run \"{run}\" before admitting its recovery: {source}")]
    Fence {
        run: RunId,
        #[source]
        source: Box<LifecycleError>,
    },
    #[error(transparent)]
    Generation(#[from] GenerationError),
    #[error(
        "run \"{run}\" is held by '{holder}' at epoch {epoch}, whose heartbeat changed within its {ttl_ms} ms TTL: it is alive. Wait for it, or take it over explicitly (--takeover); then its in-flight tool call may run twice"
    )]
    HolderAlive {
        run: RunId,
        holder: String,
        epoch: u64,
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
        let (record, etag) = match current.take() {
            Some(known) => known,
            None => recovery::read(store, id)
                .await?
                .ok_or_else(|| LifecycleError::Missing {
                    recovery_id: id.clone(),
                })?,
        };
        let next = apply(&record, &event, store.clock().wall_ms())?;
        match recovery::swap(store, &next, &etag).await {
            Ok(etag) => {
                tracing::info!(
                    recovery_id = %id,
                    event = event.name(),
                    from = record.state.describe(),
                    to = next.state.describe(),
                    worker = next.assigned_to.as_deref().unwrap_or("-"),
                    "recovery changed"
                );
                if index_phase(record.state) != index_phase(next.state) {
                    sync_index(store, &next).await?;
                }
                return Ok((next, etag));
            }
            Err(RecoveryError::Changed { .. }) => continue,
            Err(other) => return Err(other.into()),
        }
    }
    Err(LifecycleError::Contended {
        recovery_id: id.clone(),
    })
}

/// How admission treats a source run whose lease is still held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// The holder was already judged gone (the coordinator's expiry watch) or the operator
    /// asked to take it over: fence it now.
    Now,
    /// Watch the holder for its own declared TTL first, on this process's clock; refuse if
    /// its lease or heartbeat changes meanwhile (it is alive).
    IfSilent,
}

/// The outcome of an admission.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub record: RecoveryRecord,
    /// False when the recovery already existed (a replay of the same admission).
    pub created: bool,
}

/// Admits a recovery of `source` under `recovery_id`, idempotently: the one admission path.
///
/// Order (each step safe to crash after): refuse an ID taken by another source or a source
/// claimed by another ID; refuse, writing nothing, a source that ended, never started or
/// does not exist; make sure the holder is gone (`takeover`); claim the source; fence it
/// (take its lease at a higher epoch, write a fence generation, release), so nothing it might
/// still commit escapes the pin; create the record pinned to the source's newest generation;
/// index the source as recovering. A replay finds the record and only re-indexes.
pub async fn admit(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
    takeover: Takeover,
) -> Result<Admitted, LifecycleError> {
    if let Some((record, _)) = recovery::read(store, recovery_id).await? {
        if record.source_run != *source {
            return Err(RecoveryError::IdInUse {
                recovery_id: recovery_id.clone(),
                existing_source: record.source_run,
                requested_source: source.clone(),
            }
            .into());
        }
        // A replay. The index entry may be missing if the first admission crashed before
        // writing it; writing it again is harmless.
        sync_index(store, &record).await?;
        return Ok(Admitted {
            record,
            created: false,
        });
    }
    if let Some(existing) = recovery::claimed_by(store, source).await?
        && existing != *recovery_id
    {
        return Err(RecoveryError::AlreadyRecovered {
            source_run: source.clone(),
            existing,
        }
        .into());
    }
    refuse_unrecoverable(store, source).await?;
    // The lease version judged free or silent: without a takeover, only that version may be
    // taken over (a holder that took the lease since is alive, not judged).
    let judged = match takeover {
        Takeover::IfSilent => Some(wait_until_silent(store, source).await?),
        Takeover::Now => None,
    };
    // Claim, then fence, then pin: a writer that takes the source's lease after the fence
    // sees the claim and stops (see `fleet::answer_run`); one that committed before the
    // fence is in the pin; one still writing is fenced.
    let claimed_now = recovery::claim(store, source, recovery_id).await?;
    if !claimed_now && let Some((record, _)) = recovery::read(store, recovery_id).await? {
        // Another admission of this ID finished meanwhile (this one may have been paused):
        // fencing now would write to the source after its pin.
        sync_index(store, &record).await?;
        return Ok(Admitted {
            record,
            created: false,
        });
    }
    let admitted = async {
        fence(store, holder, source, judged.as_ref())
            .await
            .map_err(|error| match error {
                alive @ LifecycleError::HolderAlive { .. } => alive,
                error => LifecycleError::Fence {
                    run: source.clone(),
                    source: Box::new(error),
                },
            })?;
        Ok::<_, LifecycleError>(recovery::admit(store, source, recovery_id, force).await?)
    }
    .await;
    let admission = match admitted {
        Ok(admission) => admission,
        Err(error) => {
            if claimed_now
                && let LifecycleError::Recovery(
                    RecoveryError::NothingToRecover { .. }
                    | RecoveryError::NeverStarted { .. }
                    | RecoveryError::Source {
                        source: GenerationError::NotFound { .. } | GenerationError::Retired { .. },
                        ..
                    },
                ) = &error
            {
                recovery::release_claim(store, source, recovery_id).await?;
            }
            return Err(error);
        }
    };
    sync_index(store, &admission.record).await?;
    Ok(Admitted {
        record: admission.record,
        created: admission.created,
    })
}

/// Refuses, before anything is written, a source that cannot be recovered: one that ended
/// (or was retired after it ended), one whose first slot holds only a fence (it never
/// started), and an ID that was never used (no lease, no generation: a typo must not leave a
/// run behind). A run that has a lease but no generation yet (its host died before its first
/// commit, or is slow) goes on: the fence then takes its first slot. The pin after the fence
/// checks all of this again.
async fn refuse_unrecoverable(store: &Store, source: &RunId) -> Result<(), LifecycleError> {
    let source_error = |error: GenerationError| RecoveryError::Source {
        source_run: source.clone(),
        source: error,
    };
    match crate::generation::load(store, source, None).await {
        Ok(loaded) => {
            if let Some(terminal) = loaded.state.terminal() {
                return Err(RecoveryError::NothingToRecover {
                    source_run: source.clone(),
                    outcome: terminal.outcome,
                }
                .into());
            }
            if loaded.state.meta().is_none() {
                return Err(RecoveryError::NeverStarted {
                    source_run: source.clone(),
                }
                .into());
            }
            Ok(())
        }
        Err(GenerationError::Retired {
            outcome: Some(outcome),
            ..
        }) => Err(RecoveryError::NothingToRecover {
            source_run: source.clone(),
            outcome,
        }
        .into()),
        Err(error @ GenerationError::NotFound { .. }) => {
            if lease::read_lease(store, source).await?.is_some() {
                Ok(())
            } else {
                Err(source_error(error).into())
            }
        }
        Err(error) => Err(source_error(error).into()),
    }
}

/// Fences an interrupted source run before its recovery is pinned: takes its lease over
/// (epoch + 1) and writes the fence generation, so a host that only seemed dead can never
/// commit to it again, and the pin covers everything it ever acknowledged.
pub async fn fence_source(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
) -> Result<(), LifecycleError> {
    fence(store, holder, source, None).await
}

/// [`fence_source`]; with `judged` (the lease version [`wait_until_silent`] judged free or
/// silent, `None` if there was no lease), a lease held under any other version belongs to a
/// holder nobody judged: refuse ([`LifecycleError::HolderAlive`]) instead of taking it over.
/// The takeover is a compare-and-swap on the version checked here, so the check holds.
async fn fence(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    judged: Option<&Option<ETag>>,
) -> Result<(), LifecycleError> {
    let held = match lease::read_lease(store, source).await? {
        Some(view) if !view.lease.released => {
            if let Some(judged) = judged
                && judged.as_ref() != Some(&view.etag)
            {
                return Err(LifecycleError::HolderAlive {
                    run: source.clone(),
                    holder: view.lease.holder,
                    epoch: view.lease.epoch,
                    ttl_ms: view.lease.ttl_ms,
                });
            }
            holder.take_over(&view).await?
        }
        _ => holder.acquire(source).await?,
    };
    let policy = SnapshotPolicy::default();
    let fenced = match RunWriter::resume(store, source, held.epoch, policy).await {
        // Nothing committed yet: a host judged dead may only be slow. Take its first slot
        // with an empty generation at the fence epoch, so its first commit fails instead of
        // starting a run nobody would recover.
        Err(GenerationError::NotFound { .. }) => {
            match RunWriter::create_as(store, source.clone(), Vec::new(), held.epoch, policy).await
            {
                Ok(_) => Ok(()),
                Err(GenerationError::AlreadyExists { .. }) => {
                    RunWriter::resume(store, source, held.epoch, policy)
                        .await
                        .map(|_| ())
                }
                Err(other) => Err(other),
            }
        }
        other => other.map(|_| ()),
    };
    holder.release(&held).await?;
    match fenced {
        // A retired run has no writer left to fence (see `tombstone.rs`); admission refuses it.
        Ok(()) | Err(GenerationError::Retired { .. }) => Ok(()),
        Err(other) => Err(other.into()),
    }
}

/// Waits until the source's holder has been silent (lease and heartbeat unchanged) for the
/// TTL the holder itself declared, observed on this process's monotonic clock. Returns at
/// once if the lease is free or the holder's heartbeat is gone; refuses if the holder shows
/// a sign of life. Returns the lease version it judged (`None`: there was no lease).
async fn wait_until_silent(store: &Store, source: &RunId) -> Result<Option<ETag>, LifecycleError> {
    let Some(first) = lease::read_lease(store, source).await? else {
        return Ok(None);
    };
    if first.lease.released {
        return Ok(Some(first.etag));
    }
    let beat = |key: String| async move {
        lease::read_heartbeat(store, &key)
            .await
            .map(|beat| beat.map(|(_, etag)| etag))
    };
    let Some(first_beat) = beat(first.lease.heartbeat.clone()).await? else {
        return Ok(Some(first.etag));
    };
    let ttl = Duration::from_millis(first.lease.ttl_ms);
    let clock = Arc::clone(store.clock());
    let mut watch = ExpiryWatch::default();
    let poll = (ttl / 6).clamp(Duration::from_millis(10), Duration::from_millis(500));
    let mut lease_now = first.clone();
    let mut beat_now = Some(first_beat.clone());
    loop {
        let changed = lease_now.etag != first.etag || beat_now.as_ref() != Some(&first_beat);
        if changed {
            if lease_now.lease.released || beat_now.is_none() {
                return Ok(Some(lease_now.etag));
            }
            return Err(LifecycleError::HolderAlive {
                run: source.clone(),
                holder: first.lease.holder.clone(),
                epoch: first.lease.epoch,
                ttl_ms: first.lease.ttl_ms,
            });
        }
        let verdict = watch.observe(
            source,
            &lease_now.etag,
            beat_now.as_ref(),
            ttl,
            clock.monotonic(),
        );
        if verdict == Verdict::Expired {
            return Ok(Some(lease_now.etag));
        }
        tokio::time::sleep(poll).await;
        match lease::read_lease(store, source).await? {
            None => return Ok(None),
            Some(view) => lease_now = view,
        }
        beat_now = beat(first.lease.heartbeat.clone()).await?;
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
