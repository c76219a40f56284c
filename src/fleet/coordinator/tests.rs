use super::*;
use crate::clock::SystemClock;
use crate::store::faults::FaultyStore;

/// One memory bucket seen two ways: directly (everyone else), and through a fault
/// injector with `retry` (the process under test, whose reads a test can hold or fail).
fn two_views(retry: crate::store::RetryPolicy) -> (Store, Store, Arc<FaultyStore>) {
    let bucket = Arc::new(object_store::memory::InMemory::new());
    let faulty = FaultyStore::new(bucket.clone(), Default::default(), 0);
    let open = |inner: Arc<dyn object_store::ObjectStore>, url: &str| {
        Store::from_parts(
            inner,
            crate::store::Backend::Memory,
            url,
            "",
            retry,
            SystemClock::shared(),
        )
    };
    let direct = open(bucket, "memory://direct");
    let slow = open(faulty.clone(), "memory://faulty");
    (direct, slow, faulty)
}

/// Indexes `run` as running under `host`, which declared a 300 ms TTL.
async fn index_running(store: &Store, run: &RunId, host: &Holder) {
    let mut entry = IndexEntry::new(run.clone(), None, Phase::Running, "f".into(), 0);
    entry.holder = Some(host.heartbeat_key());
    entry.holder_ttl_ms = Some(300);
    crate::store::index::put(store, &entry).await.unwrap();
}

/// Registers worker `worker` with `capacity` slots.
async fn register(store: &Store, worker: &str, capacity: u32) {
    let registration = Registration::new(worker, layout::heartbeat(worker), capacity, "f".into());
    store
        .put(
            &layout::worker(worker),
            layout::encode_object(&registration),
        )
        .await
        .unwrap();
}

/// Reviewer's finding: the cap on remembered names measured each entry's age twice, so
/// it kept more than its bound (all of them when ages tie). Exactly the excess goes, the
/// longest unseen first, and a name named again is kept.
#[test]
fn remembered_names_stay_within_their_cap() {
    let mut forwarded = BTreeMap::new();
    let names = |range: std::ops::Range<usize>| {
        range
            .map(|i| RecoveryId::new(format!("named-{i:05}")))
            .collect::<Vec<_>>()
    };
    note_forwarded(&mut forwarded, names(0..FORWARDED_MAX));
    assert_eq!(forwarded.len(), FORWARDED_MAX);
    let again = RecoveryId::new(format!("named-{:05}", 0));
    note_forwarded(
        &mut forwarded,
        std::iter::once(again.clone()).chain(names(FORWARDED_MAX..FORWARDED_MAX + 10)),
    );
    assert_eq!(forwarded.len(), FORWARDED_MAX);
    assert!(forwarded.contains_key(&again));
}

/// Registers worker `w` for `holder` with `fingerprint`, then ticks once.
async fn register_and_tick(
    (store, coordinator, options): (&Store, &Arc<Holder>, &CoordinatorOptions),
    observer: &mut Observer,
    holder: &Holder,
    fingerprint: &str,
) {
    let registration = Registration::new("w", holder.heartbeat_key(), 1, fingerprint.into());
    store
        .put(&layout::worker("w"), layout::encode_object(&registration))
        .await
        .unwrap();
    tick(store, coordinator, options, observer, None)
        .await
        .unwrap();
}

