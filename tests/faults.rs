//! Store faults: lost responses, transient errors and throttling, stalls, partitions,
//! stores that ignore or race conditional writes, and two real processes sharing a local
//! store. Seeded cases print their seed so a failure replays exactly.

mod common;

use rekindle::core::epoch::Epoch;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::memory::InMemory;
use rekindle::clock::{Clock, ManualClock, SystemClock};
use rekindle::core::fact::RunId;
use rekindle::core::sample;
use rekindle::store::faults::{FaultPlan, FaultyStore};
use rekindle::store::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use rekindle::store::lease::{Holder, LeaseError};
use rekindle::store::{Backend, RetryPolicy, Store, StoreError};

const CAS_CHILD: &str = "REKINDLE_TEST_CAS_CHILD_DIR";
const LEASE_CHILD: &str = "REKINDLE_TEST_LEASE_CHILD_DIR";

// Proves the probe refuses a store that accepts conditional headers and ignores them.
#[tokio::test]
async fn probe_refuses_a_store_that_ignores_conditions() {
    let plan = FaultPlan {
        ignore_conditions: true,
        ..FaultPlan::default()
    };
    let (store, _) = common::faulty_memory(plan, 1);
    let error = store.probe().await.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::ProbeFailed {
                check: "create-if-absent",
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("ignores If-None-Match"),
        "{error}"
    );
}

// Proves the probe refuses a store whose conditional writes are not atomic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_refuses_a_store_with_racy_conditions() {
    let plan = FaultPlan {
        racy_conditions: true,
        ..FaultPlan::default()
    };
    let (store, _) = common::faulty_memory(plan, 2);
    let error = store.probe().await.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::ProbeFailed {
                check: "atomic create race",
                ..
            }
        ),
        "{error}"
    );
}

