//! Wake-ups move work at once. Every timer here is a minute long (coordinator scans, the
//! watch, worker polls), so a recovery that finishes within seconds was moved by wake-ups:
//! a host's new run wakes the coordinator, an admission wakes it, it wakes the worker it
//! assigns to, and a worker that does not answer is passed over for one that does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rekindle::clock::{Stopwatch, SystemClock};
use rekindle::core::assignment::{Registration, recovery_id_for};
use rekindle::core::fact::{RecoveryId, RunId};
use rekindle::core::layout;
use rekindle::core::record::{RecoveryRecord, RecoveryState};
use rekindle::fleet::admission::Takeover;
use rekindle::fleet::coordinator::{self, CoordinatorOptions};
use rekindle::fleet::runner::Stopped;
use rekindle::fleet::wake::{self, Wakeup};
use rekindle::fleet::worker::{self, WorkerOptions, WorkerStats};
use rekindle::fleet::{self, Agent, Node};
use rekindle::host::config::Config;
use rekindle::store::lease::Holder;
use rekindle::store::log::LogDir;
use rekindle::store::{Store, recovery};

const TTL: Duration = Duration::from_secs(5);
const TIMER: Duration = Duration::from_secs(60);
/// Far below every timer: only wake-ups can move the work this fast.
const LIMIT: Duration = Duration::from_secs(20);

struct Fleet {
    dir: tempfile::TempDir,
    store: Store,
    agent: Agent,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The coordinator's wake-up address, once it runs.
    coordinator_url: Option<String>,
}