/// Regression (issue 30's third scenario): registrations were listed again only when the
/// set of heartbeat keys changed. A worker restarted under its ID with another
/// configuration kept its old fingerprint in the coordinator's view (offers matched to it
/// failed the worker's resume guard), and a worker whose heartbeat was listed before its
/// registration landed got no work until some other process came or went. The heartbeat
/// listing carries every registration's version, so both are seen at the next tick.
#[tokio::test]
async fn a_registration_that_changed_is_seen_at_the_next_tick() {
    let store = Store::memory(SystemClock::shared());
    let ttl = Duration::from_millis(300);
    let coordinator = Holder::new(&store, "c", ttl);
    let options = CoordinatorOptions::new("c", ttl);
    let mut observer = Observer::default();
    let fingerprints = |observer: &Observer| -> Vec<String> {
        observer
            .registrations
            .values()
            .map(|(_, registration)| registration.fingerprint_sha256.clone())
            .collect()
    };
    // The worker's heartbeat is listed before its registration lands.
    let worker = Holder::with_role(&store, "w", ttl, "worker");
    worker.beat().await.unwrap();
    tick(&store, &coordinator, &options, &mut observer, None)
        .await
        .unwrap();
    assert!(observer.registrations.is_empty());
    let view = (&store, &coordinator, &options);
    register_and_tick(view, &mut observer, &worker, "f-old").await;
    assert_eq!(
        fingerprints(&observer),
        ["f-old"],
        "a late registration not seen"
    );
    // Restarted under its ID with another configuration: the same heartbeat keys.
    let restarted = Holder::with_role(&store, "w", ttl, "worker");
    restarted.beat().await.unwrap();
    register_and_tick(view, &mut observer, &restarted, "f-new").await;
    assert_eq!(
        fingerprints(&observer),
        ["f-new"],
        "the old configuration kept"
    );
    // Unchanged: read from the cache, not again.
    let gets = store.metrics().get;
    tick(&store, &coordinator, &options, &mut observer, None)
        .await
        .unwrap();
    assert_eq!(
        store.metrics().get,
        gets,
        "an unchanged registration read again"
    );
}

/// Regression (stale evidence, issue 30's first scenario): the tick listed the heartbeats,
/// then read registrations and records, and only then read the clock to judge what it had
/// listed. One slow read inside the tick made a host that keeps beating look silent for
/// the whole delay, and its run was admitted and fenced. The listing is judged as seen
/// when it was issued now.
#[tokio::test]
async fn a_slow_read_inside_a_tick_does_not_fence_a_beating_host() {
    let (direct, slow, faulty) = two_views(crate::store::RetryPolicy::default());
    let ttl = Duration::from_millis(300);
    let host = Holder::new(&direct, "host", ttl);
    host.beat().await.unwrap();
    let run = RunId::new("beating-host-run");
    let held = host.acquire_new(&run).await.unwrap();
    index_running(&direct, &run, &host).await;
    let coordinator = Holder::new(&slow, "c", ttl);
    let options = CoordinatorOptions::new("c", ttl);
    let mut observer = Observer::default();
    let first = tick(&slow, &coordinator, &options, &mut observer, None)
        .await
        .unwrap();
    assert!(first.actions.is_empty(), "{:?}", first.actions);
    // A worker comes up between the ticks, so the next tick reads its registration; that
    // read's answer takes three TTLs, while the host beats all along.
    let worker = Holder::with_role(&direct, "w", ttl, "worker");
    worker.beat().await.unwrap();
    register(&direct, "w", 1).await;
    let gate = faulty.pause_after_read(&layout::worker("w"));
    let ticking = tokio::spawn(async move {
        let report = tick(&slow, &coordinator, &options, &mut observer, None).await;
        report.map(|report| report.actions)
    });
    gate.reached().await;
    for _ in 0..9 {
        crate::clock::sleep(ttl / 3).await;
        host.beat().await.unwrap();
    }
    gate.release();
    let actions = ticking.await.unwrap().unwrap();
    assert!(
        actions.is_empty(),
        "a host that kept beating was judged gone after one slow read: {actions:?}"
    );
    host.check(&held).await.unwrap();
}