// Proves writes whose responses are all lost are recognised as ours and adopted: a run
// commits, and its lease is taken and released, as if nothing had gone wrong.
#[tokio::test]
async fn lost_responses_are_adopted() {
    let plan = FaultPlan {
        lost_response_per_mille: 1000,
        ..FaultPlan::default()
    };
    let (store, faulty) = common::faulty_memory(plan, 3);
    let facts = sample::run("lost", 30, 4);
    let mut writer = RunWriter::create(
        &store,
        facts[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    for fact in &facts[2..] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let holder = Holder::new(&store, "w", Duration::from_secs(10));
    let held = holder.acquire(&RunId::new("lost")).await.unwrap();
    holder.release(&held).await.unwrap();
    assert!(
        faulty
            .counts
            .lost_responses
            .load(std::sync::atomic::Ordering::Relaxed)
            > 20
    );
    let loaded = generation::load(&store, &RunId::new("lost"), None)
        .await
        .unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
}

// Proves seeded mixes of 503s, lost responses and latency never lose or duplicate a commit.
#[tokio::test]
async fn seeded_transient_faults_lose_nothing() {
    for seed in 0..6u64 {
        let plan = FaultPlan {
            error_per_mille: 250,
            lost_response_per_mille: 200,
            latency: Duration::from_millis(1),
            ..FaultPlan::default()
        };
        let (store, _) = common::faulty_memory(plan, seed);
        let facts = sample::run("seeded", 40, seed);
        let mut writer = RunWriter::create(
            &store,
            facts[..2].to_vec(),
            Epoch(1),
            SnapshotPolicy::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for chunk in facts[2..].chunks(3) {
            writer
                .commit(chunk.to_vec())
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        let loaded = generation::load(&store, &RunId::new("seeded"), None)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(loaded.state.facts(), &facts[..], "seed {seed}");
    }
}

// Proves a 409 ConditionalRequestConflict on a create (nothing written) is retried, not
// mistaken for a lost race: every commit lands exactly once.
#[tokio::test]
async fn conditional_request_conflicts_are_retried() {
    let plan = FaultPlan {
        conflict_409_per_mille: 400,
        ..FaultPlan::default()
    };
    let (store, faulty) = common::faulty_memory(plan, 8);
    let facts = sample::run("conflicts", 30, 8);
    let mut writer = RunWriter::create(
        &store,
        facts[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    for fact in &facts[2..] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    assert!(
        faulty
            .counts
            .errors
            .load(std::sync::atomic::Ordering::Relaxed)
            > 5
    );
    let loaded = generation::load(&store, &RunId::new("conflicts"), None)
        .await
        .unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
}

// Proves a 409 ConditionalRequestConflict on a compare-and-swap (reported by object_store as
// "already exists", nothing written) is retried like a transient conflict, not treated as a
// hard error: every swap lands exactly once, and leases are taken and released through it.
#[tokio::test]
async fn conflict_409_on_swap_is_retried_not_fatal() {
    let plan = FaultPlan {
        update_conflict_409_per_mille: 400,
        ..FaultPlan::default()
    };
    let (store, faulty) = common::faulty_memory(plan, 9);
    let mut etag = store
        .create("counter", Bytes::from_static(b"0"))
        .await
        .unwrap();
    for i in 1..=30 {
        etag = store
            .swap("counter", Bytes::from(i.to_string()), &etag)
            .await
            .unwrap_or_else(|e| panic!("swap {i}: {e}"));
    }
    let stored = store.read("counter").await.unwrap().unwrap();
    assert_eq!(
        (stored.bytes, stored.etag),
        (Bytes::from_static(b"30"), etag)
    );
    let holder = Holder::new(&store, "w", Duration::from_secs(10));
    for round in 0..5 {
        let held = holder
            .acquire(&RunId::new("conflicted"))
            .await
            .unwrap_or_else(|e| panic!("acquire {round}: {e}"));
        holder
            .release(&held)
            .await
            .unwrap_or_else(|e| panic!("release {round}: {e}"));
    }
    assert!(
        faulty
            .counts
            .errors
            .load(std::sync::atomic::Ordering::Relaxed)
            > 5
    );
}

// Proves a commit whose create landed but was reported unavailable (response lost, no retry
// left to adopt it) is recognised by its writer nonce when the same writer commits the same
// facts again with new bytes: the slot is adopted as ours instead of being reported as
// another writer's conflict, and facts beyond it go into the next slot.
#[tokio::test]
async fn own_slot_after_lost_ack_is_not_a_conflict() {
    let (faulty, clock, store) = without_retries("memory://lost-ack", 10);
    let lose = FaultPlan {
        lost_response_per_mille: 1000,
        ..FaultPlan::default()
    };
    let facts = sample::run("lost-ack", 20, 10);
    let mut writer = RunWriter::create(
        &store,
        facts[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    writer.commit(facts[2..4].to_vec()).await.unwrap();

    faulty.set_plan(lose);
    let error = writer.commit(facts[4..6].to_vec()).await.unwrap_err();
    assert!(
        matches!(
            error,
            GenerationError::Store(StoreError::Unavailable { .. })
        ),
        "{error}"
    );
    assert_eq!((writer.generation(), writer.committed().0), (2, 4));
    // The same facts again, at a later time (so different bytes): slot 3 is ours.
    faulty.set_plan(FaultPlan::default());
    clock.advance(Duration::from_millis(5));
    writer.commit(facts[4..6].to_vec()).await.unwrap();
    assert_eq!((writer.generation(), writer.committed().0), (3, 6));

    // Lost again, then retried with more facts: slot 4 is adopted, the rest goes to slot 5.
    faulty.set_plan(lose);
    writer.commit(facts[6..8].to_vec()).await.unwrap_err();
    faulty.set_plan(FaultPlan::default());
    clock.advance(Duration::from_millis(5));
    writer.commit(facts[6..10].to_vec()).await.unwrap();
    assert_eq!((writer.generation(), writer.committed().0), (5, 10));
    writer.commit(facts[10..].to_vec()).await.unwrap();
    let loaded = generation::load(&store, &RunId::new("lost-ack"), None)
        .await
        .unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
    assert_eq!(loaded.generation, 6);
}

// Proves the latency store charges a compare-and-swap on the local backend once, as S3's one
// conditional PUT costs one round trip: the local backend reads under its lock before it
// writes, and that read used to add a second round trip of injected latency to every swap
// (the assignment, the start, the releases), overstating every path through one. A create,
// a read and an overwrite each pay once; the swap's read still counts as a request.
#[tokio::test]
async fn injected_latency_charges_a_local_swap_once() {
    use std::sync::atomic::Ordering;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let local = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&root).unwrap());
    let plan = FaultPlan {
        latency: Duration::from_millis(1),
        ..FaultPlan::default()
    };
    let faulty = FaultyStore::new(local, plan, 12);
    let store = Store::from_parts(
        faulty.clone(),
        Backend::Local { root },
        "file://latency",
        "",
        common::fast_retry(),
        SystemClock::shared(),
    );
    let delayed = || faulty.counts.delayed.load(Ordering::Relaxed);
    let before = delayed();
    let first = store.create("k", Bytes::from_static(b"1")).await.unwrap();
    assert_eq!(delayed() - before, 1, "a create");
    let before = (delayed(), store.metrics());
    store
        .swap("k", Bytes::from_static(b"2"), &first)
        .await
        .unwrap();
    assert_eq!(delayed() - before.0, 1, "a swap is one request's latency");
    let spent = store.metrics().since(&before.1);
    assert_eq!((spent.get, spent.conditional_put), (1, 1), "{spent:?}");
    let before = delayed();
    store.read("k").await.unwrap().unwrap();
    assert_eq!(delayed() - before, 1, "a read");
}

// Proves a local compare-and-swap whose attempt deadline fires keeps the key's lock until its
// write has really landed: a second swap against the old version waits and is refused,
// instead of succeeding and then being overwritten by the late write; an overwrite abandoned
// while waiting for that lock is never done afterwards. The fault wrapper's detached delay
// stands in for object_store's blocking write that outlives its future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_swap_timeout_keeps_the_lock_until_the_write_lands() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let local = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&root).unwrap());
    let faulty = FaultyStore::new(local, FaultPlan::default(), 11);
    let open = |attempt_timeout: Duration| {
        Store::from_parts(
            faulty.clone(),
            Backend::Local { root: root.clone() },
            "file://timeout",
            "",
            RetryPolicy {
                max_retries: 0,
                attempt_timeout,
                ..common::fast_retry()
            },
            SystemClock::shared(),
        )
    };
    let impatient = open(Duration::from_millis(50));
    let patient = open(Duration::from_secs(5));
    let first = patient
        .create("k", Bytes::from_static(b"v0"))
        .await
        .unwrap();
    faulty.set_plan(FaultPlan {
        detached_write_delay: Duration::from_millis(400),
        ..FaultPlan::default()
    });
    let error = impatient
        .swap("k", Bytes::from_static(b"slow"), &first)
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error}");
    faulty.set_plan(FaultPlan::default());
    // An overwrite that gives up while the slow write holds the lock never lands later.
    let error = impatient
        .put("k", Bytes::from_static(b"late"))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error}");
    let second = patient.swap("k", Bytes::from_static(b"b"), &first).await;
    // Let the late write land whatever happened.
    rekindle::clock::sleep(Duration::from_millis(600)).await;
    let stored = patient.read("k").await.unwrap().unwrap().bytes;
    match second {
        Ok(_) => assert_eq!(
            stored,
            Bytes::from_static(b"b"),
            "an acknowledged swap was overwritten by a write whose attempt had timed out"
        ),
        Err(StoreError::Changed { .. }) => assert_eq!(stored, Bytes::from_static(b"slow")),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

// Proves a real conflict (412 / existing key) is answered at once, never retried.
#[tokio::test]
async fn real_conflicts_are_not_retried() {
    let store = common::memory();
    store.create("k", Bytes::from_static(b"a")).await.unwrap();
    let before = store.metrics();
    let error = store
        .create("k", Bytes::from_static(b"b"))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::AlreadyExists { .. }));
    let spent = store.metrics().since(&before);
    assert_eq!((spent.conditional_put, spent.get), (1, 1), "{spent:?}");
}

// Proves a request that stalls past its deadline is retried a bounded number of times and
// then reported as unavailable, naming the operation and the key.
#[tokio::test]
async fn stalls_are_bounded() {
    let plan = FaultPlan {
        stall_per_mille: 1000,
        stall: Duration::from_millis(400),
        ..FaultPlan::default()
    };
    let (store, faulty) = common::faulty_memory(plan, 5);
    let store = rekindle::store::Store::from_parts(
        faulty,
        rekindle::store::Backend::Memory,
        "memory://stall",
        "",
        RetryPolicy {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_retries: 2,
            attempt_timeout: Duration::from_millis(50),
        },
        store.clock().clone(),
    );
    let error = store.read("some/key").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "store unavailable: read of 'some/key' failed after 3 attempts: no answer within 50 ms"
    );
}

// Proves a writer cut off from the store fails its commit cleanly, keeps its state, and
// commits everything once the store is back: nothing acknowledged is lost.
#[tokio::test]
async fn partition_then_reconnect_loses_nothing() {
    let (store, faulty) = common::faulty_memory(FaultPlan::default(), 6);
    let facts = sample::run("cut", 20, 6);
    let mut writer = RunWriter::create(
        &store,
        facts[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    writer.commit(facts[2..5].to_vec()).await.unwrap();
    faulty.set_partitioned(true);
    let error = writer.commit(facts[5..8].to_vec()).await.unwrap_err();
    assert!(
        matches!(
            error,
            GenerationError::Store(StoreError::Unavailable { .. })
        ),
        "{error}"
    );
    assert_eq!(writer.committed().0, 5);
    // The failed commit's facts were rolled back out of the writer's state too.
    assert_eq!(writer.state().last_seq().0, 5);
    faulty.set_partitioned(false);
    writer.commit(facts[5..].to_vec()).await.unwrap();
    let loaded = generation::load(&store, &RunId::new("cut"), None)
        .await
        .unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
}

/// Child role for `local_compare_and_swap_across_processes`: 25 increments of a shared
/// counter by compare-and-swap. As a plain test, checks one increment in-process.
#[tokio::test]
async fn cas_child_or_single_increment() {
    let dir = std::env::var_os(CAS_CHILD);
    let temp = tempfile::tempdir().unwrap();
    let path = dir.map_or_else(|| temp.path().to_owned(), std::path::PathBuf::from);
    let store = common::local(&path).await;
    let rounds = if std::env::var_os(CAS_CHILD).is_some() {
        25
    } else {
        1
    };
    if store.read("counter").await.unwrap().is_none() {
        let _ = store.create("counter", Bytes::from_static(b"0")).await;
    }
    for _ in 0..rounds {
        loop {
            let current = store.read("counter").await.unwrap().unwrap();
            let value: u64 = std::str::from_utf8(&current.bytes)
                .unwrap()
                .parse()
                .unwrap();
            let next = Bytes::from((value + 1).to_string());
            match store.swap("counter", next, &current.etag).await {
                Ok(_) => break,
                Err(StoreError::Changed { .. }) => continue,
                Err(other) => panic!("{other}"),
            }
        }
    }
    if std::env::var_os(CAS_CHILD).is_none() {
        let value = store.read("counter").await.unwrap().unwrap().bytes;
        assert_eq!(value, Bytes::from_static(b"1"));
    }
}

// Proves the local directory's compare-and-swap is atomic across real processes: four
// processes doing 25 increments each leave the counter at exactly 100.
#[tokio::test]
async fn local_compare_and_swap_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::local(dir.path()).await;
    store
        .create("counter", Bytes::from_static(b"0"))
        .await
        .unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "cas_child_or_single_increment"])
                .env(CAS_CHILD, dir.path())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let value = store.read("counter").await.unwrap().unwrap().bytes;
    assert_eq!(value, Bytes::from_static(b"100"));
}

/// Child role for `local_lease_across_processes`: holds run "shared" and keeps beating. As a
/// plain test, checks that a lease is exclusive within one process.
#[tokio::test]
async fn lease_child_or_exclusive_in_process() {
    let temp = tempfile::tempdir().unwrap();
    let dir = std::env::var_os(LEASE_CHILD);
    let path = dir
        .clone()
        .map_or_else(|| temp.path().to_owned(), std::path::PathBuf::from);
    let store = common::local(&path).await;
    let holder = Holder::new(&store, "child", Duration::from_millis(400));
    holder.beat().await.unwrap();
    let held = holder.acquire(&RunId::new("shared")).await.unwrap();
    if dir.is_none() {
        let other = Holder::new(&store, "other", Duration::from_millis(400));
        assert!(matches!(
            other.acquire(&RunId::new("shared")).await,
            Err(LeaseError::HeldByOther { .. })
        ));
        return;
    }
    println!("HELD {}", held.epoch);
    for _ in 0..600 {
        holder.beat().await.unwrap();
        rekindle::clock::sleep(Duration::from_millis(50)).await;
    }
}

// Proves two processes compete for one lease on a local store: the second is refused while
// the first is alive and beating, and takes over (epoch 2) once the first is killed -9.
#[tokio::test]
async fn local_lease_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lease_child_or_exclusive_in_process",
            "--nocapture",
        ])
        .env(LEASE_CHILD, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("child ended early").unwrap();
        if line.starts_with("HELD") {
            break;
        }
    }
    let store = common::local(dir.path()).await;
    let run = RunId::new("shared");
    let parent = Holder::new(&store, "parent", Duration::from_millis(400));
    assert!(matches!(
        parent.acquire(&run).await,
        Err(LeaseError::HeldByOther {
            epoch: Epoch(1),
            ..
        })
    ));
    let error = parent
        .acquire_or_wait(&run, Duration::from_millis(50), Duration::from_millis(900))
        .await
        .unwrap_err();
    assert!(matches!(error, LeaseError::StillAlive { .. }), "{error}");
    child.kill().unwrap();
    child.wait().unwrap();
    let held = parent
        .acquire_or_wait(&run, Duration::from_millis(50), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(held.epoch, Epoch(2));
}

