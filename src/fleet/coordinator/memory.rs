//! What the coordinator remembers between turns, and the judgements over it: the caches of
//! registrations and records, the liveness watch, who did not answer, what was offered or
//! named to whom, and since when.
//!
//! This module never awaits and never touches the store: every function takes what was
//! observed (and reads only the monotonic clock through the stopwatches it keeps), so what a
//! tick decides from its memory can be followed without the bucket. `tests/layers.rs` keeps it
//! so.

use super::*;

/// The coordinator's memory between ticks: caches and liveness observations.
#[derive(Default)]
pub(super) struct Observer {
    pub(super) index: IndexWatch,
    // Ordered maps: the order of store calls must not depend on a hasher's random seed, so a
    // seeded simulation replays exactly.
    pub(super) registrations: BTreeMap<String, (Option<ETag>, Registration)>,
    pub(super) liveness: Judge,
    pub(super) inboxes: BTreeMap<String, Vec<RecoveryId>>,
    /// Workers that did not answer a wake-up, with the heartbeat version they had then: not
    /// offered new recoveries until their heartbeat changes (a worker that died while idle
    /// is judged by its long idle TTL, and must not hold up a recovery that long).
    pub(super) unreachable: BTreeMap<String, ETag>,
    /// Workers judged with their full-rate TTL last tick (they ran a recovery).
    pub(super) judged_busy: std::collections::BTreeSet<String>,
    /// Heartbeats judged silent, at the version judged: they stay judged gone until they
    /// change, whatever TTL applies next (a worker judged dead mid-attempt is idle once its
    /// attempt is handed back, and its long idle TTL must not bring it back to life).
    pub(super) gone: BTreeMap<String, ETag>,
    /// Recoveries offered to a worker and not started yet: to whom, and since when. An offer
    /// not taken within the worker's full TTL moves on (the worker answered its wake-up but
    /// died, or has no wake-up address and died while idle, judged by its long idle TTL).
    pub(super) offered: BTreeMap<RecoveryId, (String, crate::clock::Stopwatch)>,
    /// Recoveries seen declined (admitted, offered to nobody, `declined_by` set) last tick.
    pub(super) declines: std::collections::BTreeSet<RecoveryId>,
    /// Recovery records as last read, by source run, with the index entry they were read for
    /// and when: a record is read again when its entry changed, while it is offered and not
    /// started, while it is a fresh admission named to a worker (`forwarded`), every
    /// [`unclaimed_refresh`] while it is any other fresh admission, every [`RUNNING_REFRESH`]
    /// while it runs, after a tick acted on it, and on every sweep.
    pub(super) records:
        BTreeMap<RunId, (IndexEntry, (RecoveryRecord, ETag), crate::clock::Stopwatch)>,
    /// The TTLs holders declared as of the last tick, by heartbeat key, for the watch.
    pub(super) declared: Vec<(String, u64)>,
    /// Heartbeats of live processes that held runs at the last tick (hosts of running runs,
    /// workers running a recovery): if one falls silent, the next tick must come now.
    pub(super) watched: std::collections::BTreeSet<String>,
    /// Ticks since the last sweep (every record read again, every inbox rewritten).
    pub(super) ticks_since_sweep: u32,
    /// When this leader first saw each interrupted run so, for the oldest-interrupted gauge.
    pub(super) interrupted_since: BTreeMap<RunId, u64>,
    /// The workers and runs as the last full tick saw them (with the assignments named
    /// wake-ups made since, and the fresh admissions forwarded to a worker that claims them,
    /// counted as its), and when that tick was: what [`assign_named`] places on.
    pub(super) last_view: Option<(Vec<WorkerView>, Vec<RunView>, crate::clock::Stopwatch)>,
    /// The recoveries `last_view` counts as a worker's only because they were forwarded to
    /// it to claim: no offer, so they are never written to an inbox. Cleared with the view.
    pub(super) claims: std::collections::BTreeSet<RecoveryId>,
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
    pub(super) forwarded: BTreeMap<RecoveryId, crate::clock::Stopwatch>,
    /// Workers that did not answer the wake-up of a named assignment, marked unreachable by
    /// the next full tick.
    pub(super) unanswered: Vec<String>,
    /// When the heartbeats were last listed and judged (by a tick or the watch).
    pub(super) liveness_at: Option<crate::clock::Stopwatch>,
    /// The other coordinators sharing the partitions, by membership key, whose heartbeats
    /// were judged alive at the last listing (see `share`).
    pub(super) members: std::collections::BTreeSet<String>,
    /// Members whose heartbeats were judged gone at the last listing: their partitions'
    /// leases are taken over without waiting a second TTL.
    pub(super) gone_members: std::collections::BTreeSet<String>,
    /// The bucket's partition count as of the last tick, and (in a bucket of several) the
    /// partitions this coordinator's share held then.
    pub(super) partitions: u32,
    pub(super) sharing: Option<std::collections::BTreeSet<u32>>,
    /// In a bucket of several partitions, each worker's inbox as this coordinator last wrote
    /// or read it, with its version: the other owners' parts, and the version to swap.
    pub(super) inbox_objects: BTreeMap<String, (Inbox, ETag)>,
    /// What each listed member's heartbeat said (its TTL, where it takes wake-ups) when its
    /// membership was listed at its current version, and when this coordinator last nudged
    /// the members to hand partitions over.
    pub(super) member_info: BTreeMap<String, MemberInfo>,
    pub(super) relayed_at: Option<crate::clock::Stopwatch>,
    /// When a coordinator of a bucket of one partition last read the format marker (see
    /// `share::follow_a_split`).
    pub(super) marker_read_at: Option<crate::clock::Stopwatch>,
    /// The heartbeats judged silent at the last look (see [`fell_silent`]).
    pub(super) silent: std::collections::BTreeSet<String>,
}