/// Issue 30 ("a verdict carries its evidence"): a host silent for a TTL is judged gone on
/// the tick's listing, and comes back (it beats again) while the tick is still reading. The
/// admission checks that the heartbeat is still at the version judged before it fences, so
/// the wrong verdict costs that read: no recovery, the host's lease still its own.
#[tokio::test]
async fn a_host_that_beats_after_its_verdict_is_not_fenced() {
    let (direct, slow, faulty) = two_views(crate::store::RetryPolicy::default());
    let ttl = Duration::from_millis(300);
    let host = Holder::new(&direct, "host", ttl);
    host.beat().await.unwrap();
    let run = RunId::new("returning-host-run");
    let held = host.acquire_new(&run).await.unwrap();
    index_running(&direct, &run, &host).await;
    let coordinator = Holder::new(&slow, "c", ttl);
    let options = CoordinatorOptions::new("c", ttl);
    let mut observer = Observer::default();
    let first = tick(&slow, &coordinator, &options, &mut observer, None)
        .await
        .unwrap();
    assert!(first.actions.is_empty(), "{:?}", first.actions);
    // Silent for more than a TTL: the next tick's listing judges the host gone.
    crate::clock::sleep(ttl + ttl / 3).await;
    let worker = Holder::with_role(&direct, "w", ttl, "worker");
    worker.beat().await.unwrap();
    register(&direct, "w", 1).await;
    let gate = faulty.pause_after_read(&layout::worker("w"));
    let ticking = tokio::spawn(async move {
        let report = tick(&slow, &coordinator, &options, &mut observer, None).await;
        report.map(|report| report.actions)
    });
    gate.reached().await;
    // The host comes back after the listing, before the admission.
    host.beat().await.unwrap();
    gate.release();
    let actions = ticking.await.unwrap().unwrap();
    assert!(
        actions
            .iter()
            .any(|action| matches!(action, Action::Admit { source } if *source == run)),
        "the tick should have judged the silent host gone: {actions:?}"
    );
    assert!(
        recovery::read(&direct, &recovery_id_for(&run))
            .await
            .unwrap()
            .is_none(),
        "a host that beat after its verdict had its run admitted"
    );
    host.check(&held).await.unwrap();
}

/// Regression (issue 30: leadership checked once per tick): a leader that lost its lease
/// during a slow read inside a tick still admitted (and fenced) what that tick judged.
/// It checks again before admitting now, and acts on nothing.
#[tokio::test]
async fn a_leader_that_lost_its_lease_mid_tick_admits_nothing() {
    let (direct, slow, faulty) = two_views(crate::store::RetryPolicy::default());
    let ttl = Duration::from_millis(300);
    // A run whose host is gone (its heartbeat silent for a TTL since the first tick):
    // the second tick admits it.
    let run = RunId::new("orphaned-run");
    let host = Holder::new(&direct, "host", ttl);
    host.beat().await.unwrap();
    host.acquire_new(&run).await.unwrap();
    index_running(&direct, &run, &host).await;
    let leadership = RunId::new(layout::COORDINATOR_LEASE_RUN);
    let coordinator = Holder::new(&slow, "c", ttl);
    let mut held = Shares::new(1);
    held.held
        .insert(0, coordinator.acquire(&leadership).await.unwrap());
    let options = CoordinatorOptions::new("c", ttl);
    let mut observer = Observer::default();
    let first = tick(&slow, &coordinator, &options, &mut observer, Some(&held))
        .await
        .unwrap();
    assert!(first.actions.is_empty(), "{:?}", first.actions);
    crate::clock::sleep(ttl + ttl / 3).await;
    // A worker is registered, so the tick reads its registration: that read stalls
    // while another coordinator takes the leadership over.
    let worker = Holder::with_role(&direct, "w", ttl, "worker");
    worker.beat().await.unwrap();
    register(&direct, "w", 1).await;
    let gate = faulty.pause_after_read(&layout::worker("w"));
    let ticking = tokio::spawn(async move {
        tick(&slow, &coordinator, &options, &mut observer, Some(&held))
            .await
            .map(|report| report.actions)
    });
    gate.reached().await;
    let other = Holder::new(&direct, "c2", ttl);
    let view = crate::store::lease::read_lease(&direct, &leadership)
        .await
        .unwrap()
        .unwrap();
    other.take_over(&view).await.unwrap();
    gate.release();
    let ticked = ticking.await.unwrap();
    assert!(
        matches!(ticked, Err(TickError::NotLeading(_))),
        "a leader that lost its lease acted on its tick: {ticked:?}"
    );
    assert!(
        recovery::read(&direct, &recovery_id_for(&run))
            .await
            .unwrap()
            .is_none(),
        "a deposed leader admitted a recovery"
    );
}

