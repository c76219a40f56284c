//! Admission: the one path by which a recovery comes to exist, for the coordinator, the CLI
//! and the library alike.

use super::*;

use std::sync::Arc;

use futures::future::Either;
use std::time::Duration;

use crate::core::fact::{RecoveryId, RunId};
use crate::core::liveness::{ExpiryWatch, Seen, Verdict};
use crate::core::record::RecoveryRecord;
use crate::error::Error;
use crate::fleet::lifecycle::{LifecycleError, sync_index};
use crate::fleet::wake::CoordinatorWaker;
use crate::store::generation::{GenerationError, Loaded, RunWriter, SnapshotPolicy};
use crate::store::lease::{self, Held, Holder, LeaseError};
use crate::store::recovery::{self, RecoveryError};
use crate::store::{ETag, Store};

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
    /// The recovery's record, pinned to the source's newest generation.
    pub record: RecoveryRecord,
    /// False when the recovery already existed (a replay of the same admission).
    pub created: bool,
}

/// The lease an admission of `recovery_id` with [`Takeover::IfSilent`] will watch for its
/// holder's TTL before fencing, if any: the source's lease while it is held, the recovery does
/// not exist yet (a replay returns the existing recovery without waiting), and the admission
/// is not refused before it watches (the source claimed under another ID, or the recovery ID
/// already naming a run), so a caller never announces a wait that does not happen.
pub async fn lease_to_watch(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
) -> Result<Option<lease::Lease>, LifecycleError> {
    let Some(view) = lease::read_lease(store, source).await? else {
        return Ok(None);
    };
    if view.lease.released
        || view.lease.retired
        || recovery::read(store, recovery_id).await?.is_some()
    {
        return Ok(None);
    }
    let as_run = RunId::new(recovery_id.as_str());
    let (claimed, as_run_lease) = futures::join!(
        recovery::claimed_by(store, source),
        lease::read_lease(store, &as_run)
    );
    let claimed_by_other = claimed?.is_some_and(|existing| existing != *recovery_id);
    if claimed_by_other || as_run == *source || as_run_lease?.is_some() {
        return Ok(None);
    }
    Ok(Some(view.lease))
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
) -> crate::Result<Admitted> {
    admit_waking(store, holder, source, recovery_id, force, takeover, None).await
}