// Proves a bucket laid out by a newer build is refused at open, naming both formats.
#[tokio::test]
async fn newer_bucket_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::local(dir.path()).await;
    store.delete("rekindle-format").await.unwrap();
    store
        .create(
            "rekindle-format",
            Bytes::from_static(br#"{"format":7,"kind":"rekindle.format"}"#),
        )
        .await
        .unwrap();
    let error = store.check_format().await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "open of 'rekindle-format' failed: the bucket has layout format 7, this build reads up to 1"
    );
}

// Proves a writer never fills a slot twice (simulation seed 10001760 of 2026-11-30). Its
// commit of slot 3 landed but the response was lost. Before it tried again, a new holder
// fenced the run and wrote on past a snapshot, and gc collected slot 3, whose facts that
// snapshot holds. The retry finds slot 3 empty: it must not write it again (gc frees a slot
// its writer filled because that writer never aims at it again) but report itself fenced.
#[tokio::test]
async fn a_lost_commit_collected_meanwhile_is_not_written_again() {
    let (faulty, clock, store) = without_retries("memory://collected", 11);
    let run = RunId::new("collected");
    let facts = sample::run("collected", 40, 11);
    let mut old = RunWriter::create(
        &store,
        facts[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    .unwrap();
    old.commit(facts[2..4].to_vec()).await.unwrap();
    faulty.set_plan(FaultPlan {
        lost_response_per_mille: 1000,
        ..FaultPlan::default()
    });
    old.commit(facts[4..6].to_vec()).await.unwrap_err();
    faulty.set_plan(FaultPlan::default());
    let slot =
        rekindle::core::layout::generation(&rekindle::core::layout::run_base("collected"), 3);
    assert!(store.read(&slot).await.unwrap().is_some(), "slot 3 landed");

    let policy = SnapshotPolicy {
        max_deltas: 2,
        min_deltas: 1,
    };
    let mut new = RunWriter::resume(&store, &run, Epoch(2), policy)
        .await
        .unwrap();
    for chunk in facts[6..].chunks(4) {
        new.commit(chunk.to_vec()).await.unwrap();
    }
    clock.advance(Duration::from_secs(10));
    let report = rekindle::store::gc::collect(
        &store,
        &rekindle::store::gc::GcPolicy {
            retention: Duration::from_secs(3600),
            grace: Duration::from_secs(1),
        },
        store.clock().wall_ms(),
    )
    .await
    .unwrap();
    assert!(report.generations_deleted > 0, "{report:?}");
    assert!(
        store.read(&slot).await.unwrap().is_none(),
        "gc collected slot 3"
    );

    let error = old.commit(facts[4..6].to_vec()).await.unwrap_err();
    assert!(
        matches!(
            error,
            GenerationError::Fenced {
                by_epoch: Epoch(2),
                ..
            }
        ),
        "{error}"
    );
    assert!(
        store.read(&slot).await.unwrap().is_none(),
        "slot 3 was filled a second time"
    );
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.state.facts(), &facts[..]);
}

// Proves `Chain::create` after an attempt whose outcome was unknown: our bytes in the slot
// are adopted, other bytes are taken, and an empty slot is created only if the hint shows
// gc cannot have collected it; past the hint's snapshot it stays empty and says so.
#[tokio::test]
async fn an_unconfirmed_slot_is_created_only_below_the_hint() {
    let store = Store::memory(SystemClock::shared());
    let chain = generation::Chain::new(&store, "chains/unconfirmed".into());
    let ours = Bytes::from_static(b"ours");

    store.create(&chain.key(1), ours.clone()).await.unwrap();
    assert!(matches!(
        chain.create(1, ours.clone(), true).await.unwrap(),
        generation::SlotWrite::Created
    ));
    assert!(matches!(
        chain
            .create(1, Bytes::from_static(b"theirs"), true)
            .await
            .unwrap(),
        generation::SlotWrite::Taken
    ));

    // Empty, no hint: nothing was collected, so the slot is created.
    assert!(matches!(
        chain.create(2, ours.clone(), true).await.unwrap(),
        generation::SlotWrite::Created
    ));
    assert_eq!(
        store.read(&chain.key(2)).await.unwrap().unwrap().bytes,
        ours
    );

    // Empty below the hint: gc may have collected a write of ours there.
    chain.advance_hint(5).await.unwrap();
    assert!(matches!(
        chain.create(3, ours.clone(), true).await.unwrap(),
        generation::SlotWrite::Passed
    ));
    assert!(store.read(&chain.key(3)).await.unwrap().is_none());
    // Without an earlier attempt of ours, the same slot is simply created.
    assert!(matches!(
        chain.create(3, ours.clone(), false).await.unwrap(),
        generation::SlotWrite::Created
    ));
    // Once the run is retired, gc may delete everything: an empty slot stays empty.
    chain.retire_hint(6).await.unwrap();
    assert!(matches!(
        chain.create(4, ours.clone(), true).await.unwrap(),
        generation::SlotWrite::Passed
    ));
    assert!(store.read(&chain.key(4)).await.unwrap().is_none());
}

// Proves a 409 ConditionalRequestConflict on a slot's create (object_store's "already
// exists", with nothing there when read back) is retried into a created slot holding our
// bytes: the empty read-back after it is not taken for a collected write while the hint is
// below the slot.
#[tokio::test]
async fn a_slot_refused_by_409s_is_created_once_they_stop() {
    let faulty = FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultPlan {
            conflict_409_per_mille: 600,
            ..FaultPlan::default()
        },
        12,
    );
    let store = Store::from_parts(
        faulty.clone(),
        Backend::Memory,
        "memory://slot-409",
        "",
        common::fast_retry(),
        SystemClock::shared(),
    );
    let chain = generation::Chain::new(&store, "chains/slot-409".into());
    for n in 1..=20u64 {
        let ours = Bytes::from(format!("slot {n}"));
        assert!(
            matches!(
                chain.create(n, ours.clone(), false).await.unwrap(),
                generation::SlotWrite::Created
            ),
            "slot {n}"
        );
        assert_eq!(
            store.read(&chain.key(n)).await.unwrap().unwrap().bytes,
            ours
        );
    }
    assert!(
        faulty
            .counts
            .errors
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "no 409 was injected"
    );
}

