//! The inbox object's only reader and writer: what each worker is offered, rewritten when it
//! changes, and the wake-ups that follow.
//!
//! It never decides assignments.

use super::*;

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

/// A tick's assignments, for the inboxes: those decided, the recoveries whose assignment
/// landed, and the records those offers left, by worker.
#[derive(Clone, Copy)]
pub(super) struct Assigned<'a> {
    pub(super) decided: &'a [Action],
    pub(super) landed: &'a std::collections::BTreeSet<RecoveryId>,
    pub(super) offered: &'a BTreeMap<String, Vec<Offer>>,
}

/// Each live worker's inbox: the recoveries assigned to it and not yet finished. Written
/// only when it changed (side by side); a worker whose inbox gained a recovery is woken.
/// Returns the workers that did not answer their wake-up.
pub(super) async fn write_inboxes(
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
    // In a bucket split into partitions, the partition and admission time of each recovery,
    // for the parts each is written in.
    let sharing = observer.sharing.as_ref();
    let sources: BTreeMap<RecoveryId, (u32, u64)> = match observer.partitions {
        partitions if partitions > 1 => runs
            .iter()
            .filter_map(|run| run.recovery.as_ref().map(|record| (run, record)))
            .map(|(run, record)| {
                let partition = layout::partition_of_run(run.entry.run_id.as_str(), partitions);
                (
                    record.recovery_id.clone(),
                    (partition, record.admitted_at_ms),
                )
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    let sources = &sources;
    let cached = &observer.inbox_objects;
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
                        return Ok(Written::Unchanged);
                    }
                    let offers: Vec<Offer> = offered
                        .get(&worker)
                        .map(|offers| {
                            offers
                                .iter()
                                .filter(|offer| recoveries.contains(&offer.record.recovery_id))
                                .cloned()
                                .collect()
                        })
                        .unwrap_or_default();
                    let Some(owned) = sharing else {
                        let inbox = Inbox {
                            format: FORMAT_VERSION,
                            kind: "inbox".into(),
                            worker: worker.clone(),
                            recoveries: recoveries.clone(),
                            coordinator_wake,
                            offers,
                            ..Inbox::default()
                        };
                        return store
                            .put(&layout::inbox(&worker), layout::encode_object(&inbox))
                            .await
                            .map(|_| Written::Whole);
                    };
                    let parts = parts_of(&recoveries, offers, sources, owned, coordinator_wake);
                    let cached = cached.get(&worker).cloned();
                    merge_write(store, &worker, cached, owned, parts).await
                };
                let (written, answered) = if named.is_empty() {
                    let written = put.await?;
                    (written, poke.await)
                } else {
                    let (put, answered) = futures::join!(put, poke);
                    (put?, answered)
                };
                Ok::<_, StoreError>((worker, recoveries, answered, written))
            }
        })
        .buffer_unordered(ACTION_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut unanswered = Vec::new();
    for result in written {
        let (worker, recoveries, answered, written) = result?;
        match written {
            Written::Merged(inbox, etag) => {
                observer
                    .inbox_objects
                    .insert(worker.clone(), (*inbox, etag));
                observer.inboxes.insert(worker.clone(), recoveries);
            }
            // Contended past its tries: written again next tick, read afresh.
            Written::Contended => {
                observer.inbox_objects.remove(&worker);
            }
            Written::Whole | Written::Unchanged => {
                observer.inboxes.insert(worker.clone(), recoveries);
            }
        }
        if !answered {
            unanswered.push(worker);
        }
    }
    Ok(unanswered)
}

/// How one inbox write went.
enum Written {
    /// Nothing to write.
    Unchanged,
    /// Written whole (a bucket of one partition).
    Whole,
    /// This share's parts merged into the inbox, as it now is and its version.
    Merged(Box<Inbox>, ETag),
    /// Other owners kept changing it: left to the next tick.
    Contended,
}

/// Tries of one merged inbox write before it is left to the next tick.
const MERGE_TRIES: usize = 4;