/// What a member's membership declared, read once per version of it (a coordinator restarted
/// under its ID with another TTL or address writes another body, so another version).
#[derive(Clone, Debug, Default)]
pub(super) struct MemberInfo {
    pub(super) version: Option<ETag>,
    /// The TTL it declared: it is judged by that, not by this coordinator's own, so
    /// coordinators configured with different TTLs never judge each other gone between beats.
    pub(super) ttl_ms: u64,
    pub(super) wake: Option<String>,
}

/// The recoveries other partitions' owners assigned `worker`, as its inbox last said.
pub(super) fn elsewhere(observer: &Observer, worker: &str) -> u32 {
    match (&observer.sharing, observer.inbox_objects.get(worker)) {
        (Some(owned), Some((inbox, _))) => inbox.elsewhere(owned),
        _ => 0,
    }
}

/// Judges the coordinators' memberships `listed` by their heartbeats' verdicts in `alive`
/// (a membership whose heartbeat is not listed is gone); `own` is this coordinator's.
pub(super) fn judge_members(
    observer: &mut Observer,
    own: &str,
    listed: &[(String, Option<ETag>)],
    alive: &HashMap<String, bool>,
) {
    observer.members.clear();
    observer.gone_members.clear();
    for (member, _) in listed.iter().filter(|(member, _)| member.as_str() != own) {
        let beats = layout::member_heartbeat(member)
            .and_then(|beat| alive.get(&beat).copied())
            .unwrap_or(false);
        if beats {
            observer.members.insert(member.clone());
        } else {
            observer.gone_members.insert(member.clone());
        }
    }
}

/// Index pages a leader's full scans list per second at most, at steady state: the interval
/// between full ticks stretches past the scan interval as the index grows (a page lists
/// 1 000 entries), so their requests do not grow with the runs. Nothing waits on it: a holder
/// falling silent (the heartbeat watch), a wake-up (a new run, an admission, a freed slot) and
/// a tick that asks for another all bring the next full tick at once.
pub(super) const INDEX_PAGES_PER_SECOND: u64 = 1;

/// The interval between full ticks while the fleet is busy: the scan interval, or as long as
/// listing this share's index at [`INDEX_PAGES_PER_SECOND`] takes, whichever is longer.
pub(super) fn scan_interval(options: &CoordinatorOptions, observer: &Observer) -> Duration {
    if options.watch_interval >= options.scan_interval {
        // No watch between ticks: the scans are what sees a holder fall silent.
        return options.scan_interval;
    }
    let pages = observer.index.len().div_ceil(1000) as u64;
    options
        .scan_interval
        .max(Duration::from_secs(pages / INDEX_PAGES_PER_SECOND))
}

/// Whether a heartbeat judged alive at the last look is judged silent now (`alive`: this
/// look's verdicts), remembering this look's silent ones. Between full ticks that come
/// seldom in a big bucket, a holder whose runs the last tick did not see (a run started
/// since, by a host that sent no wake-up) is noticed when its heartbeat falls silent, and the
/// full tick that follows finds its runs.
pub(super) fn fell_silent(observer: &mut Observer, alive: &HashMap<String, bool>) -> bool {
    let silent: std::collections::BTreeSet<String> = alive
        .iter()
        .filter(|(_, alive)| !**alive)
        .map(|(key, _)| key.clone())
        .collect();
    let fell = silent.iter().any(|key| !observer.silent.contains(key));
    observer.silent = silent;
    fell
}

/// The TTLs the listed members declared, by heartbeat key, for judging them.
pub(super) fn member_ttls(observer: &Observer) -> impl Iterator<Item = (String, u64)> + '_ {
    observer.member_info.iter().filter_map(|(member, info)| {
        Some((layout::member_heartbeat(member)?, info.ttl_ms)).filter(|(_, ttl)| *ttl > 0)
    })
}