impl Fleet {
    fn new() -> Fleet {
        Self::with_tool(r#"["true"]"#)
    }

    /// A fleet whose one tool runs `command` (a TOML array).
    fn with_tool(command: &str) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("script.json"),
            r#"[{"content": "one", "tool_calls": [{"name": "noop", "arguments": {}}]}, {"content": "two", "tool_calls": [{"name": "noop", "arguments": {}}]}, {"content": "done"}]"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("rekindle.toml"),
            format!("[model]\nkind = \"scripted\"\nname = \"m\"\nscript = \"script.json\"\n[[tools]]\nname = \"noop\"\ncommand = {command}\n"),
        )
        .unwrap();
        let config = Config::load(&dir.path().join("rekindle.toml")).unwrap();
        Fleet {
            store: Store::memory(SystemClock::shared()),
            agent: Agent::from_config(config).unwrap(),
            dir,
            stop: Arc::new(AtomicBool::new(false)),
            tasks: Vec::new(),
            coordinator_url: None,
        }
    }

    /// Moves the fleet onto a local-directory bucket; returns the bucket's object store and a
    /// function that opens a store view over any wrapper of it (a `FaultyStore`).
    fn on_local_bucket(
        &mut self,
    ) -> (
        Arc<object_store::local::LocalFileSystem>,
        impl Fn(Arc<dyn object_store::ObjectStore>) -> Store + use<>,
    ) {
        let root = self.dir.path().join("bucket");
        std::fs::create_dir_all(&root).unwrap();
        let local = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&root).unwrap());
        self.store = local_view(&root, local.clone());
        (local, move |inner| local_view(&root, inner))
    }

    async fn endpoint() -> (Wakeup, Option<String>) {
        let wakeup: Wakeup = Arc::new(rekindle::fleet::wake::WakeSignal::new());
        let url = wake::serve_loopback(Arc::clone(&wakeup)).await.unwrap();
        (wakeup, Some(url))
    }

    async fn coordinator(&mut self) {
        self.coordinator_every(TIMER).await;
    }

    /// A coordinator whose scans, idle scans and watch all come every `interval`.
    async fn coordinator_every(&mut self, interval: Duration) {
        let store = self.store.clone();
        self.coordinator_on(store, interval).await;
    }

    /// [`Fleet::coordinator_every`] on its own view of the bucket.
    async fn coordinator_on(&mut self, store: Store, interval: Duration) {
        let mut options = CoordinatorOptions::new("coordinator", TTL);
        options.scan_interval = interval;
        options.idle_scan_interval = interval;
        options.watch_interval = interval;
        options.wake = Some(Self::endpoint().await);
        self.coordinator_url = options.wake.as_ref().and_then(|(_, url)| url.clone());
        let stop = Arc::clone(&self.stop);
        self.tasks.push(tokio::spawn(async move {
            coordinator::run(store, options, stop).await.unwrap();
        }));
    }

    /// A coordinator `id` of a bucket split into `partitions`, every timer a minute long.
    async fn sharing_coordinator(&mut self, id: &str, partitions: u32) {
        let mut options = CoordinatorOptions::new(id, TTL);
        options.scan_interval = TIMER;
        options.idle_scan_interval = TIMER;
        options.watch_interval = TIMER;
        options.partitions = Some(partitions);
        options.wake = Some(Self::endpoint().await);
        let (store, stop) = (self.store.clone(), Arc::clone(&self.stop));
        self.tasks.push(tokio::spawn(async move {
            coordinator::run(store, options, stop).await.unwrap();
        }));
    }

    async fn worker(&mut self, id: &str) {
        let stop = Arc::clone(&self.stop);
        self.worker_until(id, stop).await;
    }

    /// A worker that stops when `stop` is set (as on SIGTERM).
    async fn worker_until(&mut self, id: &str, stop: Arc<AtomicBool>) {
        self.worker_with(id, stop, 4, 4).await;
    }

    /// [`Fleet::worker_until`] with `slots` recoveries at once and a queue of `queue`.
    async fn worker_with(&mut self, id: &str, stop: Arc<AtomicBool>, slots: u32, queue: u32) {
        let store = self.store.clone();
        self.worker_running(store, id, stop, slots, queue).await;
    }

    /// [`Fleet::worker_with`] on its own view of the bucket.
    async fn worker_on(&mut self, store: Store, id: &str, slots: u32, queue: u32) {
        let stop = Arc::clone(&self.stop);
        self.worker_running(store, id, stop, slots, queue).await;
    }

    async fn worker_running(
        &mut self,
        store: Store,
        id: &str,
        stop: Arc<AtomicBool>,
        slots: u32,
        queue: u32,
    ) {
        let mut options = WorkerOptions::new(id, slots, TTL);
        options.queue = queue;
        options.poll_interval = TIMER;
        options.idle_ttl = Some(TIMER * 10);
        options.wake = Some(Self::endpoint().await);
        let logs = LogDir::open(self.dir.path().join(id)).unwrap();
        let agent = self.agent.clone();
        self.tasks.push(tokio::spawn(async move {
            let stats = Arc::new(WorkerStats::default());
            worker::run(store, agent, logs, options, stop, stats)
                .await
                .unwrap();
        }));
    }

    /// A host that journals the run's opening and stops before its first model turn, as a
    /// crash would leave it; `beating` keeps its heartbeat alive (a holder that only seems
    /// alive), else its heartbeat is removed and the coordinator woken (standing in for the
    /// watch, which every timer here holds off for a minute).
    async fn interrupted_run(&self, run: &RunId, beating: bool) -> Arc<Holder> {
        let holder = Holder::new(&self.store, format!("host-{run}"), TTL);
        // A host beats before it starts a run (else a coordinator may fence the run before
        // its first commit, and there is nothing to recover).
        holder.beat().await.unwrap();
        if beating {
            holder.spawn_heartbeat(Arc::clone(&self.stop));
        }
        let node = Node {
            store: self.store.clone(),
            agent: self.agent.clone(),
            logs: LogDir::open(self.dir.path().join("host")).unwrap(),
            holder: Arc::clone(&holder),
            stop: Arc::new(AtomicBool::new(true)),
        };
        let stopped = node.start_run(run, None, "go").await.unwrap();
        assert!(matches!(stopped, Stopped::StopRequested), "{stopped:?}");
        if beating {
            // Still its host's, as far as anyone can tell: the entry names it again (a host
            // that stops lets go of the entry, and the coordinator would admit it at once).
            let mut entry = rekindle::store::index::read(&self.store, run)
                .await
                .unwrap()
                .unwrap();
            entry.holder = Some(holder.heartbeat_key());
            entry.holder_ttl_ms = Some(TTL.as_millis() as u64);
            rekindle::store::index::put(&self.store, &entry)
                .await
                .unwrap();
        } else {
            // Gone at once: a host that stops lets go of its entry (judged without a TTL),
            // and its heartbeat disappears.
            holder.retire().await.unwrap();
            wake::wake_coordinator(&self.store).await;
        }
        holder
    }

    async fn finished_within(&self, id: &RecoveryId, limit: Duration) -> Duration {
        let waited = Stopwatch::start();
        loop {
            let record = recovery::read(&self.store, id)
                .await
                .unwrap()
                .map(|(r, _)| r);
            if record
                .as_ref()
                .is_some_and(|r| r.state == RecoveryState::Finished)
            {
                return waited.elapsed();
            }
            assert!(
                waited.elapsed() < limit,
                "recovery {id} not finished within {limit:?}: {record:?}"
            );
            rekindle::clock::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

// Proves a new run wakes an idle coordinator: the host's run, interrupted at once (its
// holder never beats), is admitted, assigned and finished long before any scan or poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_wakes_the_coordinator_and_the_worker() {
    let mut fleet = Fleet::new();
    fleet.coordinator().await;
    fleet.worker("w1").await;
    // The coordinator's first scan is behind it: it idles for a minute now.
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let run = RunId::new("woken");
    fleet.interrupted_run(&run, false).await;
    fleet.finished_within(&recovery_id_for(&run), LIMIT).await;
    fleet.stop().await;
}

// Proves an admission wakes the coordinator, and that a worker which does not answer its
// wake-up (its advertised address is closed) is passed over: the recovery is offered to it
// first (it has the most free slots), then moved to the worker that answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_is_assigned_at_once_and_skips_a_deaf_worker() {
    let mut fleet = Fleet::new();
    // A live worker whose wake-up address answers nobody.
    let deaf = Holder::with_role(&fleet.store, "deaf", TTL, "worker");
    deaf.beat().await.unwrap();
    deaf.spawn_heartbeat(Arc::clone(&fleet.stop));
    let mut registration = Registration::new(
        "deaf",
        deaf.heartbeat_key(),
        100,
        fleet.agent.fingerprint_sha256(),
    );
    registration.ttl_ms = Some(TTL.as_millis() as u64);
    registration.wake = Some("http://127.0.0.1:9".into());
    fleet
        .store
        .put(
            &layout::worker("deaf"),
            layout::encode_object(&registration),
        )
        .await
        .unwrap();
    fleet.coordinator().await;
    fleet.worker("near").await;
    // The host seems alive (it beats), so only an operator's takeover admits it.
    let run = RunId::new("declared");
    fleet.interrupted_run(&run, true).await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let operator = Holder::new(&fleet.store, "operator", TTL);
    let id = RecoveryId::new("declared-by-hand");
    fleet::spawn_recovery(&fleet.store, &operator, &run, &id, false, Takeover::Now)
        .await
        .unwrap();
    fleet.finished_within(&id, LIMIT).await;
    let (record, _) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(record.failures, 0, "{record:?}");
    fleet.stop().await;
}

// Proves a recovery handed back and offered again to the same worker wakes that worker: its
// inbox already listed the recovery (unchanged, so not rewritten), and before, the worker
// found it only at its next poll. The worker here is the test itself, registered with a
// wake-up endpoint it watches; every timer is a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_offered_again_to_the_same_worker_wakes_it() {
    offered_again_wakes_the_worker(false).await;
}

