//! The store conformance suite, run on every backend: memory, a local directory, and a real
//! S3-protocol server. Each case proves one property the rest of Rekindle relies on.

mod common;

use rekindle::core::epoch::Epoch;
use rekindle::core::record::{IndexEntry, Phase};
use rekindle::fleet::lifecycle;
use rekindle::fleet::lifecycle::LifecycleError;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use rekindle::core::fact::{RecoveryId, RunId, Seq};
use rekindle::core::layout;
use rekindle::core::lifecycle::Event;
use rekindle::core::sample;
use rekindle::store::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use rekindle::store::lease::{self, Holder, LeaseError};
use rekindle::store::recovery::{self, RecoveryError};
use rekindle::store::{Store, StoreError};

/// Create-if-absent: one create wins; a different second create is refused; repeating our own
/// identical bytes (a retry after a lost response) is adopted.
async fn create_if_absent(store: Store) {
    let etag = store
        .create("t/a", Bytes::from_static(b"one"))
        .await
        .unwrap();
    assert!(matches!(
        store.create("t/a", Bytes::from_static(b"two")).await,
        Err(StoreError::AlreadyExists { .. })
    ));
    let again = store
        .create("t/a", Bytes::from_static(b"one"))
        .await
        .unwrap();
    assert_eq!(again, etag);
    let read = store.read("t/a").await.unwrap().unwrap();
    assert_eq!(read.bytes, Bytes::from_static(b"one"));
    assert_eq!(read.etag, etag);
}

/// Compare-and-swap succeeds on the current version only; a missing key is "changed".
async fn compare_and_swap(store: Store) {
    let first = store
        .create("t/b", Bytes::from_static(b"v1"))
        .await
        .unwrap();
    let second = store
        .swap("t/b", Bytes::from_static(b"v2"), &first)
        .await
        .unwrap();
    assert_ne!(first, second);
    assert!(matches!(
        store.swap("t/b", Bytes::from_static(b"v3"), &first).await,
        Err(StoreError::Changed { .. })
    ));
    assert!(matches!(
        store
            .swap("t/missing", Bytes::from_static(b"v1"), &first)
            .await,
        Err(StoreError::Changed { .. })
    ));
    assert_eq!(
        store.read("t/b").await.unwrap().unwrap().bytes,
        Bytes::from_static(b"v2")
    );
}

/// Reads of missing keys are None, deletes are idempotent, listings are bounded and ordered.
async fn read_delete_list(store: Store) {
    assert!(store.read("t/none").await.unwrap().is_none());
    assert!(store.head("t/none").await.unwrap().is_none());
    store.delete("t/none").await.unwrap();
    for i in 0..7 {
        store
            .create(&format!("l/k{i}"), Bytes::from(format!("{i}")))
            .await
            .unwrap();
    }
    let first = store.list("l/", None, 3).await.unwrap();
    assert_eq!(
        first.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["l/k0", "l/k1", "l/k2"]
    );
    let rest = store.list("l/", Some("l/k2"), 100).await.unwrap();
    assert_eq!(rest.len(), 4);
    assert_eq!(rest[0].key, "l/k3");
    store.delete("l/k0").await.unwrap();
    assert!(store.read("l/k0").await.unwrap().is_none());
}

/// Of 16 concurrent creates of one key exactly one wins, and the stored bytes are the winner's.
async fn create_race_has_one_winner(store: Store) {
    let results = futures::future::join_all((0..16).map(|i| {
        let store = store.clone();
        async move { store.create("t/race", Bytes::from(format!("c{i}"))).await }
    }))
    .await;
    let winners: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_ok())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert_eq!(
        store.read("t/race").await.unwrap().unwrap().bytes,
        Bytes::from(format!("c{}", winners[0]))
    );
}

/// Concurrent compare-and-swaps on one version: exactly one wins each round.
async fn swap_race_has_one_winner(store: Store) {
    let mut etag = store
        .create("t/cas", Bytes::from_static(b"0"))
        .await
        .unwrap();
    for round in 0..3 {
        let results = futures::future::join_all((0..8).map(|i| {
            let store = store.clone();
            let etag = etag.clone();
            async move {
                store
                    .swap("t/cas", Bytes::from(format!("r{round}c{i}")), &etag)
                    .await
            }
        }))
        .await;
        let won: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
        assert_eq!(won.len(), 1, "round {round}");
        etag = won[0].clone();
    }
}

/// The capability probe passes on a store that enforces conditional writes.
async fn probe_passes(store: Store) {
    store.probe().await.unwrap();
}