/// [`admit`], waking the leading coordinator through `waker` as soon as the record exists
/// (created now or found by a replay), naming the recovery, while the index entry is
/// written: the coordinator assigns a named recovery from its record alone, so it need not
/// wait for the entry (see `coordinator::named::assign_named`). An entry written after the
/// recovery moved on (a slow PUT) is brought back in line by the coordinator's reconcile.
pub async fn admit_waking(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
    takeover: Takeover,
    waker: Option<&CoordinatorWaker>,
) -> crate::Result<Admitted> {
    // The record, claim and recovery-ID checks and the source's load only read; they go out
    // at once (the load's three round trips overlap the checks' one, which an outage's worth
    // of admissions pays on a store with S3's latency). A replay is known from the record
    // alone: the other reads are dropped then. A load that aged while a check stalled is not
    // used by the fence (see `FRESH_LOAD`); one that a commit overtook makes the fence's
    // create-if-absent fail and reload. The claim is read first only before a wait for a
    // silent holder, so that a source recovered under another ID is refused before a TTL of
    // watching. With a takeover, the claim's own create-if-absent tells the same (one request
    // fewer per admission).
    let as_run = RunId::new(recovery_id.as_str());
    let record_read = std::pin::pin!(recovery::read(store, recovery_id));
    let claim_read = async {
        match takeover {
            Takeover::IfSilent => recovery::claimed_by(store, source).await,
            Takeover::Now => Ok(None),
        }
    };
    // The source as loaded here is handed to the fence, which only reloads it if a commit
    // landed since (one load per admission, not three), or if the load has aged.
    let load = async {
        refuse_unrecoverable(store, source)
            .await
            .map(|loaded| loaded.map(|loaded| (loaded, crate::clock::Stopwatch::start())))
    };
    let mut checks = std::pin::pin!(async {
        futures::join!(claim_read, lease::read_lease(store, &as_run), load)
    });
    let (existing, checked) = match futures::future::select(record_read, checks.as_mut()).await {
        Either::Left((existing, _)) => (existing, None),
        Either::Right((checked, record_read)) => (record_read.await, Some(checked)),
    };
    if let Some((record, _)) = existing? {
        if record.source_run != *source {
            return Err(RecoveryError::IdInUse {
                recovery_id: recovery_id.clone(),
                existing_source: record.source_run,
                requested_source: source.clone(),
            }
            .into());
        }
        // A replay. The index entry may be missing if the first admission crashed before
        // writing it, or the fencing lease still held if its release failed; both are done
        // again.
        release_fence(store, holder, source, &record).await?;
        let record = index_and_wake(store, record, waker).await?;
        return Ok(Admitted {
            record,
            created: false,
        });
    }
    let (claimed, as_run_lease, loaded) = match checked {
        Some(checked) => checked,
        None => checks.await,
    };
    if let Some(existing) = claimed?
        && existing != *recovery_id
    {
        return Err(RecoveryError::AlreadyRecovered {
            source_run: source.clone(),
            existing,
        }
        .into());
    }
    // A recovery runs as the run named by its ID: an ID that already names a run (the source
    // itself, or any run that ever took a lease, which retirement keeps) would continue or
    // overwrite that run's chain.
    if as_run == *source || as_run_lease?.is_some() {
        return Err(RecoveryError::IdIsARun {
            recovery_id: recovery_id.clone(),
        }
        .into());
    }
    let loaded = match loaded {
        Ok(loaded) => loaded,
        // An earlier admission under this ID may have claimed the source before it crashed.
        Err(error) => {
            return Err(give_back_claim(store, source, recovery_id, false, error.into()).await);
        }
    };
    // The lease version judged free or silent: without a takeover, only that version may be
    // taken over (a holder that took the lease since is alive, not judged).
    let judged = match takeover {
        Takeover::IfSilent => Some(wait_until_silent(store, source).await?),
        Takeover::Now => None,
    };
    // Claim, then fence, then pin: a writer that takes the source's lease after the fence
    // sees the claim and stops (see `fleet::answer_run`); one that committed before the
    // fence is in the pin; one still writing is fenced.
    // The lease is read beside the claim (one round trip, not two). The takeover is a
    // compare-and-swap on the version read, so it can only fail, never fence the wrong
    // holding. One race differs from reading after the claim: a holder that takes the lease
    // after this read and checks for a claim before this one lands (an answer, a host
    // resuming) goes on; the takeover's swap then fails and the admission fails with a
    // conflict, its claim kept, where a read after the claim would have fenced that holder at
    // once. The retry (the coordinator's next tick, or the caller's) fences it then.
    let (claimed_now, lease_now) = futures::join!(
        recovery::claim(store, source, recovery_id),
        lease::read_lease(store, source)
    );
    let claimed_now = claimed_now?;
    if !claimed_now && let Some((record, _)) = recovery::read(store, recovery_id).await? {
        // Another admission of this ID finished meanwhile (this one may have been paused):
        // fencing now would write to the source after its pin.
        let record = index_and_wake(store, record, waker).await?;
        return Ok(Admitted {
            record,
            created: false,
        });
    }
    let admitted = async {
        let lease_now = lease_now.map_err(|error| LifecycleError::Fence {
            run: source.clone(),
            error: Box::new(error.into()),
        })?;
        let (fenced, held) = fence(store, holder, source, lease_now, judged.as_ref(), loaded)
            .await
            .map_err(|error| match error {
                alive @ LifecycleError::HolderAlive { .. } => alive,
                error => LifecycleError::Fence {
                    run: source.clone(),
                    error: Box::new(error),
                },
            })?;
        // Pinned to the fence generation the fence itself wrote: nothing can follow it (the
        // claim stops later writers, the epoch earlier ones). Without its digest (a lost
        // acknowledgement adopted) or a writer (a retired run), load it again.
        let pinned = async {
            match fenced.as_ref().and_then(|w| Some((w, w.newest_digest()?))) {
                Some((writer, digest)) => {
                    let pin = recovery::Pin {
                        generation: writer.generation(),
                        digest: digest.to_owned(),
                        epoch: writer.epoch(),
                        state: writer.state(),
                        base: writer.base(),
                    };
                    recovery::create_pinned(store, source, recovery_id, force, pin, claimed_now)
                        .await
                }
                None => recovery::admit(store, source, recovery_id, force).await,
            }
        };
        // The fencing lease is released while the record is written (one round trip, not
        // two): the fence generation already stops the old writer, and the claim later ones.
        // A failed release fails the admission after the record: its replay releases it.
        // The index entry waits for the release: once it says recovering, neither the
        // coordinator nor `recover --all` admits the source again, so nothing would replay.
        let (released, admission) = futures::join!(holder.release(&held), pinned);
        let admission = admission?;
        released.map_err(LifecycleError::from)?;
        Ok::<_, Error>(admission)
    }
    .await;
    let admission = match admitted {
        Ok(admission) => admission,
        Err(error) => {
            return Err(give_back_claim(store, source, recovery_id, claimed_now, error).await);
        }
    };
    let created = admission.created;
    let record = index_and_wake(store, admission.record, waker).await?;
    if created {
        crate::metrics::count(crate::metrics::RECOVERIES_ADMITTED);
    }
    Ok(Admitted { record, created })
}