// Proves the same when the coordinator read the record while the attempt ran, less than a
// second before the failure: its woken tick finds the running record fresh in its cache and
// must look again once it is due, not a scan interval (here a minute) later. (Under load this
// happened by chance, and the test above failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_right_after_a_look_at_the_running_record_is_seen() {
    offered_again_wakes_the_worker(true).await;
}

async fn offered_again_wakes_the_worker(seen_running: bool) {
    use rekindle::core::lifecycle::Event;
    use rekindle::fleet::lifecycle;

    let mut fleet = Fleet::new();
    let (pokes, url) = Fleet::endpoint().await;
    let me = Holder::with_role(&fleet.store, "only", TTL, "worker");
    me.beat().await.unwrap();
    me.spawn_heartbeat(Arc::clone(&fleet.stop));
    let mut registration = Registration::new(
        "only",
        me.heartbeat_key(),
        4,
        fleet.agent.fingerprint_sha256(),
    );
    registration.ttl_ms = Some(TTL.as_millis() as u64);
    registration.wake = url;
    fleet
        .store
        .put(
            &layout::worker("only"),
            layout::encode_object(&registration),
        )
        .await
        .unwrap();
    fleet.coordinator().await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let run = RunId::new("handed-back");
    let id = recovery_id_for(&run);
    let woken = |what: &'static str| {
        let pokes = Arc::clone(&pokes);
        async move {
            tokio::time::timeout(LIMIT, pokes.notify().notified())
                .await
                .unwrap_or_else(|_| panic!("the worker was not woken {what}"));
        }
    };
    let first = woken("for the first offer");
    fleet.interrupted_run(&run, false).await;
    first.await;
    // The attempt starts and fails, as a worker reports it.
    let (record, _) = lifecycle::transition(
        &fleet.store,
        &id,
        None,
        Event::Start {
            worker: "only".into(),
        },
    )
    .await
    .unwrap();
    if seen_running {
        // The coordinator reads the record while the attempt runs (a tick between the start
        // and the failure), so its next tick finds it fresh in its cache.
        wake::poke(fleet.coordinator_url.as_deref().unwrap())
            .await
            .unwrap();
        rekindle::clock::sleep(Duration::from_millis(300)).await;
    }
    let again = woken("for the second offer");
    lifecycle::transition(
        &fleet.store,
        &id,
        None,
        Event::Fail {
            worker: "only".into(),
            attempt: record.attempts,
            error: "the model was unreachable".into(),
        },
    )
    .await
    .unwrap();
    // The worker's freed slot wakes the coordinator, as a real worker does.
    wake::poke(fleet.coordinator_url.as_deref().unwrap())
        .await
        .unwrap();
    again.await;
    let (record, _) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(record.state, RecoveryState::Admitted, "{record:?}");
    assert_eq!(record.assigned_to.as_deref(), Some("only"), "{record:?}");
    fleet.stop().await;
}