/// The heartbeats of the live members: watched between ticks like a host's.
pub(super) fn member_heartbeats(observer: &Observer) -> impl Iterator<Item = String> + '_ {
    observer
        .members
        .iter()
        .filter_map(|member| layout::member_heartbeat(member))
}

/// Every this many ticks, a sweep: records that are otherwise cached are read again, and every
/// inbox is rewritten.
pub(super) const SWEEP_TICKS: u32 = 30;

/// A worker offered a recovery is judged and watched at its full rate from now on, not from
/// the next scan: if it dies before or right after starting, its silence is seen within its
/// TTL plus the watch interval.
pub(super) fn judge_offered_busy(observer: &mut Observer, offered: &BTreeMap<String, Vec<Offer>>) {
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

/// Puts the records as the landed offers left them into `runs`, so that the next named
/// assignment counts those recoveries against their workers.
pub(super) fn apply_offers(runs: &mut [RunView], offered: &BTreeMap<String, Vec<Offer>>) {
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

/// Keeps a heartbeat judged silent judged so until its version changes, for the keys in
/// `remembered` (workers that ran a recovery): `gone` remembers the version judged, `alive`
/// is corrected for it, and versions that moved on (or heartbeats no longer listed) are
/// forgotten.
pub(super) fn remember_the_gone(
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
pub(super) fn pass_over_untaken_offers(
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
pub(super) fn action_source<'a>(action: &'a Action, runs: &'a [RunView]) -> Option<&'a RunId> {
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

/// How stale a cached record of a running recovery may be: a worker hands one back (a yield,
/// a failure) without touching the index, and the coordinator sees it within this. (A
/// decision on a stale record is safe: its compare-and-swap fails and the record is read
/// again.)
pub(super) const RUNNING_REFRESH: Duration = Duration::from_secs(1);

/// How stale a cached fresh admission this leader never named to a worker may be (at most;
/// see [`unclaimed_refresh`]). Only this leader's assignment starts one, except a claim by a
/// worker an earlier leader (or a forged wake-up) named it to: the view then counts it as
/// waiting while it runs, until an assignment's swap fails on it, or this long. Read on every
/// tick, a thousand admissions waiting for slots cost the 1-worker bench 68 GETs per
/// recovery.
pub(super) const UNCLAIMED_REFRESH: Duration = Duration::from_secs(5);

/// The listed version of `worker`'s heartbeat, if it is registered and beating.
pub(super) fn registration_beat(
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

/// Liveness of every listed heartbeat, judged by [`liveness::judge_heartbeats`] with the TTL
/// each holder declared in its index entry or registration. A worker running a recovery is
/// judged by its full-rate TTL, an idle one by its idle TTL; when a worker turns busy its
/// watch starts over (its last idle beat may be older than the full-rate TTL, and it beat
/// at once when it turned busy, which this observation may not show yet). Also says whether a
/// heartbeat fell silent at this look (see [`fell_silent`]).
pub(super) fn judge_liveness(
    options: &CoordinatorOptions,
    observer: &mut Observer,
    runs: &[RunView],
    held: &BTreeMap<Arc<str>, Holding>,
    heartbeats: Vec<(String, ETag)>,
    seen: Seen,
) -> (HashMap<String, bool>, bool) {
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
        .chain(
            held.iter()
                .filter_map(|(key, holding)| Some((key.to_string(), holding.ttl_ms?))),
        )
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
    declared.extend(member_ttls(observer));
    // A named heartbeat that is not listed is judged at the absent version, for a TTL like any
    // other: one removed as a dead process's just as its process came back is written again
    // within a third of its TTL.
    let named = runs
        .iter()
        .filter_map(|run| run.entry.holder.as_deref())
        .chain(held.keys().map(|key| &**key))
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
    let fell = fell_silent(observer, &alive);
    (alive, fell)
}

/// How long a named recovery not seen since is remembered (its admission writes the index
/// entry after the record, a moment after the name went out; a record read can fail).
pub(super) const FORWARD_REMEMBERED: Duration = Duration::from_secs(60);

/// The most named recoveries remembered: forged wake-ups name what they like, and names are
/// forwarded before they are read. Past it the longest unseen are forgotten, which costs only
/// a cache that may be [`unclaimed_refresh`] stale.
pub(super) const FORWARDED_MAX: usize = 8192;

/// Remembers recoveries named to workers (see `Observer::forwarded`).
pub(super) fn note_forwarded(
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
pub(super) fn unclaimed_refresh(observer: &Observer, ttl: Duration) -> Duration {
    observer
        .registrations
        .values()
        .filter_map(|(_, registration)| registration.ttl_ms)
        .map(Duration::from_millis)
        .chain(std::iter::once(ttl))
        .map(|ttl| ttl / 2)
        .fold(UNCLAIMED_REFRESH, Duration::min)
}