/// A run committed fact by fact loads back identically, snapshots bound the load, and bytes
/// written grow with new facts rather than with the run's length.
async fn commit_and_load(store: Store) {
    let facts = sample::run("run-a", 120, 5);
    let run = RunId::new("run-a");
    let policy = SnapshotPolicy::default();
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    for fact in &facts[2..] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
    assert_eq!(loaded.generation, facts.len() as u64 - 1);
    assert!(loaded.delta_count < policy.max_deltas);
    // Re-committing an already committed fact is a no-op; a conflicting one is refused.
    writer.commit(vec![facts[5].clone()]).await.unwrap();
    assert_eq!(writer.generation(), loaded.generation + 1);
    let mut changed = facts[5].clone();
    changed.at_ms += 1;
    assert!(matches!(
        writer.commit(vec![changed]).await,
        Err(GenerationError::Fold { .. })
    ));
    // A refused commit leaves the state at what is committed, and a fact repeated within one
    // commit is written once.
    assert_eq!(writer.state().last_seq(), writer.committed());
    let other = sample::run("run-b", 10, 6);
    let mut repeated = RunWriter::create(&store, other[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    repeated
        .commit(vec![other[2].clone(), other[2].clone()])
        .await
        .unwrap();
    assert_eq!(repeated.generation(), 2);
    let reloaded = generation::load(&store, &RunId::new("run-b"), None)
        .await
        .unwrap();
    assert_eq!(reloaded.state.facts(), &other[..3]);
}

/// A new holder's first commit fences the old writer, which learns it lost the run.
async fn takeover_fences_the_old_writer(store: Store) {
    let facts = sample::run("run-f", 40, 9);
    let run = RunId::new("run-f");
    let policy = SnapshotPolicy::default();
    let mut old = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    old.commit(facts[2..6].to_vec()).await.unwrap();
    let mut new = RunWriter::resume(&store, &run, Epoch(2), policy)
        .await
        .unwrap();
    assert_eq!(new.state().last_seq(), Seq(6));
    let error = old.commit(vec![facts[6].clone()]).await.unwrap_err();
    assert!(
        matches!(
            error,
            GenerationError::Fenced {
                epoch: Epoch(1),
                by_epoch: Epoch(2),
                ..
            }
        ),
        "{error}"
    );
    new.commit(facts[6..10].to_vec()).await.unwrap();
    // The zombie keeps failing, at any slot it might aim for.
    assert!(matches!(
        old.commit(vec![facts[6].clone()]).await,
        Err(GenerationError::Fenced { .. })
    ));
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.state.facts(), &facts[..10]);
    assert_eq!(loaded.epoch, Epoch(2));
    // An older epoch cannot even start a takeover any more.
    assert!(matches!(
        RunWriter::resume(&store, &run, Epoch(1), policy).await,
        Err(GenerationError::Fenced { .. })
    ));
}

/// Leases: one holder at a time, epochs only grow, release hands over at once, and a holder
/// that stops beating is taken over after a TTL observed on the contender's own clock.
async fn leases(store: Store) {
    let run = RunId::new("run-l");
    let ttl = Duration::from_millis(300);
    let a = Holder::new(&store, "worker-a", ttl);
    let b = Holder::new(&store, "worker-b", ttl);
    a.beat().await.unwrap();
    let held_a = a.acquire(&run).await.unwrap();
    assert_eq!(held_a.epoch, Epoch(1));
    assert!(matches!(
        b.acquire(&run).await,
        Err(LeaseError::HeldByOther {
            epoch: Epoch(1),
            ..
        })
    ));
    a.release(&held_a).await.unwrap();
    let held_b = b.acquire(&run).await.unwrap();
    assert_eq!(held_b.epoch, Epoch(2));
    assert!(matches!(
        a.check(&held_a).await,
        Err(LeaseError::Lost { .. })
    ));

    // b stops beating (it never beat at all): a takes over after one TTL.
    let poll = Duration::from_millis(50);
    let taken = a
        .acquire_or_wait(&run, poll, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(taken.epoch, Epoch(3));
    assert!(matches!(
        b.check(&held_b).await,
        Err(LeaseError::Lost {
            epoch: Epoch(3),
            ..
        })
    ));

    // While a keeps beating, b cannot take over.
    let beating = {
        let a = a.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                a.beat().await.unwrap();
                rekindle::clock::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    let error = b
        .acquire_or_wait(&run, poll, Duration::from_millis(600))
        .await
        .unwrap_err();
    assert!(matches!(error, LeaseError::StillAlive { .. }), "{error}");
    beating.await.unwrap();
    let view = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert_eq!(view.lease.epoch, Epoch(3));
    assert_eq!(view.lease.holder, "worker-a");
}

/// Recovery admission is idempotent, pinned, and refuses conflicting IDs and sources.
async fn recovery_records(store: Store) {
    let policy = SnapshotPolicy::default();
    for name in ["src-1", "src-2"] {
        let facts = sample::run(name, 30, 1);
        let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
            .await
            .unwrap();
        writer.commit(facts[2..10].to_vec()).await.unwrap();
    }
    let (source, other) = (RunId::new("src-1"), RunId::new("src-2"));
    let id = RecoveryId::new("rec-1");
    let first = recovery::admit(&store, &source, &id, false).await.unwrap();
    assert!(first.created);
    assert_eq!(first.record.source_generation, 2);
    let replay = recovery::admit(&store, &source, &id, false).await.unwrap();
    assert!(!replay.created);
    assert_eq!(replay.record, first.record);
    let error = recovery::admit(&store, &other, &id, false)
        .await
        .unwrap_err();
    assert!(matches!(error, RecoveryError::IdInUse { .. }), "{error}");
    let error = recovery::admit(&store, &source, &RecoveryId::new("rec-2"), false)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "run \"src-1\" is already being recovered as 'rec-1'"
    );
    let (record, etag) = recovery::read(&store, &id).await.unwrap().unwrap();
    // Changes go through the lifecycle: offered, started, finished. A decision taken on the
    // stale version is re-decided on the current one, and a finished record refuses it.
    let w = || "w-1".to_string();
    lifecycle::transition(
        &store,
        &id,
        Some((record.clone(), etag.clone())),
        Event::Assign { worker: w() },
    )
    .await
    .unwrap();
    lifecycle::transition(&store, &id, None, Event::Start { worker: w() })
        .await
        .unwrap();
    let result = rekindle::core::record::RecoveryResult {
        outcome: rekindle::core::fact::Outcome::Completed,
        message: "done".into(),
        final_generation: 9,
    };
    let (updated, _) = lifecycle::transition(
        &store,
        &id,
        None,
        Event::Finish {
            worker: w(),
            attempt: 1,
            result,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        updated.state,
        rekindle::core::record::RecoveryState::Finished
    );
    assert_eq!((updated.attempts, updated.failures), (1, 0));
    let stale = lifecycle::transition(
        &store,
        &id,
        Some((record, etag)),
        Event::Assign { worker: w() },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(stale, LifecycleError::Refused(_)),
        "a finished recovery was reopened: {stale}"
    );
    let finished = recovery::admit(&store, &source, &id, false).await.unwrap();
    assert_eq!(finished.record, updated);

    // A finished run has nothing to recover.
    let facts = sample::run("done-run", 20, 2);
    RunWriter::create(&store, facts.clone(), Epoch(1), policy)
        .await
        .unwrap();
    let done = RunId::new("done-run");
    assert!(matches!(
        recovery::admit(&store, &done, &RecoveryId::new("rec-3"), false).await,
        Err(RecoveryError::NothingToRecover { .. })
    ));
}

/// Corrupt, foreign and future-format objects are refused naming the key; other runs load.
async fn bad_objects_are_named(store: Store) {
    let policy = SnapshotPolicy::default();
    let good = sample::run("good", 20, 3);
    RunWriter::create(&store, good.clone(), Epoch(1), policy)
        .await
        .unwrap();
    let victim = sample::run("victim", 20, 3);
    RunWriter::create(&store, victim[..4].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    let victim_run = RunId::new("victim");
    let key2 = layout::generation(&layout::run_base("victim"), 2);

    store
        .create(&key2, Bytes::from_static(b"{\"oops\""))
        .await
        .unwrap();
    let error = generation::load(&store, &victim_run, None)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains(&format!("'{key2}' is corrupt")),
        "{error}"
    );

    // A generation copied from another run is refused as foreign.
    let other_key = layout::generation(&layout::run_base("good"), 1);
    let foreign = store.read(&other_key).await.unwrap().unwrap().bytes;
    store.delete(&key2).await.unwrap();
    store.create(&key2, foreign).await.unwrap();
    let error = generation::load(&store, &victim_run, None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, GenerationError::ForeignRun { .. }),
        "{error}"
    );

    store.delete(&key2).await.unwrap();
    store
        .create(
            &key2,
            Bytes::from_static(br#"{"format":99,"kind":"run.generation"}"#),
        )
        .await
        .unwrap();
    let error = generation::load(&store, &victim_run, None)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("has format 99, this build reads up to 1"),
        "{error}"
    );

    // A lease object with garbage is refused naming its key.
    let lease_key = layout::lease("victim");
    store
        .create(&lease_key, Bytes::from_static(b"garbage"))
        .await
        .unwrap();
    let error = lease::read_lease(&store, &victim_run).await.unwrap_err();
    assert!(error.to_string().contains(&lease_key), "{error}");

    // The healthy run is unaffected.
    let loaded = generation::load(&store, &RunId::new("good"), None)
        .await
        .unwrap();
    assert_eq!(loaded.state.facts(), &good[..]);
}

/// Session snapshots are whole envelopes saved by compare-and-swap on the last digest.
async fn session_snapshots(store: Store) {
    use rekindle::core::fact::SessionId;
    use rekindle::store::checkpoint::{self, CheckpointError, SessionData};
    let session = SessionId::new("sess-1");
    assert!(
        checkpoint::load_session(&store, &session)
            .await
            .unwrap()
            .is_none()
    );
    let data = |n: u64| SessionData {
        data: serde_json::json!({"n": n}),
        artifacts: serde_json::json!(["a.txt"]),
        ..SessionData::default()
    };
    let first = checkpoint::save_session(&store, &session, data(1), None)
        .await
        .unwrap();
    let second = checkpoint::save_session(&store, &session, data(2), Some(&first.digest))
        .await
        .unwrap();
    // A saver that read the first envelope lost the race: refused, nothing mixed.
    let error = checkpoint::save_session(&store, &session, data(3), Some(&first.digest))
        .await
        .unwrap_err();
    assert!(matches!(error, CheckpointError::Conflict { .. }), "{error}");
    let (envelope, saved) = checkpoint::load_session(&store, &session)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(saved, second);
    assert_eq!(envelope.contents, data(2));
    for n in 3..12 {
        let (_, saved) = checkpoint::load_session(&store, &session)
            .await
            .unwrap()
            .unwrap();
        checkpoint::save_session(&store, &session, data(n), Some(&saved.digest))
            .await
            .unwrap();
    }
    let (envelope, saved) = checkpoint::load_session(&store, &session)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((envelope.contents, saved.generation), (data(11), 11));
}

/// Loop and workflow checkpoints round-trip and refuse another run's or session's.
async fn loop_and_workflow_checkpoints(store: Store) {
    use rekindle::core::fact::{Outcome, SessionId};
    use rekindle::store::checkpoint::{self, CheckpointError, LoopCheckpoint, StepOutcome};
    let facts = sample::run("loop-run", 30, 8);
    let state = rekindle::core::fold::fold(facts).unwrap();
    let saved = LoopCheckpoint::of(&state, 77).unwrap();
    checkpoint::save_loop(&store, &saved).await.unwrap();
    let run = RunId::new("loop-run");
    let session = SessionId::new("sample-session");
    let loaded = checkpoint::load_loop(&store, &run, Some(&session))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(loaded, saved);
    let error = checkpoint::load_loop(&store, &run, Some(&SessionId::new("other")))
        .await
        .unwrap_err();
    assert!(matches!(error, CheckpointError::Refused { .. }));
    assert!(
        error
            .to_string()
            .starts_with("refusing to resume checkpoint '"),
        "{error}"
    );
    assert!(
        error.to_string().contains("it belongs to session"),
        "{error}"
    );

    // A loop checkpoint planted under another run's key is refused, naming both runs.
    let mut foreign = saved.clone();
    foreign.run_id = RunId::new("someone-else");
    let key = layout::generation(&layout::loop_base("loop-run"), 2);
    store
        .create(&key, Bytes::from(serde_json::to_vec(&foreign).unwrap()))
        .await
        .unwrap();
    let error = checkpoint::load_loop(&store, &run, None).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "refusing to resume checkpoint '{key}': it belongs to run \"someone-else\", not \"loop-run\""
        )
    );

    let step = |name: &str| StepOutcome {
        step: name.into(),
        run_id: RunId::new(format!("wf-{name}")),
        outcome: Outcome::Completed,
        message: String::new(),
        spec_sha256: None,
    };
    let n = checkpoint::save_workflow(&store, "wf", vec![step("a")], None)
        .await
        .unwrap();
    checkpoint::save_workflow(&store, "wf", vec![step("a"), step("b")], Some(n))
        .await
        .unwrap();
    assert!(
        checkpoint::save_workflow(&store, "wf", vec![step("x")], Some(n))
            .await
            .is_err()
    );
    let (loaded, generation) = checkpoint::load_workflow(&store, "wf")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(generation, 2);
    assert_eq!(loaded.completed, vec![step("a"), step("b")]);

    let future =
        br#"{"format":2,"kind":"workflow.checkpoint","workflow_id":"wf","completed":[],"at_ms":0}"#;
    store
        .create(
            &layout::generation(&layout::workflow_base("wf"), 3),
            Bytes::from_static(future),
        )
        .await
        .unwrap();
    let error = checkpoint::load_workflow(&store, "wf").await.unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("has format 2, this build reads up to 1"),
        "{error}"
    );
}

