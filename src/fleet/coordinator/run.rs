//! The coordinator's loop: leadership and standby, pacing the next turn (a full tick, only
//! the named wake-ups, or a look at the heartbeats), waiting, and shutdown.
//!
//! It never decides what a tick does; it decides when one comes.

use super::*;

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
    let partitions = match options.partitions {
        Some(wanted) => crate::store::partitions::set(&store, wanted).await,
        None => crate::store::partitions::read(&store).await,
    };
    let partitions = match partitions {
        Ok(partitions) => partitions,
        Err(error) => {
            stop.store(true, Ordering::SeqCst);
            let _ = beating.await;
            let _ = holder.retire().await;
            return Err(error.into());
        }
    };
    let mut shares = Shares::new(partitions);
    if partitions > 1 {
        // A member only once its heartbeat is written (the heartbeat task's first beat).
        holder.beat().await.ok();
        if let Err(error) = join(&store, &options).await {
            tracing::warn!(%error, "cannot write the coordinator's membership; owning partitions by their leases alone");
        }
        tracing::info!(coordinator = %options.id, partitions, "sharing the bucket's partitions");
    }
    let mut observer = Observer {
        partitions,
        marker_read_at: Some(crate::clock::Stopwatch::start()),
        ..Observer::default()
    };
    // Kept across ticks: a standby judges the leader dead only after a whole TTL of silence.
    let mut standby = ExpiryWatch::default();
    // Ticks may follow each other at once while they make progress (admissions to assign),
    // up to a bound.
    let mut followed_up = 0;
    // Whether the wait before this tick was cut short by a wake-up.
    let mut woken = false;
    // Whether the next turn must be a full tick (the last one asked for another at once).
    let mut tick_due = false;
    let mut first = true;
    // When this coordinator's share last changed (a split bucket).
    let mut share_changed: Option<crate::clock::Stopwatch> = None;
    while !stop.load(Ordering::SeqCst) {
        follow_a_split(&store, &options, &mut observer, &mut shares).await;
        let before: Vec<u32> = shares.held.keys().copied().collect();
        if shares.partitions > 1 && (shares.is_empty() || observer.liveness_at.is_none()) {
            // Holding nothing, no tick lists the heartbeats: look at the members here.
            if let Err(error) = look_at_members(&store, &options, &mut observer).await {
                tracing::warn!(%error, "cannot list the coordinators");
            }
        }
        rebalance(
            &store,
            &holder,
            &options,
            &mut observer,
            &mut shares,
            &mut standby,
        )
        .await;
        let after: Vec<u32> = shares.held.keys().copied().collect();
        if after != before {
            // Partitions taken from another coordinator: the wake-ups their runs' hosts sent
            // went to it, so this one does not idle on them for a while.
            share_changed = Some(crate::clock::Stopwatch::start());
        }
        if after != before || std::mem::take(&mut first) {
            // Another coordinator may have written the inboxes since this one last did, and
            // changed the fleet (and the records) since this one last looked.
            observer.inboxes.clear();
            observer.inbox_objects.clear();
            observer.last_view = None;
            observer.records.clear();
            set_leading(&options, !shares.is_empty());
            crate::metrics::set(
                crate::metrics::COORDINATOR_PARTITIONS,
                shares.held.len() as f64,
            );
        }
        let leading = (!shares.is_empty()).then_some(&shares);
        // A standby looks at the leader's lease at least once per TTL: taking over needs two
        // looks a TTL apart, so a scan interval longer than the TTL would double the wait.
        let scan = scan_interval(&options, &observer);
        let mut pause = if leading.is_some() {
            scan
        } else {
            options.scan_interval.min(options.ttl)
        };
        // Coordinators sharing partitions watch each other: one that falls silent has its
        // partitions taken over once its TTL runs out, not a scan later.
        let mut watching = !observer.members.is_empty();
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
            let view_left = scan.saturating_sub(age);
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
        relay_wakeup(&observer, &shares, plain, &named);
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
                        lost_leadership(&options, &mut shares, &error);
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
            let members = observer.members.clone();
            let ticked = tick(&store, &holder, &options, &mut observer, Some(held)).await;
            // A member joined or left: the shares move now, not a scan later.
            let rebalance_now = shares.partitions > 1 && observer.members != members;
            let mut named_offered = false;
            if ticked.is_ok() && !after_tick.is_empty() {
                let named = std::mem::take(&mut after_tick);
                match assign_named(&store, &holder, &options, &mut observer, held, named).await {
                    Err(TickError::NotLeading(error)) => {
                        lost_leadership(&options, &mut shares, &error);
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
                    lost_leadership(&options, &mut shares, &error);
                    continue;
                }
                Ok(report)
                    if (report.again || rebalance_now) && followed_up < MAX_IMMEDIATE_TICKS =>
                {
                    followed_up += 1;
                    tick_due = report.again;
                    continue;
                }
                Ok(report) => {
                    watching = report.watching || !observer.watched.is_empty();
                    // A named recovery assigned (or still waiting) after this tick is work the
                    // index may not have shown it: not an idle fleet.
                    // Nor is one whose members must be watched while the watch is off: the
                    // scans watch them then.
                    let watch_off = options.watch_interval >= options.scan_interval;
                    let members_unwatched = watch_off && !observer.members.is_empty();
                    let just_shared = shares.partitions > 1
                        && share_changed
                            .as_ref()
                            .is_some_and(|at| at.elapsed() < options.idle_scan_interval);
                    if !report.busy && !named_offered && !members_unwatched && !just_shared {
                        pause = options.idle_scan_interval.max(scan);
                    }
                    // Woken (a worker that handed a recovery back wakes it), but the running
                    // records were taken from the cache: look again once they are due, not
                    // a scan interval later.
                    if woken && let Some(due) = report.recheck {
                        pause = pause.min(due + Duration::from_millis(5));
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "coordinator tick failed");
                    // No view to pace by: look again a scan interval on.
                    pause = pause.min(options.scan_interval);
                }
            }
        }
        followed_up = 0;
        // A paced interval is longer than the scan interval only because the watch looks
        // between the scans: it runs then, whatever this tick saw (every entry finished or
        // waiting, a failed tick), so a host that starts a run and dies is seen within a watch
        // interval of its TTL, not at the paced scan.
        let watching = watching || scan > options.scan_interval;
        woken = wait_for_next_tick(&store, &options, &mut observer, pause, watching, &stop).await;
    }
    if let Some(readiness) = &options.readiness {
        readiness.draining();
    }
    for held in shares.held.values() {
        let _ = holder.release(held).await;
    }
    if shares.partitions > 1 {
        leave(&store, &options).await;
    }
    let _ = beating.await;
    let _ = holder.retire().await;
    Ok(())
}

