//! One look at the bucket: the heartbeat listing (with the registrations that live beside the
//! heartbeats), the registrations read by version, the index entries with their recovery
//! records, and the heartbeat watch between ticks.
//!
//! It never decides what to do about what it sees; judging is `memory`'s, deciding
//! `core::placement`'s.

use super::*;

/// One look at the heartbeats between ticks: whether a holder that held runs at the last
/// tick is now judged gone (one LIST).
pub(super) async fn watch(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
) -> Result<bool, StoreError> {
    let alive = look_at_heartbeats(store, options, observer).await?;
    let gone = observer
        .watched
        .iter()
        .find(|key| !alive.get(key.as_str()).copied().unwrap_or(false));
    if let Some(key) = gone {
        tracing::info!(heartbeat = %key, "a holder fell silent; looking now");
        return Ok(true);
    }
    if fell_silent(observer, &alive) {
        tracing::info!("a heartbeat fell silent; looking now");
        return Ok(true);
    }
    Ok(false)
}

/// One look at the coordinators sharing the partitions, for one that owns none (no tick lists
/// the heartbeats for it): their memberships judged by their heartbeats (one LIST), and their
/// heartbeats watched from now on.
pub(super) async fn look_at_members(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
) -> Result<(), StoreError> {
    look_at_heartbeats(store, options, observer).await?;
    observer.watched = member_heartbeats(observer).collect();
    Ok(())
}

/// Lists the heartbeats and judges them (the watched ones not listed as absent) by the TTLs
/// declared as of the last tick, and the members by theirs.
async fn look_at_heartbeats(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
) -> Result<HashMap<String, bool>, StoreError> {
    let Listing {
        heartbeats,
        seen,
        members,
        ..
    } = list_heartbeats_seen(store).await?;
    refresh_members(store, options, observer, &members).await;
    let heartbeats = liveness::with_absent(heartbeats, observer.watched.iter().map(String::as_str));
    let listed: BTreeMap<String, ETag> = heartbeats.iter().cloned().collect();
    let declared: Vec<(String, u64)> = observer
        .declared
        .iter()
        .cloned()
        .chain(member_ttls(observer))
        .collect();
    let mut alive = liveness::judge_heartbeats(
        &mut observer.liveness,
        options.ttl,
        declared.iter().map(|(key, ttl)| (key.as_str(), *ttl)),
        heartbeats,
        seen,
    );
    let running_keys = observer.watched.clone();
    remember_the_gone(&mut observer.gone, &listed, &mut alive, &running_keys);
    judge_members(
        observer,
        &layout::coordinator_member(&options.id),
        &members,
        &alive,
    );
    observer.liveness_at = Some(crate::clock::Stopwatch::start());
    Ok(alive)
}

/// Brings what is known of the members up to the versions `listed`: a membership new or at
/// a new version is read once (its TTL, its wake-up address; from its heartbeat if an older
/// build wrote it), one no longer listed is forgotten. Only a TTL read is kept: a member whose
/// read failed or said nothing is read again at the next listing, and judged by this
/// coordinator's TTL until then. In a bucket of several partitions, this coordinator's own
/// membership missing (removed by gc while it was paused past its TTLs) is written again, so
/// the others count it in their shares.
pub(super) async fn refresh_members(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    listed: &[(String, Option<ETag>)],
) {
    let own = layout::coordinator_member(&options.id);
    if observer.partitions > 1 && !listed.iter().any(|(member, _)| *member == own) {
        match join(store, options).await {
            Ok(()) => {
                tracing::info!(coordinator = %options.id, "wrote this coordinator's membership again")
            }
            Err(error) => tracing::warn!(%error, "cannot write the coordinator's membership"),
        }
    }
    observer
        .member_info
        .retain(|member, _| listed.iter().any(|(listed, _)| listed == member));
    for (member, version) in listed.iter().filter(|(member, _)| *member != own) {
        if observer
            .member_info
            .get(member)
            .is_some_and(|info| info.version == *version)
        {
            continue;
        }
        match read_member(store, member).await {
            Ok(Some((ttl_ms, wake))) if ttl_ms > 0 => {
                observer.member_info.insert(
                    member.clone(),
                    MemberInfo {
                        version: version.clone(),
                        ttl_ms,
                        wake,
                    },
                );
            }
            Ok(_) => {
                observer.member_info.remove(member);
            }
            Err(error) => {
                observer.member_info.remove(member);
                tracing::debug!(%error, %member, "cannot read a coordinator's membership")
            }
        }
    }
}

/// A member's declared TTL (ms) and wake-up address: from its membership, or from its
/// heartbeat if an older build wrote the membership without them. `None`: nothing read.
async fn read_member(
    store: &Store,
    member: &str,
) -> Result<Option<(u64, Option<String>)>, crate::Error> {
    let Some(object) = store.read(member).await? else {
        return Ok(None);
    };
    let body: share::Member = layout::decode_object(member, "coordinator", &object.bytes)?;
    if let Some(ttl_ms) = body.ttl_ms {
        return Ok(Some((ttl_ms, body.wake)));
    }
    let Some(beat) = layout::member_heartbeat(member) else {
        return Ok(None);
    };
    Ok(crate::store::lease::read_heartbeat(store, &beat)
        .await?
        .map(|(beat, _)| (beat.ttl_ms, beat.wake)))
}