/// The index lists runs without scanning the bucket, re-reads only changed entries, and a
/// foreign object in it is reported without hiding the others.
async fn index_scans(store: Store) {
    use rekindle::store::index::{self, IndexScan};
    for i in 0..5 {
        let entry = IndexEntry::new(
            RunId::new(format!("r{i}")),
            None,
            Phase::Running,
            "fp".into(),
            1,
        );
        index::put(&store, &entry).await.unwrap();
    }
    let mut scan = IndexScan::default();
    let (entries, bad) = scan.scan(&store).await.unwrap();
    assert_eq!((entries.len(), bad.len()), (5, 0));
    let before = store.metrics();
    let (entries, _) = scan.scan(&store).await.unwrap();
    let spent = store.metrics().since(&before);
    assert_eq!(entries.len(), 5);
    assert_eq!(
        (spent.list, spent.get),
        (1, 0),
        "an unchanged index costs one LIST"
    );

    let parked = IndexEntry::new(RunId::new("r2"), None, Phase::Parked, "fp".into(), 2);
    index::put(&store, &parked).await.unwrap();
    index::remove(&store, &RunId::new("r4")).await.unwrap();
    store
        .put(
            &layout::index_entry("intruder"),
            Bytes::from_static(b"not ours"),
        )
        .await
        .unwrap();
    let before = store.metrics();
    let (entries, bad) = scan.scan(&store).await.unwrap();
    let spent = store.metrics().since(&before);
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[2].phase, Phase::Parked);
    assert_eq!(bad.len(), 1);
    assert!(
        bad[0]
            .error
            .to_string()
            .contains(&layout::index_entry("intruder"))
    );
    assert_eq!(spent.get, 2, "only the changed and the new entry are read");
}

