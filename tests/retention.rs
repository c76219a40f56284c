//! Retention and its races: gc running while a successor probes for the newest generation or
//! loads a chain, and gc of finished runs that must never let a run, an epoch or a recovery ID
//! come back to life.

mod common;

use rekindle::core::epoch::Epoch;
use rekindle::core::lifecycle as rules;
use rekindle::core::record::{RecoveryResult, RecoveryState};
use rekindle::fleet::lifecycle;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use rekindle::clock::SystemClock;
use rekindle::core::fact::RunId;
use rekindle::core::layout;
use rekindle::core::sample;
use rekindle::store::faults::{FaultPlan, FaultyStore};
use rekindle::store::gc;
use rekindle::store::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use rekindle::store::{Backend, Store};

/// Two stores over one memory bucket: `paused` can hold one of its reads (a reader that
/// stalls mid-operation), `direct` is everyone else (the old writer, gc).
fn shared_memory() -> (Store, Arc<FaultyStore>, Store) {
    let bucket = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(bucket.clone(), FaultPlan::default(), 0);
    let paused = Store::from_parts(
        faulty.clone(),
        Backend::Memory,
        "memory://paused",
        "",
        common::fast_retry(),
        SystemClock::shared(),
    );
    let direct = Store::from_parts(
        bucket,
        Backend::Memory,
        "memory://direct",
        "",
        common::fast_retry(),
        SystemClock::shared(),
    );
    (paused, faulty, direct)
}

/// gc far enough in the future that every generation is past any grace period.
async fn collect_later(store: &Store) -> gc::GcReport {
    let later = store.clock().wall_ms() + 10 * 3600 * 1000;
    gc::collect(
        store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        later,
    )
    .await
    .unwrap()
}

/// Asserts `run` loads as retired before it ended (by `runs rm`), never as a live run.
async fn assert_retired_before_it_ended(store: &Store, run: &RunId) {
    let loaded = generation::load(store, run, None).await;
    assert!(
        matches!(loaded, Err(GenerationError::Retired { outcome: None, .. })),
        "{run} does not load as retired: {loaded:?}"
    );
}

const POLICY: SnapshotPolicy = SnapshotPolicy {
    max_deltas: 5,
    min_deltas: 5,
};

