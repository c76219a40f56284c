//! Turning `decide`'s actions into lifecycle events (admit, assign, abandon, dead-letter,
//! answered, reconcile), each one compare-and-swap on its own record.
//!
//! It never observes or remembers.

use super::*;

/// Actions (admissions, lifecycle events) executed at once per tick, and records read at once.
/// After an outage every index entry changes at once; with S3's 20–30 ms per request, 16 at a
/// time made a tick over 200 recoveries take over a second before the first worker was told.
pub(super) const ACTION_CONCURRENCY: usize = 256;

/// Whether the run's index entry is still the one the decision was made on. A tick can take
/// long (a slow store, a paused process): a host may have finished or parked since its entry
/// was listed, and retired its heartbeat, which then looks like death. One GET keeps such a
/// stale decision from fencing a run that is no longer interrupted; the next tick decides
/// again from fresh observations.
pub(super) async fn still_as_observed(
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

/// The heartbeat versions a tick judged, as its listing saw them, and which heartbeat each
/// worker beats: what an action justified by a verdict of silence checks before it acts.
pub(super) struct Judged<'a> {
    pub(super) versions: &'a BTreeMap<String, ETag>,
    pub(super) workers: &'a [WorkerView],
}

impl Judged<'_> {
    /// Whether `heartbeat` is still at the version judged silent (one HEAD; absent if it was
    /// absent). A holder that beat since was judged on stale evidence (a listing that took
    /// long to answer, a coordinator paused inside its tick) and is left alone: a wrong
    /// verdict costs this read, never a fence; the next tick judges again.
    pub(super) async fn still_silent(
        &self,
        store: &Store,
        heartbeat: &str,
    ) -> Result<bool, StoreError> {
        let now = store.listed_version(heartbeat).await?;
        let silent = now.as_ref() == self.versions.get(heartbeat);
        if !silent {
            tracing::info!(
                heartbeat,
                "a heartbeat judged silent has beaten since; not acting on the verdict"
            );
        }
        Ok(silent)
    }

    /// [`Judged::still_silent`] for `worker`'s heartbeat (a worker without a registration
    /// seen has nothing to check).
    async fn worker_still_silent(&self, store: &Store, worker: &str) -> Result<bool, StoreError> {
        match self
            .workers
            .iter()
            .find(|view| view.registration.worker == worker)
        {
            Some(view) => self.still_silent(store, &view.registration.heartbeat).await,
            None => Ok(true),
        }
    }
}

/// Admits a recovery of an interrupted source under its deterministic ID, or under the ID
/// that already claimed it (an operator's `rekindle recover` that crashed before indexing).
pub(super) async fn admit_interrupted(
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
pub(super) async fn execute(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    action: &Action,
    runs: &[RunView],
    known: &BTreeMap<&RecoveryId, &(RecoveryRecord, ETag)>,
    judged: &Judged<'_>,
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
            let heartbeat = observed.and_then(|r| r.entry.holder.as_deref());
            let silent = async {
                match heartbeat {
                    Some(heartbeat) => judged.still_silent(store, heartbeat).await,
                    None => Ok(true),
                }
            };
            let (same, silent) = futures::join!(
                still_as_observed(store, source, observed.map(|r| &r.entry)),
                silent
            );
            if same? && silent? {
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
            // Judged gone while it ran this attempt: unless it has beaten since, its attempt
            // is handed back, and the next one takes the recovery run's lease from it at once.
            if !judged.worker_still_silent(store, worker).await? {
                return Ok((false, None));
            }
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
            // A record this tick saw finished says its entry goes, for good: no event leaves
            // that state, and removing an entry that is already gone (the worker removes it
            // as it finishes, `runs rm` with the record) changes nothing. Any other record is
            // read again, so an entry is never written from a version that has moved on.
            if let Some((record, _)) = known.get(recovery).copied()
                && record.state == RecoveryState::Finished
            {
                lifecycle::sync_index(store, record).await?;
            } else if let Some((record, _)) = recovery::read(store, recovery).await? {
                lifecycle::sync_index(store, &record).await?;
            }
            false
        }
    };
    Ok((progress, None))
}