/// One LIST of the heartbeats' prefix: every process's heartbeat, every worker's registration
/// and every coordinator's membership, each with its listed version, and when the listing was issued and returned.
pub(super) struct Listing {
    /// The coordinators' membership keys (see `share`), with their versions.
    pub(super) members: Vec<(String, Option<ETag>)>,
    pub(super) heartbeats: Vec<(String, ETag)>,
    pub(super) registrations: Vec<(String, Option<ETag>)>,
    pub(super) seen: Seen,
}

pub(super) async fn list_heartbeats_seen(store: &Store) -> Result<Listing, StoreError> {
    let issued = store.clock().monotonic();
    let listed = store.list_all(layout::heartbeats_prefix()).await?;
    let seen = Seen {
        issued,
        returned: store.clock().monotonic(),
    };
    let (members, listed): (Vec<_>, Vec<_>) = listed
        .into_iter()
        .partition(|listed| layout::is_member(&listed.key));
    let (registrations, heartbeats): (Vec<_>, Vec<_>) = listed
        .into_iter()
        .partition(|listed| layout::is_registration(&listed.key));
    Ok(Listing {
        members: members
            .into_iter()
            .map(|listed| (listed.key, listed.etag))
            .collect(),
        heartbeats: heartbeats
            .into_iter()
            .map(|listed| {
                let etag = listed.etag.unwrap_or_else(|| ETag(String::new()));
                (listed.key, etag)
            })
            .collect(),
        registrations: registrations
            .into_iter()
            .map(|listed| (listed.key, listed.etag))
            .collect(),
        seen,
    })
}

pub(super) async fn list_heartbeats(store: &Store) -> Result<Vec<(String, ETag)>, StoreError> {
    Ok(list_heartbeats_seen(store).await?.heartbeats)
}

/// Brings the registrations up to the versions `listed` (every tick's heartbeat listing
/// carries them): an entry whose version is unchanged keeps what was read before, one that
/// changed or is new is read, one no longer listed goes. Versions say what changed, so a
/// worker restarted under its ID with another configuration is seen at the next tick, and so
/// is a worker whose registration landed after its heartbeat was listed.
pub(super) async fn refresh_registrations(
    store: &Store,
    observer: &mut Observer,
    listed: &[(String, Option<ETag>)],
) {
    let mut registrations = BTreeMap::new();
    for (key, etag) in listed {
        let cached = observer.registrations.remove(key);
        if let Some(cached) = cached.as_ref().filter(|(cached, _)| cached == etag) {
            registrations.insert(key.clone(), cached.clone());
            continue;
        }
        match store.read(key).await {
            // A read that failed after its retries (a brownout, an expired credential) keeps
            // the registration as read before, at its old version, so it is read again next
            // tick: a partial map would leave the workers it misses unregistered, their
            // recoveries abandoned and themselves fenced.
            Err(error) => {
                tracing::warn!(%key, %error, "cannot read a worker registration; keeping the one read before");
                if let Some(cached) = cached {
                    registrations.insert(key.clone(), cached);
                }
            }
            Ok(Some(object)) => match layout::decode_object::<Registration>(
                key,
                crate::core::assignment::REGISTRATION_KIND,
                &object.bytes,
            ) {
                Ok(registration) => {
                    registrations.insert(key.clone(), (etag.clone(), registration));
                }
                Err(error) => tracing::warn!(%error, "ignoring a bad worker registration"),
            },
            Ok(None) => {}
        }
    }
    // A worker whose registration is gone (it stopped, or gc removed a dead worker's) gets no
    // more inbox writes; the inbox it had goes too, so inboxes follow the registered workers.
    let departed: Vec<String> = observer
        .registrations
        .values()
        .map(|(_, registration)| registration.worker.clone())
        .collect();
    observer.registrations = registrations;
    for worker in departed {
        if observer
            .registrations
            .values()
            .any(|(_, registration)| registration.worker == worker)
        {
            continue;
        }
        observer.inboxes.remove(&worker);
        observer.unreachable.remove(&worker);
        if let Err(error) = store.delete(&layout::inbox(&worker)).await {
            tracing::debug!(worker_id = %worker, %error, "cannot remove a departed worker's inbox");
        }
    }
}