/// Regression (issue 30's second scenario): one registration read that failed after its
/// retries returned from the refresh half-way, after the registrations read so far had
/// been taken out of the map, and after the refresh was marked done: the coordinator knew
/// only some workers for up to 30 ticks. The failed one keeps what was read before now,
/// at its old version, so it is read again at the next listing.
#[tokio::test]
async fn a_failed_registration_read_keeps_the_map_of_workers_whole() {
    use crate::store::faults::FaultPlan;
    let (_, store, faulty) = two_views(crate::store::RetryPolicy {
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
        max_retries: 2,
        attempt_timeout: Duration::from_secs(1),
    });
    register(&store, "w1", 1).await;
    register(&store, "w2", 1).await;
    let listing = |store: Store| async move {
        store
            .list_all(layout::workers_prefix())
            .await
            .unwrap()
            .into_iter()
            .map(|listed| (listed.key, listed.etag))
            .collect::<Vec<_>>()
    };
    let mut observer = Observer::default();
    refresh_registrations(&store, &mut observer, &listing(store.clone()).await).await;
    assert_eq!(observer.registrations.len(), 2);
    // Both change; the first is read again, then the store fails every request.
    register(&store, "w1", 2).await;
    register(&store, "w2", 2).await;
    let mut keys = [layout::worker("w1"), layout::worker("w2")];
    keys.sort();
    let gate = faulty.pause_after_read(&keys[0]);
    let listed = listing(store.clone()).await;
    let refreshing = tokio::spawn(async move {
        refresh_registrations(&store, &mut observer, &listed).await;
        (store, observer)
    });
    gate.reached().await;
    faulty.set_plan(FaultPlan {
        error_per_mille: 1000,
        ..FaultPlan::default()
    });
    gate.release();
    let (store, mut observer) = refreshing.await.unwrap();
    let workers: Vec<&str> = observer
        .registrations
        .values()
        .map(|(_, registration)| registration.worker.as_str())
        .collect();
    assert_eq!(
        workers.len(),
        2,
        "the map of workers lost some: {workers:?}"
    );
    // The store is back: the one kept at its old version is read again.
    faulty.set_plan(FaultPlan::default());
    refresh_registrations(&store, &mut observer, &listing(store.clone()).await).await;
    let capacities: Vec<u32> = observer
        .registrations
        .values()
        .map(|(_, registration)| registration.capacity)
        .collect();
    assert_eq!(capacities, [2, 2], "a registration kept stale");
}

/// A heartbeat an index entry names but the listing does not show is judged at the absent
/// version for a TTL, like any version: a process whose heartbeat was removed (as a dead
/// process's, just as it came back under its ID) writes it again within a third of its
/// TTL. Only absent for a whole TTL is its holder gone.
#[tokio::test]
async fn an_absent_named_heartbeat_is_gone_only_after_a_ttl() {
    let store = Store::memory(SystemClock::shared());
    let ttl = Duration::from_millis(300);
    let options = CoordinatorOptions::new("c", ttl);
    let mut observer = Observer::default();
    let host = Holder::new(&store, "host", ttl);
    let mut entry = IndexEntry::new(RunId::new("r"), None, Phase::Running, "f".into(), 0);
    entry.holder = Some(host.heartbeat_key());
    entry.holder_ttl_ms = Some(300);
    let runs = [RunView {
        entry,
        holder_alive: false,
        recovery: None,
        answered: false,
    }];
    let key = host.heartbeat_key();
    let judge = |observer: &mut Observer| {
        let seen = Seen::at(store.clock().monotonic());
        judge_liveness(
            &options,
            observer,
            &runs,
            &BTreeMap::new(),
            Vec::new(),
            seen,
        )
        .0
        .get(&key)
        .copied()
    };
    assert_eq!(
        judge(&mut observer),
        Some(true),
        "gone at first sight of absence"
    );
    crate::clock::sleep(Duration::from_millis(150)).await;
    assert_eq!(judge(&mut observer), Some(true), "gone within its TTL");
    crate::clock::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        judge(&mut observer),
        Some(false),
        "absent for a TTL, still alive"
    );
}