// Proves a worker stopping (SIGTERM) wakes the coordinator once it has handed its recovery
// back, so another worker takes it at once rather than at the next scan (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_handed_back_at_a_stop_moves_on_at_once() {
    let mut fleet = Fleet::with_tool(r#"["sleep", "1"]"#);
    fleet.coordinator().await;
    let leaving = Arc::new(AtomicBool::new(false));
    fleet.worker_until("leaving", Arc::clone(&leaving)).await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let run = RunId::new("handed-over");
    let id = recovery_id_for(&run);
    fleet.interrupted_run(&run, false).await;
    // The leaving worker runs it (its first call sleeps a second), then is told to stop.
    let waited = Stopwatch::start();
    loop {
        let record = recovery::read(&fleet.store, &id)
            .await
            .unwrap()
            .map(|(r, _)| r);
        if record.is_some_and(|r| r.state == RecoveryState::Running) {
            break;
        }
        assert!(waited.elapsed() < LIMIT, "never started");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    fleet.worker("staying").await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    leaving.store(true, Ordering::SeqCst);
    fleet.finished_within(&id, LIMIT).await;
    let (record, _) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(record.assigned_to.as_deref(), Some("staying"), "{record:?}");
    fleet.stop().await;
}

// Proves a stopping worker does not keep the recoveries waiting in its queue: it declines
// them, and the coordinator (woken) gives them to another worker at once, while the stopping
// worker's own recovery is still finishing its step (a 4 s tool call). Left in the queue, the
// waiting one would move only once the worker is gone, after that step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_declines_what_waits_in_its_queue() {
    let mut fleet = Fleet::with_tool(r#"["sleep", "4"]"#);
    fleet.coordinator().await;
    let leaving = Arc::new(AtomicBool::new(false));
    fleet
        .worker_with("leaving", Arc::clone(&leaving), 1, 1)
        .await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let (first, second) = (RunId::new("runs-first"), RunId::new("waits-second"));
    fleet.interrupted_run(&first, false).await;
    fleet.interrupted_run(&second, false).await;
    let (first, second) = (recovery_id_for(&first), recovery_id_for(&second));
    // One slot: one runs, the other waits in the leaving worker's queue.
    let waited = Stopwatch::start();
    loop {
        let read = |id: RecoveryId| {
            let store = fleet.store.clone();
            async move { recovery::read(&store, &id).await.unwrap().map(|(r, _)| r) }
        };
        let (a, b) = (read(first.clone()).await, read(second.clone()).await);
        let states: Vec<_> = [a, b]
            .into_iter()
            .flatten()
            .map(|r| (r.state, r.assigned_to))
            .collect();
        if states.contains(&(RecoveryState::Running, Some("leaving".into())))
            && states.contains(&(RecoveryState::Admitted, Some("leaving".into())))
        {
            break;
        }
        assert!(
            waited.elapsed() < LIMIT,
            "never one running, one queued: {states:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    fleet.worker("staying").await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    leaving.store(true, Ordering::SeqCst);
    // The declined one starts on the other worker while the leaving one still runs its own.
    let waited = Stopwatch::start();
    loop {
        let (b, _) = recovery::read(&fleet.store, &second)
            .await
            .unwrap()
            .unwrap();
        if b.state == RecoveryState::Running {
            assert_eq!(b.assigned_to.as_deref(), Some("staying"), "{b:?}");
            let (a, _) = recovery::read(&fleet.store, &first).await.unwrap().unwrap();
            assert_eq!(
                (a.state, a.assigned_to.as_deref()),
                (RecoveryState::Running, Some("leaving")),
                "the queued recovery waited for the leaving worker's step: {a:?}"
            );
            break;
        }
        assert!(waited.elapsed() < LIMIT, "never started elsewhere: {b:?}");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    for id in [&first, &second] {
        fleet.finished_within(id, LIMIT).await;
        let (record, _) = recovery::read(&fleet.store, id).await.unwrap().unwrap();
        assert_eq!(record.assigned_to.as_deref(), Some("staying"), "{record:?}");
    }
    fleet.stop().await;
}

// Proves a stopping worker that is the only one is not offered back what it declined (its
// registration says it drains): the recoveries wait, offered to nobody, and the next worker
// to come takes them. (Before, the coordinator offered them back to it, which declined them
// again, hundreds of times a second until it exited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_is_not_offered_back_what_it_declined() {
    let mut fleet = Fleet::with_tool(r#"["sleep", "2"]"#);
    fleet.coordinator().await;
    let leaving = Arc::new(AtomicBool::new(false));
    fleet.worker_with("only", Arc::clone(&leaving), 1, 2).await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let runs = ["d-one", "d-two", "d-three"].map(RunId::new);
    for run in &runs {
        fleet.interrupted_run(run, false).await;
    }
    let ids = runs.each_ref().map(recovery_id_for);
    let read = |id: &RecoveryId| {
        let (store, id) = (fleet.store.clone(), id.clone());
        async move { recovery::read(&store, &id).await.unwrap().unwrap().0 }
    };
    let waited = Stopwatch::start();
    loop {
        let mut states = Vec::new();
        for id in &ids {
            // Admitted by the coordinator as it is woken: maybe not yet.
            if let Some((record, _)) = recovery::read(&fleet.store, id).await.unwrap() {
                states.push((record.state, record.assigned_to));
            }
        }
        let on = |state| {
            states
                .iter()
                .filter(|s| **s == (state, Some("only".into())))
                .count()
        };
        if on(RecoveryState::Running) == 1 && on(RecoveryState::Admitted) == 2 {
            break;
        }
        assert!(
            waited.elapsed() < LIMIT,
            "never one running, two queued: {states:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    leaving.store(true, Ordering::SeqCst);
    // Its step done and handed back, the worker is gone; nothing is offered to it meanwhile.
    let waited = Stopwatch::start();
    loop {
        let registered = fleet
            .store
            .head(&rekindle::core::layout::worker("only"))
            .await
            .unwrap()
            .is_some();
        if !registered {
            break;
        }
        assert!(waited.elapsed() < LIMIT, "the worker never left");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    for id in &ids {
        let record = read(id).await;
        assert_eq!(
            (record.state, record.assigned_to.as_deref()),
            (RecoveryState::Admitted, None),
            "{record:?}"
        );
    }
    let mut declined = 0;
    for id in &ids {
        if read(id).await.declined_by.as_deref() == Some("only") {
            declined += 1;
        }
    }
    assert_eq!(declined, 2, "the two that waited were declined");
    fleet.worker("next").await;
    for id in &ids {
        fleet.finished_within(id, LIMIT).await;
    }
    fleet.stop().await;
}

// A worker whose registration was removed (gc removes a dead worker's; this one only looked
// dead, or gc read its heartbeat just before it beat again) registers again within the TTL
// it declares, so it is offered work again instead of idling unregistered forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_registration_was_removed_registers_again() {
    let fleet = Fleet::new();
    let mut options = WorkerOptions::new("w-again", 1, Duration::from_millis(300));
    options.poll_interval = Duration::from_millis(50);
    let logs = LogDir::open(fleet.dir.path().join("w-again")).unwrap();
    let (store, agent, stop) = (
        fleet.store.clone(),
        fleet.agent.clone(),
        Arc::clone(&fleet.stop),
    );
    let worker = tokio::spawn(async move {
        let stats = Arc::new(WorkerStats::default());
        worker::run(store, agent, logs, options, stop, stats)
            .await
            .unwrap();
    });
    let key = rekindle::core::layout::worker("w-again");
    let registered = || {
        let store = fleet.store.clone();
        let key = key.clone();
        async move { store.head(&key).await.unwrap().is_some() }
    };
    let wait = |want: bool| async move {
        for _ in 0..200 {
            if registered().await == want {
                return true;
            }
            rekindle::clock::sleep(Duration::from_millis(25)).await;
        }
        false
    };
    assert!(wait(true).await, "the worker never registered");
    fleet.store.delete(&key).await.unwrap();
    assert!(!registered().await);
    assert!(wait(true).await, "the worker did not register again");
    fleet.stop.store(true, Ordering::SeqCst);
    worker.await.unwrap();
}

// Proves a worker's slot takes the next recovery as soon as a run stops, not once that run's
// outcome is written: with one slot and two recoveries, the second runs to the end while
// the first's finish is held (its compare-and-swap paused right after its read, on the
// worker's view of a local-directory store). Before, the slot stayed taken until the outcome
// was written, and the second waited behind two writes per recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_takes_the_next_recovery_while_the_last_outcome_is_written() {
    use rekindle::store::faults::{FaultPlan, FaultyStore};
    let mut fleet = Fleet::with_tool(r#"["sleep", "1"]"#);
    let (local, open) = fleet.on_local_bucket();
    let faulty = FaultyStore::new(local, FaultPlan::default(), 7);
    fleet.coordinator().await;
    fleet
        .worker_on(open(faulty.clone()), "one-slot", 1, 1)
        .await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let runs = [RunId::new("slot-a"), RunId::new("slot-b")];
    for run in &runs {
        fleet.interrupted_run(run, false).await;
    }
    let ids = runs.each_ref().map(recovery_id_for);
    let read = |id: &RecoveryId| {
        let (store, id) = (fleet.store.clone(), id.clone());
        async move { recovery::read(&store, &id).await.unwrap().map(|(r, _)| r) }
    };
    // One runs (its tool sleeps a second), the other waits in the worker's queue.
    let waited = Stopwatch::start();
    let (running, queued) = loop {
        let states = [read(&ids[0]).await, read(&ids[1]).await].map(|r| r.map(|r| r.state));
        match states {
            [Some(RecoveryState::Running), Some(RecoveryState::Admitted)] => {
                break (ids[0].clone(), ids[1].clone());
            }
            [Some(RecoveryState::Admitted), Some(RecoveryState::Running)] => {
                break (ids[1].clone(), ids[0].clone());
            }
            _ => {}
        }
        assert!(
            waited.elapsed() < LIMIT,
            "never one running, one queued: {states:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    };
    // The worker's next read of the running recovery's record is its finish's swap.
    let gate = faulty.pause_after_read(&format!("/{running}"));
    tokio::time::timeout(LIMIT, gate.reached())
        .await
        .expect("the running recovery's outcome was never written (or written before the gate)");
    let waited = Stopwatch::start();
    loop {
        let held = read(&running).await.unwrap();
        assert_eq!(held.state, RecoveryState::Running, "{held:?}");
        if read(&queued)
            .await
            .is_some_and(|r| r.state == RecoveryState::Finished)
        {
            break;
        }
        assert!(
            waited.elapsed() < LIMIT,
            "the queued recovery waited for the first one's outcome to be written: {:?}",
            read(&queued).await
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    gate.release();
    fleet.finished_within(&running, LIMIT).await;
    fleet.stop().await;
}

/// A store view over `inner`, an object store on the local directory `root`.
fn local_view(root: &std::path::Path, inner: Arc<dyn object_store::ObjectStore>) -> Store {
    use rekindle::store::{Backend, RetryPolicy};
    Store::from_parts(
        inner,
        Backend::Local {
            root: root.to_path_buf(),
        },
        "file://bucket",
        "",
        RetryPolicy::default(),
        SystemClock::shared(),
    )
}

/// Registers a stand-in worker `id` (the test plays it) with `slots` slots, beating, woken
/// at its own endpoint; returns that endpoint.
async fn stand_in_worker(fleet: &Fleet, id: &str, slots: u32) -> Wakeup {
    let (pokes, url) = Fleet::endpoint().await;
    let me = Holder::with_role(&fleet.store, id, TTL, "worker");
    me.beat().await.unwrap();
    me.spawn_heartbeat(Arc::clone(&fleet.stop));
    let mut registration = Registration::new(
        id,
        me.heartbeat_key(),
        slots,
        fleet.agent.fingerprint_sha256(),
    );
    registration.ttl_ms = Some(TTL.as_millis() as u64);
    registration.wake = url;
    fleet
        .store
        .put(&layout::worker(id), layout::encode_object(&registration))
        .await
        .unwrap();
    pokes
}

/// The record of recovery `id` once it is offered to a worker (within [`LIMIT`]).
async fn assigned_within(fleet: &Fleet, id: &RecoveryId) -> RecoveryRecord {
    let waited = Stopwatch::start();
    loop {
        let (record, _) = recovery::read(&fleet.store, id).await.unwrap().unwrap();
        if record.assigned_to.is_some() {
            return record;
        }
        assert!(waited.elapsed() < LIMIT, "never assigned: {record:?}");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
}

/// A fleet of a coordinator and a stand-in worker "only" (4 slots, answering that it claims
/// up to `claims` named recoveries), the coordinator's first tick behind it (it has a view of
/// the worker), and a recovery of run "named" admitted without its index entry.
async fn named_behind_a_stand_in(claims: usize) -> (Fleet, Wakeup, RecoveryId) {
    let mut fleet = Fleet::new();
    let pokes = stand_in_worker(&fleet, "only", 4).await;
    pokes.set_claims(claims);
    let run = RunId::new("named");
    fleet.interrupted_run(&run, true).await;
    fleet.coordinator().await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let id = admitted_without_entry(&fleet, &run).await;
    (fleet, pokes, id)
}

/// Admits a recovery of `run` (whose host beats) by takeover, and removes the source's index
/// entry again: only a wake-up naming the recovery can lead the fleet to it now.
async fn admitted_without_entry(fleet: &Fleet, run: &RunId) -> RecoveryId {
    let operator = Arc::new(Holder::new(&fleet.store, "operator", TTL));
    let id = recovery_id_for(run);
    rekindle::fleet::admission::admit(&fleet.store, &operator, run, &id, false, Takeover::Now)
        .await
        .unwrap();
    rekindle::store::index::remove(&fleet.store, run)
        .await
        .unwrap();
    id
}

// Proves a wake-up naming a fresh admission makes the coordinator forward the name to a
// worker with an idle slot at once, without its index entry (an admission names it before the
// entry is written) and without a scan (every timer is a minute), and leave the record to that
// worker's claim: no assignment swap, no inbox. Names are forwarded before any record is read,
// so a forged one goes along and costs the worker a read, nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_fresh_admission_is_forwarded_to_a_worker_before_its_record_is_read() {
    // The stand-in answers that it claims what is named to it, as a worker with free slots.
    let (fleet, pokes, id) = named_behind_a_stand_in(4).await;
    let coordinator = fleet.coordinator_url.clone().unwrap();
    let forged = RecoveryId::new("recovery-of-nothing");
    let woken = {
        let pokes = Arc::clone(&pokes);
        tokio::spawn(async move {
            tokio::time::timeout(LIMIT, pokes.notify().notified())
                .await
                .expect("the worker was not woken for the named recovery");
        })
    };
    wake::poke_naming(&coordinator, &[forged.clone(), id.clone()])
        .await
        .unwrap();
    woken.await.unwrap();
    let mut named = pokes.take_named();
    named.sort();
    let mut expected = vec![id.clone(), forged.clone()];
    expected.sort();
    assert_eq!(named, expected);
    // Long enough for a swap or an inbox PUT the forward should have spared.
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let (record, _) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(record.state, RecoveryState::Admitted, "{record:?}");
    assert_eq!(
        record.assigned_to, None,
        "left to the worker's claim: {record:?}"
    );
    let inbox = fleet.store.read(&layout::inbox("only")).await.unwrap();
    assert!(
        inbox.is_none_or(|inbox| !String::from_utf8_lossy(&inbox.bytes).contains(id.as_str())),
        "the forwarded recovery was written to an inbox"
    );
    assert!(
        recovery::read(&fleet.store, &forged)
            .await
            .unwrap()
            .is_none()
    );
    fleet.stop().await;
}

// Proves a wake-up naming a fresh admission to a coordinator whose only worker does not
// claim it (full, stopping, or an older build: it answers the forward without claiming) makes
// the coordinator assign it from its record alone, without its index entry and without a scan
// (every timer is a minute), and name it to that worker; and that a named ID with no record
// (a forged or stale wake-up) costs nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_recovery_no_worker_claims_is_assigned_from_its_record_alone() {
    let (fleet, _pokes, id) = named_behind_a_stand_in(0).await;
    let forged = RecoveryId::new("recovery-of-nothing");
    let coordinator = fleet.coordinator_url.clone().unwrap();
    wake::poke_naming(&coordinator, &[forged.clone(), id.clone()])
        .await
        .unwrap();
    let record = assigned_within(&fleet, &id).await;
    assert_eq!(record.state, RecoveryState::Admitted, "{record:?}");
    assert_eq!(record.assigned_to.as_deref(), Some("only"), "{record:?}");
    let inbox = fleet
        .store
        .read(&layout::inbox("only"))
        .await
        .unwrap()
        .expect("the offer is written to the worker's inbox");
    assert!(String::from_utf8_lossy(&inbox.bytes).contains(id.as_str()));
    assert!(
        recovery::read(&fleet.store, &forged)
            .await
            .unwrap()
            .is_none()
    );
    fleet.stop().await;
}

// Proves a wake-up naming an admitted recovery that is not a fresh admission (it ran once and
// was handed back) makes the coordinator assign it from its record alone, without its index
// entry and without a scan, and name it to the worker it offers it to: only a fresh admission
// is left to a worker's claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_recovery_that_ran_before_is_assigned_from_its_record_alone() {
    use rekindle::core::lifecycle::Event;
    use rekindle::fleet::lifecycle;

    // It would claim a fresh admission: this one is not.
    let (fleet, pokes, id) = named_behind_a_stand_in(4).await;
    let worker = || "earlier".to_owned();
    for event in [
        Event::Start { worker: worker() },
        Event::Yield {
            worker: worker(),
            attempt: 1,
            keep_assignment: false,
        },
    ] {
        lifecycle::transition(&fleet.store, &id, None, event)
            .await
            .unwrap();
    }
    let coordinator = fleet.coordinator_url.clone().unwrap();
    wake::poke_naming(&coordinator, std::slice::from_ref(&id))
        .await
        .unwrap();
    let record = assigned_within(&fleet, &id).await;
    assert_eq!(record.state, RecoveryState::Admitted, "{record:?}");
    assert_eq!(record.assigned_to.as_deref(), Some("only"), "{record:?}");
    // Forwarded first, then offered: the worker is named it either way.
    tokio::time::timeout(LIMIT, async {
        while !pokes.take_named().contains(&id) {
            pokes.notify().notified().await;
        }
    })
    .await
    .expect("the worker was not named the recovery it was offered");
    fleet.stop().await;
}

// Proves a worker woken with a name starts that recovery from its record, though its inbox
// does not list it (the coordinator names an offer while it writes the inbox), and that a
// named recovery offered to another worker is left alone: the name is a hint, the record
// decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starts_a_named_recovery_only_if_its_record_offers_it() {
    use rekindle::core::lifecycle::Event;
    use rekindle::fleet::lifecycle;

    let mut fleet = Fleet::new();
    fleet.worker("w1").await;
    let [mine, theirs] = [RunId::new("mine"), RunId::new("theirs")];
    for run in [&mine, &theirs] {
        fleet.interrupted_run(run, true).await;
    }
    let mut ids = Vec::new();
    for (run, worker) in [(&mine, "w1"), (&theirs, "w2")] {
        let id = admitted_without_entry(&fleet, run).await;
        let assign = Event::Assign {
            worker: worker.into(),
        };
        lifecycle::transition(&fleet.store, &id, None, assign)
            .await
            .unwrap();
        ids.push(id);
    }
    let url = worker_wake_url(&fleet, "w1").await;
    wake::poke_naming(&url, &ids).await.unwrap();
    fleet.finished_within(&ids[0], LIMIT).await;
    let (theirs, _) = recovery::read(&fleet.store, &ids[1])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(theirs.state, RecoveryState::Admitted, "{theirs:?}");
    assert_eq!(theirs.assigned_to.as_deref(), Some("w2"), "{theirs:?}");
    assert_eq!(theirs.attempts, 0, "{theirs:?}");
    fleet.stop().await;
}

/// Where worker `id` takes wake-ups, as its registration advertises (once it registered).
async fn worker_wake_url(fleet: &Fleet, id: &str) -> String {
    let waited = Stopwatch::start();
    let object = loop {
        if let Some(object) = fleet.store.read(&layout::worker(id)).await.unwrap() {
            break object;
        }
        assert!(waited.elapsed() < LIMIT, "worker {id} never registered");
        rekindle::clock::sleep(Duration::from_millis(10)).await;
    };
    let registration: Registration =
        layout::decode_object(&layout::worker(id), "worker", &object.bytes).unwrap();
    registration
        .wake
        .expect("the worker advertises its wake-up")
}

// Proves a fresh admission named to two workers at once (two coordinators' forwards, or a
// forward racing a stale one) is started by exactly one of them: each starts it only by
// compare-and-swap on the record, so one start lands and the other is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_admission_named_to_two_workers_starts_once() {
    let mut fleet = Fleet::new();
    fleet.worker("w1").await;
    fleet.worker("w2").await;
    let run = RunId::new("both");
    fleet.interrupted_run(&run, true).await;
    let id = admitted_without_entry(&fleet, &run).await;
    let urls = [
        worker_wake_url(&fleet, "w1").await,
        worker_wake_url(&fleet, "w2").await,
    ];
    let (one, two) = futures::join!(
        wake::poke_naming(&urls[0], std::slice::from_ref(&id)),
        wake::poke_naming(&urls[1], std::slice::from_ref(&id)),
    );
    one.unwrap();
    two.unwrap();
    fleet.finished_within(&id, LIMIT).await;
    let (record, _) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(record.attempts, 1, "started more than once: {record:?}");
    assert_eq!(record.failures, 0, "{record:?}");
    fleet.stop().await;
}

// Proves a worker named a fresh admission it may not run (the run's configuration differs
// from the worker's, and the admission is not forced) does not claim it: it stays admitted,
// offered to nobody and never started, for the coordinator to place on a matching worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_does_not_claim_a_fresh_admission_configured_for_others() {
    let mut fleet = Fleet::new();
    fleet.worker("w1").await;
    let run = RunId::new("elsewhere");
    fleet.interrupted_run(&run, true).await;
    let id = admitted_without_entry(&fleet, &run).await;
    let key = layout::recovery(id.as_str());
    let object = fleet.store.read(&key).await.unwrap().unwrap();
    let mut record: RecoveryRecord =
        layout::decode_object(&key, "recovery", &object.bytes).unwrap();
    record.fingerprint_sha256 = "another configuration".into();
    fleet
        .store
        .swap(&key, layout::encode_object(&record), &object.etag)
        .await
        .unwrap();
    let url = worker_wake_url(&fleet, "w1").await;
    wake::poke_naming(&url, std::slice::from_ref(&id))
        .await
        .unwrap();
    // Long enough for the worker's read and start swap.
    rekindle::clock::sleep(Duration::from_millis(500)).await;
    let (after, etag) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(after.state, RecoveryState::Admitted, "{after:?}");
    assert_eq!(after.assigned_to, None, "{after:?}");
    assert_eq!(after.attempts, 0, "{after:?}");
    // The control: configured alike again, the same name makes the worker claim and run it.
    record.fingerprint_sha256 = fleet.agent.fingerprint_sha256();
    fleet
        .store
        .swap(&key, layout::encode_object(&record), &etag)
        .await
        .unwrap();
    wake::poke_naming(&url, std::slice::from_ref(&id))
        .await
        .unwrap();
    fleet.finished_within(&id, LIMIT).await;
    fleet.stop().await;
}

// Proves a stream of wake-ups naming recoveries that do not exist (forged, or stale) does not
// hold the coordinator's scans off: a host that is gone without waking anybody (its heartbeat
// removed, no wake-up) is still found by a scan, and its run admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_wake_ups_do_not_hold_the_scans_off() {
    use rekindle::store::faults::{FaultPlan, FaultyStore};
    let mut fleet = Fleet::new();
    // The coordinator's requests take 20 ms (as on S3), so the next junk name is always
    // there by the time it has looked at the last one.
    let (local, open) = fleet.on_local_bucket();
    let plan = FaultPlan {
        latency: Duration::from_millis(20),
        ..FaultPlan::default()
    };
    let slow = open(FaultyStore::new(local, plan, 11));
    let _pokes = stand_in_worker(&fleet, "only", 4).await;
    fleet.coordinator_on(slow, Duration::from_millis(300)).await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let coordinator = fleet.coordinator_url.clone().unwrap();
    let flooding = Arc::new(AtomicBool::new(true));
    let flood = {
        let flooding = Arc::clone(&flooding);
        tokio::spawn(async move {
            let junk = [RecoveryId::new("recovery-of-nobody")];
            while flooding.load(Ordering::SeqCst) {
                let _ = wake::poke_naming(&coordinator, &junk).await;
                rekindle::clock::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // A host starts a run (which wakes the coordinator), then is gone without a word.
    let run = RunId::new("gone-quietly");
    let holder = Holder::new(&fleet.store, "host-quiet", TTL);
    holder.beat().await.unwrap();
    let node = Node {
        store: fleet.store.clone(),
        agent: fleet.agent.clone(),
        logs: LogDir::open(fleet.dir.path().join("host")).unwrap(),
        holder: Arc::clone(&holder),
        stop: Arc::new(AtomicBool::new(true)),
    };
    node.start_run(&run, None, "go").await.unwrap();
    rekindle::clock::sleep(Duration::from_millis(100)).await;
    holder.retire().await.unwrap();
    let id = recovery_id_for(&run);
    let waited = Stopwatch::start();
    while recovery::read(&fleet.store, &id).await.unwrap().is_none() {
        assert!(
            waited.elapsed() < LIMIT,
            "the run of a host that is gone was not admitted while named wake-ups kept coming"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    flooding.store(false, Ordering::SeqCst);
    flood.await.unwrap();
    fleet.stop().await;
}

// Proves a recovery whose ID a wake-up cannot carry (longer than a name may be) still moves
// at once: its admission and its offer wake after the index entry and the inbox are written
// instead of naming it, and every timer here is a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_too_long_to_name_still_moves_by_wake_ups() {
    let mut fleet = Fleet::new();
    fleet.coordinator().await;
    fleet.worker("w1").await;
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    let run = RunId::new(format!("long-{}", "x".repeat(600)));
    fleet.interrupted_run(&run, true).await;
    let operator = Holder::new(&fleet.store, "operator", TTL);
    let id = recovery_id_for(&run);
    assert!(!wake::carried(&id));
    fleet::spawn_recovery(&fleet.store, &operator, &run, &id, false, Takeover::Now)
        .await
        .unwrap();
    fleet.finished_within(&id, LIMIT).await;
    fleet.stop().await;
}

// Regression (simulation seed 50003916, found once the simulation sent wake-ups): a worker
// whose inbox still lists a recovery its record says is another worker's launched it, found
// it not its own, and the attempt's end woke the worker's loop, which read the inbox and
// launched it again at once: an inbox GET, a heartbeat PUT and a record GET per round trip
// for as long as the inbox stayed stale (with its coordinator down, for good). It now looks
// at such an entry once per version of its inbox.
// (One thread, as in the simulation: an attempt's task then ends before the loop it woke
// looks at it, every time.)
#[tokio::test]
async fn a_stale_inbox_entry_is_looked_at_once_not_in_a_loop() {
    use rekindle::core::assignment::Inbox;
    use rekindle::core::lifecycle::Event;
    use rekindle::fleet::lifecycle;

    let mut fleet = Fleet::new();
    let run = RunId::new("stale-entry");
    fleet.interrupted_run(&run, true).await;
    let id = admitted_without_entry(&fleet, &run).await;
    // Offered to another worker; this one's inbox still lists it (a coordinator that moved
    // it and died before rewriting this inbox).
    lifecycle::transition(
        &fleet.store,
        &id,
        None,
        Event::Assign {
            worker: "other".into(),
        },
    )
    .await
    .unwrap();
    let inbox = Inbox {
        format: rekindle::core::layout::FORMAT_VERSION,
        kind: "inbox".into(),
        worker: "w".into(),
        recoveries: vec![id.clone()],
        coordinator_wake: None,
        offers: Vec::new(),
        ..Inbox::default()
    };
    fleet
        .store
        .put(&layout::inbox("w"), layout::encode_object(&inbox))
        .await
        .unwrap();
    fleet.worker("w").await;
    // The worker's start: its registration, heartbeat, first inbox read and one look at the
    // record. Then, with every timer a minute long, it waits.
    rekindle::clock::sleep(Duration::from_millis(500)).await;
    let before = fleet.store.metrics();
    rekindle::clock::sleep(Duration::from_secs(1)).await;
    let requests = fleet.store.metrics().since(&before).requests();
    assert!(
        requests < 20,
        "an idle worker with a stale inbox entry made {requests} requests in a second"
    );
    let (record, _) = recovery::read(&fleet.store, &id).await.unwrap().unwrap();
    assert_eq!(record.assigned_to.as_deref(), Some("other"));
    assert_eq!(record.attempts, 0, "{record:?}");
    fleet.stop().await;
}

/// Who holds each of the bucket's `partitions` partition leases.
async fn partition_owners(store: &Store, partitions: u32) -> Vec<Option<String>> {
    let mut owners = Vec::new();
    for partition in 0..partitions {
        let run = RunId::new(layout::partition_lease(partition));
        owners.push(
            match rekindle::store::lease::read_lease(store, &run)
                .await
                .unwrap()
            {
                Some(view) if !view.lease.released => Some(view.lease.holder),
                _ => None,
            },
        );
    }
    owners
}

// Proves wake-ups reach every coordinator of a split bucket, with every timer a minute long: a
// coordinator that joins is handed its share on wake-ups (it wakes the owner of what it should
// own), and a new run in a partition that partition 0's owner does not own (its host wakes
// partition 0's owner, whose lease the host finds) is admitted by its own partition's owner,
// assigned and finished within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_buckets_coordinators_pass_wake_ups_on() {
    const PARTITIONS: u32 = 16;
    let mut fleet = Fleet::new();
    fleet.sharing_coordinator("ca", PARTITIONS).await;
    let waited = Stopwatch::start();
    while partition_owners(&fleet.store, PARTITIONS)
        .await
        .iter()
        .any(Option::is_none)
    {
        assert!(
            waited.elapsed() < LIMIT,
            "the first coordinator owns nothing"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    fleet.sharing_coordinator("cb", PARTITIONS).await;
    fleet.worker("w1").await;
    let owners = loop {
        let owners = partition_owners(&fleet.store, PARTITIONS).await;
        let shared = owners.iter().flatten().any(|o| o == "ca")
            && owners.iter().flatten().any(|o| o == "cb");
        if owners.iter().all(Option::is_some) && shared {
            break owners;
        }
        assert!(
            waited.elapsed() < LIMIT,
            "the joiner got no share: {owners:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    };
    let first = owners[0].clone();
    let run = (0..)
        .map(|i| RunId::new(format!("elsewhere-{i}")))
        .find(|run| owners[layout::partition_of_run(run.as_str(), PARTITIONS) as usize] != first)
        .unwrap();
    fleet.interrupted_run(&run, false).await;
    fleet.finished_within(&recovery_id_for(&run), LIMIT).await;
    fleet.stop().await;
}