/// Writes the source's index entry as `record` says, while `waker` (if any) wakes the
/// leading coordinator naming the recovery.
async fn index_and_wake(
    store: &Store,
    record: RecoveryRecord,
    waker: Option<&CoordinatorWaker>,
) -> Result<RecoveryRecord, crate::store::index::IndexError> {
    let Some(waker) = waker else {
        return sync_index(store, &record).await.map(|()| record);
    };
    // A recovery a wake-up cannot name is found through its index entry: wake after it.
    if !crate::fleet::wake::carried(&record.recovery_id) {
        sync_index(store, &record).await?;
        waker.wake().await;
        return Ok(record);
    }
    let wake = waker.wake_naming(std::slice::from_ref(&record.recovery_id));
    let (indexed, ()) = futures::join!(sync_index(store, &record), wake);
    indexed.map(|()| record)
}

/// Gives back this ID's claim on a source that turned out to have nothing to recover. A
/// claim this admission created (`claimed_now`) is given back on any such refusal. One it did
/// not create (an earlier admission under this ID crashed after claiming) only when the
/// verdict is final: the source ended, or its first slot holds only a fence. Then no admission
/// of the source can ever succeed, so none can be completing a record under the claim while
/// `release_claim` (a read of the record, then of the claim, then a delete; not atomic) runs.
/// A run that did not exist may start a moment later and be admitted under this ID by
/// another process, whose claim a late delete here would remove. `release_claim` keeps a
/// claim that has a record or names another ID. Returns the admission's error.
async fn give_back_claim(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
    claimed_now: bool,
    error: Error,
) -> Error {
    let final_verdict = matches!(
        error,
        Error::Recovery(
            RecoveryError::NothingToRecover { .. } | RecoveryError::NeverStarted { .. }
        )
    );
    let give_back = final_verdict || (claimed_now && nothing_to_continue(&error));
    if give_back && let Err(release) = recovery::release_claim(store, source, recovery_id).await {
        return release.into();
    }
    error
}