/// The coordinator's view of the index keeps a run its host drives as its holder only, every
/// other entry in full, and reads a gone holder's runs again: only those still its own.
async fn index_watches(store: Store) {
    use rekindle::store::index::{self, Holding, IndexWatch};
    let held = |run: &str, holder: &str, ttl| {
        let mut entry = IndexEntry::new(RunId::new(run), None, Phase::Running, "fp".into(), 1);
        entry.holder = Some(holder.into());
        entry.holder_ttl_ms = Some(ttl);
        entry
    };
    for entry in [
        held("a1", "hb/a", 300),
        held("a2", "hb/a", 500),
        held("b1", "hb/b", 300),
        IndexEntry::new(RunId::new("p"), None, Phase::Parked, "fp".into(), 1),
    ] {
        index::put(&store, &entry).await.unwrap();
    }
    let mut watch = IndexWatch::default();
    let scanned = watch.scan(&store).await.unwrap();
    let ids: Vec<&str> = scanned.entries.iter().map(|e| e.run_id.as_str()).collect();
    assert_eq!(
        ids,
        ["p"],
        "only the entry the control plane acts on, in full"
    );
    let holders: Vec<(&str, Holding)> = scanned
        .holders
        .iter()
        .map(|(key, holding)| (&**key, *holding))
        .collect();
    assert_eq!(
        holders,
        [
            (
                "hb/a",
                Holding {
                    runs: 2,
                    ttl_ms: Some(500)
                }
            ),
            (
                "hb/b",
                Holding {
                    runs: 1,
                    ttl_ms: Some(300)
                }
            ),
        ]
    );
    let before = store.metrics();
    let again = watch.scan(&store).await.unwrap();
    assert_eq!(
        store.metrics().since(&before).get,
        0,
        "unchanged entries are not read"
    );
    assert_eq!(again.holders, scanned.holders);

    // a2 moved on (admitted) since the scan: only a1 is still hb/a's.
    let mut moved = held("a2", "hb/a", 500);
    moved.phase = Phase::Recovering;
    moved.holder = None;
    index::put(&store, &moved).await.unwrap();
    let gone = std::collections::BTreeSet::from(["hb/a".to_owned()]);
    let ids: Vec<String> = watch
        .held_by(&store, &gone)
        .await
        .into_iter()
        .map(|e| e.run_id.as_str().to_owned())
        .collect();
    assert_eq!(ids, ["a1"]);
    let scanned = watch.scan(&store).await.unwrap();
    let ids: Vec<&str> = scanned.entries.iter().map(|e| e.run_id.as_str()).collect();
    assert_eq!(ids, ["a2", "p"]);
    assert_eq!(scanned.holders.get("hb/a").map(|h| h.runs), Some(1));
}