// Proves a successor that read the hint before the old writer moved it and gc freed the slots
// in between still fences the old writer: it must not load the stale prefix and put its fence
// into a freed slot (finding 1: gc raced the latest-generation probe and the fence was lost).
#[tokio::test]
async fn gc_between_hint_read_and_probe_loses_no_fence() {
    let (paused, faulty, direct) = shared_memory();
    let facts = sample::run("raced", 40, 21);
    let run = RunId::new("raced");
    let mut old = RunWriter::create(&direct, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    let gate = faulty.pause_after_read("/head");
    let successor = {
        let (paused, run) = (paused.clone(), run.clone());
        tokio::spawn(async move { RunWriter::resume(&paused, &run, Epoch(2), POLICY).await })
    };
    gate.reached().await;
    // The successor holds hint 1. The old writer commits up to a snapshot at generation 6
    // (which moves the hint), then gc frees generations 2..=5.
    for fact in &facts[2..7] {
        old.commit(vec![fact.clone()]).await.unwrap();
    }
    assert_eq!((old.generation(), old.base()), (6, 6));
    let report = collect_later(&direct).await;
    assert_eq!(report.generations_deleted, 4, "{report:?}");
    gate.release();
    let successor = successor.await.unwrap().unwrap();
    assert_eq!(
        successor.state().facts(),
        &facts[..7],
        "the successor must start from every committed fact"
    );
    let zombie = old.commit(vec![facts[7].clone()]).await;
    assert!(
        matches!(zombie, Err(GenerationError::Fenced { .. })),
        "the old writer committed after the takeover: {zombie:?}"
    );
}

// Proves a load that found its newest generation, then had the deltas under it collected by a
// gc that followed a newer snapshot, reloads from the new hint instead of failing with
// "generation missing" (finding 13: load failed mid-read under a concurrent gc).
#[tokio::test]
async fn gc_during_load_reloads_from_the_new_snapshot() {
    let (paused, faulty, direct) = shared_memory();
    let facts = sample::run("loading", 40, 22);
    let run = RunId::new("loading");
    let mut writer = RunWriter::create(&direct, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    for fact in &facts[2..6] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    assert_eq!((writer.generation(), writer.base()), (5, 1));
    let gate = faulty.pause_after_read(&layout::generation("", 5));
    let loader = {
        let (paused, run) = (paused.clone(), run.clone());
        tokio::spawn(async move { generation::load(&paused, &run, None).await })
    };
    gate.reached().await;
    for fact in &facts[6..8] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    assert_eq!(writer.base(), 6);
    let report = collect_later(&direct).await;
    assert_eq!(report.generations_deleted, 4, "{report:?}");
    gate.release();
    let loaded = loader.await.unwrap().unwrap();
    assert!(loaded.generation >= 6, "{}", loaded.generation);
    assert_eq!(loaded.state.facts(), &facts[..loaded.state.facts().len()]);
    assert!(loaded.state.facts().len() >= 7);
}

// Proves gc of a finished, recovered run cannot bring anything back: admitting the same
// recovery ID again returns the old finished record (nothing executes again), another ID is
// refused, the retired run does not load as a live one, and its stale writers stay fenced
// (finding 2: retention resurrected finished runs).
#[tokio::test]
async fn gc_of_a_finished_recovered_run_resurrects_nothing() {
    use rekindle::core::fact::{Outcome, RecoveryId};
    use rekindle::store::recovery::{self, RecoveryError};

    let store = common::memory();
    let source = RunId::new("src");
    let recovery_id = RecoveryId::new("rec");
    let recovery_run = RunId::new(recovery_id.as_str());
    let source_facts = sample::run("src", 30, 23);
    // The host ran the source at epoch 1 and died; the coordinator fenced it at epoch 2.
    let mut host = RunWriter::create(&store, source_facts[..6].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    RunWriter::resume(&store, &source, Epoch(2), POLICY)
        .await
        .unwrap();
    let admitted = recovery::admit(&store, &source, &recovery_id, false)
        .await
        .unwrap();
    assert!(admitted.created);
    // A first worker starts the recovery run at epoch 3 and is taken over at epoch 4, which
    // finishes it.
    let mut first_worker = RunWriter::create_as(
        &store,
        recovery_run.clone(),
        source_facts[..6].to_vec(),
        Epoch(3),
        POLICY,
    )
    .await
    .unwrap();
    let mut worker = RunWriter::resume(&store, &recovery_run, Epoch(4), POLICY)
        .await
        .unwrap();
    for fact in &source_facts[6..] {
        worker.commit(vec![fact.clone()]).await.unwrap();
    }
    let outcome = worker.state().terminal().unwrap().outcome;
    let w = || "w-1".to_string();
    for event in [
        rules::Event::Assign { worker: w() },
        rules::Event::Start { worker: w() },
        rules::Event::Finish {
            worker: w(),
            attempt: 1,
            result: RecoveryResult {
                outcome,
                message: "done".into(),
                final_generation: worker.generation(),
            },
        },
    ] {
        lifecycle::transition(&store, &recovery_id, None, event)
            .await
            .unwrap();
    }

    // A dry run first: it counts what the real pass does, and changes nothing.
    let keys = |store: &Store| {
        let store = store.clone();
        async move {
            let mut keys: Vec<(String, Option<String>)> = store
                .list_all("")
                .await
                .unwrap()
                .into_iter()
                .map(|listed| (listed.key, listed.etag.map(|etag| etag.0)))
                .collect();
            keys.sort();
            keys
        }
    };
    let before = keys(&store).await;
    let later = store.clock().wall_ms() + 10 * 3600 * 1000;
    let dry = gc::dry_run(
        &store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        later,
    )
    .await
    .unwrap();
    assert_eq!(keys(&store).await, before, "a dry run changed the store");
    let report = collect_later(&store).await;
    assert_eq!(report.runs_retired, 1, "{report:?}");
    assert_eq!(dry.runs_retired, report.runs_retired, "{dry:?} {report:?}");
    assert_eq!(
        dry.generations_deleted, report.generations_deleted,
        "{dry:?} {report:?}"
    );
    assert_ne!(keys(&store).await, before);

    let again = recovery::admit(&store, &source, &recovery_id, false)
        .await
        .unwrap();
    assert!(
        !again.created,
        "the same recovery ID was admitted a second time"
    );
    assert_eq!(again.record.state, RecoveryState::Finished);
    assert!(matches!(
        recovery::admit(&store, &source, &RecoveryId::new("other"), false).await,
        Err(RecoveryError::AlreadyRecovered { .. })
    ));
    assert!(
        matches!(
            recovery::admit(&store, &recovery_run, &RecoveryId::new("rec-of-rec"), false).await,
            Err(RecoveryError::NothingToRecover { .. })
        ),
        "a retired finished run was admitted for recovery"
    );
    let final_generation = worker.generation();
    match generation::load(&store, &recovery_run, None).await {
        Err(GenerationError::Retired {
            run,
            outcome: Some(retired_outcome),
            final_generation: retired_at,
        }) => {
            assert_eq!(run, recovery_run);
            assert_eq!(retired_outcome, outcome);
            assert_eq!(retired_at, final_generation);
        }
        other => panic!("a retired run must not load: {other:?}"),
    }
    assert!(matches!(
        RunWriter::resume(&store, &recovery_run, Epoch(5), POLICY).await,
        Err(GenerationError::Retired { .. })
    ));
    assert!(matches!(
        RunWriter::create_as(
            &store,
            recovery_run.clone(),
            source_facts[..2].to_vec(),
            Epoch(5),
            POLICY
        )
        .await,
        Err(GenerationError::Retired { .. })
    ));
    assert!(matches!(
        first_worker.commit(vec![source_facts[6].clone()]).await,
        Err(GenerationError::Fenced { .. })
    ));
    assert!(matches!(
        host.commit(vec![source_facts[6].clone()]).await,
        Err(GenerationError::Fenced { .. })
    ));
    // What stays forever: the tombstone, the lease-free run's hint, the claim, the record.
    for key in [
        layout::tombstone(recovery_run.as_str()),
        layout::recovered_by(source.as_str()),
        layout::recovery(recovery_id.as_str()),
    ] {
        assert!(
            store.head(&key).await.unwrap().is_some(),
            "{key} was deleted"
        );
    }
    let again = collect_later(&store).await;
    assert_eq!(
        (again.runs_retired, again.generations_deleted),
        (0, 0),
        "{again:?}"
    );
    let _ = Outcome::Completed;
}

// Proves a retirement interrupted after its tombstone (a gc killed before deleting anything)
// is finished by the next gc, and that the run stops loading as live from then on.
#[tokio::test]
async fn gc_finishes_a_retirement_a_crash_interrupted() {
    use rekindle::store::tombstone::{self, RetiredBy, Tombstone};

    let store = common::memory();
    let facts = sample::run("crashed-gc", 30, 24);
    let run = RunId::new("crashed-gc");
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    for fact in &facts[2..] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    // Step 1 of a retirement only, as if gc died right after it.
    let written = tombstone::write(
        &store,
        &Tombstone::new(
            &run,
            writer.state().terminal().map(|terminal| terminal.outcome),
            Epoch(1),
            writer.generation(),
            vec![(Epoch(1), 1)],
            RetiredBy::Retention,
            store.clock().wall_ms(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(written.final_generation, writer.generation());
    let now = store.clock().wall_ms();
    let report = gc::collect(
        &store,
        &gc::GcPolicy::retention(Duration::from_secs(3600)),
        now,
    )
    .await
    .unwrap();
    assert!(report.generations_deleted > 0, "{report:?}");
    assert!(matches!(
        generation::load(&store, &run, None).await,
        Err(GenerationError::Retired { .. })
    ));
    let left: Vec<String> = store
        .list(&format!("{}/", layout::run_base("crashed-gc")), None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|listed| listed.key)
        .collect();
    let base = layout::run_base("crashed-gc");
    assert_eq!(
        left,
        [
            layout::generation(&base, 1),
            layout::head(&base),
            layout::tombstone("crashed-gc"),
        ]
    );
}

// Proves a run retired before it ended (as `rekindle runs rm --force` does) is refused
// everywhere with no outcome, an admission for it is refused rather than started from what is
// left, and its last writer is fenced rather than left a free slot to commit into.
#[tokio::test]
async fn a_run_retired_before_it_ended_stays_retired() {
    use rekindle::core::fact::RecoveryId;
    use rekindle::store::recovery::{self, RecoveryError};
    use rekindle::store::tombstone::RetiredBy;

    let store = common::memory();
    let facts = sample::run("removed", 30, 25);
    let run = RunId::new("removed");
    let mut zombie = RunWriter::create(&store, facts[..8].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    gc::retire(&store, &run, RetiredBy::Removal, None)
        .await
        .unwrap();
    assert_retired_before_it_ended(&store, &run).await;
    assert!(matches!(
        recovery::admit(&store, &run, &RecoveryId::new("late"), false).await,
        Err(RecoveryError::Source {
            error: GenerationError::Retired { .. },
            ..
        })
    ));
    assert!(matches!(
        RunWriter::resume(&store, &run, Epoch(2), POLICY).await,
        Err(GenerationError::Retired { .. })
    ));
    // The writer that was never fenced (its holder only seemed gone) is fenced by the
    // retirement, and the run cannot be created again.
    assert!(matches!(
        zombie.commit(vec![facts[8].clone()]).await,
        Err(GenerationError::Fenced { .. })
    ));
    assert!(matches!(
        RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), POLICY).await,
        Err(GenerationError::Retired { .. })
    ));
}

// Proves the coordinator's fencing step accepts a retired run (nothing left to fence) instead
// of failing on it every scan, and leaves it retired.
#[tokio::test]
async fn fencing_a_retired_run_is_a_no_op() {
    use rekindle::store::lease::Holder;
    use rekindle::store::tombstone::RetiredBy;

    let store = common::memory();
    let facts = sample::run("fenced-retired", 20, 26);
    let run = RunId::new("fenced-retired");
    RunWriter::create(&store, facts.clone(), Epoch(1), POLICY)
        .await
        .unwrap();
    gc::retire(&store, &run, RetiredBy::Removal, None)
        .await
        .unwrap();
    let holder = Arc::new(Holder::new(&store, "coordinator", Duration::from_secs(60)));
    rekindle::fleet::admission::fence_source(&store, &holder, &run)
        .await
        .unwrap();
    assert!(matches!(
        generation::load(&store, &run, None).await,
        Err(GenerationError::Retired { .. })
    ));
}

// Proves a successor that paused between loading the run and writing its fence, while the old
// writer moved on to a newer snapshot and gc freed the slot the fence was aimed at, does not
// settle for a fence in the freed slot: it fences again above the old writer's head.
#[tokio::test]
async fn gc_between_load_and_fence_loses_no_fence() {
    let (paused, faulty, direct) = shared_memory();
    let facts = sample::run("late-fence", 40, 27);
    let run = RunId::new("late-fence");
    let mut old = RunWriter::create(&direct, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    let gate = faulty.pause_after_read(&layout::generation("", 1));
    let successor = {
        let (paused, run) = (paused.clone(), run.clone());
        tokio::spawn(async move { RunWriter::resume(&paused, &run, Epoch(2), POLICY).await })
    };
    gate.reached().await;
    for fact in &facts[2..7] {
        old.commit(vec![fact.clone()]).await.unwrap();
    }
    let report = collect_later(&direct).await;
    assert_eq!(report.generations_deleted, 4, "{report:?}");
    gate.release();
    let successor = successor.await.unwrap().unwrap();
    assert_eq!(successor.state().facts(), &facts[..7]);
    let zombie = old.commit(vec![facts[7].clone()]).await;
    assert!(
        matches!(zombie, Err(GenerationError::Fenced { .. })),
        "the old writer committed after the takeover: {zombie:?}"
    );
}

// Proves an admission whose load of the source a commit overtook still pins that commit: the
// admission loads the source beside its first checks and reads the lease beside its claim, so
// the old writer may commit (and be acknowledged) after the load and before the fence; the
// fence's create-if-absent then finds the slot taken, and the fence reloads and lands above
// it. The old writer is fenced after.
#[tokio::test]
async fn an_admission_pins_a_commit_that_overtook_its_load() {
    use rekindle::core::fact::RecoveryId;
    use rekindle::fleet::admission::{self, Takeover};
    use rekindle::store::lease::Holder;

    let (paused, faulty, direct) = shared_memory();
    let facts = sample::run("overtaken", 20, 29);
    let run = RunId::new("overtaken");
    let host = Holder::new(&direct, "host", Duration::from_secs(30));
    host.beat().await.unwrap();
    let held = host.acquire(&run).await.unwrap();
    let mut old = RunWriter::create(&direct, facts[..2].to_vec(), held.epoch, POLICY)
        .await
        .unwrap();
    for fact in &facts[2..5] {
        old.commit(vec![fact.clone()]).await.unwrap();
    }
    // Held once the admission has loaded the source and read its lease, before the fence.
    let gate = faulty.pause_after_read(&format!("/{}/lease", run.as_str()));
    let operator = Holder::new(&paused, "operator", Duration::from_secs(30));
    let id = RecoveryId::new("takes-over-late");
    let admission = {
        let (paused, operator, run, id) =
            (paused.clone(), operator.clone(), run.clone(), id.clone());
        tokio::spawn(async move {
            admission::admit(&paused, &operator, &run, &id, false, Takeover::Now).await
        })
    };
    gate.reached().await;
    old.commit(vec![facts[5].clone()]).await.unwrap();
    let acknowledged = old.generation();
    gate.release();
    let admitted = admission.await.unwrap().unwrap();
    assert!(
        admitted.record.source_generation > acknowledged,
        "pinned at {} below the acknowledged commit at {acknowledged}",
        admitted.record.source_generation
    );
    let pinned = generation::load(&direct, &run, Some(admitted.record.source_generation))
        .await
        .unwrap();
    assert_eq!(pinned.state.facts(), &facts[..6]);
    let zombie = old.commit(vec![facts[6].clone()]).await;
    assert!(
        matches!(zombie, Err(GenerationError::Fenced { .. })),
        "the old writer committed after the admission: {zombie:?}"
    );
}

// Reviewer's finding: an admission that found no such run gave back this ID's claim, but that
// verdict can change: the run may start a moment later and be claimed under the same ID by
// another process (two host replicas admitting the same recovery ID). A late give-back then
// deleted that claim, and the source could be recovered under a second ID. Only a final
// verdict (ended, never started) gives back a claim this admission did not create.
#[tokio::test]
async fn an_admission_that_found_no_run_keeps_a_claim_made_since() {
    use rekindle::core::fact::RecoveryId;
    use rekindle::fleet::admission::{self, Takeover};
    use rekindle::store::lease::Holder;
    use rekindle::store::recovery::{self, RecoveryError};

    let (paused, faulty, direct) = shared_memory();
    let run = RunId::new("starts-late");
    let id = RecoveryId::new("same-id");
    // Held right after the admission read the run's (missing) lease: it found no such run.
    let gate = faulty.pause_after_read(&format!("/{}/lease", run.as_str()));
    let operator = Holder::new(&paused, "operator", Duration::from_secs(30));
    let first = {
        let (paused, operator, run, id) =
            (paused.clone(), operator.clone(), run.clone(), id.clone());
        tokio::spawn(async move {
            admission::admit(&paused, &operator, &run, &id, false, Takeover::Now).await
        })
    };
    gate.reached().await;
    // Meanwhile the run starts, and another admission under the same ID claims it.
    let host = Holder::new(&direct, "host", Duration::from_secs(30));
    host.beat().await.unwrap();
    let held = host.acquire(&run).await.unwrap();
    let facts = sample::run("starts-late", 10, 30);
    RunWriter::create(&direct, facts[..3].to_vec(), held.epoch, POLICY)
        .await
        .unwrap();
    assert!(recovery::claim(&direct, &run, &id).await.unwrap());
    gate.release();
    let refused = first.await.unwrap().unwrap_err();
    assert!(
        matches!(
            refused,
            rekindle::Error::Recovery(RecoveryError::NoSuchRun { .. })
        ),
        "{refused}"
    );
    assert_eq!(
        recovery::claimed_by(&direct, &run).await.unwrap(),
        Some(id),
        "the claim made since was given back"
    );
}

// Proves a run whose chain no longer loads (a corrupt delta) can still be retired, keeping
// what it cannot judge, and is refused as retired afterwards.
#[tokio::test]
async fn a_damaged_run_can_be_retired() {
    use bytes::Bytes;
    use rekindle::store::tombstone::RetiredBy;

    let store = common::memory();
    let facts = sample::run("damaged", 30, 28);
    let run = RunId::new("damaged");
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    for fact in &facts[2..5] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let base = layout::run_base("damaged");
    store
        .put(
            &layout::generation(&base, 3),
            Bytes::from_static(b"{not json"),
        )
        .await
        .unwrap();
    assert!(generation::load(&store, &run, None).await.is_err());
    gc::retire(&store, &run, RetiredBy::Removal, None)
        .await
        .unwrap();
    assert_retired_before_it_ended(&store, &run).await;
    assert!(
        store
            .head(&layout::generation(&base, 3))
            .await
            .unwrap()
            .is_some(),
        "a generation that could not be judged was deleted"
    );
}

// Reviewer's finding: `runs rm --force` read the recovery claim and record even though a
// forced removal ignores them, so a damaged claim blocked exactly the removal `--force` is
// for. Unforced, the damage is still reported.
#[tokio::test]
async fn a_forced_removal_is_not_blocked_by_a_damaged_recovery_claim() {
    use bytes::Bytes;
    use rekindle::fleet::removal;

    let store = common::memory();
    let run = RunId::new("claimed");
    let holder = rekindle::store::lease::Holder::new(&store, "host", Duration::from_secs(5));
    let held = holder.acquire_new(&run).await.unwrap();
    let facts = sample::run("claimed", 10, 3);
    RunWriter::create(&store, facts[..2].to_vec(), held.epoch, POLICY)
        .await
        .unwrap();
    holder.release(&held).await.unwrap();
    store
        .put(
            &layout::recovered_by("claimed"),
            Bytes::from_static(b"{not json"),
        )
        .await
        .unwrap();
    let unforced = removal::remove(&store, &run, false).await;
    assert!(
        unforced.is_err(),
        "a damaged claim was ignored without --force"
    );
    removal::remove(&store, &run, true).await.unwrap();
    assert_retired_before_it_ended(&store, &run).await;
}

// New-user finding: `runs rm --force` retired a run whose host was alive and heartbeating
// (the help said "only when that holder is gone", but nothing checked). A forced removal now
// watches the holder's heartbeat for its TTL and refuses if it beats; a silent holder's run
// is retired.
#[tokio::test]
async fn a_forced_removal_refuses_a_holder_that_beats() {
    use rekindle::fleet::removal;
    use rekindle::store::lease::Holder;

    let store = common::memory();
    let facts = sample::run("alive", 10, 4);
    let alive = RunId::new("alive");
    let host = Holder::new(&store, "host", Duration::from_millis(300));
    host.beat().await.unwrap();
    let held = host.acquire_new(&alive).await.unwrap();
    RunWriter::create(&store, facts[..2].to_vec(), held.epoch, POLICY)
        .await
        .unwrap();
    let beating = {
        let host = Arc::clone(&host);
        tokio::spawn(async move {
            loop {
                host.beat().await.unwrap();
                rekindle::clock::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let error = removal::remove(&store, &alive, true).await.unwrap_err();
    assert_eq!(error.kind(), rekindle::ErrorKind::Refused, "{error}");
    assert!(error.to_string().contains("is alive"), "{error}");
    assert!(generation::load(&store, &alive, None).await.is_ok());
    // The host dies: its heartbeat stops changing, and --force retires the run.
    beating.abort();
    removal::remove(&store, &alive, true).await.unwrap();
    assert!(matches!(
        generation::load(&store, &alive, None).await,
        Err(GenerationError::Retired { .. })
    ));
}

// What dead processes leave behind goes with gc: a heartbeat last written longer ago than its
// TTL plus the grace period (on gc's clock) is deleted unless an index entry still names it,
// and a dead worker's registration and inbox go with its heartbeat. Live processes, recent
// silences and heartbeats that interrupted runs still name are kept; a dry run counts the
// same and changes nothing.
#[tokio::test]
async fn gc_removes_what_long_dead_processes_left() {
    use rekindle::core::assignment::Registration;
    use rekindle::core::record::{IndexEntry, Phase};
    use rekindle::store::lease::Holder;
    let clock = rekindle::clock::ManualClock::new(1_700_000_000_000);
    let store = Store::memory(clock.clone());
    let ttl = Duration::from_secs(30);
    // Killed long ago: a host, a worker (registered, with an inbox), and a host whose run was
    // never recovered (its index entry still names it).
    let dead_host = Holder::new(&store, "host-dead", ttl);
    dead_host.beat().await.unwrap();
    let dead_worker = Holder::with_role(&store, "worker-dead", ttl, "worker");
    dead_worker.beat().await.unwrap();
    let registration = Registration::new("worker-dead", dead_worker.heartbeat_key(), 1, "f".into());
    store
        .put(
            &layout::worker("worker-dead"),
            layout::encode_object(&registration),
        )
        .await
        .unwrap();
    store
        .put(
            &layout::inbox("worker-dead"),
            bytes::Bytes::from_static(b"{}"),
        )
        .await
        .unwrap();
    let named = Holder::new(&store, "host-named", ttl);
    named.beat().await.unwrap();
    let mut entry = IndexEntry::new(RunId::new("r-named"), None, Phase::Running, "f".into(), 0);
    entry.holder = Some(named.heartbeat_key());
    rekindle::store::index::put(&store, &entry).await.unwrap();
    // Two hours later: one process beats now, another fell silent a minute ago.
    clock.advance(Duration::from_secs(2 * 3600));
    let alive = Holder::with_role(&store, "worker-alive", ttl, "worker");
    alive.beat().await.unwrap();
    let alive_registration =
        Registration::new("worker-alive", alive.heartbeat_key(), 1, "f".into());
    store
        .put(
            &layout::worker("worker-alive"),
            layout::encode_object(&alive_registration),
        )
        .await
        .unwrap();
    // Left behind by a crash: a registration whose heartbeat was removed already (with its
    // inbox), and the inbox of a worker that stopped (written by a stale leader after it).
    let orphan = Registration::new(
        "worker-orphan",
        layout::heartbeat("worker-orphan"),
        1,
        "f".into(),
    );
    store
        .put(
            &layout::worker("worker-orphan"),
            layout::encode_object(&orphan),
        )
        .await
        .unwrap();
    for worker in ["worker-orphan", "worker-stopped"] {
        store
            .put(&layout::inbox(worker), bytes::Bytes::from_static(b"{}"))
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(60));
    let policy = gc::GcPolicy::retention(Duration::from_secs(3600));
    let now = store.clock().wall_ms();
    let exists = |key: String| {
        let store = store.clone();
        async move { store.head(&key).await.unwrap().is_some() }
    };
    let dry = gc::dry_run(&store, &policy, now).await.unwrap();
    assert_eq!(
        (dry.heartbeats_deleted, dry.workers_deleted),
        (2, 3),
        "{dry:?}"
    );
    assert!(
        exists(dead_host.heartbeat_key()).await,
        "a dry run deleted something"
    );
    let report = gc::collect(&store, &policy, now).await.unwrap();
    assert_eq!(
        (report.heartbeats_deleted, report.workers_deleted),
        (2, 3),
        "{report:?}"
    );
    assert!(!exists(dead_host.heartbeat_key()).await);
    assert!(!exists(dead_worker.heartbeat_key()).await);
    assert!(!exists(layout::worker("worker-dead")).await);
    assert!(!exists(layout::inbox("worker-dead")).await);
    assert!(!exists(layout::worker("worker-orphan")).await);
    assert!(!exists(layout::inbox("worker-orphan")).await);
    assert!(!exists(layout::inbox("worker-stopped")).await);
    // Kept: named by an interrupted run's entry, alive, silent for less than TTL + grace.
    assert!(exists(named.heartbeat_key()).await);
    assert!(exists(alive.heartbeat_key()).await);
    assert!(exists(layout::worker("worker-alive")).await);
    // A second pass finds nothing more.
    let again = gc::collect(&store, &policy, now).await.unwrap();
    assert_eq!((again.heartbeats_deleted, again.workers_deleted), (0, 0));
}

/// The coordinator removes a dead host's heartbeat once it has watched it unchanged for three
/// TTLs and no index entry names it; it keeps a silent heartbeat an interrupted run's entry
/// names, live processes' objects, and a dead worker's heartbeat, registration and inbox
/// (gc's, after its grace period: a registration removed just as its worker came back would
/// be missed for an idle TTL).
#[tokio::test]
async fn the_coordinator_removes_what_dead_processes_left() {
    the_coordinator_removes_what_dead_processes_left_in(Store::memory(SystemClock::shared())).await;
    let dir = tempfile::tempdir().unwrap();
    the_coordinator_removes_what_dead_processes_left_in(common::local(dir.path()).await).await;
}

async fn the_coordinator_removes_what_dead_processes_left_in(store: Store) {
    use rekindle::core::assignment::Registration;
    use rekindle::core::record::{IndexEntry, Phase};
    use rekindle::fleet::coordinator::{self, CoordinatorOptions, DEAD_AFTER_TTLS};
    use rekindle::store::lease::Holder;
    use std::sync::atomic::{AtomicBool, Ordering};
    let ttl = Duration::from_millis(300);
    let register = |holder: &Arc<Holder>, worker: &str| {
        let (store, holder, worker) = (store.clone(), Arc::clone(holder), worker.to_owned());
        async move {
            let registration = Registration::new(&worker, holder.heartbeat_key(), 1, "f".into());
            store
                .put(
                    &layout::worker(&worker),
                    layout::encode_object(&registration),
                )
                .await
                .unwrap();
            store
                .put(&layout::inbox(&worker), bytes::Bytes::from_static(b"{}"))
                .await
                .unwrap();
        }
    };
    // Something under heartbeats/ that does not read (another format, a foreign object),
    // sorted first: it is skipped, and does not stop the others' removal.
    store
        .put(
            "heartbeats/00/foreign",
            bytes::Bytes::from_static(b"garbage"),
        )
        .await
        .unwrap();
    // Dead: a host and a registered worker, each with one heartbeat that never changes.
    let dead_host = Holder::new(&store, "host-dead", ttl);
    dead_host.beat().await.unwrap();
    let dead_worker = Holder::with_role(&store, "worker-dead", ttl, "worker");
    dead_worker.beat().await.unwrap();
    register(&dead_worker, "worker-dead").await;
    // Silent too, but an interrupted run's entry names it: its chain is corrupt, so its
    // admission keeps failing and the entry keeps naming the host.
    let named = Holder::new(&store, "host-named", ttl);
    named.beat().await.unwrap();
    store
        .put(
            &layout::generation(&layout::run_base("r-named"), 1),
            bytes::Bytes::from_static(b"not a generation"),
        )
        .await
        .unwrap();
    let mut entry = IndexEntry::new(RunId::new("r-named"), None, Phase::Running, "f".into(), 0);
    entry.holder = Some(named.heartbeat_key());
    rekindle::store::index::put(&store, &entry).await.unwrap();
    // Alive: a registered worker that keeps beating.
    let stop = Arc::new(AtomicBool::new(false));
    let alive = Holder::with_role(&store, "worker-alive", ttl, "worker");
    let alive_stop = Arc::new(AtomicBool::new(false));
    let beating = alive.spawn_heartbeat(Arc::clone(&alive_stop));
    register(&alive, "worker-alive").await;

    let started = rekindle::clock::Stopwatch::start();
    let mut options = CoordinatorOptions::new("c", ttl);
    options.scan_interval = Duration::from_millis(50);
    options.idle_scan_interval = Duration::from_millis(50);
    options.watch_interval = Duration::from_millis(50);
    let coordinator = tokio::spawn(coordinator::run(store.clone(), options, Arc::clone(&stop)));
    let exists = |key: String| {
        let store = store.clone();
        async move { store.head(&key).await.unwrap().is_some() }
    };
    let deadline = rekindle::clock::Stopwatch::start();
    while exists(dead_host.heartbeat_key()).await {
        assert!(
            deadline.elapsed() < Duration::from_secs(20),
            "dead heartbeats were not removed"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    // Not before the coordinator watched them unchanged for three TTLs.
    assert!(started.elapsed() >= ttl * DEAD_AFTER_TTLS);
    assert!(exists(dead_worker.heartbeat_key()).await);
    assert!(exists(layout::worker("worker-dead")).await);
    assert!(exists(layout::inbox("worker-dead")).await);
    // Another scan or two: what is named or alive stays.
    rekindle::clock::sleep(ttl * 2).await;
    assert!(
        exists(named.heartbeat_key()).await,
        "a named heartbeat was removed"
    );
    assert!(exists(alive.heartbeat_key()).await);
    assert!(exists(layout::worker("worker-alive")).await);
    assert!(exists(layout::inbox("worker-alive")).await);
    // A process that was only paused writes its heartbeat again when it resumes.
    dead_host.beat().await.unwrap();
    assert!(exists(dead_host.heartbeat_key()).await);
    // A worker that leaves (its registration and heartbeat removed, as a graceful stop
    // does, here without its inbox): the coordinator removes the inbox it kept for it.
    alive_stop.store(true, Ordering::SeqCst);
    beating.await.unwrap();
    store.delete(&layout::worker("worker-alive")).await.unwrap();
    alive.retire().await.unwrap();
    let deadline = rekindle::clock::Stopwatch::start();
    while exists(layout::inbox("worker-alive")).await {
        assert!(
            deadline.elapsed() < Duration::from_secs(20),
            "a departed worker's inbox was kept"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap().unwrap();
}

/// Regression (issue 30's fourth scenario): removing what a dead process left is a listing
/// and then deletes; a process that came back under its ID inside that window lost its fresh
/// heartbeat, and a coordinator (one that had not removed it itself: a new leader) judged its
/// runs interrupted at once and fenced it, as did `recover --all`. An absent heartbeat is now
/// judged like any version, for a whole TTL, and the process writes it again within a third.
#[tokio::test]
async fn a_process_whose_heartbeat_is_removed_as_it_returns_is_not_fenced() {
    use rekindle::core::record::{IndexEntry, Phase};
    use rekindle::fleet::coordinator::{self, CoordinatorOptions};
    use rekindle::fleet::liveness::{Watch, Watched};
    use rekindle::store::lease::Holder;
    use std::sync::atomic::{AtomicBool, Ordering};
    let store = Store::memory(SystemClock::shared());
    let ttl = Duration::from_millis(300);
    let host = Holder::new(&store, "host-back", ttl);
    host.beat().await.unwrap();
    let run = RunId::new("r-back");
    let held = host.acquire_new(&run).await.unwrap();
    let mut entry = IndexEntry::new(run.clone(), None, Phase::Running, "f".into(), 0);
    entry.holder = Some(host.heartbeat_key());
    entry.holder_ttl_ms = Some(300);
    rekindle::store::index::put(&store, &entry).await.unwrap();
    // The removal of its dead predecessor's heartbeat lands just after the host came back.
    store.delete(&host.heartbeat_key()).await.unwrap();
    let host_stop = Arc::new(AtomicBool::new(false));
    let watch = Watch::begin(&store, [entry.clone()]).await.unwrap();
    let beating = {
        let host = Arc::clone(&host);
        let stop = Arc::clone(&host_stop);
        tokio::spawn(async move {
            // Its next beat, a third of its TTL later.
            rekindle::clock::sleep(Duration::from_millis(100)).await;
            host.spawn_heartbeat(stop).await.unwrap();
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut options = CoordinatorOptions::new("c", ttl);
    options.scan_interval = Duration::from_millis(30);
    options.idle_scan_interval = Duration::from_millis(30);
    options.watch_interval = Duration::from_millis(30);
    let coordinator = tokio::spawn(coordinator::run(store.clone(), options, Arc::clone(&stop)));
    let judged = watch.finish(&store).await.unwrap();
    assert_eq!(
        judged[0].1,
        Watched::Alive,
        "recover --all judged it interrupted"
    );
    rekindle::clock::sleep(ttl * 5).await;
    host.check(&held)
        .await
        .expect("the host that came back was fenced");
    let now = rekindle::store::index::read(&store, &run).await.unwrap();
    assert_eq!(now.map(|entry| entry.phase), Some(Phase::Running));
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap().unwrap();
    host_stop.store(true, Ordering::SeqCst);
    beating.await.unwrap();
}

// Proves a run that never snapshots past its first generation, which therefore never gets a
// hint (a hint at generation 1 is not written: a reader probes from 1 anyway), still loads,
// fences and is retired by gc once it ended long ago: gc takes generation 1 as its snapshot.
#[tokio::test]
async fn a_run_without_a_hint_loads_fences_and_is_retired() {
    let store = common::memory();
    let run = RunId::new("short");
    let facts = sample::run("short", 6, 5);
    let (first, rest) = facts.split_at(2);
    let mut writer = RunWriter::create(&store, first.to_vec(), Epoch(1), SnapshotPolicy::default())
        .await
        .unwrap();
    for fact in rest {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    assert!(writer.state().terminal().is_some());
    let head = layout::head(&layout::run_base(run.as_str()));
    assert!(
        store.read(&head).await.unwrap().is_none(),
        "no snapshot past generation 1, so no hint was written"
    );
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.generation, writer.generation());
    assert_eq!(loaded.base, 1);
    assert_eq!(loaded.state.facts().len(), facts.len());

    let report = collect_later(&store).await;
    assert_eq!(report.runs_retired, 1, "{report:?}");
    assert!(matches!(
        generation::load(&store, &run, None).await,
        Err(GenerationError::Retired { .. })
    ));
}

// Proves a pinned load given a wrong snapshot number (the record's `source_base` is only a
// hint) still loads exactly the pinned generation, checked as any load is.
#[tokio::test]
async fn a_pinned_load_with_a_wrong_base_is_still_exact() {
    let store = common::memory();
    let run = RunId::new("pinned");
    let facts = sample::run("pinned", 40, 9);
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    for fact in &facts[2..30] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let (pinned, base) = (writer.generation(), writer.base());
    assert!(base > 1, "the run snapshotted past its first generation");
    let exact = generation::load(&store, &run, Some(pinned)).await.unwrap();
    for hint in [
        Some(base),
        Some(1),
        Some(base + 1),
        Some(pinned),
        Some(pinned + 7),
        None,
    ] {
        let loaded = generation::load_pinned(&store, &run, pinned, hint)
            .await
            .unwrap();
        assert_eq!(loaded.generation, pinned, "hint {hint:?}");
        assert_eq!(loaded.digest, exact.digest, "hint {hint:?}");
        assert_eq!(loaded.state, exact.state, "hint {hint:?}");
    }
}

// Regression (retirement before generation 1): a host took its lease and was paused before
// its first commit; `runs rm --force` found no generation, so it fenced nothing and the host's
// later commits were acknowledged into a retired run that gc then deleted. The retirement now
// takes generation 1 with an empty fence at the epoch it reserved.
#[tokio::test]
async fn retiring_a_run_before_its_first_generation_fences_its_first_slot() {
    use rekindle::store::lease::Holder;
    use rekindle::store::tombstone;

    let store = common::memory();
    let run = RunId::new("paused-before-gen-1");
    let host = Holder::new(&store, "host", Duration::from_millis(200));
    host.beat().await.unwrap();
    let held = host.acquire_new(&run).await.unwrap();
    // The host is paused now: it never beats again, so the forced removal judges it gone.
    rekindle::fleet::removal::remove(&store, &run, true)
        .await
        .unwrap();
    let facts = sample::run(run.as_str(), 20, 41);
    let woke = RunWriter::create(
        &store.writing_as("host"),
        facts[..3].to_vec(),
        held.epoch,
        POLICY,
    )
    .await;
    assert!(
        matches!(
            woke,
            Err(GenerationError::Retired { .. } | GenerationError::Fenced { .. })
        ),
        "the paused host's first commit landed in a retired run: {woke:?}"
    );
    let retired = tombstone::read(&store, &run).await.unwrap().unwrap();
    assert!(retired.last_epoch > held.epoch, "{retired:?}");
    assert_eq!(retired.epoch_starts, vec![(retired.last_epoch, 1)]);
    // gc keeps the fence (an epoch's first slot): the host stays refused after it.
    collect_later(&store).await;
    assert!(
        RunWriter::create(&store, facts[..3].to_vec(), held.epoch, POLICY)
            .await
            .is_err()
    );
    assert_retired_before_it_ended(&store, &run).await;
}

// Regression (an epoch retirement never reserved): retirement read the lease and fenced at
// epoch + 1 without writing that epoch to the lease, so a holder taking the lease meanwhile
// (an answer to a parked run) got the same epoch, took the retirement's fence for its own
// holding and committed after it. Now the retirement reserves the epoch by compare-and-swap on
// the lease version it judged: a holder that took the lease first makes it decide again, and
// one that comes after is refused.
#[tokio::test]
async fn retirement_reserves_its_epoch_against_a_racing_holder() {
    use rekindle::store::gc::GcError;
    use rekindle::store::lease::{self, Holder, LeaseError};
    use rekindle::store::tombstone::RetiredBy;

    let store = common::memory();
    let run = RunId::new("parked-run");
    let facts = sample::run(run.as_str(), 20, 42);
    let host = Holder::new(&store, "host", Duration::from_secs(5));
    let held = host.acquire_new(&run).await.unwrap();
    RunWriter::create(
        &store.writing_as("host"),
        facts[..4].to_vec(),
        held.epoch,
        POLICY,
    )
    .await
    .unwrap();
    host.release(&held).await.unwrap();
    // The remover judges the released lease; an answerer takes it before the retirement acts.
    let judged = lease::read_lease(&store, &run).await.unwrap().unwrap();
    let answerer = Holder::new(&store, "answerer", Duration::from_secs(5));
    let answering = answerer.acquire(&run).await.unwrap();
    let refused = gc::retire(&store, &run, RetiredBy::Removal, Some(&judged.etag)).await;
    assert!(
        matches!(
            refused,
            Err(GcError::Lease(LeaseError::ChangedSinceJudged { .. }))
        ),
        "{refused:?}"
    );
    // Nothing was retired: the answer commits and is kept.
    let mut writer =
        RunWriter::resume(&store.writing_as("answerer"), &run, answering.epoch, POLICY)
            .await
            .unwrap();
    writer.commit(facts[4..5].to_vec()).await.unwrap();
    answerer.release(&answering).await.unwrap();
    // The other order: the retirement reserves first, and the answerer is refused.
    let judged = lease::read_lease(&store, &run).await.unwrap().unwrap();
    gc::retire(&store, &run, RetiredBy::Removal, Some(&judged.etag))
        .await
        .unwrap();
    let late = answerer.acquire(&run).await;
    assert!(
        matches!(late, Err(LeaseError::Retired { .. })),
        "a holder took a retired run's lease: {late:?}"
    );
    let tombstone = rekindle::store::tombstone::read(&store, &run)
        .await
        .unwrap()
        .unwrap();
    assert!(tombstone.last_epoch > answering.epoch, "{tombstone:?}");
}

// Proves the "same epoch, so this is my holding" shortcut of a resuming writer checks that the
// generation at its epoch is its own: a writer handed an epoch another writer already fenced
// at is refused, not let to commit beside it.
#[tokio::test]
async fn a_writer_takes_only_its_own_generation_for_its_holding() {
    let store = common::memory();
    let run = RunId::new("shared-epoch");
    let facts = sample::run(run.as_str(), 20, 43);
    RunWriter::create(&store, facts[..3].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    RunWriter::resume(&store.writing_as("first"), &run, Epoch(2), POLICY)
        .await
        .unwrap();
    let other = RunWriter::resume(&store.writing_as("second"), &run, Epoch(2), POLICY).await;
    assert!(
        matches!(other, Err(GenerationError::Fenced { .. })),
        "{other:?}"
    );
    // The holding's own writer (a restart of the same holding) goes on without a new fence.
    let mine = RunWriter::resume(&store.writing_as("first"), &run, Epoch(2), POLICY)
        .await
        .unwrap();
    assert_eq!(mine.generation(), 2);
}

// Regression (a late fence cost a recovery its pinned chain): two admissions of one recovery
// both passed the claim; the second fenced the source after the first pinned it, and when that
// fence came out a snapshot it moved the hint past the pin, so gc deleted the pinned deltas
// and the recovery could never seed. Fences are never snapshots now: the pin survives gc.
#[tokio::test]
async fn a_late_fence_after_a_pin_leaves_the_pinned_chain_to_gc() {
    use rekindle::core::fact::RecoveryId;
    use rekindle::fleet::admission::{self, Takeover};
    use rekindle::store::lease::Holder;

    let store = common::memory();
    let source = RunId::new("pinned-source");
    let facts = sample::run(source.as_str(), 200, 44);
    let host = Holder::new(&store, "host", Duration::from_secs(5));
    let held = host.acquire_new(&source).await.unwrap();
    // A large snapshot, then small deltas only, so the admissions' fences count on to the
    // default policy's limit: the first fence lands as the 63rd delta, the second would have
    // been the 64th, a snapshot.
    let wide = SnapshotPolicy {
        max_deltas: 1000,
        min_deltas: 1000,
    };
    let default = SnapshotPolicy::default();
    let mut writer = RunWriter::create(
        &store.writing_as("host"),
        facts[..100].to_vec(),
        held.epoch,
        wide,
    )
    .await
    .unwrap();
    for fact in &facts[100..100 + default.max_deltas as usize - 2] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let coordinator = Arc::new(Holder::new(&store, "coordinator", Duration::from_secs(5)));
    let recovery_id = RecoveryId::new("pinned-recovery");
    let admitted = admission::admit(
        &store,
        &coordinator,
        &source,
        &recovery_id,
        false,
        Takeover::Now,
    )
    .await
    .unwrap();
    let pin = admitted.record;
    // The second admission's fence, after the pin (a paused old leader waking up).
    let late = Arc::new(Holder::new(&store, "old-leader", Duration::from_secs(5)));
    admission::fence_source(&store, &late, &source)
        .await
        .unwrap();
    let hint = rekindle::store::generation::Chain::new(&store, layout::run_base(source.as_str()))
        .hint()
        .await
        .unwrap()
        .map(|(generation, _)| generation);
    assert!(
        hint.is_none_or(|hint| hint <= pin.source_base.unwrap_or(1)),
        "the late fence moved the hint past the pin: hint {hint:?}, pin base {:?}",
        pin.source_base
    );
    collect_later(&store).await;
    let seeded = generation::load_pinned(&store, &source, pin.source_generation, pin.source_base)
        .await
        .unwrap();
    assert_eq!(seeded.digest, pin.source_digest);
    assert_eq!(seeded.state.facts(), writer.state().facts());
}

// Hardening: an undecodable hint was read as "no hint", so after gc a load probed from 1 and
// could fold a stale prefix from the epochs' first slots. It is an error naming the hint now.
#[tokio::test]
async fn an_undecodable_hint_is_an_error_naming_it() {
    let store = common::memory();
    let run = RunId::new("bad-hint");
    let facts = sample::run(run.as_str(), 40, 45);
    let mut writer = RunWriter::create(&store, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    for fact in &facts[2..20] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    collect_later(&store).await;
    let head = layout::head(&layout::run_base(run.as_str()));
    store
        .put(&head, bytes::Bytes::from_static(b"{\"generation\": 1"))
        .await
        .unwrap();
    let error = generation::load(&store, &run, None).await.unwrap_err();
    assert!(
        error.to_string().contains(&head) && error.to_string().contains("corrupt"),
        "{error}"
    );
    let error: rekindle::Error = error.into();
    assert_eq!(error.kind(), rekindle::ErrorKind::Corrupt);
    // gc names it and goes on with the other runs; `runs rm --force` retires the damaged chain.
    let report = collect_later(&store).await;
    assert!(
        report.skipped.iter().any(|skipped| skipped.contains(&head)),
        "{report:?}"
    );
    let lease = rekindle::store::lease::Holder::new(&store, "host", Duration::from_secs(1));
    lease.acquire(&run).await.unwrap();
    rekindle::fleet::removal::remove(&store, &run, true)
        .await
        .unwrap();
    assert!(matches!(
        generation::load(&store, &run, None).await,
        Err(GenerationError::Retired { .. })
    ));
}

// Reviewer's finding: a chain written before anyone leased it (a workflow step) was admitted
// at epoch 1, the epoch its first generation already had, and the fence refused itself; every
// step's first admission failed. The fence's lease now starts above the chain's epochs.
#[tokio::test]
async fn a_chain_nobody_leased_is_admitted_at_the_first_try() {
    use rekindle::core::fact::RecoveryId;
    use rekindle::fleet::admission::{self, Takeover};
    use rekindle::store::lease::Holder;

    let store = common::memory();
    let run = RunId::new("workflow-step");
    let facts = sample::run(run.as_str(), 20, 47);
    RunWriter::create(&store, facts[..3].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    let coordinator = Arc::new(Holder::new(&store, "coordinator", Duration::from_secs(5)));
    let admitted = admission::admit(
        &store,
        &coordinator,
        &run,
        &RecoveryId::new("recovery-of-workflow-step"),
        false,
        Takeover::Now,
    )
    .await
    .unwrap();
    assert!(admitted.created);
    assert_eq!(admitted.record.source_epoch, Epoch(2));
}

// Reviewer's finding: a retirement that crashed after reserving the lease of a run with no
// generation yet left nothing gc scanned for, and a paused host could still write generation
// 1 later. gc now finishes a reserved lease it finds alone: the fence takes slot 1.
#[tokio::test]
async fn gc_finishes_a_retirement_that_stopped_after_reserving_the_lease() {
    use rekindle::store::lease::{self, Holder};

    let store = common::memory();
    let run = RunId::new("reserved-only");
    let host = Holder::new(&store, "host", Duration::from_secs(5));
    let held = host.acquire_new(&run).await.unwrap();
    let judged = lease::read_lease(&store, &run).await.unwrap().unwrap();
    // The retirement's first write lands; it crashes before the fence.
    lease::reserve_for_retirement(&store, &run, Some(&judged.etag), Epoch(1))
        .await
        .unwrap();
    let report = collect_later(&store).await;
    assert_eq!(report.runs_retired, 1, "{report:?}");
    let facts = sample::run(run.as_str(), 10, 48);
    let woke = RunWriter::create(
        &store.writing_as("host"),
        facts[..3].to_vec(),
        held.epoch,
        POLICY,
    )
    .await;
    assert!(woke.is_err(), "the host's first commit landed: {woke:?}");
    assert_retired_before_it_ended(&store, &run).await;
}

// Hardening: gc judged the grace period on the writer's clock (`at_ms`), so a writer whose
// clock lagged by more than the grace got none. On a store that reports modification times
// (a local directory here, S3 alike) ages are judged on the store's clock.
#[tokio::test]
async fn a_writer_with_a_lagging_clock_still_gets_its_grace() {
    use rekindle::clock::ManualClock;
    use rekindle::store::StoreUrl;

    let dir = tempfile::tempdir().unwrap();
    let gc_store = common::local(dir.path()).await;
    let two_hours = 2 * 3600 * 1000;
    let lagging = ManualClock::new(gc_store.clock().wall_ms() - two_hours);
    let writer_store = Store::open(
        &StoreUrl::Local {
            root: dir.path().to_owned(),
        },
        &common::settings(),
        lagging,
    )
    .await
    .unwrap();
    let run = RunId::new("lagging-writer");
    let facts = sample::run(run.as_str(), 40, 46);
    let mut writer = RunWriter::create(&writer_store, facts[..2].to_vec(), Epoch(1), POLICY)
        .await
        .unwrap();
    for fact in &facts[2..20] {
        writer.commit(vec![fact.clone()]).await.unwrap();
    }
    let policy = gc::GcPolicy {
        retention: Duration::from_secs(7 * 24 * 3600),
        grace: Duration::from_secs(3600),
    };
    let now = gc_store.clock().wall_ms();
    let report = gc::collect(&gc_store, &policy, now).await.unwrap();
    assert_eq!(
        report.generations_deleted, 0,
        "gc took the lagging writer's clock for the age: {report:?}"
    );
    assert!(report.generations_in_grace > 0, "{report:?}");
    // Past the grace on gc's own clock, they go.
    let later = gc::collect(&gc_store, &policy, now + 2 * 3600 * 1000)
        .await
        .unwrap();
    assert!(later.generations_deleted > 0, "{later:?}");
}