/// Whether an admission was refused because the source has nothing a recovery could
/// continue, ever: its host died before its first commit (the fence now holds its first
/// slot, so a slow host's first commit fails too), the run does not exist, or it was retired
/// (`runs rm`). Its index entry is stale: the coordinator and `recover --all` remove it.
pub fn nothing_to_continue(error: &Error) -> bool {
    if let Error::Lifecycle(LifecycleError::Fence { error, .. }) = error
        && matches!(**error, LifecycleError::Lease(LeaseError::Retired { .. }))
    {
        return true;
    }
    matches!(
        error,
        Error::Recovery(
            RecoveryError::NeverStarted { .. }
                | RecoveryError::NoSuchRun { .. }
                | RecoveryError::Source {
                    error: GenerationError::NotFound { .. } | GenerationError::Retired { .. },
                    ..
                },
        )
    )
}

/// Releases the source's fencing lease if it is still held: a fence whose release failed
/// (the admission then failed after its record; this is its replay, by any process). The
/// fence took the lease at exactly the epoch the record pins, and nothing else ever holds a
/// run at that epoch (a later holder takes a higher one), so a lease held at it is the
/// fence's and is released by compare-and-swap on the version read.
async fn release_fence(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    record: &RecoveryRecord,
) -> Result<(), LifecycleError> {
    if let Some(view) = lease::read_lease(store, source).await?
        && !view.lease.released
        && view.lease.epoch == record.source_epoch
    {
        let fenced = Held {
            run: source.clone(),
            epoch: view.lease.epoch,
            etag: view.etag,
        };
        holder.release(&fenced).await?;
    }
    Ok(())
}