/// A sharded prefix listed a few pages at a time (16 ranges side by side on S3) hands on
/// every key under it, each once, for at most one more page per range than paging it.
async fn a_sharded_listing_hands_on_every_key_once(store: Store) {
    // Keys at the ranges' bounds (`index/a` ends one range and `index/f` opens the last) and
    // one that is not sharded at all are listed like any other.
    let keys: Vec<String> = (0..2600)
        .map(|i| layout::index_entry(&format!("run-{i}")))
        .chain(["index/a", "index/f", "index/zz"].map(String::from))
        .collect();
    futures::stream::iter(keys.iter())
        .map(|key| store.put(key, Bytes::from_static(b"{}")))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .for_each(|put| {
            put.unwrap();
        });
    let mut sorted = keys.clone();
    sorted.sort();
    let paged: Vec<String> = store
        .list_all(layout::index_prefix())
        .await
        .unwrap()
        .into_iter()
        .map(|listed| listed.key)
        .collect();
    assert_eq!(paged, sorted);
    let before = store.metrics();
    let mut handed = Vec::new();
    store
        .for_each_sharded(layout::index_prefix(), |listed| handed.push(listed.key))
        .await
        .unwrap();
    let spent = store.metrics().since(&before);
    handed.sort();
    assert_eq!(handed, sorted, "every key once");
    assert!(spent.list <= 3 + 16, "{} LISTs", spent.list);
    // A partition's shards, listed alone: exactly the keys of those shards, once each, for
    // ranges that hold more than a page (split side by side) and ranges that hold a few keys.
    let shard_of = |key: &str| {
        let shard = key.strip_prefix("index/")?.get(..3)?.strip_suffix('/')?;
        u8::from_str_radix(shard, 16).ok()
    };
    for range in [
        (0u8, 0u8),
        (0, 127),
        (3, 200),
        (128, 255),
        (255, 255),
        (17, 17),
    ] {
        let mut handed = Vec::new();
        store
            .for_each_in_shards(layout::index_prefix(), range, |listed| {
                handed.push(listed.key)
            })
            .await
            .unwrap();
        handed.sort();
        handed.dedup();
        let wanted: Vec<String> = sorted
            .iter()
            .filter(|key| shard_of(key).is_some_and(|s| (range.0..=range.1).contains(&s)))
            .cloned()
            .collect();
        assert!(!wanted.is_empty());
        let missing: Vec<&String> = wanted.iter().filter(|k| !handed.contains(k)).collect();
        let extra: Vec<&String> = handed.iter().filter(|k| !wanted.contains(k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "shards {range:?}: {} handed, {} wanted, missing {missing:?}, extra {extra:?}",
            handed.len(),
            wanted.len()
        );
    }
}

/// gc deletes superseded generations (once their snapshot is past the grace period) but keeps
/// every epoch's first one, so a zombie is still fenced afterwards and the run still loads.
async fn gc_keeps_fences(store: Store) {
    use rekindle::store::gc;
    let facts = sample::run("gc-run", 200, 12);
    let run = RunId::new("gc-run");
    let policy = SnapshotPolicy {
        max_deltas: 6,
        min_deltas: 6,
    };
    let mut zombie = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    zombie.commit(facts[2..4].to_vec()).await.unwrap();
    let mut writer = RunWriter::resume(&store, &run, Epoch(2), policy)
        .await
        .unwrap();
    let fence = writer.generation();
    for fact in &facts[4..60] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    // Nothing goes while the snapshot is younger than the grace period.
    let now = store.clock().wall_ms();
    let young = gc::collect(
        &store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        now,
    )
    .await
    .unwrap();
    assert_eq!(young.generations_deleted, 0, "{young:?}");
    assert!(young.generations_in_grace > 40, "{young:?}");
    let later = now + 2 * 3600 * 1000;
    let report = gc::collect(
        &store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        later,
    )
    .await
    .unwrap();
    assert!(report.generations_deleted > 40, "{report:?}");
    assert!(
        store
            .head(&layout::generation(&layout::run_base("gc-run"), fence))
            .await
            .unwrap()
            .is_some()
    );
    assert!(matches!(
        zombie.commit(vec![facts[4].clone()]).await,
        Err(GenerationError::Fenced { .. })
    ));
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.state.facts(), &facts[..60]);
    let again = gc::collect(
        &store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        later,
    )
    .await
    .unwrap();
    assert_eq!(again.generations_deleted, 0);
}