/// Pairs each entry with, where it has a recovery, the record (the holder's liveness is
/// filled in once heartbeats are judged). Records of recovering runs are read every tick;
/// those of parked runs only every [`SWEEP_TICKS`] ticks (a crash between an
/// answer's record and index writes is repaired then); dead-lettered records never change.
/// The reads go side by side.
pub(super) async fn observe_runs(
    store: &Store,
    observer: &mut Observer,
    entries: Vec<IndexEntry>,
    ttl: Duration,
) -> (Vec<RunView>, Option<Duration>) {
    let sweep = observer.ticks_since_sweep == 0;
    let cache = &observer.records;
    let forwarded = &observer.forwarded;
    let refresh = unclaimed_refresh(observer, ttl);
    let mut recheck: Option<Duration> = None;
    let observed = futures::stream::iter(entries)
        .map(|entry| {
            // A cached record still describes the run unless its entry changed, it waits to
            // be started (this coordinator assigns it; a worker starts it, and may fail or
            // hand it back at once: the tick its wake-up brings must see that), or it has
            // been running for a while (a worker may have handed it back).
            let cached = cache
                .get(&entry.run_id)
                .filter(|(seen, (record, _), read_at)| {
                    *seen == entry
                        && !sweep
                        && match record.state {
                            // Only the coordinator offers it, and a worker starts an offered
                            // one; but a worker this leader named a fresh admission to (see
                            // `Observer::forwarded`) may claim it (`lifecycle::unclaimed`), so
                            // that is read again; any other after `unclaimed_refresh`.
                            RecoveryState::Admitted => {
                                record.assigned_to.is_none()
                                    && (!crate::core::lifecycle::unclaimed(record)
                                        || (!forwarded.contains_key(&record.recovery_id)
                                            && read_at.elapsed() < refresh))
                            }
                            RecoveryState::Running => read_at.elapsed() < RUNNING_REFRESH,
                            _ => true,
                        }
                })
                .map(|(_, known, read_at)| (known.clone(), *read_at));
            if let Some(((record, _), read_at)) = &cached
                && record.state == RecoveryState::Running
            {
                let due = RUNNING_REFRESH.saturating_sub(read_at.elapsed());
                recheck = Some(recheck.map_or(due, |other| other.min(due)));
            }
            observe_run(store, sweep, entry, cached)
        })
        .buffered(ACTION_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut records = BTreeMap::new();
    let mut runs = Vec::with_capacity(observed.len());
    for (run, known) in observed.into_iter().flatten() {
        if let (Some(record), Some((etag, read_at))) = (&run.recovery, known) {
            records.insert(
                run.entry.run_id.clone(),
                (run.entry.clone(), (record.clone(), etag), read_at),
            );
        }
        runs.push(run);
    }
    // A named recovery is forgotten once its record, just read, is no longer a fresh
    // admission (claimed, assigned, ended); one still fresh is remembered anew; one not seen
    // (not listed yet, or its read failed) is kept for a while after it was last named or
    // seen (a name whose admission never wrote its entry is then forgotten).
    if !observer.forwarded.is_empty() {
        let fresh: BTreeMap<&RecoveryId, bool> = records
            .values()
            .map(|(_, (record, _), _)| {
                (
                    &record.recovery_id,
                    crate::core::lifecycle::unclaimed(record),
                )
            })
            .collect();
        observer.forwarded.retain(|id, at| match fresh.get(id) {
            Some(true) => {
                *at = crate::clock::Stopwatch::start();
                true
            }
            Some(false) => false,
            None => at.elapsed() < FORWARD_REMEMBERED,
        });
    }
    // Only runs still in the index are remembered.
    observer.records = records;
    (runs, recheck)
}

/// One run's view, and its record's version and when it was read; `None` if its record
/// cannot be read now (the next tick tries again).
pub(super) async fn observe_run(
    store: &Store,
    sweep: bool,
    entry: IndexEntry,
    cached: Option<((RecoveryRecord, ETag), crate::clock::Stopwatch)>,
) -> Option<(RunView, Option<(ETag, crate::clock::Stopwatch)>)> {
    let read_record = match entry.phase {
        Phase::Recovering => true,
        Phase::Parked => sweep,
        Phase::Running | Phase::Dead => false,
    };
    let (recovery, known) = match (&entry.recovery_id, cached) {
        (Some(_), Some(((record, etag), read_at))) => (Some(record), Some((etag, read_at))),
        (Some(id), None) if read_record => match recovery::read(store, id).await {
            Ok(Some((record, etag))) => {
                (Some(record), Some((etag, crate::clock::Stopwatch::start())))
            }
            Ok(None) => (None, None),
            Err(error) => {
                tracing::warn!(recovery_id = %id, %error, "cannot read the recovery record");
                return None;
            }
        },
        _ => (None, None),
    };
    // One HEAD per parked recovery per sweep: the slot after the generation it parked at.
    let answered = match &recovery {
        Some(record) if sweep && record.state == RecoveryState::Parked => match record.parked_at {
            Some(parked_at) => {
                let chain = crate::store::generation::Chain::new(
                    store,
                    layout::run_base(record.recovery_id.as_str()),
                );
                matches!(store.head(&chain.key(parked_at + 1)).await, Ok(Some(_)))
            }
            None => false,
        },
        _ => false,
    };
    Some((
        RunView {
            entry,
            holder_alive: false,
            recovery,
            answered,
        },
        known,
    ))
}