/// Refuses, before anything is written, a source that cannot be recovered: one that ended
/// (or was retired after it ended), one whose first slot holds only a fence (it never
/// started), and an ID that was never used (no lease, no generation: a typo must not leave a
/// run behind). A run that has a lease but no generation yet (its host died before its first
/// commit, or is slow) goes on: the fence then takes its first slot. The pin after the fence
/// checks all of this again.
async fn refuse_unrecoverable(
    store: &Store,
    source: &RunId,
) -> Result<Option<Loaded>, LifecycleError> {
    let source_error = |error: GenerationError| RecoveryError::Source {
        source_run: source.clone(),
        error,
    };
    match crate::store::generation::load(store, source, None).await {
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
            Ok(Some(loaded))
        }
        Err(GenerationError::Retired {
            outcome: Some(outcome),
            ..
        }) => Err(RecoveryError::NothingToRecover {
            source_run: source.clone(),
            outcome,
        }
        .into()),
        Err(GenerationError::NotFound { .. }) => {
            if lease::read_lease(store, source).await?.is_some() {
                Ok(None)
            } else {
                Err(RecoveryError::NoSuchRun {
                    source_run: source.clone(),
                }
                .into())
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
) -> crate::Result<()> {
    let lease_now = lease::read_lease(store, source)
        .await
        .map_err(LifecycleError::from)?;
    match fence(store, holder, source, lease_now, None, None).await {
        Ok((_, held)) => Ok(holder.release(&held).await?),
        // Its retirement fenced it at the epoch it reserved; nothing can hold it again.
        Err(LifecycleError::Lease(LeaseError::Retired { .. })) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// [`fence_source`] from `lease_now`, the source's lease as read (after the claim, or beside
/// it); with `judged` (the lease version [`wait_until_silent`] judged free or
/// silent, `None` if there was no lease), a lease held under any other version belongs to a
/// holder nobody judged: refuse ([`LifecycleError::HolderAlive`]) instead of taking it over.
/// The takeover is a compare-and-swap on the version checked here, so the check holds.
/// `loaded` is the caller's load of the source with when it was taken, if it has one; one
/// older than [`FRESH_LOAD`] is not used. Returns the writer that wrote
/// the fence (`None` for a retired run, which has no writer left to fence) and the lease it
/// fenced under, which the caller releases (on an error it is released here).
async fn fence(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    lease_now: Option<lease::LeaseView>,
    judged: Option<&Option<ETag>>,
    loaded: Option<(Loaded, crate::clock::Stopwatch)>,
) -> Result<(Option<RunWriter>, Held), LifecycleError> {
    let held = match lease_now {
        // Retired: its retirement holds the last epoch there will ever be (see `gc::retire`).
        Some(view) if view.lease.retired => {
            return Err(LeaseError::Retired {
                run: source.clone(),
                epoch: view.lease.epoch,
            }
            .into());
        }
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
        // Free, or never leased (a workflow step is written before anyone holds it): above
        // every epoch the chain holds, so the fence is this holding's alone.
        _ => {
            let floor = loaded
                .as_ref()
                .map_or(crate::core::epoch::Epoch::ZERO, |(loaded, _)| {
                    loaded.epoch.next()
                });
            holder.acquire_from(source, floor).await?
        }
    };
    let loaded = loaded
        .filter(|(_, at)| at.elapsed() < FRESH_LOAD)
        .map(|(loaded, _)| loaded);
    let policy = SnapshotPolicy::default();
    // The fence generation names the admitting process.
    let writing = store.writing_as(holder.id());
    let store = &writing;
    let fenced = match RunWriter::resume_from(store, source, held.epoch, policy, loaded).await {
        // Nothing committed yet: a host judged dead may only be slow. Take its first slot
        // with an empty generation at the fence epoch, so its first commit fails instead of
        // starting a run nobody would recover.
        Err(GenerationError::NotFound { .. }) => {
            match RunWriter::create_as(store, source.clone(), Vec::new(), held.epoch, policy).await
            {
                Ok(writer) => Ok(writer),
                Err(GenerationError::AlreadyExists { .. }) => {
                    RunWriter::resume(store, source, held.epoch, policy).await
                }
                Err(other) => Err(other),
            }
        }
        other => other,
    };
    match fenced {
        Ok(writer) => {
            crate::metrics::count(crate::metrics::FENCES);
            Ok((Some(writer), held))
        }
        // A retired run has no writer left to fence (see `tombstone.rs`); admission refuses it.
        Err(GenerationError::Retired { .. }) => Ok((None, held)),
        Err(other) => {
            holder.release(&held).await?;
            Err(other.into())
        }
    }
}

/// How old a load of the source may be when the fence starts from it. The fence is a
/// create-if-absent in the slot after the newest generation loaded, so a commit that landed
/// since makes it fail and reload; but a load older than gc's grace period may name a slot
/// gc has freed since (the old writer went on past a newer snapshot), and the fence would
/// land in it, below the old writer's head (`resume_from` sees that from the hint and fences
/// again, but the slot was written twice). An admission that stalled this long (a pause, a
/// wait for a silent holder) loads again.
const FRESH_LOAD: Duration = Duration::from_secs(1);

/// Waits until the source's holder has been silent (lease and heartbeat unchanged) for the
/// TTL the holder itself declared, observed on this process's monotonic clock. Returns at
/// once if the lease is free or the holder's heartbeat is gone; refuses if the holder shows
/// a sign of life. Returns the lease version it judged (`None`: there was no lease).
async fn wait_until_silent(store: &Store, source: &RunId) -> Result<Option<ETag>, LifecycleError> {
    let clock = Arc::clone(store.clock());
    // Each pair of reads is judged as seen when its first request went out (see `Seen`).
    let mut issued = clock.monotonic();
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
        let seen = Seen {
            issued,
            returned: clock.monotonic(),
        };
        let verdict = watch.observe(
            source.as_str(),
            &lease_now.etag,
            beat_now.as_ref(),
            ttl,
            seen,
        );
        if verdict == Verdict::Expired {
            return Ok(Some(lease_now.etag));
        }
        crate::clock::sleep(poll).await;
        issued = clock.monotonic();
        match lease::read_lease(store, source).await? {
            None => return Ok(None),
            Some(view) => lease_now = view,
        }
        beat_now = beat(first.lease.heartbeat.clone()).await?;
    }
}

/// Spawns a recovery of `source` under the host-chosen `recovery_id`: fences the source
/// (takes its lease over and writes a fence generation, so its old host can never commit
/// again), admits the recovery pinned to the source's newest generation, and marks the run
/// in the index so the fleet executes it. Idempotent: the same ID again returns the
/// existing recovery (also to one racing it: a conflict is retried, briefly, and the retry
/// finds the winner's record); another ID for the same source is refused naming the first. A source
/// whose holder is alive is refused unless `takeover` is [`Takeover::Now`]. The leading
/// coordinator is woken, so the recovery is assigned now rather than at its next scan.
pub async fn spawn_recovery(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
    takeover: Takeover,
) -> Result<RecoveryRecord> {
    spawn_recovery_admitted(store, holder, source, recovery_id, force, takeover)
        .await
        .map(|admitted| admitted.record)
}

/// [`spawn_recovery`], also saying whether this call created the recovery or found it
/// admitted before (a replay), so a caller can tell the two apart when it reports them.
#[tracing::instrument(name = "admission", skip_all, fields(run_id = %source, recovery_id = %recovery_id))]
pub async fn spawn_recovery_admitted(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
    takeover: Takeover,
) -> Result<admission::Admitted> {
    use backon::{ExponentialBuilder, Retryable};
    // Two admissions of one ID at once (a retried request, two replicas of a host) both
    // claim it, and the one that loses the fence race sees a conflict: admitting again is
    // idempotent, and finds the winner's record.
    let backoff = ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(50))
        .with_max_delay(std::time::Duration::from_secs(1))
        .with_max_times(5);
    // The coordinator's address is looked up while the admission runs, and the coordinator
    // woken as soon as the record exists, naming it.
    let waker = wake::CoordinatorWaker::new(store);
    let waking = Some(&waker);
    let admitting = async move {
        (move || {
            admission::admit_waking(store, holder, source, recovery_id, force, takeover, waking)
        })
        .retry(backoff)
        .sleep(crate::clock::sleep)
        .when(conflict)
        .await
    };
    let ((), admitted) = futures::join!(waker.prepare(), admitting);
    admitted
}

/// Whether an admission failed on a conflict, which admitting again resolves.
pub(crate) fn conflict(error: &Error) -> bool {
    error.kind() == crate::ErrorKind::Conflict
}

/// Admits the recovery of a run already judged interrupted (`liveness`), under its
/// deterministic ID (`recovery-of-<run>`, as the coordinator names it), fencing the run now:
/// the judgement already waited out its holder, so admission does not wait again. It wakes
/// the coordinator through `waker` (one per batch, which looks its address up once) as soon
/// as the record exists, naming the recovery.
///
/// A run that turns out to have ended (its host committed the end, then died before leaving
/// the index) is refused with [`RecoveryError::NothingToRecover`], and one with nothing to
/// continue (its host died before its first commit, see [`admission::nothing_to_continue`])
/// with its own error; either leaves the index here, as the coordinator's admission does,
/// rather than a holder's TTL later (or never, for a run that never started).
#[tracing::instrument(name = "admission", skip_all, fields(run_id = %run))]
pub async fn recover_interrupted(
    store: &Store,
    holder: &Arc<Holder>,
    run: &RunId,
    force: bool,
    waker: &wake::CoordinatorWaker,
) -> Result<RecoveryRecord> {
    let recovery_id = crate::core::assignment::recovery_id_for(run);
    let admitting = admission::admit_waking(
        store,
        holder,
        run,
        &recovery_id,
        force,
        Takeover::Now,
        Some(waker),
    );
    match admitting.await {
        Ok(admitted) => Ok(admitted.record),
        Err(gone)
            if matches!(
                gone,
                Error::Recovery(recovery::RecoveryError::NothingToRecover { .. })
            ) || admission::nothing_to_continue(&gone) =>
        {
            lifecycle::host_finished(store, run).await?;
            Err(gone)
        }
        Err(other) => Err(other),
    }
}