/// A run that ended longer ago than the retention period is retired: it loses its checkpoint
/// except each epoch's first slot (so its stale writers are still fenced), keeps its hint and
/// a tombstone, and loads as retired, never as a live run.
async fn gc_removes_finished_runs_but_keeps_fences(store: Store) {
    use rekindle::store::gc;
    let facts = sample::run("old-run", 40, 14);
    let run = RunId::new("old-run");
    let policy = SnapshotPolicy {
        max_deltas: 4,
        min_deltas: 4,
    };
    let mut zombie = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    let mut writer = RunWriter::resume(&store, &run, Epoch(2), policy)
        .await
        .unwrap();
    let fence = writer.generation();
    for fact in &facts[2..] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let now = store.clock().wall_ms();
    let kept = gc::collect(
        &store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        now,
    )
    .await
    .unwrap();
    assert_eq!(kept.runs_retired, 0, "not past retention yet");
    let policy = gc::GcPolicy {
        retention: Duration::from_secs(60),
        grace: Duration::from_secs(60),
    };
    let report = gc::collect(&store, &policy, u64::MAX / 2).await.unwrap();
    assert_eq!(report.runs_retired, 1, "{report:?}");
    let left: Vec<String> = store
        .list(&format!("{}/", layout::run_base("old-run")), None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .collect();
    let base = layout::run_base("old-run");
    assert_eq!(
        left,
        [
            layout::generation(&base, 1),
            layout::generation(&base, fence),
            layout::head(&base),
            // This run was written without a lease; its retirement created one, reserved.
            layout::lease("old-run"),
            layout::tombstone("old-run"),
        ]
    );
    assert!(matches!(
        zombie.commit(vec![facts[2].clone()]).await,
        Err(GenerationError::Fenced { .. })
    ));
    assert!(matches!(
        generation::load(&store, &run, None).await,
        Err(GenerationError::Retired { .. })
    ));
}

/// The cost model: a commit is one conditional PUT (snapshots add one hint write), and
/// loading needs no LIST.
async fn commit_costs_one_put(store: Store) {
    let facts = sample::run("cost", 60, 13);
    let policy = SnapshotPolicy::default();
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    for fact in &facts[2..40] {
        let before = store.metrics();
        writer.commit(vec![fact.clone()]).await.unwrap();
        let spent = store.metrics().since(&before);
        // A snapshot also moves the head hint forward: a read and a conditional write (on
        // the local directory, whose swap reads under its lock, one more read).
        let snapshot = u64::from(writer.base() == writer.generation());
        assert_eq!(spent.conditional_put, 1 + snapshot, "{spent:?}");
        assert!(spent.requests() <= 1 + 3 * snapshot, "{spent:?}");
        assert_eq!(spent.list, 0);
    }
    let before = store.metrics();
    generation::load(&store, &RunId::new("cost"), None)
        .await
        .unwrap();
    let spent = store.metrics().since(&before);
    assert_eq!(spent.list, 0, "{spent:?}");
}

/// A load finds the newest generation from the hint (the newest snapshot) by reading the
/// slots after it at once: at every distance from the snapshot it loads the whole run, lists
/// nothing, and near the snapshot (the usual case) it reads the hint twice and one window of
/// four slots, which double as the generations it loads (six GETs, no HEAD).
async fn a_load_probes_from_the_hint(store: Store) {
    let facts = sample::run("probe", 90, 17);
    let run = RunId::new("probe");
    let policy = SnapshotPolicy::default();
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    let mut distances = std::collections::BTreeSet::new();
    for (committed, fact) in facts.iter().enumerate().skip(2) {
        writer.commit(vec![fact.clone()]).await.unwrap();
        if writer.base() <= 1 {
            continue;
        }
        let distance = writer.generation() - writer.base();
        let before = store.metrics();
        let loaded = generation::load(&store, &run, None).await.unwrap();
        let spent = store.metrics().since(&before);
        assert_eq!(
            loaded.generation,
            writer.generation(),
            "distance {distance}"
        );
        assert_eq!(loaded.state.facts(), &facts[..=committed]);
        assert_eq!((spent.list, spent.head), (0, 0), "{spent:?}");
        if distance <= 2 {
            assert_eq!(spent.get, 6, "distance {distance}: {spent:?}");
        } else {
            // The window, the slots after it once each, and the exponential and binary
            // probe's misses past the newest.
            let misses = 2 * u64::from(u64::BITS - distance.leading_zeros());
            assert!(
                spent.get <= 2 + 4 + distance + misses,
                "distance {distance}: {spent:?}"
            );
        }
        distances.insert(distance);
    }
    assert!(
        distances.contains(&0) && distances.iter().any(|&d| d > 4),
        "the run covers loads at and far from a snapshot: {distances:?}"
    );
}

/// A listing of `recoveries/` names each record by key, and a key's last segment is the
/// recovery ID only for a plain ID: `runs ls --all` read an encoded one (`team/7`) back under
/// its hash and lost its outcome. A record is read by its listed key and names its own ID; a
/// record copied under another ID's key is refused.
async fn listed_records_name_their_own_ids(store: Store) {
    let facts = sample::run("src-enc", 30, 2);
    RunWriter::create(
        &store,
        facts[..3].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    let source = RunId::new("src-enc");
    let encoded = RecoveryId::new("team/7 recovery");
    assert_ne!(layout::encode_id(encoded.as_str()), encoded.as_str());
    recovery::admit(&store, &source, &encoded, false)
        .await
        .unwrap();
    let listed = store.list_all(layout::recoveries_prefix()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (record, _) = recovery::read_listed(&store, &listed[0].key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.recovery_id, encoded);
    let copy = layout::recovery("another");
    let object = store.read(&listed[0].key).await.unwrap().unwrap();
    store.put(&copy, object.bytes).await.unwrap();
    assert!(matches!(
        recovery::read_listed(&store, &copy).await,
        Err(RecoveryError::Object(_))
    ));
}

/// A stale version never matches again, however fast same-sized rewrites come. (The local
/// backend's own inode/mtime/size ETags could repeat after inode reuse within one timestamp
/// tick; this machine's filesystem did not show it, but content-hash versions rule it out.)
async fn stale_versions_never_match_again(store: Store) {
    let stale = store
        .create("t/aba", Bytes::from_static(b"value-00000"))
        .await
        .unwrap();
    let mut current = stale.clone();
    for i in 1..200 {
        current = store
            .swap("t/aba", Bytes::from(format!("value-{i:05}")), &current)
            .await
            .unwrap();
        assert_ne!(current, stale, "write {i} reused the first version");
        assert!(matches!(
            store
                .swap("t/aba", Bytes::from_static(b"stale-write"), &stale)
                .await,
            Err(StoreError::Changed { .. })
        ));
    }
}

macro_rules! conformance {
    ($backend:ident, $open:expr) => {
        mod $backend {
            use super::*;

            conformance!(@case $open, create_if_absent);
            conformance!(@case $open, compare_and_swap);
            conformance!(@case $open, read_delete_list);
            conformance!(@case $open, create_race_has_one_winner);
            conformance!(@case $open, swap_race_has_one_winner);
            conformance!(@case $open, probe_passes);
            conformance!(@case $open, commit_and_load);
            conformance!(@case $open, takeover_fences_the_old_writer);
            conformance!(@case $open, leases);
            conformance!(@case $open, recovery_records);
            conformance!(@case $open, bad_objects_are_named);
            conformance!(@case $open, session_snapshots);
            conformance!(@case $open, loop_and_workflow_checkpoints);
            conformance!(@case $open, index_scans);
            conformance!(@case $open, index_watches);
            conformance!(@case $open, a_sharded_listing_hands_on_every_key_once);
            conformance!(@case $open, gc_keeps_fences);
            conformance!(@case $open, commit_costs_one_put);
            conformance!(@case $open, a_load_probes_from_the_hint);
            conformance!(@case $open, listed_records_name_their_own_ids);
            conformance!(@case $open, stale_versions_never_match_again);
            conformance!(@case $open, gc_removes_finished_runs_but_keeps_fences);
        }
    };
    (@case $open:expr, $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let open = $open;
            let (store, _guard) = open(stringify!($case)).await;
            super::$case(store).await;
        }
    };
}

conformance!(memory, |_name: &'static str| async {
    (common::memory(), None::<tempfile::TempDir>)
});
conformance!(local, |_name: &'static str| async {
    let dir = tempfile::tempdir().unwrap();
    let store = common::local(dir.path()).await;
    (store, Some(dir))
});
conformance!(s3, |name: &'static str| async move {
    (common::s3(name).await, None::<tempfile::TempDir>)
});