/// This share's parts of a worker's inbox: `recoveries` (this coordinator's, in order) by the
/// partition of their source run, each with its offers and this coordinator's wake-up address;
/// every owned partition has a part, empty if it assigns the worker nothing.
fn parts_of(
    recoveries: &[RecoveryId],
    offers: Vec<Offer>,
    sources: &BTreeMap<RecoveryId, (u32, u64)>,
    owned: &std::collections::BTreeSet<u32>,
    wake: Option<String>,
) -> BTreeMap<u32, InboxPart> {
    let fallback = owned.first().copied().unwrap_or(0);
    let mut parts: BTreeMap<u32, InboxPart> = owned
        .iter()
        .map(|&partition| {
            let part = InboxPart {
                coordinator_wake: wake.clone(),
                ..InboxPart::default()
            };
            (partition, part)
        })
        .collect();
    let partition_of = |id: &RecoveryId| sources.get(id).map_or((fallback, u64::MAX), |s| *s);
    for id in recoveries {
        let (partition, admitted) = partition_of(id);
        if let Some(part) = parts.get_mut(&partition) {
            part.queued.push((id.clone(), admitted));
        }
    }
    for offer in offers {
        let (partition, _) = partition_of(&offer.record.recovery_id);
        if let Some(part) = parts.get_mut(&partition) {
            part.offers.push(offer);
        }
    }
    parts
}

/// Writes this share's `parts` into `worker`'s inbox by compare-and-swap, keeping the other
/// partitions' parts: on the version cached from this coordinator's last write, or read now;
/// a swap refused because another owner wrote meanwhile reads the inbox again and merges once
/// more, up to [`MERGE_TRIES`] times.
async fn merge_write(
    store: &Store,
    worker: &str,
    mut cached: Option<(Inbox, ETag)>,
    owned: &std::collections::BTreeSet<u32>,
    parts: BTreeMap<u32, InboxPart>,
) -> Result<Written, StoreError> {
    let key = layout::inbox(worker);
    for _ in 0..MERGE_TRIES {
        let (mut inbox, etag) = match cached.take() {
            Some((inbox, etag)) => (inbox, Some(etag)),
            None => read_inbox_version(store, worker).await?,
        };
        inbox.format = FORMAT_VERSION;
        inbox.kind = "inbox".into();
        inbox.worker = worker.to_owned();
        inbox.merge(owned, parts.clone());
        let bytes = layout::encode_object(&inbox);
        let written = match &etag {
            Some(etag) => store.swap(&key, bytes, etag).await,
            None => store.create(&key, bytes).await,
        };
        match written {
            Ok(etag) => return Ok(Written::Merged(Box::new(inbox), etag)),
            Err(
                StoreError::Changed { .. }
                | StoreError::AlreadyExists { .. }
                | StoreError::Unconfirmed { .. },
            ) => continue,
            Err(other) => return Err(other),
        }
    }
    Ok(Written::Contended)
}

/// A worker's inbox with its version (`None` if there is none; an unreadable one is
/// replaced).
pub(super) async fn read_inbox_version(
    store: &Store,
    worker: &str,
) -> Result<(Inbox, Option<ETag>), StoreError> {
    let key = layout::inbox(worker);
    Ok(match store.read(&key).await? {
        Some(object) => (
            layout::decode_object::<Inbox>(&key, "inbox", &object.bytes).unwrap_or_default(),
            Some(object.etag),
        ),
        None => (Inbox::default(), None),
    })
}

/// Reads the inboxes of `workers` again (side by side), for what the other partitions'
/// owners assigned them: a tick that places recoveries counts those against the workers.
pub(super) async fn refresh_inboxes(store: &Store, observer: &mut Observer, workers: Vec<String>) {
    let read = futures::stream::iter(workers)
        .map(|worker| async move {
            let read = read_inbox_version(store, &worker).await;
            (worker, read)
        })
        .buffer_unordered(ACTION_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for (worker, read) in read {
        match read {
            Ok((inbox, Some(etag))) => {
                observer.inbox_objects.insert(worker, (inbox, etag));
            }
            Ok((_, None)) => {
                observer.inbox_objects.remove(&worker);
            }
            Err(error) => tracing::debug!(worker_id = %worker, %error, "cannot read an inbox"),
        }
    }
}