/// A memory store behind a fault wrapper (no faults yet), on a manual clock, that does not
/// retry: a lost response surfaces to the caller.
fn without_retries(url: &str, seed: u64) -> (Arc<FaultyStore>, Arc<ManualClock>, Store) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultPlan::default(), seed);
    let clock = ManualClock::new(1_000);
    let shared: Arc<dyn Clock> = clock.clone();
    let store = Store::from_parts(
        faulty.clone(),
        Backend::Memory,
        url,
        "",
        RetryPolicy {
            max_retries: 0,
            ..common::fast_retry()
        },
        shared,
    );
    (faulty, clock, store)
}

// Regression (stale evidence, issue 30's first scenario, in the takeover): a contender judged
// each reading as seen when its request returned, so one slow response made a holder that
// keeps beating look silent for the whole delay, and its lease was taken over. Silence now
// runs from the return of the request that first saw a version to the issue of the one that
// saw it again.
#[tokio::test]
async fn a_slow_response_does_not_make_a_beating_holder_look_gone() {
    use rekindle::core::liveness::ExpiryWatch;
    use rekindle::store::lease::Attempt;

    let bucket = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(bucket.clone(), FaultPlan::default(), 0);
    let open = |inner: Arc<dyn object_store::ObjectStore>, url: &str| {
        Store::from_parts(
            inner,
            Backend::Memory,
            url,
            "",
            common::fast_retry(),
            SystemClock::shared(),
        )
    };
    let direct = open(bucket, "memory://holder");
    let slow = open(faulty.clone(), "memory://contender");
    let ttl = Duration::from_millis(300);
    let run = RunId::new("slow-look");
    let holder = Holder::new(&direct, "holder", ttl);
    holder.beat().await.unwrap();
    let held = holder.acquire(&run).await.unwrap();
    let contender = Holder::new(&slow, "contender", ttl);
    let mut watch = ExpiryWatch::default();
    let first = contender
        .try_acquire(&run, Epoch::ZERO, &mut watch)
        .await
        .unwrap();
    assert!(matches!(first, Attempt::Alive { .. }), "{first:?}");
    // The next look reads the same heartbeat version at once; its answer takes three TTLs
    // to come back, while the holder beats all along.
    let gate = faulty.pause_after_read(&holder.heartbeat_key());
    let looking = tokio::spawn(async move {
        let attempt = contender.try_acquire(&run, Epoch::ZERO, &mut watch).await;
        (attempt, contender)
    });
    gate.reached().await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beating = holder.spawn_heartbeat(Arc::clone(&stop));
    rekindle::clock::sleep(ttl * 3).await;
    gate.release();
    let (second, _) = looking.await.unwrap();
    let second = second.unwrap();
    assert!(
        matches!(second, Attempt::Alive { .. }),
        "a holder that kept beating was taken over after one slow response: {second:?}"
    );
    holder.check(&held).await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    beating.await.unwrap();
}