// Proves the local directory backend makes its writes and deletes durable as far as a test
// can see: it runs object_store with fsync on (which syncs each written file, its directory
// and every directory created for it before the write returns; visible only in its Debug
// form), fsyncs the directory after a delete (counted), and still creates, swaps, overwrites
// and deletes in new nested directories. It cannot prove data reached stable storage: that
// would take a power cut.
#[tokio::test]
async fn local_store_fsyncs_writes_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::local(dir.path()).await;
    assert!(format!("{store:?}").contains("fsync: true"), "{store:?}");
    let key = "deep/new/directories/object";
    let first = store.create(key, Bytes::from_static(b"a")).await.unwrap();
    store
        .swap(key, Bytes::from_static(b"b"), &first)
        .await
        .unwrap();
    store.put(key, Bytes::from_static(b"c")).await.unwrap();
    let stored = store.read(key).await.unwrap().unwrap();
    assert_eq!(stored.bytes, Bytes::from_static(b"c"));
    let before = store.local_directory_syncs();
    store.delete(key).await.unwrap();
    assert_eq!(store.local_directory_syncs(), before + 1);
    assert!(store.read(key).await.unwrap().is_none());
    // Deleting a missing key still succeeds; its missing directory has nothing to sync.
    store.delete("never/written").await.unwrap();
}

