//! The coordinator half of a named recovery: a wake-up naming recoveries is placed on the last
//! full tick's view of the workers, without a full tick (an assignment, or a fresh admission
//! forwarded to the worker that claims it).
//!
//! It never writes a record except through the lifecycle executor.

use super::*;

/// What a named assignment did: the names to look at again after a full tick (none if every
/// named recovery that waits for a worker was offered one), and whether any offer landed.
#[derive(Debug, Default)]
pub(super) struct NamedOutcome {
    pub(super) again: Vec<RecoveryId>,
    pub(super) offered: bool,
    /// A worker offered one did not answer its wake-up.
    pub(super) unanswered: bool,
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
pub(super) async fn assign_named(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    leading: &Shares,
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
        futures::join!(leading.check(holder), read(named), forwarding);
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
                // Another coordinator's partition: its owner places it (the forward, if
                // any, still lets a worker claim it first).
                Ok(Some((record, _))) if !leading.owns_run(record.source_run.as_str()) => {}
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
    // Only assignments run here, which no verdict of silence justifies: nothing judged.
    let nothing = BTreeMap::new();
    let judged = &Judged {
        versions: &nothing,
        workers: &workers,
    };
    let executed = futures::stream::iter(actions.clone())
        .map(|action| async move {
            match execute(store, holder, options, &action, observed, known, judged).await {
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
pub(super) const NAMED_ROUNDS: usize = 3;

/// Wakes each worker `targets` names (one target per name of `batch`, `None`: not forwarded)
/// naming the recoveries forwarded to it, all at once. A name whose worker did not answer
/// that it claims it (full, stopping, an older build, or no answer) is placed from its record
/// as usual.
pub(super) async fn forward_to(
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
pub(super) struct Forwarded {
    pub(super) claimed: Vec<(RecoveryId, String)>,
    pub(super) deaf: Vec<String>,
    /// Every name a wake-up carried to a worker, answered or not (a lost answer may follow a
    /// delivered wake-up).
    pub(super) sent: Vec<RecoveryId>,
}
