//! The tick as a sequence: observe → judge → decide (`core::placement::decide`) → check the
//! leadership again if it admits → execute → inboxes → clean up.
//!
//! It holds no state of its own: what carries over between ticks is the [`Observer`]'s.

use super::*;

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
pub(super) enum TickError {
    /// Observing the bucket or writing failed; the next tick tries again.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The leadership lease is lost: nothing of this tick is acted on.
    #[error(transparent)]
    NotLeading(LeaseError),
}

/// One look at the bucket and the actions it calls for. With `leading` (this coordinator's
/// share of the partitions), only the share's index shards are read, its leases are checked
/// while the index is read (one round trip fewer), and nothing is acted on if one is lost.
/// Without, the whole index is read.
pub(super) async fn tick(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    leading: Option<&Shares>,
) -> Result<TickReport, TickError> {
    observer.partitions = leading.map_or(1, |shares| shares.partitions);
    observer.sharing = leading
        .filter(|shares| shares.partitions > 1)
        .map(|shares| shares.held.keys().copied().collect());
    let Read {
        runs,
        held,
        recheck,
        heartbeats,
        seen,
        versions,
        named,
        members,
    } = read_the_bucket(store, holder, options, observer, leading).await?;
    // Sharing the workers with other partitions' owners: what they assigned each worker takes
    // its slots too, read afresh when this tick may place a recovery.
    if observer.sharing.is_some()
        && runs.iter().any(|run| {
            run.recovery
                .as_ref()
                .is_some_and(|record| record.state == RecoveryState::Admitted)
        })
    {
        let workers = observer
            .registrations
            .values()
            .map(|(_, registration)| registration.worker.clone())
            .collect();
        refresh_inboxes(store, observer, workers).await;
    }
    let (workers, mut runs, alive, fell) =
        judge(options, observer, runs, &held, heartbeats, seen, &versions);
    judge_members(
        observer,
        &layout::coordinator_member(&options.id),
        &members,
        &alive,
    );
    // The runs of holders judged gone, read again in full: interrupted (the rest of the
    // runs hosts drive need nothing but their holder's watch).
    let gone: std::collections::BTreeSet<String> = held
        .keys()
        .filter(|key| !alive.get(&***key).copied().unwrap_or(false))
        .map(|key| key.to_string())
        .collect();
    if !gone.is_empty() {
        runs.extend(
            observer
                .index
                .held_by(store, &gone)
                .await
                .into_iter()
                .map(|entry| RunView {
                    entry,
                    holder_alive: false,
                    recovery: None,
                    answered: false,
                }),
        );
        runs.sort_by(|a, b| a.entry.run_id.cmp(&b.entry.run_id));
    }
    let driven = held
        .iter()
        .filter(|(key, _)| !gone.contains(&***key))
        .map(|(_, holding)| holding.runs)
        .sum();
    export_fleet(
        &runs,
        driven,
        &workers,
        store.clock().wall_ms(),
        &mut observer.interrupted_since,
    );
    let actions = decide(&workers, &runs, options);
    // Leadership was checked as the tick began; a pause or a slow read since may have cost it,
    // and an admission fences a host on this tick's verdict. Checked again before admitting
    // (one GET, only in a tick that admits; other actions are compare-and-swaps on records,
    // which two leaders at once only make cost requests).
    if let Some(shares) = leading
        && actions
            .iter()
            .any(|action| matches!(action, Action::Admit { .. }))
    {
        shares.check(holder).await.map_err(TickError::NotLeading)?;
    }
    let judged = Judged {
        versions: &versions,
        workers: &workers,
    };
    let acted = act(store, holder, options, observer, &actions, &runs, &judged).await;
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
        landed: &acted.moved,
        offered: &acted.offered,
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
    // Also when a heartbeat fell silent at this tick's own look: the index was listed before
    // the heartbeats, so a run its holder started in between is in the next listing only (no
    // watch brings it, since the heartbeat is silent already, and a paced scan could be far).
    let again = newly_unreachable || acted.progressed || acted.stale || fell;
    judge_offered_busy(observer, &acted.offered);
    watch_the_living(observer, &workers, &runs, &held, &alive);
    // The index named is this share's only: partition 0's owner cleans up for everyone (a
    // removed heartbeat fences nothing, see `cleanup`).
    if let Some(named) = &named
        && leading.is_none_or(Shares::cleans_up)
    {
        remove_the_dead(store, holder, observer, &versions, &alive, named).await;
    }
    let busy = !runs.is_empty() || !held.is_empty();
    apply_offers(&mut runs, &acted.offered);
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

/// What a tick read: the runs the control plane acts on (index entries with their records),
/// the holders of the runs hosts drive, the heartbeat listing (judged as of when it went out),
/// its versions, and the holders the index names (`None` while an entry is unreadable: it
/// might name any heartbeat, so none is removed).
struct Read {
    runs: Vec<RunView>,
    held: BTreeMap<Arc<str>, Holding>,
    recheck: Option<Duration>,
    heartbeats: Vec<(String, ETag)>,
    seen: Seen,
    versions: BTreeMap<String, ETag>,
    named: Option<std::collections::BTreeSet<String>>,
    members: Vec<(String, Option<ETag>)>,
}

/// The tick's reads: the leadership (with `leading`) beside the index, the heartbeat listing
/// with the registrations it carries, and the records of the runs it lists.
async fn read_the_bucket(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    leading: Option<&Shares>,
) -> Result<Read, TickError> {
    // The index is read before the heartbeats: a host beats before it writes its entry, so
    // every holder named by an entry seen here is in the heartbeat listing that follows, and
    // a missing heartbeat really means the holder is gone.
    let checking = async {
        match leading {
            Some(shares) => shares.check(holder).await,
            None => Ok(()),
        }
    };
    let ranges = match leading {
        Some(shares) if !shares.whole() => shares.ranges(),
        _ => vec![(0, 255)],
    };
    // A tick that fails part-way leaves no view to place named recoveries on. The records
    // read now say who claimed what.
    observer.last_view = None;
    observer.claims.clear();
    let (checked, scanned) = futures::join!(checking, observer.index.scan_shards(store, &ranges));
    checked.map_err(TickError::NotLeading)?;
    let crate::store::index::Scanned {
        entries,
        holders: held,
        bad,
    } = scanned?;
    let named = bad.is_empty().then(|| {
        entries
            .iter()
            .filter_map(|e| e.holder.clone())
            .chain(held.keys().map(|key| key.to_string()))
            .collect()
    });
    for bad in bad {
        tracing::warn!(key = %bad.key, error = %bad.error, "ignoring a bad index entry");
    }
    // Judged as seen when the listing went out, however long the rest of the tick takes
    // (registration and record reads, a slow request, a pause): see `Seen`.
    let Listing {
        heartbeats,
        registrations,
        seen,
        members,
    } = list_heartbeats_seen(store).await?;
    refresh_registrations(store, observer, &registrations).await;
    refresh_members(store, options, observer, &members).await;
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
    Ok(Read {
        runs,
        held,
        recheck,
        heartbeats,
        seen,
        versions,
        named,
        members,
    })
}

/// Judges every listed heartbeat and shapes the views `decide` places on: each worker alive
/// or not and offered to or not, each run's holder alive or not. No I/O.
fn judge(
    options: &CoordinatorOptions,
    observer: &mut Observer,
    runs: Vec<RunView>,
    held: &BTreeMap<Arc<str>, Holding>,
    heartbeats: Vec<(String, ETag)>,
    seen: Seen,
    versions: &BTreeMap<String, ETag>,
) -> (Vec<WorkerView>, Vec<RunView>, HashMap<String, bool>, bool) {
    let (alive, fell) = judge_liveness(options, observer, &runs, held, heartbeats, seen);
    pass_over_untaken_offers(observer, &runs, versions, options.ttl);
    let still: BTreeMap<String, ETag> = observer
        .unreachable
        .iter()
        .filter(|(worker, etag)| {
            registration_beat(observer, worker, versions).as_ref() == Some(*etag)
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
            elsewhere: elsewhere(observer, &registration.worker),
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
    (workers, runs, alive, fell)
}

/// `decide`'s actions: every admission due, however many (an outage's worth is executed side
/// by side, [`ACTION_CONCURRENCY`] at a time). Each is attempted on every tick until it lands,
/// so a source whose admission keeps failing (a corrupt chain, a newer format) holds up no
/// other.
fn decide(workers: &[WorkerView], runs: &[RunView], options: &CoordinatorOptions) -> Vec<Action> {
    placement::decide(workers, runs, options.max_attempts)
}

/// What executing a tick's actions left.
struct Acted {
    /// An action changed something another tick should act on at once.
    progressed: bool,
    /// An assignment was refused because its record changed since it was read.
    stale: bool,
    /// Workers whose offer landed, with the records as the offers left them.
    offered: BTreeMap<String, Vec<Offer>>,
    /// The recoveries whose assignment landed.
    moved: std::collections::BTreeSet<RecoveryId>,
}

/// Executes the actions side by side: each is one lifecycle event on its own recovery (an
/// admission fences and loads its source, which takes several round trips).
async fn act(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &Observer,
    actions: &[Action],
    runs: &[RunView],
    judged: &Judged<'_>,
) -> Acted {
    // The records as read this tick, by recovery: an assignment swaps the version observed
    // (one GET fewer per assignment; a record changed since fails the swap and is reread).
    let known: BTreeMap<&RecoveryId, &(RecoveryRecord, ETag)> = observer
        .records
        .values()
        .map(|(_, known, _)| (&known.0.recovery_id, known))
        .collect();
    let known = &known;
    let executed = futures::stream::iter(actions.iter().cloned())
        .map(|action| async move {
            match execute(store, holder, options, &action, runs, known, judged).await {
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
    Acted {
        progressed,
        stale,
        offered,
        moved,
    }
}

/// The heartbeats whose silence would need action: hosts of running runs and workers running
/// (or offered) a recovery, while they live. If one falls silent, the watch brings the next
/// tick at once.
fn watch_the_living(
    observer: &mut Observer,
    workers: &[WorkerView],
    runs: &[RunView],
    held: &BTreeMap<Arc<str>, Holding>,
    alive: &HashMap<String, bool>,
) {
    let members: Vec<String> = member_heartbeats(observer).collect();
    observer.watched = runs
        .iter()
        .filter(|run| run.entry.phase == Phase::Running && run.holder_alive)
        .filter_map(|run| run.entry.holder.clone())
        .chain(
            held.keys()
                .filter(|key| alive.get(&***key).copied().unwrap_or(false))
                .map(|key| key.to_string()),
        )
        .chain(
            workers
                .iter()
                .filter(|w| w.alive && observer.judged_busy.contains(&w.registration.worker))
                .map(|w| w.registration.heartbeat.clone()),
        )
        .chain(members)
        .collect();
}