// A commit whose future is dropped mid-write (its caller was cancelled: a timeout, Ctrl-C in a
// host) leaves the writer not knowing whether the generation landed. The writer then refuses
// to commit more, naming the run, instead of writing a generation whose seqs skip the
// in-doubt ones (which made the run unreadable); a fresh resume carries on from what landed.
#[tokio::test]
async fn a_commit_cancelled_mid_write_stops_the_writer_not_the_run() {
    let plan = rekindle::store::faults::FaultPlan {
        latency: Duration::from_millis(20),
        ..Default::default()
    };
    let (store, _faults) = common::faulty_memory(plan, 1);
    let facts = sample::run("run-cancel", 12, 3);
    let policy = SnapshotPolicy::default();
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), policy)
        .await
        .unwrap();
    // Every request takes 20 ms: the timeout drops the commit while it writes.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(5),
        writer.commit(facts[2..3].to_vec()),
    )
    .await;
    assert!(cancelled.is_err(), "the commit was not cut off mid-write");
    match writer.commit(facts[3..4].to_vec()).await {
        Err(error @ GenerationError::Interrupted { .. }) => {
            assert!(error.to_string().contains("run-cancel"), "{error}")
        }
        other => panic!("expected the writer to refuse, got {other:?}"),
    }
    // Whatever landed loads, and a resume continues from it.
    let loaded = generation::load(&store, &RunId::new("run-cancel"), None)
        .await
        .unwrap();
    let landed = loaded.state.last_seq().0 as usize;
    assert!(landed == 2 || landed == 3, "{landed}");
    let mut resumed = RunWriter::resume(&store, &RunId::new("run-cancel"), Epoch(2), policy)
        .await
        .unwrap();
    resumed
        .commit(facts[landed..landed + 1].to_vec())
        .await
        .unwrap();
    let reloaded = generation::load(&store, &RunId::new("run-cancel"), None)
        .await
        .unwrap();
    assert_eq!(reloaded.state.last_seq().0 as usize, landed + 1);
}

// Lock files of the local store do not outlive their keys: a compare-and-swap or overwrite
// takes the key's lock file, and deleting the key removes it (the soak found one per key ever
// swapped, never removed, heartbeats of dead processes among them).
#[tokio::test]
async fn local_lock_files_go_with_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::local(dir.path()).await;
    let locks = || {
        std::fs::read_dir(dir.path().join(".rekindle-locks"))
            .map(|entries| entries.count())
            .unwrap_or(0)
    };
    let before = locks();
    let first = store
        .create("a/key", Bytes::from_static(b"1"))
        .await
        .unwrap();
    store
        .swap("a/key", Bytes::from_static(b"2"), &first)
        .await
        .unwrap();
    store.put("b/key", Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(locks(), before + 2);
    store.delete("a/key").await.unwrap();
    store.delete("b/key").await.unwrap();
    assert_eq!(locks(), before, "deleting a key removes its lock file");
    // The key comes back, and so does its lock, as before.
    store.put("a/key", Bytes::from_static(b"3")).await.unwrap();
    assert_eq!(
        store.read("a/key").await.unwrap().unwrap().bytes,
        Bytes::from_static(b"3")
    );
}