/// Waits `pause` for the next tick, cut short by a wake-up or a stop; while `watching`,
/// lists the heartbeats every watch interval (and when a silent holder's TTL runs out) and
/// ends the wait as soon as a watched holder is judged gone. Returns whether a wake-up (or
/// the stop) cut the wait short.
pub(super) async fn wait_for_next_tick(
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

/// Logs that this coordinator lost a partition's lease (in a bucket of one partition, the
/// leadership), forgets it, and says to `/readyz` and the metrics whether it still owns any.
pub(super) fn lost_leadership(
    options: &CoordinatorOptions,
    shares: &mut Shares,
    error: &LeaseError,
) {
    shares.drop_lost(error);
    if shares.is_empty() {
        tracing::info!(coordinator = %options.id, %error, "no longer leading");
    } else {
        tracing::info!(coordinator = %options.id, %error, "lost a partition");
    }
    set_leading(options, !shares.is_empty());
    crate::metrics::set(
        crate::metrics::COORDINATOR_PARTITIONS,
        shares.held.len() as f64,
    );
}

/// Tells `/readyz` and the metrics whether this coordinator leads. A coordinator that stops
/// leading zeroes its view of the fleet, so dashboards summing over coordinators count only
/// the leader's.
pub(super) fn set_leading(options: &CoordinatorOptions, leading: bool) {
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

/// Ticks that may follow each other without a pause while each makes progress.
pub(super) const MAX_IMMEDIATE_TICKS: u32 = 64;