/// An offer waiting on a worker whose slots all run is queued, not untaken: however long
/// the worker's recoveries take, it is not passed over for it. Once the worker has a slot
/// free and still leaves the offer for its TTL, it is.
#[tokio::test(start_paused = true)]
async fn a_queued_offer_is_not_untaken_while_its_worker_is_full() {
    let key = layout::heartbeat("w");
    let mut registration = Registration::new("w", key.clone(), 1, "f".into());
    registration.queue = Some(1);
    registration.ttl_ms = Some(30_000);
    let mut observer = Observer::default();
    observer
        .registrations
        .insert(layout::worker("w"), (None, registration));
    let versions = BTreeMap::from([(key, ETag("v1".into()))]);
    let ttl = Duration::from_secs(30);
    let view = |name: &str, state: RecoveryState| {
        let source = RunId::new(name);
        let recovery_id = recovery_id_for(&source);
        let mut entry = IndexEntry::new(source.clone(), None, Phase::Recovering, "f".into(), 0);
        entry.recovery_id = Some(recovery_id.clone());
        let record: RecoveryRecord = serde_json::from_value(serde_json::json!({
            "format": 1, "kind": "recovery", "recovery_id": recovery_id,
            "source_run": source, "source_generation": 3, "source_digest": "d",
            "source_epoch": 1, "state": state, "force": false, "attempts": 0,
            "failures": 0, "assigned_to": "w", "fingerprint_sha256": "f",
            "admitted_at_ms": 0, "updated_at_ms": 0,
        }))
        .expect("a record");
        RunView {
            entry,
            holder_alive: false,
            recovery: Some(record),
            answered: false,
        }
    };
    let full = [
        view("running", RecoveryState::Running),
        view("waiting", RecoveryState::Admitted),
    ];
    for _ in 0..4 {
        pass_over_untaken_offers(&mut observer, &full, &versions, ttl);
        tokio::time::advance(Duration::from_secs(20)).await;
    }
    pass_over_untaken_offers(&mut observer, &full, &versions, ttl);
    assert!(observer.unreachable.is_empty(), "passed over while full");
    // The running one ended: the slot is free, and the offer is left for a TTL.
    let free = [view("waiting", RecoveryState::Admitted)];
    pass_over_untaken_offers(&mut observer, &free, &versions, ttl);
    tokio::time::advance(Duration::from_secs(31)).await;
    pass_over_untaken_offers(&mut observer, &free, &versions, ttl);
    assert!(observer.unreachable.contains_key("w"), "never passed over");
}

/// Reviewer's finding: a coordinator handing a partition over forgot it before its release
/// landed, so a release that failed left the lease naming a live coordinator that no longer
/// thought it held it, and its rightful owner waited on it for as long as it beat. The share
/// keeps a lease it could not release and releases it at its next turn.
#[tokio::test]
async fn a_handover_whose_release_fails_is_tried_again() {
    let retry = crate::store::RetryPolicy {
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
        max_retries: 1,
        attempt_timeout: Duration::from_secs(1),
    };
    let (direct, slow, faulty) = two_views(retry);
    let ttl = Duration::from_secs(3);
    let options = CoordinatorOptions::new("a", ttl);
    let holder = Arc::new(Holder::with_role(&slow, "a", ttl, "coordinator"));
    holder.beat().await.unwrap();
    let mut shares = Shares::new(2);
    let mut standby = ExpiryWatch::default();
    let mut observer = Observer {
        partitions: 2,
        ..Observer::default()
    };
    // Alone, it owns both partitions.
    rebalance(
        &slow,
        &holder,
        &options,
        &mut observer,
        &mut shares,
        &mut standby,
    )
    .await;
    assert_eq!(shares.held.len(), 2);
    // Another member joins, rightful owner of at least one of them: handed over while the
    // store refuses every request, the lease stays in the share.
    let other = layout::coordinator_member("b");
    observer.members.insert(other.clone());
    let theirs: Vec<u32> = (0..2)
        .filter(|p| !rightful(&layout::coordinator_member("a"), &observer.members, 2).contains(p))
        .collect();
    let partition = *theirs
        .first()
        .expect("b owns a partition of two (rendezvous)");
    faulty.set_partitioned(true);
    rebalance(
        &slow,
        &holder,
        &options,
        &mut observer,
        &mut shares,
        &mut standby,
    )
    .await;
    assert!(shares.held.contains_key(&partition), "forgotten unreleased");
    let lease = RunId::new(layout::partition_lease(partition));
    let view = crate::store::lease::read_lease(&direct, &lease)
        .await
        .unwrap()
        .unwrap();
    assert!(!view.lease.released && view.lease.holder == "a");
    // The store back, the next turn releases it.
    faulty.set_partitioned(false);
    rebalance(
        &slow,
        &holder,
        &options,
        &mut observer,
        &mut shares,
        &mut standby,
    )
    .await;
    assert!(!shares.held.contains_key(&partition));
    let view = crate::store::lease::read_lease(&direct, &lease)
        .await
        .unwrap()
        .unwrap();
    assert!(view.lease.released, "{view:?}");
}

// Proves a member is judged by what its membership declares, read afresh when its body
// changes: a coordinator restarted under its ID with another TTL or address writes another
// body (so another version even where a version is the body's hash, as S3's ETag of a plain
// PUT), and a membership that declares nothing (an older build's, whose heartbeat is not
// there yet) is not remembered, so it is read again at the next listing.
#[tokio::test]
async fn a_member_is_judged_by_what_its_membership_declares_now() {
    let store = Store::memory(SystemClock::shared());
    let listed = |store: Store| async move {
        let member = layout::coordinator_member("b");
        let version = store.read(&member).await.unwrap().map(|o| o.etag);
        vec![(member, version)]
    };
    let options = CoordinatorOptions::new("a", Duration::from_millis(300));
    let mut observer = Observer::default();
    let b = |ttl: u64, url: &str| CoordinatorOptions {
        wake: Some((
            Arc::new(crate::fleet::wake::WakeSignal::new()),
            Some(url.to_owned()),
        )),
        ..CoordinatorOptions::new("b", Duration::from_millis(ttl))
    };
    share::join(&store, &b(3000, "http://b1")).await.unwrap();
    let first = store
        .read(&layout::coordinator_member("b"))
        .await
        .unwrap()
        .unwrap();
    refresh_members(
        &store,
        &options,
        &mut observer,
        &listed(store.clone()).await,
    )
    .await;
    let info = observer.member_info[&layout::coordinator_member("b")].clone();
    assert_eq!(
        (info.ttl_ms, info.wake.as_deref()),
        (3000, Some("http://b1"))
    );
    // Restarted with another TTL and address: another body.
    share::join(&store, &b(5000, "http://b2")).await.unwrap();
    let second = store
        .read(&layout::coordinator_member("b"))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(
        first.bytes, second.bytes,
        "the same body would keep an MD5 ETag"
    );
    refresh_members(
        &store,
        &options,
        &mut observer,
        &listed(store.clone()).await,
    )
    .await;
    let info = observer.member_info[&layout::coordinator_member("b")].clone();
    assert_eq!(
        (info.ttl_ms, info.wake.as_deref()),
        (5000, Some("http://b2"))
    );
    // An older build's membership, its heartbeat not written yet: nothing remembered.
    store
        .put(
            &layout::coordinator_member("b"),
            bytes::Bytes::from_static(br#"{"format":1,"kind":"coordinator","coordinator":"b"}"#),
        )
        .await
        .unwrap();
    let listing = listed(store.clone()).await;
    refresh_members(&store, &options, &mut observer, &listing).await;
    assert!(
        !observer
            .member_info
            .contains_key(&layout::coordinator_member("b"))
    );
    // Its heartbeat written, the same listing reads it.
    let holder = Holder::with_role(&store, "b", Duration::from_millis(4000), "coordinator");
    holder.beat().await.unwrap();
    refresh_members(&store, &options, &mut observer, &listing).await;
    assert_eq!(
        observer.member_info[&layout::coordinator_member("b")].ttl_ms,
        4000
    );
}

// Proves a heartbeat that falls silent at a tick's own look asks for another tick at once.
// The index is listed before the heartbeats: a host that indexes a run in between and dies is
// judged silent by this tick, which has not seen the run; no watch brings the next tick for it
// (it is silent already), and a paced scan may be minutes away.
#[tokio::test]
async fn a_heartbeat_falling_silent_at_a_ticks_own_look_asks_for_another() {
    let (direct, slow, faulty) = two_views(crate::store::RetryPolicy::default());
    let ttl = Duration::from_millis(300);
    let host = Holder::new(&direct, "host", ttl);
    host.beat().await.unwrap();
    let other = Holder::new(&direct, "other", ttl);
    other.beat().await.unwrap();
    let known = RunId::new("known-run");
    index_running(&direct, &known, &other).await;
    let coordinator = Holder::new(&slow, "c", ttl);
    let options = CoordinatorOptions::new("c", ttl);
    let mut observer = Observer::default();
    let first = tick(&slow, &coordinator, &options, &mut observer, None)
        .await
        .unwrap();
    assert!(first.actions.is_empty(), "{:?}", first.actions);
    // The known run's entry changes, so the next tick reads it after listing the index; that
    // read is held while the host indexes a run and dies.
    index_running(&direct, &known, &other).await;
    let gate = faulty.pause_after_read(&layout::index_entry(known.as_str()));
    let ticking =
        tokio::spawn(async move { tick(&slow, &coordinator, &options, &mut observer, None).await });
    gate.reached().await;
    index_running(&direct, &RunId::new("late-run"), &host).await;
    for _ in 0..3 {
        crate::clock::sleep(ttl / 2).await;
        other.beat().await.unwrap();
    }
    gate.release();
    let report = ticking.await.unwrap().unwrap();
    assert!(report.actions.is_empty(), "{:?}", report.actions);
    assert!(
        report.again,
        "a heartbeat fell silent at this tick's look, after its index listing"
    );
}

/// A tick that saw a recovery finished while the source's entry still says recovering (the
/// worker crashed between its record's finish and the entry's removal) removes the entry
/// from the record it saw, without reading it again: no event leaves that state. Any other
/// record is read again first.
#[tokio::test]
async fn a_finished_recoverys_entry_goes_without_reading_its_record_again() {
    let store = Store::memory(SystemClock::shared());
    let ttl = Duration::from_millis(300);
    let coordinator = Holder::new(&store, "c", ttl);
    let options = CoordinatorOptions::new("c", ttl);
    let source = RunId::new("finished-run");
    let recovery = recovery_id_for(&source);
    let entry = |phase| {
        let mut entry = IndexEntry::new(source.clone(), None, phase, "f".into(), 0);
        entry.recovery_id = Some(recovery.clone());
        entry
    };
    crate::store::index::put(&store, &entry(Phase::Recovering))
        .await
        .unwrap();
    let action = Action::Reconcile {
        source: source.clone(),
        recovery: recovery.clone(),
    };
    let judged = Judged {
        versions: &BTreeMap::new(),
        workers: &[],
    };
    let record = |state| {
        let mut record: RecoveryRecord = serde_json::from_value(serde_json::json!({
            "format": 1, "kind": "recovery", "recovery_id": recovery.as_str(),
            "source_run": source.as_str(), "source_generation": 3, "source_digest": "d",
            "source_epoch": 1, "state": "admitted", "force": false, "attempts": 1,
            "failures": 0, "fingerprint_sha256": "f", "admitted_at_ms": 0, "updated_at_ms": 0,
        }))
        .unwrap();
        record.state = state;
        (record, ETag("seen".into()))
    };
    // Reconciles the entry with the record seen as `state`; returns the GETs it spent.
    let reconcile = |state| {
        let seen = record(state);
        let (store, coordinator, options, action, judged) =
            (&store, &coordinator, &options, &action, &judged);
        async move {
            let known = BTreeMap::from([(&seen.0.recovery_id, &seen)]);
            let before = store.metrics().get;
            execute(store, coordinator, options, action, &[], &known, judged)
                .await
                .unwrap();
            store.metrics().get - before
        }
    };
    assert_eq!(
        reconcile(RecoveryState::Finished).await,
        0,
        "the record was read again"
    );
    assert_eq!(
        crate::store::index::read(&store, &source).await.unwrap(),
        None
    );

    // A record seen running is read again: here it is gone, so the entry is left alone.
    crate::store::index::put(&store, &entry(Phase::Parked))
        .await
        .unwrap();
    assert!(reconcile(RecoveryState::Running).await > 0);
    assert_eq!(
        crate::store::index::read(&store, &source).await.unwrap(),
        Some(entry(Phase::Parked))
    );
}
