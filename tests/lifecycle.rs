//! The recovery lifecycle: the pure transition function's properties, and regression tests
//! for the lifecycle bugs found by review (each named after what broke), run as a fleet in
//! one process on the memory store under tokio's paused, virtual clock, with in-process
//! tools that record every execution in a ledger.

#![allow(clippy::disallowed_methods)] // the harness schedules its own faults on the paused runtime's clock.

mod common;

use rekindle::core::epoch::Epoch;
use rekindle::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryResult, RecoveryState};
use rekindle::fleet::admission;
use rekindle::fleet::admission::Takeover;
use rekindle::fleet::lifecycle;
use rekindle::fleet::lifecycle::LifecycleError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use proptest::prelude::*;
use rekindle::clock::Clock;
use rekindle::core::assignment::recovery_id_for;
use rekindle::core::fact::{Outcome, RecoveryId, RunId, ToolCall};
use rekindle::core::layout;
use rekindle::core::lifecycle::{Event, apply};
use rekindle::fleet::coordinator::{self, CoordinatorOptions};
use rekindle::fleet::runner::Stopped;
use rekindle::fleet::worker::{self, WorkerOptions, WorkerStats};
use rekindle::fleet::{self, Agent, Node};
use rekindle::host::config::Config;
use rekindle::host::{CommandTools, ToolContext, ToolDefinition, ToolOutput, Tools};
use rekindle::store::index::{self};
use rekindle::store::lease::{self, Holder, LeaseError};
use rekindle::store::log::LogDir;
use rekindle::store::recovery::{self};
use rekindle::store::{Backend, Store};

use common::crash::Crashable;

// ---------------------------------------------------------------------------------------
// The pure transition function.

fn fresh_record() -> RecoveryRecord {
    RecoveryRecord {
        format: 1,
        kind: "recovery".into(),
        recovery_id: RecoveryId::new("rec"),
        source_run: RunId::new("src"),
        source_generation: 3,
        source_digest: "d".into(),
        source_base: None,
        source_epoch: Epoch(1),
        state: RecoveryState::Admitted,
        force: false,
        attempts: 0,
        failures: 0,
        last_error: None,
        assigned_to: None,
        result: None,
        session_id: None,
        fingerprint_sha256: "fp".into(),
        admitted_at_ms: 0,
        updated_at_ms: 0,
        parked_at: None,
        abandoned_by: None,
        declined_by: None,
    }
}

fn result() -> RecoveryResult {
    RecoveryResult {
        outcome: Outcome::Completed,
        message: "done".into(),
        final_generation: 9,
    }
}

const WORKERS: [&str; 2] = ["w1", "w2"];

/// An attempt number standing for "the attempt running now"; any other value is stale.
const CURRENT: u32 = u32::MAX;

/// `event` with its attempt number resolved against `record`: the current attempt, or one
/// before it (a stale attempt's late outcome).
fn resolve(event: &Event, record: &RecoveryRecord) -> Event {
    let mut event = event.clone();
    if let Event::Yield { attempt, .. }
    | Event::Park { attempt, .. }
    | Event::Fail { attempt, .. }
    | Event::Abandon { attempt, .. }
    | Event::Finish { attempt, .. } = &mut event
    {
        *attempt = if *attempt == CURRENT {
            record.attempts
        } else {
            record.attempts.wrapping_sub(1)
        };
    }
    event
}

fn is_stale(event: &Event) -> bool {
    matches!(
        event,
        Event::Yield { attempt, .. }
            | Event::Park { attempt, .. }
            | Event::Fail { attempt, .. }
            | Event::Abandon { attempt, .. }
            | Event::Finish { attempt, .. } if *attempt != CURRENT
    )
}

fn any_event() -> impl Strategy<Value = Event> {
    let worker = prop::sample::select(WORKERS.to_vec()).prop_map(str::to_owned);
    // Mostly the current attempt; now and then a stale one.
    let attempt = prop_oneof![4 => Just(CURRENT), 1 => Just(0u32)];
    prop_oneof![
        worker.clone().prop_map(|worker| Event::Assign { worker }),
        worker.clone().prop_map(|worker| Event::Start { worker }),
        worker.clone().prop_map(|worker| Event::Decline { worker }),
        (worker.clone(), attempt.clone(), any::<bool>()).prop_map(
            |(worker, attempt, keep_assignment)| Event::Yield {
                worker,
                attempt,
                keep_assignment
            }
        ),
        (worker.clone(), attempt.clone()).prop_map(|(worker, attempt)| Event::Park {
            worker,
            attempt,
            generation: 7
        }),
        Just(Event::Answer),
        (worker.clone(), attempt.clone()).prop_map(|(worker, attempt)| Event::Fail {
            worker,
            attempt,
            error: "boom".into()
        }),
        (worker.clone(), attempt.clone())
            .prop_map(|(worker, attempt)| Event::Abandon { worker, attempt }),
        (worker, attempt).prop_map(|(worker, attempt)| Event::Finish {
            worker,
            attempt,
            result: result()
        }),
        (0u32..4).prop_map(|max_failures| Event::DeadLetter { max_failures }),
    ]
}

/// Drives a record to an end the way a healthy fleet would: answer, abandon a dead attempt,
/// assign, start, finish. Returns the events used.
fn drive_to_end(mut record: RecoveryRecord) -> (RecoveryRecord, usize) {
    let mut steps = 0;
    while !record.state.is_terminal() {
        let event = match record.state {
            RecoveryState::Parked => Event::Answer,
            RecoveryState::Running => Event::Abandon {
                worker: record.assigned_to.clone().unwrap_or_default(),
                attempt: record.attempts,
            },
            RecoveryState::Admitted if record.assigned_to.is_none() => Event::Assign {
                worker: "w1".into(),
            },
            RecoveryState::Admitted => Event::Start {
                worker: record.assigned_to.clone().unwrap_or_default(),
            },
            RecoveryState::Finished | RecoveryState::DeadLettered => unreachable!(),
        };
        let event = match (&event, record.state) {
            // A started attempt finishes.
            (Event::Abandon { worker, attempt }, RecoveryState::Running) if steps > 0 => {
                Event::Finish {
                    worker: worker.clone(),
                    attempt: *attempt,
                    result: result(),
                }
            }
            _ => event,
        };
        record = apply(&record, &event, 1).expect("the healthy path applies");
        steps += 1;
        assert!(steps < 10, "no end after {steps} events: {record:?}");
    }
    (record, steps)
}

proptest! {
    // Proves, over random event sequences: no event leaves a terminal state; `abandoned_by`
    // names a worker only after an abandoned attempt; `declined_by` only after a Decline of
    // an offer to that worker, until the next start; `failures`
    // counts exactly the accepted Fail and Abandon events (yields, parks and hand-backs never
    // count); `attempts` counts accepted starts; dead-lettering happens only from Admitted
    // (no live attempt) and only after enough failures; and from every reachable record a
    // healthy fleet reaches an end in a few events.
    #[test]
    fn transitions_keep_the_lifecycle_rules(events in prop::collection::vec(any_event(), 0..60)) {
        let mut record = fresh_record();
        let (mut failures, mut starts) = (0u32, 0u32);
        for template in &events {
            let before = record.clone();
            let event = &resolve(template, &record);
            match apply(&record, event, 7) {
                Ok(next) => {
                    prop_assert!(!before.state.is_terminal(), "{event:?} left terminal {before:?}");
                    // A stale attempt's outcome never changes the record.
                    prop_assert!(!is_stale(template), "stale {event:?} applied to {before:?}");
                    match event {
                        Event::Fail { .. } | Event::Abandon { .. } => failures += 1,
                        Event::Start { worker } => {
                            starts += 1;
                            // Only the worker offered it starts it, or any worker a fresh
                            // admission nobody was offered; either way it is then that
                            // worker's.
                            let fresh = before.assigned_to.is_none()
                                && before.declined_by.is_none()
                                && before.attempts == 0
                                && before.failures == 0;
                            prop_assert!(
                                fresh || before.assigned_to.as_deref() == Some(worker.as_str()),
                                "{event:?} started {before:?}"
                            );
                            prop_assert_eq!(next.assigned_to.as_deref(), Some(worker.as_str()));
                        }
                        Event::DeadLetter { max_failures } => {
                            prop_assert_eq!(before.state, RecoveryState::Admitted);
                            prop_assert!(before.failures >= *max_failures);
                        }
                        _ => {}
                    }
                    if next.state == RecoveryState::Running {
                        prop_assert!(next.assigned_to.is_some());
                    }
                    // `abandoned_by` names the worker of the last attempt only if that attempt
                    // was abandoned; any other end of an attempt clears it.
                    let expected = match event {
                        Event::Abandon { worker, .. } => Some(worker.clone()),
                        Event::Yield { .. }
                        | Event::Park { .. }
                        | Event::Fail { .. }
                        | Event::Finish { .. } => None,
                        _ => before.abandoned_by.clone(),
                    };
                    prop_assert_eq!(&next.abandoned_by, &expected);
                    // `declined_by` names the worker of the last Decline, which applies only to
                    // an offer to that very worker not yet started, and leaves it offered to
                    // nobody; a Start clears it; nothing else touches it.
                    let declined = match event {
                        Event::Decline { worker } => {
                            prop_assert_eq!(before.state, RecoveryState::Admitted);
                            prop_assert_eq!(before.assigned_to.as_deref(), Some(worker.as_str()));
                            prop_assert_eq!(&next.assigned_to, &None);
                            Some(worker.clone())
                        }
                        Event::Start { .. } => None,
                        _ => before.declined_by.clone(),
                    };
                    prop_assert_eq!(&next.declined_by, &declined);
                    record = next;
                }
                Err(refused) => {
                    prop_assert_eq!(refused.state, before.state);
                    prop_assert_eq!(&record, &before);
                }
            }
            prop_assert_eq!(record.failures, failures);
            prop_assert_eq!(record.attempts, starts);
        }
        let (end, _) = drive_to_end(record);
        prop_assert!(end.state.is_terminal());
    }
}

// Reviewer's finding: an assignment decided on a cached record was re-applied to whatever
// the record had become (a reread after the swap failed), so a decision on a stale view could
// move an offer away from the worker about to start it, or give a recovery one more attempt
// than its failures allow. Decided on a version, it now lands only on that version.
#[tokio::test]
async fn an_assignment_lands_only_on_the_version_it_was_decided_on() {
    use rekindle::fleet::lifecycle::{transition, transition_as_observed};
    let store = Store::memory(rekindle::clock::SystemClock::shared());
    let fresh = fresh_record();
    let id = fresh.recovery_id.clone();
    let etag = store
        .create(
            &layout::recovery(id.as_str()),
            layout::encode_object(&fresh),
        )
        .await
        .unwrap();
    let assign = |worker: &str| Event::Assign {
        worker: worker.into(),
    };
    // Someone else's assignment lands first.
    let (offered, offered_etag) = transition(&store, &id, None, assign("w1")).await.unwrap();
    assert_eq!(offered.assigned_to.as_deref(), Some("w1"));
    // The decision made on the fresh version is void now, and changes nothing.
    let void = transition_as_observed(&store, &id, (fresh.clone(), etag), assign("w2"))
        .await
        .unwrap();
    assert!(void.is_none(), "{void:?}");
    let (now, now_etag) = rekindle::store::recovery::read(&store, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.assigned_to.as_deref(), Some("w1"));
    assert_eq!(now_etag, offered_etag);
    // On the version it saw, it lands.
    let (moved, _) = transition_as_observed(&store, &id, (now, now_etag), assign("w2"))
        .await
        .unwrap()
        .expect("decided on the current version");
    assert_eq!(moved.assigned_to.as_deref(), Some("w2"));
}

// Proves a fresh admission nobody was offered may be started by any worker and is then
// that worker's, and that nothing else may be started without an offer: one offered to
// another worker, one declined, one that ran and was handed back, one that failed.
#[test]
fn only_a_fresh_admission_starts_without_an_offer() {
    let start = |worker: &str| Event::Start {
        worker: worker.into(),
    };
    let fresh = fresh_record();
    let started = apply(&fresh, &start("any"), 1).expect("a fresh admission is claimable");
    assert_eq!(started.state, RecoveryState::Running);
    assert_eq!(started.assigned_to.as_deref(), Some("any"));
    assert_eq!(started.attempts, 1);
    let offered = apply(
        &fresh,
        &Event::Assign {
            worker: "w1".into(),
        },
        1,
    )
    .unwrap();
    assert!(apply(&offered, &start("w2"), 1).is_err());
    let declined = apply(
        &offered,
        &Event::Decline {
            worker: "w1".into(),
        },
        1,
    )
    .unwrap();
    assert!(apply(&declined, &start("w2"), 1).is_err());
    let ran = apply(&offered, &start("w1"), 1).unwrap();
    let handed_back = Event::Yield {
        worker: "w1".into(),
        attempt: 1,
        keep_assignment: false,
    };
    let yielded = apply(&ran, &handed_back, 1).unwrap();
    assert_eq!(yielded.assigned_to, None);
    assert!(apply(&yielded, &start("w2"), 1).is_err());
    let fail = Event::Fail {
        worker: "w1".into(),
        attempt: 1,
        error: "x".into(),
    };
    let failed = apply(&ran, &fail, 1).unwrap();
    assert!(apply(&failed, &start("w2"), 1).is_err());
}

// Proves every state is reachable from a fresh admission, and that a dead-lettered or
// finished record refuses every event (a stale coordinator cannot reopen it).
#[test]
fn every_state_is_reachable_and_terminal_states_refuse_everything() {
    let events: Vec<Event> = WORKERS
        .iter()
        .flat_map(|w| {
            let worker = (*w).to_owned();
            vec![
                Event::Assign {
                    worker: worker.clone(),
                },
                Event::Start {
                    worker: worker.clone(),
                },
                Event::Yield {
                    worker: worker.clone(),
                    attempt: CURRENT,
                    keep_assignment: true,
                },
                Event::Park {
                    worker: worker.clone(),
                    attempt: CURRENT,
                    generation: 7,
                },
                Event::Fail {
                    worker: worker.clone(),
                    attempt: CURRENT,
                    error: "x".into(),
                },
                Event::Abandon {
                    worker: worker.clone(),
                    attempt: CURRENT,
                },
                Event::Finish {
                    worker,
                    attempt: CURRENT,
                    result: result(),
                },
            ]
        })
        .chain([Event::Answer, Event::DeadLetter { max_failures: 1 }])
        .collect();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut frontier = vec![fresh_record()];
    let mut visited = 0;
    while let Some(record) = frontier.pop() {
        visited += 1;
        assert!(visited < 10_000, "the state space should be small");
        let key = format!(
            "{:?}",
            (record.state, &record.assigned_to, record.failures.min(2))
        );
        if !seen.insert(key) || record.failures > 2 {
            continue;
        }
        for template in &events {
            let event = &resolve(template, &record);
            match apply(&record, event, 1) {
                Ok(next) => frontier.push(next),
                Err(refused) => assert_eq!(refused.state, record.state),
            }
            if record.state.is_terminal() {
                assert!(
                    apply(&record, event, 1).is_err(),
                    "{event:?} reopened {record:?}"
                );
            }
        }
    }
    let states: BTreeSet<&str> = seen
        .iter()
        .map(|key| {
            key.split(',')
                .next()
                .unwrap_or_default()
                .trim_start_matches('(')
        })
        .collect();
    for state in ["Admitted", "Running", "Parked", "Finished", "DeadLettered"] {
        assert!(states.contains(state), "{state} unreachable: {states:?}");
    }
}

// Regression (finding 13): an assignment decided before a recovery finished never reopens
// it — Assign on a finished record is refused.
#[test]
fn assign_never_reopens_a_finished_record() {
    let mut record = fresh_record();
    record.state = RecoveryState::Finished;
    record.result = Some(result());
    let refused = apply(
        &record,
        &Event::Assign {
            worker: "w1".into(),
        },
        1,
    )
    .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "recovery 'rec' is finished; cannot assign it: the recovery has ended"
    );
}

// ---------------------------------------------------------------------------------------
// A fleet in one process, on virtual time.

/// A clock on tokio's (paused) virtual time, shared by every simulated process.
#[derive(Debug)]
struct VirtualClock {
    start: tokio::time::Instant,
    nonces: AtomicU64,
}

impl Clock for VirtualClock {
    fn wall_ms(&self) -> u64 {
        1_700_000_000_000 + self.start.elapsed().as_millis() as u64
    }
    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
    fn nonce(&self) -> String {
        format!("nonce-{:08}", self.nonces.fetch_add(1, Ordering::SeqCst))
    }
}

/// Every tool execution: (run, call, epoch).
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<(String, String, u64)>>>);

impl Ledger {
    fn calls(&self, run: &str) -> Vec<(String, u64)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _, _)| r == run || r == recovery_id_for(&RunId::new(run)).as_str())
            .map(|(_, call, epoch)| (call.clone(), *epoch))
            .collect()
    }
}

/// Tools that run in-process (a child process would make the virtual clock jump) and
/// record each execution.
struct LedgerTools {
    declared: CommandTools,
    ledger: Ledger,
    delay: Duration,
}

#[async_trait]
impl Tools for LedgerTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        self.declared.definitions()
    }
    fn needs_confirmation(&self, name: &str) -> bool {
        self.declared.needs_confirmation(name)
    }
    async fn call(&self, call: &ToolCall, context: &ToolContext) -> ToolOutput {
        self.ledger.0.lock().unwrap().push((
            context.run_id.clone(),
            call.id.as_str().to_owned(),
            context.epoch.get(),
        ));
        rekindle::clock::sleep(self.delay).await;
        ToolOutput {
            output: "ok".into(),
            is_error: false,
            duration_ms: self.delay.as_millis() as u64,
        }
    }
}

struct Harness {
    dir: tempfile::TempDir,
    clock: Arc<VirtualClock>,
    bucket: Arc<InMemory>,
    ledger: Ledger,
    agent: Agent,
    /// Steps each run takes: one tool call each.
    steps: usize,
}

const TTL: Duration = Duration::from_millis(900);

impl Harness {
    /// A run of `steps` tool calls; the call at `confirm_at` (0-based) needs a human's
    /// approval first.
    fn new(steps: usize, steps_per_resume: u32, confirm_at: Option<usize>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let turns: Vec<serde_json::Value> = (0..steps)
            .map(|i| {
                let tool = if Some(i) == confirm_at { "approve" } else { "record" };
                serde_json::json!({"content": format!("step {i}"), "tool_calls": [{"name": tool, "arguments": {}}]})
            })
            .collect();
        std::fs::write(
            dir.path().join("script.json"),
            serde_json::to_vec(&turns).unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("rekindle.toml"),
            format!(
                "[model]\nkind = \"scripted\"\nname = \"m\"\nscript = \"script.json\"\n[budgets]\nsteps_per_resume = {steps_per_resume}\n[[tools]]\nname = \"record\"\ncommand = [\"true\"]\n[[tools]]\nname = \"approve\"\ncommand = [\"true\"]\nconfirm = true\n"
            ),
        )
        .unwrap();
        let config = Config::load(&dir.path().join("rekindle.toml")).unwrap();
        let mut agent = Agent::from_config(config.clone()).unwrap();
        let ledger = Ledger::default();
        agent.tools = Arc::new(LedgerTools {
            declared: CommandTools::new(config.tools.clone()),
            ledger: ledger.clone(),
            delay: Duration::from_millis(5),
        });
        Harness {
            dir,
            clock: Arc::new(VirtualClock {
                start: tokio::time::Instant::now(),
                nonces: AtomicU64::new(0),
            }),
            bucket: Arc::new(InMemory::new()),
            ledger,
            agent,
            steps,
        }
    }

    /// Every tool call takes `delay` (virtual time).
    fn with_tool_delay(mut self, delay: Duration) -> Harness {
        let tools = self.agent.config.tools.clone();
        self.agent.tools = Arc::new(LedgerTools {
            declared: CommandTools::new(tools),
            ledger: self.ledger.clone(),
            delay,
        });
        self
    }

    fn store_over(&self, inner: Arc<dyn ObjectStore>) -> Store {
        Store::from_parts(
            inner,
            Backend::Memory,
            "memory://lifecycle",
            "",
            common::fast_retry(),
            self.clock.clone(),
        )
    }

    /// A healthy process's view of the bucket.
    fn store(&self) -> Store {
        self.store_over(self.bucket.clone())
    }

    /// A process's view that can be killed at a chosen write.
    fn crashable(&self) -> (Store, Arc<Crashable>) {
        let crashable = Crashable::new(self.bucket.clone());
        (self.store_over(crashable.clone()), crashable)
    }

    fn node(&self, store: &Store, id: &str, ttl: Duration) -> Node {
        Node {
            store: store.clone(),
            agent: self.agent.clone(),
            logs: LogDir::open(self.dir.path().join(format!("logs-{id}"))).unwrap(),
            holder: Holder::new(store, id, ttl),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    fn worker_options(&self, id: &str) -> WorkerOptions {
        WorkerOptions {
            id: id.into(),
            concurrency: 4,
            queue: 4,
            ttl: TTL,
            poll_interval: Duration::from_millis(100),
            shutdown_deadline: Duration::from_secs(5),
            crash: None,
            idle_ttl: None,
            wake: None,
            readiness: None,
        }
    }

    fn spawn_worker(
        &self,
        store: &Store,
        options: WorkerOptions,
        stop: &Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<rekindle::Result<()>> {
        let logs = LogDir::open(self.dir.path().join(format!("logs-{}", options.id))).unwrap();
        tokio::spawn(worker::run(
            store.clone(),
            self.agent.clone(),
            logs,
            options,
            Arc::clone(stop),
            Arc::new(WorkerStats::default()),
        ))
    }

    fn spawn_coordinator(
        &self,
        store: &Store,
        id: &str,
        ttl: Duration,
        max_attempts: u32,
        stop: &Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        self.spawn_sharing_coordinator(store, id, ttl, max_attempts, None, stop)
    }

    fn spawn_sharing_coordinator(
        &self,
        store: &Store,
        id: &str,
        ttl: Duration,
        max_attempts: u32,
        partitions: Option<u32>,
        stop: &Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let options = CoordinatorOptions {
            id: id.into(),
            ttl,
            scan_interval: Duration::from_millis(200),
            idle_scan_interval: Duration::from_millis(200),
            watch_interval: Duration::from_millis(200),
            wake: None,
            readiness: None,
            partitions,
            max_attempts,
        };
        let store = store.clone();
        let stop = Arc::clone(stop);
        tokio::spawn(async move {
            coordinator::run(store, options, stop).await.unwrap();
        })
    }

    /// Starts a host run that dies (kill -9) right after its `after`th tool call.
    async fn crashed_host(&self, run: &str, after: usize) {
        let (store, crashable) = self.crashable();
        let node = self.node(&store, &format!("host-{run}"), TTL);
        node.holder.beat().await.unwrap();
        let beating = node
            .holder
            .spawn_heartbeat(Arc::new(AtomicBool::new(false)));
        let id = RunId::new(run);
        let task = tokio::spawn(async move { node.start_run(&id, None, "go").await });
        while self.ledger.calls(run).len() < after {
            rekindle::clock::sleep(Duration::from_millis(1)).await;
        }
        crashable.crash();
        task.abort();
        beating.abort();
    }

    /// Admits a recovery of `run` (taking over its dead host) and offers it to `worker`.
    async fn admit_and_assign(&self, run: &str, worker: &str) -> RecoveryId {
        let store = self.store();
        let holder = Holder::new(&store, "cli", TTL);
        let id = recovery_id_for(&RunId::new(run));
        admission::admit(&store, &holder, &RunId::new(run), &id, false, Takeover::Now)
            .await
            .unwrap();
        let assign = Event::Assign {
            worker: worker.into(),
        };
        lifecycle::transition(&store, &id, None, assign)
            .await
            .unwrap();
        id
    }

    /// Waits (virtual time) until `check` holds, failing after `limit`.
    async fn until<F: std::future::Future<Output = bool>>(
        &self,
        limit: Duration,
        what: &str,
        mut check: impl FnMut() -> F,
    ) {
        let start = tokio::time::Instant::now();
        while !check().await {
            assert!(start.elapsed() < limit, "timed out waiting for {what}");
            rekindle::clock::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn record(&self, run: &str) -> Option<RecoveryRecord> {
        recovery::read(&self.store(), &recovery_id_for(&RunId::new(run)))
            .await
            .unwrap()
            .map(|(r, _)| r)
    }

    /// Each call ran at most once per interruption of its run's lineage, and every call of
    /// the script ran.
    fn audit(&self, run: &str, interruptions: usize) {
        let mut runs: BTreeMap<String, usize> = BTreeMap::new();
        for (call, _) in self.ledger.calls(run) {
            *runs.entry(call).or_default() += 1;
        }
        assert_eq!(runs.len(), self.steps, "calls that ran: {runs:?}");
        let repeats: usize = runs.values().map(|n| n - 1).sum();
        assert!(
            repeats <= interruptions,
            "{repeats} repeated calls for {interruptions} interruptions: {runs:?}"
        );
    }
}

// Proves a recovery waiting in a worker's queue is not starved by a long one ahead of it:
// with one slot and both offered to the worker, the long one gives its slot up at each step
// cap while the other waits, so the two take turns (before, the first ran every resume back
// to back, and the second, queued on a worker that never looked free, waited for all of it).
#[tokio::test(start_paused = true)]
async fn a_queued_recovery_gets_a_turn_at_the_step_cap() {
    let harness = Harness::new(24, 2, None);
    harness.crashed_host("first", 1).await;
    harness.crashed_host("second", 1).await;
    let first = harness.admit_and_assign("first", "w1").await;
    harness.admit_and_assign("second", "w1").await;
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 2, &stop);
    let mut options = harness.worker_options("w1");
    options.concurrency = 1;
    options.queue = 1;
    let worker = harness.spawn_worker(&store, options, &stop);
    let start = tokio::time::Instant::now();
    let second_started_early = loop {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "first never finished"
        );
        let (one, two) = (
            harness.record("first").await,
            harness.record("second").await,
        );
        let (one, two) = (one.unwrap(), two.unwrap());
        if one.state == RecoveryState::Finished {
            break two.attempts > 0;
        }
        if two.attempts > 0 {
            break true;
        }
        rekindle::clock::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        second_started_early,
        "{first} ran to its end before the queued recovery got a turn"
    );
    harness
        .until(
            Duration::from_secs(240),
            "both recoveries to end",
            || async {
                let done = |r: Option<RecoveryRecord>| {
                    r.is_some_and(|r| r.state == RecoveryState::Finished)
                };
                done(harness.record("first").await) && done(harness.record("second").await)
            },
        )
        .await;
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
    harness.audit("first", 1);
    harness.audit("second", 1);
}

// Regression (finding 3): a recovery that makes progress is never dead-lettered. With a
// step cap of 2 steps per resume, a 24-step recovery yields a dozen times; counting those
// yields as attempts dead-lettered it at max_attempts 2.
#[tokio::test(start_paused = true)]
async fn long_recovery_yielding_at_the_step_cap_is_never_dead_lettered() {
    let harness = Harness::new(24, 2, None);
    harness.crashed_host("long", 1).await;
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 2, &stop);
    let worker = harness.spawn_worker(&store, harness.worker_options("w1"), &stop);
    harness
        .until(Duration::from_secs(120), "the recovery to end", || async {
            harness
                .record("long")
                .await
                .is_some_and(|r| r.state.is_terminal())
        })
        .await;
    let record = harness.record("long").await.unwrap();
    assert_eq!(record.state, RecoveryState::Finished, "{record:?}");
    assert_eq!(record.failures, 0);
    assert!(record.attempts > 2, "{record:?}");
    harness.audit("long", 1);
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

// Regression (issue 30's fifth scenario): a worker's Start that landed but answered an error
// (its response lost, and the retries refused in a brownout) made the worker take the running
// record for an earlier incarnation's and hand it back: a failure counted for nothing, the
// attempt run again. It reads the record and runs the attempt its own start began.
#[tokio::test(start_paused = true)]
async fn a_start_that_landed_but_answered_an_error_is_run() {
    let harness = Harness::new(4, 32, None);
    harness.crashed_host("lost-start", 1).await;
    let id = harness.admit_and_assign("lost-start", "w1").await;
    let store = harness.store();
    let (worker_store, crashable) = harness.crashable();
    // The worker's first write to the record is its start: it lands, its answer is lost,
    // and every retry of it fails (fast_retry retries 12 times).
    crashable.lose_answer(&layout::recovery(id.as_str()), 12);
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    let worker = harness.spawn_worker(&worker_store, harness.worker_options("w1"), &stop);
    harness
        .until(
            Duration::from_secs(60),
            "the recovery to finish",
            || async {
                harness
                    .record("lost-start")
                    .await
                    .is_some_and(|record| record.state.is_terminal())
            },
        )
        .await;
    let record = harness.record("lost-start").await.unwrap();
    assert_eq!(record.state, RecoveryState::Finished);
    assert_eq!(
        (record.attempts, record.failures),
        (1, 0),
        "the worker gave up the attempt its own start began"
    );
    harness.audit("lost-start", 1);
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

// Regression (finding 3): dead-lettering never overwrites a running attempt. The
// coordinator decided on the Admitted version; a worker started an attempt before the
// write: the compare-and-swap rereads, and the Running record refuses.
#[tokio::test(start_paused = true)]
async fn dead_letter_never_overwrites_a_running_attempt() {
    let harness = Harness::new(4, 32, None);
    harness.crashed_host("contested", 1).await;
    let store = harness.store();
    let id = harness.admit_and_assign("contested", "w1").await;
    let w = || "w1".to_string();
    for _ in 0..3 {
        let (started, _) = lifecycle::transition(&store, &id, None, Event::Start { worker: w() })
            .await
            .unwrap();
        lifecycle::transition(
            &store,
            &id,
            None,
            Event::Fail {
                worker: w(),
                attempt: started.attempts,
                error: "boom".into(),
            },
        )
        .await
        .unwrap();
        lifecycle::transition(&store, &id, None, Event::Assign { worker: w() })
            .await
            .unwrap();
    }
    let decided_on = recovery::read(&store, &id).await.unwrap().unwrap();
    assert_eq!(decided_on.0.failures, 3);
    lifecycle::transition(&store, &id, None, Event::Start { worker: w() })
        .await
        .unwrap();
    let error = lifecycle::transition(
        &store,
        &id,
        Some(decided_on),
        Event::DeadLetter { max_failures: 3 },
    )
    .await
    .unwrap_err();
    assert!(matches!(error, LifecycleError::Refused(_)), "{error}");
    let (now, _) = recovery::read(&store, &id).await.unwrap().unwrap();
    assert_eq!(now.state, RecoveryState::Running);
}

// Regression (finding 4): a worker killed -9 at any write of a recovery attempt — between
// the terminal commit, the record and the index entry included — strands nothing: another
// worker and the coordinator finish the recovery, the record ends Finished, the index entry
// is gone, and no call ran more than once per interruption.
#[tokio::test(start_paused = true)]
async fn a_worker_killed_at_every_write_of_an_attempt_strands_nothing() {
    // Count the writes of one worker's whole life through an uninterrupted attempt first.
    let writes = {
        let harness = Harness::new(3, 32, None);
        harness.crashed_host("count", 1).await;
        let store = harness.store();
        let stop = Arc::new(AtomicBool::new(false));
        let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
        let measured = harness.store();
        let worker = harness.spawn_worker(&measured, harness.worker_options("w1"), &stop);
        harness
            .until(Duration::from_secs(60), "the measured attempt", || async {
                harness
                    .record("count")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            })
            .await;
        stop.store(true, Ordering::SeqCst);
        worker.await.unwrap().unwrap();
        coordinator.await.unwrap();
        let metrics = measured.metrics();
        metrics.put + metrics.conditional_put + metrics.delete
    };
    assert!(writes > 5, "an attempt makes {writes} writes");
    for crash_at in 1..=writes as i64 {
        for lands in [false, true] {
            let harness = Harness::new(3, 32, None);
            let run = format!("boundary-{crash_at}-{lands}");
            harness.crashed_host(&run, 1).await;
            let store = harness.store();
            let stop = Arc::new(AtomicBool::new(false));
            let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
            // The first worker dies at the chosen write of its attempt.
            // The first worker dies at its `crash_at`th write (counted from its start).
            let (doomed, crashable) = harness.crashable();
            crashable.crash_at_write(crash_at, lands);
            let mut options = harness.worker_options("doomed");
            let crash = Arc::new(AtomicBool::new(false));
            options.crash = Some(Arc::clone(&crash));
            let first = harness.spawn_worker(&doomed, options, &stop);
            harness
                .until(Duration::from_secs(60), "the crash", || async {
                    crashable.crashed()
                        || harness
                            .record(&run)
                            .await
                            .is_some_and(|r| r.state == RecoveryState::Finished)
                })
                .await;
            crash.store(true, Ordering::SeqCst);
            first.abort();
            let second = harness.spawn_worker(&store, harness.worker_options("rescuer"), &stop);
            harness
                .until(
                    Duration::from_secs(120),
                    &format!("crash at write {crash_at} (lands {lands}) to be repaired"),
                    || async {
                        let finished = harness
                            .record(&run)
                            .await
                            .is_some_and(|r| r.state == RecoveryState::Finished);
                        let indexed = index::read(&store, &RunId::new(run.as_str()))
                            .await
                            .unwrap()
                            .is_some();
                        finished && !indexed
                    },
                )
                .await;
            harness.audit(&run, 2);
            stop.store(true, Ordering::SeqCst);
            second.await.unwrap().unwrap();
            coordinator.await.unwrap();
        }
    }
}

// Regression (finding 5): a parked recovery is not re-run from a worker's stale inbox: no
// new attempt, no new lease epoch, no fence generation per poll.
#[tokio::test(start_paused = true)]
async fn a_parked_recovery_is_not_rerun_from_a_stale_inbox() {
    let harness = Harness::new(4, 32, Some(2));
    harness.crashed_host("parks", 1).await;
    let store = harness.store();
    let id = harness.admit_and_assign("parks", "w1").await;
    // No coordinator: the inbox keeps listing the recovery after it parks.
    let inbox = serde_json::json!({"format": 1, "kind": "inbox", "worker": "w1", "recoveries": [id.as_str()]});
    store
        .put(
            &layout::inbox("w1"),
            bytes::Bytes::from(serde_json::to_vec(&inbox).unwrap()),
        )
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = harness.spawn_worker(&store, harness.worker_options("w1"), &stop);
    harness
        .until(Duration::from_secs(60), "the recovery to park", || async {
            harness
                .record("parks")
                .await
                .is_some_and(|r| r.state == RecoveryState::Parked)
        })
        .await;
    let run = RunId::new(id.as_str());
    let epoch = lease::read_lease(&store, &run)
        .await
        .unwrap()
        .unwrap()
        .lease
        .epoch;
    let generation = rekindle::store::generation::load(&store, &run, None)
        .await
        .unwrap()
        .generation;
    // Many polls later.
    rekindle::clock::sleep(Duration::from_secs(5)).await;
    let record = harness.record("parks").await.unwrap();
    assert_eq!((record.state, record.attempts), (RecoveryState::Parked, 1));
    assert_eq!(
        lease::read_lease(&store, &run)
            .await
            .unwrap()
            .unwrap()
            .lease
            .epoch,
        epoch
    );
    assert_eq!(
        rekindle::store::generation::load(&store, &run, None)
            .await
            .unwrap()
            .generation,
        generation
    );
    assert_eq!(
        index::read(&store, &RunId::new("parks"))
            .await
            .unwrap()
            .unwrap()
            .phase,
        Phase::Parked
    );
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
}

// Regression (finding 10): starting a run under an ID that exists (here a completed run)
// is refused before anything is written: its lease and index stay exactly as they were.
#[tokio::test(start_paused = true)]
async fn a_refused_start_writes_nothing() {
    let harness = Harness::new(2, 32, None);
    let store = harness.store();
    let node = harness.node(&store, "host-1", TTL);
    node.holder.beat().await.unwrap();
    let run = RunId::new("taken-id");
    let stopped = node.start_run(&run, None, "go").await.unwrap();
    assert!(matches!(stopped, Stopped::Finished(_)));
    let before = lease::read_lease(&store, &run).await.unwrap().unwrap();
    let again = harness.node(&store, "host-2", TTL);
    again.holder.beat().await.unwrap();
    let error = again.start_run(&run, None, "go").await.unwrap_err();
    assert!(
        matches!(error, rekindle::Error::Lease(LeaseError::Exists { .. })),
        "{error}"
    );
    assert!(error.to_string().contains("already exists"), "{error}");
    let after = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert_eq!(after.etag, before.etag, "the lease was changed");
    assert!(index::read(&store, &run).await.unwrap().is_none());
    // And the coordinator finds nothing to do.
    let coordinator = Holder::new(&store, "c", TTL);
    let options = CoordinatorOptions {
        id: "c".into(),
        ttl: TTL,
        scan_interval: Duration::from_millis(100),
        idle_scan_interval: Duration::from_millis(100),
        watch_interval: Duration::from_millis(100),
        wake: None,
        readiness: None,
        partitions: None,
        max_attempts: 5,
    };
    let actions = coordinator::tick_once(&store, &coordinator, &options)
        .await
        .unwrap();
    assert!(actions.is_empty(), "{actions:?}");
}

// Regression (finding 11a): the coordinator judges a holder by the TTL the holder declared:
// a live host with a 6 s TTL, beating every 2 s, is never fenced by a coordinator whose own
// TTL is 0.9 s, and none of its calls runs twice.
#[tokio::test(start_paused = true)]
async fn a_live_host_with_a_longer_ttl_is_not_fenced() {
    // Each call takes 0.5 s: the run lasts 3 s, longer than the coordinator's TTL and
    // than the 2 s the host's heartbeat stays unchanged between beats.
    let harness = Harness::new(6, 32, None).with_tool_delay(Duration::from_millis(500));
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    let worker = harness.spawn_worker(&store, harness.worker_options("w1"), &stop);
    let node = harness.node(&store, "patient-host", Duration::from_secs(6));
    node.holder.beat().await.unwrap();
    let host_stop = Arc::new(AtomicBool::new(false));
    let beating = node.holder.spawn_heartbeat(Arc::clone(&host_stop));
    let run = RunId::new("patient");
    let watcher = {
        let store = store.clone();
        let run = run.clone();
        tokio::spawn(async move {
            let mut epochs = BTreeSet::new();
            for _ in 0..40 {
                if let Ok(Some(view)) = lease::read_lease(&store, &run).await {
                    epochs.insert(view.lease.epoch);
                }
                rekindle::clock::sleep(Duration::from_millis(100)).await;
            }
            epochs
        })
    };
    let outcome = {
        let run = run.clone();
        tokio::spawn(async move { node.start_run(&run, None, "go").await })
    };
    let stopped = outcome.await.unwrap().unwrap();
    assert!(matches!(stopped, Stopped::Finished(_)), "{stopped:?}");
    let epochs = watcher.await.unwrap();
    assert!(
        epochs.iter().all(|&e| e == Epoch(1)),
        "the live host was fenced: epochs {epochs:?}"
    );
    assert!(harness.record("patient").await.is_none());
    harness.audit("patient", 0);
    host_stop.store(true, Ordering::SeqCst);
    beating.await.unwrap();
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

// Regression (finding 11b): admitting a recovery of a run whose holder heartbeats normally
// is refused unless the caller takes it over explicitly: the live host is not fenced.
#[tokio::test(start_paused = true)]
async fn recover_refuses_a_live_holder_without_takeover() {
    let harness = Harness::new(2, 32, Some(1));
    let store = harness.store();
    let node = harness.node(&store, "live-host", TTL);
    node.holder.beat().await.unwrap();
    let host_stop = Arc::new(AtomicBool::new(false));
    let beating = node.holder.spawn_heartbeat(Arc::clone(&host_stop));
    let run = RunId::new("alive");
    // The host holds the run's lease and beats.
    let held = node.holder.acquire_new(&run).await.unwrap();
    let cli = Holder::new(&store, "cli", TTL);
    let id = RecoveryId::new("mine");
    let error = fleet::spawn_recovery(&store, &cli, &run, &id, false, Takeover::IfSilent)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            rekindle::Error::Lifecycle(LifecycleError::HolderAlive { .. })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("the takeover option"), "{error}");
    let lease = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert_eq!((lease.lease.epoch, lease.etag), (held.epoch, held.etag));
    assert!(recovery::read(&store, &id).await.unwrap().is_none());
    // Once the host is gone (silent for its TTL), the same call admits.
    host_stop.store(true, Ordering::SeqCst);
    beating.await.unwrap();
    let error = fleet::spawn_recovery(&store, &cli, &run, &id, false, Takeover::IfSilent)
        .await
        .unwrap_err();
    // Nothing was committed: there is nothing to recover, and it says so.
    assert!(
        error.to_string().contains("never made its first commit"),
        "{error}"
    );
}

// Regression (finding 12): a second worker with the ID of a live one refuses to start, and
// its failed start does not remove the live worker's registration or heartbeat.
#[tokio::test(start_paused = true)]
async fn a_second_worker_with_the_same_id_refuses_to_start() {
    let harness = Harness::new(2, 32, None);
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let first = harness.spawn_worker(&store, harness.worker_options("w1"), &stop);
    rekindle::clock::sleep(Duration::from_millis(500)).await;
    let other_stop = Arc::new(AtomicBool::new(false));
    let second = harness.spawn_worker(&store, harness.worker_options("w1"), &other_stop);
    let error = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("a second worker with a live worker's ID must refuse to start, not run")
        .unwrap()
        .unwrap_err();
    assert!(
        error.to_string().contains("in use by another live process"),
        "{error}"
    );
    assert!(store.head(&layout::worker("w1")).await.unwrap().is_some());
    assert!(
        store
            .head(&layout::heartbeat("w1"))
            .await
            .unwrap()
            .is_some()
    );
    // After a clean stop the ID is free at once.
    stop.store(true, Ordering::SeqCst);
    first.await.unwrap().unwrap();
    assert!(
        store
            .head(&layout::heartbeat("w1"))
            .await
            .unwrap()
            .is_none()
    );
    let again_stop = Arc::new(AtomicBool::new(false));
    let again = harness.spawn_worker(&store, harness.worker_options("w1"), &again_stop);
    rekindle::clock::sleep(Duration::from_millis(300)).await;
    assert!(!again.is_finished());
    again_stop.store(true, Ordering::SeqCst);
    again.await.unwrap().unwrap();
}

// Regression (finding 13): a graceful stop hands the recovery back without counting a
// failure, and another worker finishes it.
#[tokio::test(start_paused = true)]
async fn graceful_stop_hands_back_without_a_failure() {
    let harness = Harness::new(12, 32, None);
    harness.crashed_host("handed", 1).await;
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 1, &stop);
    let leaving = Arc::new(AtomicBool::new(false));
    let first = harness.spawn_worker(&store, harness.worker_options("leaving"), &leaving);
    harness
        .until(Duration::from_secs(60), "the first attempt", || async {
            harness.ledger.calls("handed").len() >= 3
        })
        .await;
    leaving.store(true, Ordering::SeqCst);
    first.await.unwrap().unwrap();
    // Handed back, not failed. (The coordinator may have offered it to the leaving worker
    // again while it drained; once that worker's heartbeat is gone it is reassigned.)
    let record = harness.record("handed").await.unwrap();
    assert_eq!(
        (record.state, record.failures),
        (RecoveryState::Admitted, 0),
        "{record:?}"
    );
    let second = harness.spawn_worker(&store, harness.worker_options("staying"), &stop);
    harness
        .until(
            Duration::from_secs(60),
            "the recovery to finish",
            || async {
                harness
                    .record("handed")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    harness.audit("handed", 2);
    stop.store(true, Ordering::SeqCst);
    second.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

// Proves: `recover` without --takeover never fences a holder that took the lease after the
// admission judged it free. The run's lease is released (its host parked); the admission
// reads it, is paused, and meanwhile a live process (an answerer committing the human's
// answer) takes the lease and beats. The admission must refuse, not take the lease over.
#[tokio::test(start_paused = true)]
async fn recover_without_takeover_refuses_a_holder_that_came_after_the_silence_check() {
    use rekindle::store::faults::{FaultPlan, FaultyStore};
    let harness = Harness::new(2, 32, Some(1));
    let store = harness.store();
    // A host whose run parked: it committed, then released the lease.
    let host = harness.node(&store, "host", TTL);
    host.holder.beat().await.unwrap();
    let run = RunId::new("parked");
    let stopped = host.start_run(&run, None, "go").await.unwrap();
    assert!(matches!(stopped, Stopped::Parked(_)), "{stopped:?}");
    host.holder.retire().await.unwrap();
    // The CLI's admission, paused right after it first reads the (released) lease.
    let faulty = FaultyStore::new(harness.bucket.clone(), FaultPlan::default(), 1);
    let cli_store = harness.store_over(faulty.clone());
    let gate = faulty.pause_after_read(&format!("{}/lease", run.as_str()));
    let cli = Holder::new(&cli_store, "cli", TTL);
    let id = RecoveryId::new("by-hand");
    let admission = {
        let (cli_store, cli, run, id) = (cli_store.clone(), cli.clone(), run.clone(), id.clone());
        tokio::spawn(async move {
            fleet::spawn_recovery(&cli_store, &cli, &run, &id, false, Takeover::IfSilent).await
        })
    };
    gate.reached().await;
    // Meanwhile a live process takes the free lease and keeps beating.
    let answerer = Holder::new(&store, "answerer", TTL);
    answerer.beat().await.unwrap();
    let answerer_stop = Arc::new(AtomicBool::new(false));
    let beating = answerer.spawn_heartbeat(Arc::clone(&answerer_stop));
    let held = answerer.acquire(&run).await.unwrap();
    gate.release();
    let outcome = admission.await.unwrap();
    let lease = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert_eq!(
        (lease.lease.holder.as_str(), lease.lease.epoch),
        ("answerer", held.epoch),
        "the live answerer was fenced without --takeover (admission: {outcome:?})"
    );
    let error = outcome.unwrap_err();
    assert!(error.to_string().contains("the takeover option"), "{error}");
    // Refused: no record. (The claim stays: giving it back races an admission of the same
    // ID that the answerer may be completing, see `fleet::answer_run`; the same ID admits
    // later, another ID is refused naming it.)
    assert!(recovery::read(&store, &id).await.unwrap().is_none());
    answerer_stop.store(true, Ordering::SeqCst);
    beating.await.unwrap();
}

// Proves: a worker's next attempt at a recovery fences its earlier attempt even in the same
// process. An attempt whose commit is still in flight fails (its store call gave up) without
// releasing the lease; the same worker is offered the recovery again and re-takes the lease.
// If that returns the same epoch, `RunWriter::resume` writes no fence, the late commit lands
// behind the new attempt's back and the new attempt redoes committed work.
#[tokio::test(start_paused = true)]
async fn a_late_commit_of_an_earlier_attempt_is_fenced_by_the_same_workers_next_attempt() {
    use rekindle::core::fact::{Fact, FactBody, ModelTurn, Seq};
    use rekindle::store::faults::{FaultPlan, FaultyStore};
    use rekindle::store::generation::{RunWriter, SnapshotPolicy};
    let harness = Harness::new(2, 32, None);
    let store = harness.store();
    let policy = SnapshotPolicy::default();
    let holder = Holder::new(&store, "w1", TTL);
    holder.beat().await.unwrap();
    let run = RunId::new("recovery-run");
    // Attempt 1 takes the recovery run's lease and seeds the run.
    let first = holder
        .acquire_or_wait_from(&run, Epoch(2), TTL / 4, TTL * 3)
        .await
        .unwrap();
    let facts = fleet::opening_facts(&run, None, &harness.agent, "go", 0);
    // The worker writes as itself, as `Node` does: resuming at its own epoch is its holding.
    RunWriter::create_as(
        &store.writing_as("w1"),
        run.clone(),
        facts,
        first.epoch,
        policy,
    )
    .await
    .unwrap();
    // Its next commit goes over a slow link and lands 2 s after it was sent.
    let slow = FaultyStore::new(
        harness.bucket.clone(),
        FaultPlan {
            detached_write_delay: Duration::from_secs(2),
            ..FaultPlan::default()
        },
        1,
    );
    let mut late = RunWriter::resume(
        &harness.store_over(slow).writing_as("w1"),
        &run,
        first.epoch,
        policy,
    )
    .await
    .unwrap();
    let turn = Fact {
        seq: Seq(3),
        at_ms: 1,
        body: FactBody::ModelTurn(ModelTurn {
            content: Some("late".into()),
            tool_calls: Vec::new(),
            reasoning: None,
            usage: Default::default(),
        }),
    };
    let in_flight = tokio::spawn(async move { late.commit(vec![turn]).await });
    rekindle::clock::sleep(Duration::from_millis(100)).await;
    // Attempt 1 is given up for failed (no release); attempt 2 on the same worker.
    let second = holder
        .acquire_or_wait_from(&run, Epoch(2), TTL / 4, TTL * 3)
        .await
        .unwrap();
    let writer = RunWriter::resume(&store, &run, second.epoch, policy)
        .await
        .unwrap();
    let landed = in_flight.await.unwrap();
    assert!(
        landed.is_err(),
        "attempt 1's commit landed after attempt 2 resumed at epoch {} (attempt 1: {}); attempt 2 saw {} facts",
        second.epoch,
        first.epoch,
        writer.state().facts().len()
    );
    assert!(second.epoch > first.epoch);
}

// Proves: `rekindle answer` killed between committing the answer and the record's `Answer`
// transition does not strand the recovery. The run is no longer parked but its record says
// Parked, so no worker would be offered it; the coordinator's parked sweep sees a
// generation after the one the recovery parked at and finishes the `Answer`.
#[tokio::test(start_paused = true)]
async fn an_answer_killed_after_its_commit_does_not_strand_the_recovery() {
    let harness = Harness::new(4, 32, Some(2));
    harness.crashed_host("answered", 1).await;
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    let worker = harness.spawn_worker(&store, harness.worker_options("w1"), &stop);
    harness
        .until(Duration::from_secs(60), "the recovery to park", || async {
            harness
                .record("answered")
                .await
                .is_some_and(|r| r.state == RecoveryState::Parked)
        })
        .await;
    let id = recovery_id_for(&RunId::new("answered"));
    let run = RunId::new(id.as_str());
    let parked = rekindle::store::generation::load(&store, &run, None)
        .await
        .unwrap();
    let call_id = match parked.state.parked() {
        Some(rekindle::core::fold::Parked::Confirmation { call_id, .. }) => call_id.clone(),
        other => panic!("not waiting for a confirmation: {other:?}"),
    };
    // The answering CLI dies at its fourth write (the lease release after the answer's
    // commit; writes: take the lease, fence, answer, release), before the record changes.
    let (cli_store, crashable) = harness.crashable();
    crashable.crash_at_write(4, false);
    let cli = Holder::new(&cli_store, "cli", TTL);
    let answer = fleet::Answer::Confirm {
        call_id,
        approve: true,
    };
    let answering = {
        let (cli_store, cli) = (cli_store.clone(), cli.clone());
        tokio::spawn(async move {
            fleet::answer_run(&cli_store, &cli, &RunId::new("answered"), answer).await
        })
    };
    harness
        .until(Duration::from_secs(30), "the CLI to die", || async {
            crashable.crashed()
        })
        .await;
    answering.abort();
    let now = rekindle::store::generation::load(&store, &run, None)
        .await
        .unwrap();
    assert!(now.state.parked().is_none(), "the answer did not land");
    assert_eq!(
        harness.record("answered").await.unwrap().state,
        RecoveryState::Parked
    );
    harness
        .until(
            Duration::from_secs(120),
            "the answered recovery to finish",
            || async {
                harness
                    .record("answered")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

// Proves: an inbox overwritten behind the leading coordinator's back is rewritten. A
// coordinator paused mid-tick (after computing inboxes, before its PUTs) wakes after a
// standby took over and writes its stale inboxes unconditionally; the new leader caches
// what it wrote last and writes an inbox only when that cache changes, so the recovery it
// assigned stays Admitted on a live worker that never sees it.
#[tokio::test(start_paused = true)]
async fn an_inbox_clobbered_by_a_stale_leader_is_rewritten() {
    let harness = Harness::new(3, 32, None);
    harness.crashed_host("clobbered", 1).await;
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let mut options = harness.worker_options("w1");
    // Slow polling, so the worker reads its inbox only after the stale write below.
    options.poll_interval = Duration::from_secs(20);
    let worker = harness.spawn_worker(&store, options, &stop);
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    harness
        .until(
            Duration::from_secs(15),
            "the recovery to be assigned",
            || async {
                harness
                    .record("clobbered")
                    .await
                    .is_some_and(|r| r.assigned_to.as_deref() == Some("w1"))
            },
        )
        .await;
    // The stale leader's write: its inbox for w1, computed before the admission.
    let stale = serde_json::json!({"format": 1, "kind": "inbox", "worker": "w1", "recoveries": []});
    store
        .put(
            &layout::inbox("w1"),
            bytes::Bytes::from(serde_json::to_vec(&stale).unwrap()),
        )
        .await
        .unwrap();
    harness
        .until(
            Duration::from_secs(120),
            "the recovery to finish",
            || async {
                harness
                    .record("clobbered")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    harness.audit("clobbered", 1);
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

/// Every key in the bucket with its version, to show that nothing was written.
async fn snapshot_of(store: &Store) -> BTreeMap<String, Option<String>> {
    let mut keys = BTreeMap::new();
    for prefix in ["runs/", "index/", "recoveries/"] {
        for listed in store.list(prefix, None, 10_000).await.unwrap() {
            keys.insert(listed.key, listed.etag.map(|e| e.0));
        }
    }
    keys
}

// Regression (new-user pass): `recover` of a run that ended, or of an ID that was never
// used, is refused before anything is written: no claim, no fence, no lease epoch, no run.
#[tokio::test(start_paused = true)]
async fn a_refused_recovery_writes_nothing() {
    let harness = Harness::new(2, 32, None);
    let store = harness.store();
    let node = harness.node(&store, "host", TTL);
    node.holder.beat().await.unwrap();
    let done = RunId::new("done");
    node.start_run(&done, None, "go").await.unwrap();
    let before = snapshot_of(&store).await;
    let cli = Holder::new(&store, "cli", TTL);
    for (run, expected) in [
        ("done", "has ended (completed); there is nothing to recover"),
        ("typo", "does not exist in this store"),
    ] {
        let error = fleet::spawn_recovery(
            &store,
            &cli,
            &RunId::new(run),
            &RecoveryId::new(format!("rec-{run}")),
            false,
            Takeover::Now,
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains(expected), "{run}: {error}");
    }
    assert_eq!(
        snapshot_of(&store).await,
        before,
        "a refused recovery wrote"
    );
}

// Regression (new-user pass): an answer to the wrong call is refused before the run's
// lease is taken (no fence generation, no epoch), and the error names what the run waits for.
#[tokio::test(start_paused = true)]
async fn a_refused_answer_writes_nothing() {
    let harness = Harness::new(2, 32, Some(0));
    let store = harness.store();
    let node = harness.node(&store, "host", TTL);
    node.holder.beat().await.unwrap();
    let run = RunId::new("waits");
    let stopped = node.start_run(&run, None, "go").await.unwrap();
    assert!(matches!(stopped, Stopped::Parked(_)), "{stopped:?}");
    let before = snapshot_of(&store).await;
    let cli = Holder::new(&store, "cli", TTL);
    let wrong = fleet::Answer::Confirm {
        call_id: rekindle::core::fact::CallId::new("nope"),
        approve: true,
    };
    let error = fleet::answer_run(&store, &cli, &run, wrong)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "run \"waits\" is not parked waiting for confirmation of call 'nope'; it waits for confirmation of call 'call_1_1'"
    );
    assert_eq!(snapshot_of(&store).await, before, "a refused answer wrote");
    // The right answer goes through and hands the run to the fleet.
    let right = fleet::Answer::Confirm {
        call_id: rekindle::core::fact::CallId::new("call_1_1"),
        approve: true,
    };
    fleet::answer_run(&store, &cli, &run, right).await.unwrap();
    let entry = index::read(&store, &run).await.unwrap().unwrap();
    assert_eq!((entry.phase, entry.holder), (Phase::Running, None));
}

// Regression (hostile review): the outcome of a stale attempt (a paused process whose worker
// ID a new process took over) never hands back, fails or finishes the attempt that replaced
// it: events name their attempt, and only the running one applies.
#[test]
fn a_stale_attempts_outcome_never_touches_the_next_attempt() {
    let w = || "w1".to_string();
    let mut record = fresh_record();
    for event in [
        Event::Assign { worker: w() },
        Event::Start { worker: w() },
        Event::Abandon {
            worker: w(),
            attempt: 1,
        },
        Event::Assign { worker: w() },
        Event::Start { worker: w() },
    ] {
        record = apply(&record, &event, 1).unwrap();
    }
    assert_eq!((record.state, record.attempts), (RecoveryState::Running, 2));
    for stale in [
        Event::Yield {
            worker: w(),
            attempt: 1,
            keep_assignment: false,
        },
        Event::Fail {
            worker: w(),
            attempt: 1,
            error: "late".into(),
        },
        Event::Finish {
            worker: w(),
            attempt: 1,
            result: result(),
        },
    ] {
        let refused = apply(&record, &stale, 2).unwrap_err();
        assert_eq!(refused.state, RecoveryState::Running, "{stale:?}");
    }
    let finished = apply(
        &record,
        &Event::Finish {
            worker: w(),
            attempt: 2,
            result: result(),
        },
        3,
    )
    .unwrap();
    assert_eq!(finished.state, RecoveryState::Finished);
}

/// A running run whose holder (named as the run, a 300 ms TTL) beat once and went silent:
/// its index entry as written, its version, and the holder.
async fn silent_running(
    store: &Store,
    name: &str,
) -> (
    rekindle::core::record::IndexEntry,
    rekindle::store::ETag,
    Arc<Holder>,
) {
    let holder = Holder::new(store, name, Duration::from_millis(300));
    holder.beat().await.unwrap();
    let mut entry = rekindle::core::record::IndexEntry::new(
        RunId::new(name),
        None,
        Phase::Running,
        "fp".into(),
        1,
    );
    entry.holder = Some(holder.heartbeat_key());
    let written = lifecycle::host_started(store, &entry).await.unwrap();
    (entry, written, holder)
}

/// Asserts what a watch found of each run named in `expected`.
fn assert_found(
    judged: &[(
        rekindle::core::record::IndexEntry,
        rekindle::fleet::liveness::Watched,
    )],
    expected: &[(&str, rekindle::fleet::liveness::Watched)],
) {
    for (id, want) in expected {
        let found = judged
            .iter()
            .find(|(entry, _)| entry.run_id.as_str() == *id)
            .map(|(_, found)| *found);
        assert_eq!(found, Some(*want), "{id}: {judged:?}");
    }
}

// Reviewer's finding: `recover --all` watched a running run for a TTL from one index scan; a
// host that parked meanwhile (entry Parked with no holder, heartbeat removed) looked gone on
// the second look, and the parked run was fenced and given a recovery nobody asked for. The
// watch now leaves alone a run whose entry changed while it watched.
#[tokio::test]
async fn recover_all_leaves_alone_a_run_that_parked_while_it_watched() {
    use rekindle::fleet::liveness::{Watch, Watched};

    let store = common::memory();
    let (entry, written, host) = silent_running(&store, "parks").await;
    // A run whose holder is silent for the whole watch is still judged interrupted.
    silent_running(&store, "silent").await;

    let (entries, _) = index::IndexScan::default().scan(&store).await.unwrap();
    let watch = Watch::begin(&store, entries).await.unwrap();
    // The host parks while the watch waits, and removes its heartbeat as it exits.
    lifecycle::host_parked(&store, &entry, &written)
        .await
        .unwrap();
    store.delete(&host.heartbeat_key()).await.unwrap();
    let judged = watch.finish(&store).await.unwrap();
    assert_found(
        &judged,
        &[
            ("parks", Watched::MovedOn),
            ("silent", Watched::Interrupted),
        ],
    );
}

// Reviewer's finding: the watch's second look read each entry with `?`, so one entry that no
// longer decodes (rewritten by a newer build mid-upgrade) failed the whole `recover --all`
// after it had waited a TTL. It changed, so it is left alone; the others are still judged.
#[tokio::test]
async fn a_watch_leaves_alone_an_entry_that_no_longer_decodes() {
    use bytes::Bytes;
    use rekindle::fleet::liveness::{Watch, Watched};

    let store = common::memory();
    let mut entries = Vec::new();
    for name in ["rewritten", "silent"] {
        entries.push(silent_running(&store, name).await.0);
    }
    let watch = Watch::begin(&store, entries).await.unwrap();
    store
        .put(
            &layout::index_entry("rewritten"),
            Bytes::from_static(br#"{"format":99,"kind":"index.entry"}"#),
        )
        .await
        .unwrap();
    let judged = watch.finish(&store).await.unwrap();
    assert_found(
        &judged,
        &[
            ("rewritten", Watched::MovedOn),
            ("silent", Watched::Interrupted),
        ],
    );
}

// Found measuring `recover --all` after an outage: the watch looked at one holder after
// another, a round trip per run before anything was admitted (20 s for a thousand runs on
// S3, then as long again after the TTL). The looks now go out side by side: while the first
// holder's heartbeat read is held, the others are read. `--takeover` looks at no holder.
#[tokio::test]
async fn recover_all_looks_at_the_holders_side_by_side() {
    use object_store::memory::InMemory;
    use rekindle::fleet::liveness::Watch;
    use rekindle::store::faults::{FaultPlan, FaultyStore};
    use std::sync::Arc;

    use rekindle::store::{Backend, RetryPolicy};

    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultPlan::default(), 1);
    // A held read is not cut short by an attempt timeout (a retry would let one look after
    // another through too).
    let patient = RetryPolicy {
        attempt_timeout: Duration::from_secs(600),
        ..common::fast_retry()
    };
    let store = Store::from_parts(
        faulty.clone(),
        Backend::Memory,
        "memory://patient",
        "",
        patient,
        rekindle::clock::SystemClock::shared(),
    );
    let mut entries = Vec::new();
    for name in ["first", "second", "third"] {
        entries.push(silent_running(&store, name).await.0);
    }
    let gate = faulty.pause_after_read(&layout::heartbeat("first"));
    let before = store.metrics();
    let watching = tokio::spawn({
        let (store, entries) = (store.clone(), entries.clone());
        async move {
            Watch::begin(&store, entries)
                .await
                .map(|watch| watch.runs())
        }
    });
    gate.reached().await;
    // The first look is held after its response arrived (it counts once released); the
    // others are read meanwhile. One look after another would never get past the first.
    let others = async {
        while store.metrics().since(&before).get < 2 {
            rekindle::clock::sleep(Duration::from_millis(5)).await;
        }
    };
    let looked_aside = tokio::time::timeout(Duration::from_secs(20), others).await;
    gate.release();
    assert!(
        looked_aside.is_ok(),
        "the other holders were not looked at while the first look was held"
    );
    assert_eq!(watching.await.unwrap().unwrap(), 3);
    // With the operator's word, no holder is looked at at all.
    let before = store.metrics();
    assert_eq!(Watch::take_over(entries.clone()).len(), 3);
    assert_eq!(store.metrics().since(&before).requests(), 0);
}

// Reviewer's finding: `status` and `runs ls` decoded every holder's heartbeat, so one
// heartbeat this build cannot read (a newer format mid-upgrade, a foreign object) failed the
// whole command. Liveness is judged by the heartbeat's version, as the coordinator does.
#[tokio::test]
async fn an_unreadable_heartbeat_is_judged_by_its_version() {
    use bytes::Bytes;
    use rekindle::core::liveness::Liveness;
    use rekindle::core::record::IndexEntry;
    use rekindle::fleet::liveness;

    let store = common::memory();
    let key = layout::heartbeat("newer-build");
    store
        .put(
            &key,
            Bytes::from_static(br#"{"format": 99, "kind": "heartbeat"}"#),
        )
        .await
        .unwrap();
    let mut entry = IndexEntry::new(RunId::new("r"), None, Phase::Running, "fp".into(), 1);
    entry.holder = Some(key.clone());
    assert_eq!(
        liveness::judge_now(&store, &entry).await.unwrap(),
        Liveness::Running
    );
    store.delete(&key).await.unwrap();
    assert_eq!(
        liveness::judge_now(&store, &entry).await.unwrap(),
        Liveness::Interrupted
    );
}

/// A node on `store` with a scripted agent that answers twice, then finishes.
fn plain_node(store: &Store, dir: &std::path::Path, name: &str) -> Node {
    std::fs::write(
        dir.join("script.json"),
        r#"[{"content": "thinking"}, {"content": "done"}]"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("rekindle.toml"),
        "[model]\nkind = \"scripted\"\nname = \"m\"\nscript = \"script.json\"\n",
    )
    .unwrap();
    let agent = Agent::from_config(Config::load(&dir.join("rekindle.toml")).unwrap()).unwrap();
    Node {
        store: store.clone(),
        agent,
        logs: LogDir::open(dir.join(format!("logs-{name}"))).unwrap(),
        holder: Holder::new(store, name, TTL),
        stop: Arc::new(AtomicBool::new(false)),
    }
}

// New-user finding: a recovery ID could name an existing run — a finished one, one being
// recovered, or the source itself. The recovery, which runs as the run of its ID, then
// continued that run's chain or "finished" at once, and the source's pending call never ran.
// Admission now refuses such an ID, and a host refuses a run ID that is a recovery's.
#[tokio::test]
async fn a_recovery_id_never_names_an_existing_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::memory();
    let host = plain_node(&store, dir.path(), "host");
    let done = RunId::new("done-1");
    host.start_run(&done, None, "go").await.unwrap();
    // An interrupted source: its host stopped before the model's turn.
    let interrupted = RunId::new("k-3");
    let stopping = plain_node(&store, dir.path(), "stopping");
    stopping.stop.store(true, Ordering::SeqCst);
    stopping.start_run(&interrupted, None, "go").await.unwrap();

    let cli = Holder::new(&store, "cli", TTL);
    for taken in ["done-1", "k-3"] {
        let error = admission::admit(
            &store,
            &cli,
            &interrupted,
            &RecoveryId::new(taken),
            false,
            Takeover::Now,
        )
        .await
        .unwrap_err();
        assert_eq!(error.kind(), rekindle::ErrorKind::Refused, "{error}");
        assert!(
            error
                .to_string()
                .contains(&format!("'{taken}' already names a run")),
            "{error}"
        );
    }
    assert!(
        recovery::claimed_by(&store, &interrupted)
            .await
            .unwrap()
            .is_none()
    );
    // A fresh ID is admitted; afterwards a host cannot start a run under it, nor under the
    // coordinator's reserved prefix.
    let id = RecoveryId::new("k-3-again");
    admission::admit(&store, &cli, &interrupted, &id, false, Takeover::Now)
        .await
        .unwrap();
    for reserved in ["k-3-again", "recovery-of-k-9"] {
        let error = host
            .start_run(&RunId::new(reserved), None, "go")
            .await
            .unwrap_err();
        assert_eq!(error.kind(), rekindle::ErrorKind::Refused, "{error}");
        assert!(error.to_string().contains(reserved), "{error}");
    }
    assert!(
        lease::read_lease(&store, &RunId::new("recovery-of-k-9"))
            .await
            .unwrap()
            .is_none(),
        "the refused run took a lease"
    );
}

// Proves an idle worker, which beats only every third of its idle TTL, is judged by that TTL
// and offered work, and that it returns to the full rate when an attempt begins: without
// idle judging it would be silent for many full TTLs and never be offered the recovery.
#[tokio::test(start_paused = true)]
async fn an_idle_worker_beating_slowly_is_still_offered_work() {
    let harness = Harness::new(3, 32, None);
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    let mut options = harness.worker_options("sleepy");
    options.idle_ttl = Some(Duration::from_secs(600));
    let worker = harness.spawn_worker(&store, options, &stop);
    // Idle for many full TTLs: it beats every 200 s now.
    rekindle::clock::sleep(Duration::from_secs(15)).await;
    let beat = |key: String| {
        let store = store.clone();
        async move {
            lease::read_heartbeat(&store, &key)
                .await
                .unwrap()
                .unwrap()
                .0
        }
    };
    let key = layout::heartbeat("sleepy");
    assert_eq!(
        beat(key.clone()).await.ttl_ms,
        600_000,
        "idle, it declares its idle TTL"
    );
    let idle_beats = beat(key.clone()).await.beat;
    assert!(
        idle_beats <= 2,
        "it beat {idle_beats} times in 15 s while idle"
    );

    harness.crashed_host("idle", 1).await;
    // Well before its next idle beat (at 200 s): judged by its full TTL it would look dead
    // until then and be offered nothing.
    harness
        .until(
            Duration::from_secs(30),
            "the recovery on the idle worker",
            || async {
                harness
                    .record("idle")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    harness.audit("idle", 1);
    let record = harness.record("idle").await.unwrap();
    assert_eq!(record.failures, 0, "{record:?}");
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
}

// Proves the attempt after an abandoned one resumes within about one TTL of its worker's
// death: it takes the recovery run's lease over from the worker the coordinator judged gone,
// instead of watching that lease for a second TTL. Virtual time: the bound is the
// protocol's, not the machine's.
#[tokio::test(start_paused = true)]
async fn the_attempt_after_an_abandoned_one_does_not_wait_a_second_ttl() {
    let harness = Harness::new(3, 32, None).with_tool_delay(Duration::from_millis(400));
    harness.crashed_host("handoff", 1).await;
    let host_epoch = harness
        .ledger
        .calls("handoff")
        .iter()
        .map(|(_, epoch)| *epoch)
        .max()
        .unwrap();
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let mut options = CoordinatorOptions::new("c", TTL);
    options.scan_interval = Duration::from_millis(50);
    options.idle_scan_interval = Duration::from_millis(50);
    options.watch_interval = Duration::from_millis(50);
    let coordinator = tokio::spawn(coordinator::run(store.clone(), options, Arc::clone(&stop)));
    let crash = Arc::new(AtomicBool::new(false));
    let mut doomed_options = harness.worker_options("doomed");
    doomed_options.crash = Some(Arc::clone(&crash));
    // Both idle-paced, as the binaries run them: once its attempt is handed back, the dead
    // worker is idle, and its long idle TTL must not bring it back to life for new offers.
    doomed_options.idle_ttl = Some(Duration::from_secs(600));
    let doomed = harness.spawn_worker(&store, doomed_options, &stop);
    harness
        .until(
            Duration::from_secs(30),
            "the doomed worker's first call",
            || async {
                harness
                    .ledger
                    .calls("handoff")
                    .iter()
                    .any(|(_, epoch)| *epoch > host_epoch)
            },
        )
        .await;
    let doomed_epoch = harness
        .ledger
        .calls("handoff")
        .iter()
        .map(|(_, epoch)| *epoch)
        .max()
        .unwrap();
    let mut rescuer_options = harness.worker_options("rescuer");
    rescuer_options.idle_ttl = Some(Duration::from_secs(600));
    let rescuer = harness.spawn_worker(&store, rescuer_options, &stop);
    rekindle::clock::sleep(Duration::from_millis(100)).await;
    // Killed mid-call, holding the recovery run's lease.
    crash.store(true, Ordering::SeqCst);
    let killed = rekindle::clock::Stopwatch::start();
    harness
        .until(
            Duration::from_secs(30),
            "the rescuer's first call",
            || async {
                harness
                    .ledger
                    .calls("handoff")
                    .iter()
                    .any(|(_, epoch)| *epoch > doomed_epoch)
            },
        )
        .await;
    let resumed = killed.elapsed();
    // Noticed within the worker's poll (100 ms), judged after its TTL (900 ms) plus one
    // watch (50 ms), reassigned and polled (100 ms): about 1.2 s. Watching the lease for a
    // second TTL would make it about 2.1 s.
    assert!(
        resumed < TTL + TTL * 2 / 3,
        "resumed {resumed:?} after the worker died (TTL {TTL:?})"
    );
    let record = harness.record("handoff").await.unwrap();
    assert_eq!(record.abandoned_by.as_deref(), Some("doomed"), "{record:?}");
    harness
        .until(
            Duration::from_secs(30),
            "the recovery to finish",
            || async {
                harness
                    .record("handoff")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    let record = harness.record("handoff").await.unwrap();
    assert_eq!(
        record.abandoned_by, None,
        "cleared once the next attempt ended: {record:?}"
    );
    harness.audit("handoff", 2);
    stop.store(true, Ordering::SeqCst);
    doomed.await.unwrap().unwrap();
    rescuer.await.unwrap().unwrap();
    coordinator.await.unwrap().unwrap();
}

// Proves the watch between ticks does not spin: a heartbeat left behind by a killed process
// (expired long ago) sits next to a live host's, and the coordinator lists the heartbeats
// about once per watch interval, not in a loop.
#[tokio::test(start_paused = true)]
async fn a_stale_heartbeat_does_not_make_the_watch_spin() {
    let harness = Harness::new(3, 32, None).with_tool_delay(Duration::from_secs(60));
    let store = harness.store();
    // A process killed long ago: its heartbeat stays behind.
    Holder::new(&store, "long-gone", TTL).beat().await.unwrap();
    // A live host in the middle of a long tool call: the coordinator watches it.
    let host = harness.node(&store, "host-live", TTL);
    host.holder.beat().await.unwrap();
    let beating = host
        .holder
        .spawn_heartbeat(Arc::new(AtomicBool::new(false)));
    let run = tokio::spawn(async move { host.start_run(&RunId::new("live"), None, "go").await });
    let measured = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let mut options = CoordinatorOptions::new("c", TTL);
    options.scan_interval = Duration::from_secs(2);
    options.watch_interval = Duration::from_millis(500);
    let coordinator = tokio::spawn(coordinator::run(
        measured.clone(),
        options,
        Arc::clone(&stop),
    ));
    rekindle::clock::sleep(Duration::from_secs(5)).await;
    let before = measured.metrics().list;
    rekindle::clock::sleep(Duration::from_secs(10)).await;
    let lists = measured.metrics().list - before;
    // Per 10 s: 5 scans of 2 LISTs (index, heartbeats) and up to 20 watch LISTs.
    assert!(lists <= 40, "{lists} LISTs in 10 s");
    assert!(
        lists >= 10,
        "{lists} LISTs in 10 s: is the live host watched at all?"
    );
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap().unwrap();
    run.abort();
    beating.abort();
}

// Proves sources whose admission keeps failing cannot starve the rest: 17 runs with a
// corrupt chain sort before a valid interrupted run, every one attempted on every tick, and
// the valid one is still admitted within a few scans.
#[tokio::test(start_paused = true)]
async fn failing_admissions_do_not_starve_the_others() {
    let harness = Harness::new(3, 32, None);
    let store = harness.store();
    for i in 0..17 {
        let run = RunId::new(format!("a-corrupt-{i:02}"));
        store
            .put(
                &layout::generation(&layout::run_base(run.as_str()), 1),
                bytes::Bytes::from_static(b"not a generation"),
            )
            .await
            .unwrap();
        let entry = IndexEntry::new(run, None, Phase::Running, "fp".into(), 1);
        index::put(&store, &entry).await.unwrap();
    }
    harness.crashed_host("z-valid", 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    harness
        .until(
            Duration::from_secs(30),
            "the valid run's admission",
            || async { harness.record("z-valid").await.is_some() },
        )
        .await;
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap();
}

// Proves the coordinator does not read every waiting recovery's record on every tick: 24
// fresh admissions that no worker can take (there is none) are read when they appear, and
// then only now and then, not on each 200 ms tick. Read on every tick, a thousand admissions
// waiting for slots cost a 1-worker bench 68 GETs per recovery.
#[tokio::test(start_paused = true)]
async fn waiting_fresh_admissions_are_not_read_on_every_tick() {
    let harness = Harness::new(3, 32, None);
    let names: Vec<String> = (0..24).map(|i| format!("waiting-{i:02}")).collect();
    for name in &names {
        harness.crashed_host(name, 1).await;
    }
    let measured = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    // A cached waiting record is trusted for at most half the shortest TTL the coordinator
    // judges by: a TTL long enough that the 5 s cap applies.
    let coordinator = harness.spawn_coordinator(&measured, "c", Duration::from_secs(30), 5, &stop);
    harness
        .until(Duration::from_secs(120), "every admission", || async {
            for name in &names {
                if harness.record(name).await.is_none() {
                    return false;
                }
            }
            true
        })
        .await;
    rekindle::clock::sleep(Duration::from_secs(1)).await;
    let before = measured.metrics();
    rekindle::clock::sleep(Duration::from_secs(3)).await;
    let spent = measured.metrics().since(&before);
    // About 15 ticks: one reread of every record per tick would be 360 GETs. Allowed: the
    // leadership checks, one sweep and one refresh of the waiting records.
    assert!(
        spent.get < 3 * names.len() as u64,
        "{} GETs in 3 s for {} waiting recoveries",
        spent.get,
        names.len()
    );
    assert!(
        spent.list >= 10,
        "{} LISTs in 3 s: did it tick?",
        spent.list
    );
    for name in &names {
        let record = harness.record(name).await.unwrap();
        assert_eq!(record.state, RecoveryState::Admitted, "{name}: {record:?}");
    }
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap();
}

// Proves an offer that is never taken moves on: a worker that looks alive (it beats) and has
// no wake-up address gets the recovery first (it has the most free slots) and never starts
// it; after its TTL the coordinator offers it to a worker that does.
#[tokio::test(start_paused = true)]
async fn an_offer_left_untaken_moves_to_another_worker() {
    let harness = Harness::new(3, 32, None);
    let store = harness.store();
    let ghost = Holder::with_role(&store, "ghost", TTL, "worker");
    ghost.beat().await.unwrap();
    let beating = ghost.spawn_heartbeat(Arc::new(AtomicBool::new(false)));
    let mut registration = rekindle::core::assignment::Registration::new(
        "ghost",
        ghost.heartbeat_key(),
        100,
        harness.agent.fingerprint_sha256(),
    );
    registration.ttl_ms = Some(TTL.as_millis() as u64);
    store
        .put(
            &layout::worker("ghost"),
            layout::encode_object(&registration),
        )
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator = harness.spawn_coordinator(&store, "c", TTL, 5, &stop);
    let worker = harness.spawn_worker(&store, harness.worker_options("real"), &stop);
    harness.crashed_host("untaken", 1).await;
    harness
        .until(Duration::from_secs(5), "the offer to the ghost", || async {
            harness
                .record("untaken")
                .await
                .is_some_and(|r| r.assigned_to.as_deref() == Some("ghost"))
        })
        .await;
    harness
        .until(
            Duration::from_secs(30),
            "the recovery on the real worker",
            || async {
                harness
                    .record("untaken")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    harness.audit("untaken", 1);
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
    coordinator.await.unwrap();
    beating.abort();
}

// Proves a worker that dies right after taking an offer is noticed within its TTL plus one
// watch, not at the coordinator's next scan: a worker is watched at its full-rate TTL from
// the tick that offers it a recovery (before, only from the tick after it started, up to a
// scan interval later). Virtual time; the scan interval here is far longer than the bound.
#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_just_after_its_offer_is_noticed_within_its_ttl() {
    let harness = Harness::new(3, 32, None).with_tool_delay(Duration::from_millis(400));
    harness.crashed_host("offered", 1).await;
    let host_epoch = harness
        .ledger
        .calls("offered")
        .iter()
        .map(|(_, epoch)| *epoch)
        .max()
        .unwrap();
    let store = harness.store();
    let stop = Arc::new(AtomicBool::new(false));
    let mut options = CoordinatorOptions::new("c", TTL);
    options.scan_interval = Duration::from_secs(20);
    options.idle_scan_interval = Duration::from_secs(20);
    options.watch_interval = Duration::from_millis(50);
    let crash = Arc::new(AtomicBool::new(false));
    let mut doomed_options = harness.worker_options("doomed");
    doomed_options.crash = Some(Arc::clone(&crash));
    doomed_options.idle_ttl = Some(Duration::from_secs(600));
    let doomed = harness.spawn_worker(&store, doomed_options, &stop);
    rekindle::clock::sleep(Duration::from_millis(200)).await;
    let coordinator = tokio::spawn(coordinator::run(store.clone(), options, Arc::clone(&stop)));
    harness
        .until(
            Duration::from_secs(60),
            "the doomed worker's first call",
            || async {
                harness
                    .ledger
                    .calls("offered")
                    .iter()
                    .any(|(_, epoch)| *epoch > host_epoch)
            },
        )
        .await;
    let doomed_epoch = harness
        .ledger
        .calls("offered")
        .iter()
        .map(|(_, epoch)| *epoch)
        .max()
        .unwrap();
    let mut rescuer_options = harness.worker_options("rescuer");
    rescuer_options.idle_ttl = Some(Duration::from_secs(600));
    let rescuer = harness.spawn_worker(&store, rescuer_options, &stop);
    crash.store(true, Ordering::SeqCst);
    let killed = rekindle::clock::Stopwatch::start();
    harness
        .until(
            Duration::from_secs(60),
            "the rescuer's first call",
            || async {
                harness
                    .ledger
                    .calls("offered")
                    .iter()
                    .any(|(_, epoch)| *epoch > doomed_epoch)
            },
        )
        .await;
    let resumed = killed.elapsed();
    // Judged after its TTL (900 ms) plus one watch (50 ms), reassigned and polled: well under
    // the 20 s scan interval it used to wait for.
    assert!(
        resumed < TTL * 3,
        "resumed {resumed:?} after the worker died (TTL {TTL:?}, scan 20 s)"
    );
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap().unwrap();
    let _ = doomed.await;
    let _ = rescuer.await;
}

/// Writes `worker`'s inbox listing `id`, with `offer` as the record the offer left.
async fn write_inbox_with_offer(
    store: &Store,
    worker: &str,
    id: &RecoveryId,
    offer: RecoveryRecord,
    etag: &str,
) {
    let inbox = rekindle::core::assignment::Inbox {
        format: layout::FORMAT_VERSION,
        kind: "inbox".into(),
        worker: worker.into(),
        recoveries: vec![id.clone()],
        coordinator_wake: None,
        offers: vec![rekindle::core::assignment::Offer {
            record: offer,
            etag: etag.into(),
        }],
        ..Default::default()
    };
    store
        .put(&layout::inbox(worker), layout::encode_object(&inbox))
        .await
        .unwrap();
}

// Proves the record an inbox carries is only a shortcut: an offer whose version is stale
// (the record changed since the offer) still starts, from the record as read; and a stale
// offer of a recovery the record has since given to another worker starts nothing. (An
// offer is the record and the version one compare-and-swap of the coordinator returned, so
// its content is exactly what that version names.)
#[tokio::test(start_paused = true)]
async fn an_offer_in_the_inbox_is_a_hint_not_the_truth() {
    let harness = Harness::new(3, 32, None);
    let store = harness.store();

    // Stale version: the record was rewritten after the offer; the worker reads it and runs.
    harness.crashed_host("stale", 1).await;
    let id = harness.admit_and_assign("stale", "w1").await;
    let (offered, etag) = recovery::read(&store, &id).await.unwrap().unwrap();
    // An attempt that started and yielded since, keeping the assignment: a new version.
    let w = || "w1".to_string();
    lifecycle::transition(&store, &id, None, Event::Start { worker: w() })
        .await
        .unwrap();
    let yielded = Event::Yield {
        worker: w(),
        attempt: 1,
        keep_assignment: true,
    };
    let (now, _) = lifecycle::transition(&store, &id, None, yielded)
        .await
        .unwrap();
    assert_eq!(now.state, RecoveryState::Admitted);
    assert_eq!(now.assigned_to.as_deref(), Some("w1"));
    write_inbox_with_offer(&store, "w1", &id, offered, &etag.0).await;
    let stop = Arc::new(AtomicBool::new(false));
    let worker = harness.spawn_worker(&store, harness.worker_options("w1"), &stop);
    harness
        .until(
            Duration::from_secs(60),
            "the stale offer's recovery",
            || async {
                harness
                    .record("stale")
                    .await
                    .is_some_and(|r| r.state == RecoveryState::Finished)
            },
        )
        .await;
    harness.audit("stale", 1);
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();

    // Offered to w2, then moved to w-other (w2 was passed over) before w2 read its inbox: the
    // offer's version is stale and the record gives the recovery to another worker.
    harness.crashed_host("other", 1).await;
    let id = harness.admit_and_assign("other", "w2").await;
    let (offered, etag) = recovery::read(&store, &id).await.unwrap().unwrap();
    let moved = Event::Assign {
        worker: "w-other".into(),
    };
    lifecycle::transition(&store, &id, None, moved)
        .await
        .unwrap();
    write_inbox_with_offer(&store, "w2", &id, offered, &etag.0).await;
    let calls_before = harness.ledger.calls("other").len();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = harness.spawn_worker(&store, harness.worker_options("w2"), &stop);
    rekindle::clock::sleep(Duration::from_secs(5)).await;
    let record = harness.record("other").await.unwrap();
    assert_eq!(record.state, RecoveryState::Admitted, "{record:?}");
    assert_eq!(record.assigned_to.as_deref(), Some("w-other"));
    assert_eq!(record.attempts, 0);
    assert_eq!(harness.ledger.calls("other").len(), calls_before);
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();

    // Offered to w3, then started by an earlier incarnation of w3 that died: the restarted
    // w3 finds the old offer in its inbox. The offer's version is stale and its state wrong
    // (the record runs already); the dead incarnation's attempt is handed back and the
    // recovery finishes, nothing stranded on the offer.
    harness.crashed_host("restarted", 1).await;
    let id = harness.admit_and_assign("restarted", "w3").await;
    let (offered, etag) = recovery::read(&store, &id).await.unwrap().unwrap();
    lifecycle::transition(
        &store,
        &id,
        None,
        Event::Start {
            worker: "w3".into(),
        },
    )
    .await
    .unwrap();
    write_inbox_with_offer(&store, "w3", &id, offered, &etag.0).await;
    let stop = Arc::new(AtomicBool::new(false));
    let worker = harness.spawn_worker(&store, harness.worker_options("w3"), &stop);
    harness
        .until(
            Duration::from_secs(10),
            "the dead incarnation's attempt handed back",
            || async {
                harness
                    .record("restarted")
                    .await
                    .is_some_and(|r| r.state != RecoveryState::Running)
            },
        )
        .await;
    stop.store(true, Ordering::SeqCst);
    worker.await.unwrap().unwrap();
}

// Proves a final answer and the terminal fact it implies land in one generation: a run of K
// tool steps costs 2K + 2 commits (opening, K model turns calling a tool, K results, the
// final answer with its end), and nothing is lost by sharing the commit.
#[tokio::test(start_paused = true)]
async fn the_final_answer_and_the_end_share_one_commit() {
    use rekindle::core::fact::FactBody;
    use rekindle::store::generation;

    let harness = Harness::new(3, 32, None);
    let store = harness.store();
    let node = harness.node(&store, "host", TTL);
    let run = RunId::new("ends");
    let stopped = node.start_run(&run, None, "go").await.unwrap();
    assert!(matches!(stopped, Stopped::Finished(_)), "{stopped:?}");
    let loaded = generation::load(&store, &run, None).await.unwrap();
    assert_eq!(loaded.state.terminal().unwrap().outcome, Outcome::Completed);
    assert_eq!(loaded.generation, 2 * 3 + 2, "generations of a 3-step run");
    let key = layout::generation(&layout::run_base(run.as_str()), loaded.generation);
    let object = store.read(&key).await.unwrap().unwrap();
    let last = generation::decode(&key, &run, &object.bytes).unwrap();
    let kinds: Vec<bool> = last
        .facts
        .iter()
        .map(|fact| matches!(fact.body, FactBody::Terminal(_)))
        .collect();
    assert_eq!(
        kinds,
        [false, true],
        "the last generation: {:?}",
        last.facts
    );
    assert!(
        matches!(last.facts[0].body, FactBody::ModelTurn(ref turn) if turn.tool_calls.is_empty())
    );
    harness.audit("ends", 0);
}

// Proves a fence whose lease release fails is not left holding the source for good: the
// admission fails after writing its record (and before indexing it), and its replay — by
// another process, as an operator running the command again — releases the lease and indexes
// the recovery. (The release goes out beside the
// record's write, so its failure is only known once the record exists.)
#[tokio::test(start_paused = true)]
async fn a_failed_release_of_the_fencing_lease_is_finished_by_the_replay() {
    let harness = Harness::new(3, 32, None);
    harness.crashed_host("relfail", 1).await;
    let (store, crashable) = harness.crashable();
    let holder = Holder::new(&store, "operator", TTL);
    let run = RunId::new("relfail");
    let id = recovery_id_for(&run);
    // The takeover's swap of the lease lands; the release after the fence is refused.
    crashable.fail_writes(Some(("/lease", 1)));
    let error = admission::admit(&store, &holder, &run, &id, false, Takeover::Now)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("lease"), "{error}");
    let view = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert_eq!(view.lease.holder, "operator");
    assert!(
        !view.lease.released,
        "the failed release left the lease held"
    );
    assert!(
        harness.record("relfail").await.is_some(),
        "the record was written"
    );

    crashable.fail_writes(None);
    let again_holder = Holder::new(&store, "operator-again", TTL);
    let replay = admission::admit(&store, &again_holder, &run, &id, false, Takeover::Now)
        .await
        .unwrap();
    assert!(!replay.created);
    let view = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert!(view.lease.released, "the replay released the fencing lease");
    let entry = index::read(&store, &run).await.unwrap().unwrap();
    assert_eq!(entry.phase, Phase::Recovering);

    // A replay is known from the record: the source is not loaded again (the reads started
    // beside the record's are dropped), so it costs the record, the lease and the entry.
    let before = store.metrics();
    let again = admission::admit(&store, &holder, &run, &id, false, Takeover::Now)
        .await
        .unwrap();
    assert!(!again.created);
    let spent = store.metrics().since(&before);
    assert!(spent.requests() <= 4, "a replay cost {spent:?}");
}

// Proves an attempt that fails after taking the recovery run's lease (here the resume guard:
// a worker configured differently) releases that lease, so the next attempt takes it at once
// instead of watching this worker's live heartbeat for three TTLs.
#[tokio::test(start_paused = true)]
async fn a_failed_attempt_releases_the_recovery_runs_lease() {
    let harness = Harness::new(3, 32, None);
    harness.crashed_host("refused", 1).await;
    let store = harness.store();
    let id = harness.admit_and_assign("refused", "w1").await;
    let (started, _) = lifecycle::transition(
        &store,
        &id,
        None,
        Event::Start {
            worker: "w1".into(),
        },
    )
    .await
    .unwrap();
    let mut node = harness.node(&store, "w1", TTL);
    node.agent.config.system_prompt = "Another prompt: another configuration.".into();
    let error = node.execute_recovery(&started).await.unwrap_err();
    assert!(
        error.to_string().contains("fingerprint") || error.to_string().contains("configuration"),
        "{error}"
    );
    let run = RunId::new(id.as_str());
    let view = lease::read_lease(&store, &run).await.unwrap().unwrap();
    assert_eq!(view.lease.holder, "w1");
    assert!(
        view.lease.released,
        "the failed attempt released the recovery run's lease"
    );
}

/// Who holds each of the bucket's `partitions` partition leases (`None`: nobody, or released).
async fn partition_owners(store: &Store, partitions: u32) -> Vec<Option<String>> {
    let mut owners = Vec::new();
    for partition in 0..partitions {
        let run = RunId::new(layout::partition_lease(partition));
        owners.push(match lease::read_lease(store, &run).await.unwrap() {
            Some(view) if !view.lease.released => Some(view.lease.holder),
            _ => None,
        });
    }
    owners
}

// Proves coordinators share a bucket split into partitions: three coordinators own all 16
// partitions between them (each a share), runs whose hosts die in every partition are each
// recovered once; a coordinator killed outright has its partitions taken over by the others
// well within two TTLs (no second TTL of waiting on a lease its judge already saw fall
// silent), and the runs that die after it are recovered by the survivors; a coordinator that
// joins later gets a share without a restart of the others.
#[tokio::test(start_paused = true)]
async fn coordinators_share_the_partitions_and_take_a_killed_ones_over() {
    const PARTITIONS: u32 = 16;
    let harness = Harness::new(3, 32, None);
    let store = harness.store();
    let stops: Vec<Arc<AtomicBool>> = (0..4).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let mut coordinators: Vec<_> = (0..3)
        .map(|i| {
            harness.spawn_sharing_coordinator(
                &store,
                &format!("c{i}"),
                TTL,
                5,
                Some(PARTITIONS),
                &stops[i],
            )
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|id| harness.spawn_worker(&store, harness.worker_options(id), &stop))
        .collect();
    harness
        .until(
            Duration::from_secs(10),
            "every partition owned, by all three",
            || async {
                let owners = partition_owners(&store, PARTITIONS).await;
                let distinct: BTreeSet<&String> = owners.iter().flatten().collect();
                owners.iter().all(Option::is_some) && distinct.len() == 3
            },
        )
        .await;
    let runs: Vec<String> = (0..12).map(|i| format!("shared-{i}")).collect();
    let covered: BTreeSet<u32> = runs
        .iter()
        .map(|run| layout::partition_of_run(run, PARTITIONS))
        .collect();
    assert!(covered.len() >= 6, "the runs fall in {covered:?}");
    for run in &runs {
        harness.crashed_host(run, 1).await;
    }
    let finished = |runs: Vec<String>| {
        let harness = &harness;
        async move {
            harness
                .until(Duration::from_secs(30), "every run recovered", || {
                    let runs = runs.clone();
                    async move {
                        for run in &runs {
                            if harness.record(run).await.map(|r| r.state)
                                != Some(RecoveryState::Finished)
                            {
                                return false;
                            }
                        }
                        true
                    }
                })
                .await
        }
    };
    finished(runs.clone()).await;
    for run in &runs {
        harness.audit(run, 1);
    }
    // Killed: its heartbeat stops, nothing is released and its membership stays.
    let owners = partition_owners(&store, PARTITIONS).await;
    let victim = owners[0].clone().unwrap();
    let index: usize = victim.strip_prefix('c').unwrap().parse().unwrap();
    let theirs: Vec<u32> = (0..PARTITIONS)
        .filter(|p| owners[*p as usize].as_deref() == Some(victim.as_str()))
        .collect();
    stops[index].store(true, Ordering::SeqCst);
    coordinators[index].abort();
    let killed = tokio::time::Instant::now();
    harness
        .until(
            Duration::from_secs(10),
            "the killed one's partitions taken over",
            || async {
                let owners = partition_owners(&store, PARTITIONS).await;
                theirs.iter().all(|p| {
                    owners[*p as usize]
                        .as_deref()
                        .is_some_and(|owner| owner != victim)
                })
            },
        )
        .await;
    let taken = killed.elapsed();
    assert!(taken < TTL * 2, "taken over after {taken:?} (TTL {TTL:?})");
    let later: Vec<String> = (0..6).map(|i| format!("after-{i}")).collect();
    for run in &later {
        harness.crashed_host(run, 1).await;
    }
    finished(later.clone()).await;
    for run in &later {
        harness.audit(run, 1);
    }
    // A fourth joins and is given a share.
    coordinators.push(harness.spawn_sharing_coordinator(
        &store,
        "c3",
        TTL,
        5,
        Some(PARTITIONS),
        &stops[3],
    ));
    harness
        .until(Duration::from_secs(10), "the joiner's share", || async {
            let owners = partition_owners(&store, PARTITIONS).await;
            owners.iter().all(Option::is_some) && owners.iter().flatten().any(|owner| owner == "c3")
        })
        .await;
    stop.store(true, Ordering::SeqCst);
    for (i, stop) in stops.iter().enumerate() {
        stop.store(true, Ordering::SeqCst);
        if i != index {
            let _ = (&mut coordinators[i]).await;
        }
    }
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
}

// Proves coordinators configured with different TTLs judge each other by the TTL each
// declared: one of 300 ms sharing with one of 3 s (which beats about once a second, far
// apart by the short one's measure) never takes the other's partitions over, so no lease of
// theirs changes hands in 20 s; and one whose membership was removed behind its back (gc,
// after a long pause) writes it again and keeps its share.
#[tokio::test(start_paused = true)]
async fn coordinators_of_different_ttls_keep_their_shares() {
    const PARTITIONS: u32 = 8;
    let harness = Harness::new(1, 8, None);
    let store = harness.store();
    let stops: Vec<Arc<AtomicBool>> = (0..2).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let ttls = [Duration::from_millis(300), Duration::from_secs(3)];
    let coordinators: Vec<_> = ["short", "long"]
        .iter()
        .zip(ttls)
        .zip(&stops)
        .map(|((id, ttl), stop)| {
            harness.spawn_sharing_coordinator(&store, id, ttl, 5, Some(PARTITIONS), stop)
        })
        .collect();
    let leases = || async {
        let mut leases = Vec::new();
        for partition in 0..PARTITIONS {
            let run = RunId::new(layout::partition_lease(partition));
            leases.push(
                lease::read_lease(&store, &run)
                    .await
                    .unwrap()
                    .filter(|view| !view.lease.released)
                    .map(|view| (view.lease.holder, view.lease.epoch)),
            );
        }
        leases
    };
    let shared = || async {
        let owners = partition_owners(&store, PARTITIONS).await;
        let distinct: BTreeSet<&String> = owners.iter().flatten().collect();
        owners.iter().all(Option::is_some) && distinct.len() == 2
    };
    harness
        .until(Duration::from_secs(10), "both own a share", shared)
        .await;
    // Settled: a handover in flight may still bump an epoch once.
    rekindle::clock::sleep(Duration::from_secs(4)).await;
    let settled = leases().await;
    rekindle::clock::sleep(Duration::from_secs(20)).await;
    assert_eq!(leases().await, settled, "a partition changed hands");
    let member = layout::coordinator_member("long");
    store.delete(&member).await.unwrap();
    harness
        .until(
            Duration::from_secs(10),
            "the membership written again",
            || {
                let store = store.clone();
                let member = member.clone();
                async move { store.read(&member).await.unwrap().is_some() }
            },
        )
        .await;
    rekindle::clock::sleep(Duration::from_secs(5)).await;
    assert!(shared().await, "{:?}", leases().await);
    for (stop, coordinator) in stops.iter().zip(coordinators) {
        stop.store(true, Ordering::SeqCst);
        coordinator.await.unwrap();
    }
}

// Proves a coordinator that led a bucket of one partition follows a split another makes
// while it runs: it joins the members and shares the partitions (keeping partition 0 outside
// the membership would hold it from its rightful owner for as long as it beats).
#[tokio::test(start_paused = true)]
async fn a_leader_follows_a_split_made_while_it_runs() {
    const PARTITIONS: u32 = 4;
    let harness = Harness::new(1, 8, None);
    let store = harness.store();
    let stops: Vec<Arc<AtomicBool>> = (0..2).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let old = harness.spawn_sharing_coordinator(&store, "old", TTL, 5, None, &stops[0]);
    harness
        .until(Duration::from_secs(10), "the old one leads", || async {
            partition_owners(&store, 1).await == [Some("old".to_owned())]
        })
        .await;
    let new = harness.spawn_sharing_coordinator(&store, "new", TTL, 5, Some(PARTITIONS), &stops[1]);
    harness
        .until(
            Duration::from_secs(10),
            "both share the split bucket",
            || async {
                let owners = partition_owners(&store, PARTITIONS).await;
                let distinct: BTreeSet<&String> = owners.iter().flatten().collect();
                let joined = store
                    .read(&layout::coordinator_member("old"))
                    .await
                    .unwrap()
                    .is_some();
                joined && owners.iter().all(Option::is_some) && distinct.len() == 2
            },
        )
        .await;
    for (stop, coordinator) in stops.iter().zip([old, new]) {
        stop.store(true, Ordering::SeqCst);
        coordinator.await.unwrap();
    }
}

// Proves a big index is listed in full seldom, and that a holder the last full tick did not
// see is still noticed at once: 10 000 runs held by a beating host stretch the interval
// between full ticks to 10 s (one index page a second), so in 30 s the coordinator lists the
// index a few times besides its heartbeat watch, not every 500 ms scan interval; and a host
// that starts a run after that (sending no wake-up) and dies has it admitted within a few
// watch intervals of its TTL, because its heartbeat falling silent brings a full tick.
#[tokio::test(start_paused = true)]
async fn a_big_index_is_listed_seldom_and_a_new_holders_death_is_seen_at_once() {
    a_big_index(true).await;
}

// The same with nothing to watch: every entry parked (waiting for an answer, no holder), so
// no tick leaves a heartbeat to watch. The watch still runs between the paced scans (it is
// what the pacing stands on), so the late host's death is seen as fast.
#[tokio::test(start_paused = true)]
async fn a_big_index_of_parked_runs_still_sees_a_new_holders_death_at_once() {
    a_big_index(false).await;
}

/// 10 000 index entries, held by one live host (`held`) or parked, then a host that starts a
/// run, sends no wake-up and dies.
async fn a_big_index(held: bool) {
    const RUNS: usize = 10_000;
    let harness = Harness::new(3, 32, None);
    let store = harness.store();
    let busy = Holder::new(&store, "busy-host", TTL);
    let beating = if held {
        busy.beat().await.unwrap();
        Some(busy.spawn_heartbeat(Arc::new(AtomicBool::new(false))))
    } else {
        None
    };
    for i in 0..RUNS {
        let phase = if held { Phase::Running } else { Phase::Parked };
        let mut entry = IndexEntry::new(
            RunId::new(format!("held-{i:05}")),
            None,
            phase,
            "f".into(),
            0,
        );
        if held {
            entry.holder = Some(busy.heartbeat_key());
            entry.holder_ttl_ms = Some(TTL.as_millis() as u64);
        }
        index::put(&store, &entry).await.unwrap();
    }
    let counted = store.with_fresh_metrics();
    let stop = Arc::new(AtomicBool::new(false));
    let options = CoordinatorOptions {
        scan_interval: Duration::from_millis(500),
        idle_scan_interval: Duration::from_millis(500),
        watch_interval: Duration::from_millis(200),
        ..CoordinatorOptions::new("c", TTL)
    };
    let coordinator = tokio::spawn({
        let (counted, stop) = (counted.clone(), Arc::clone(&stop));
        async move { coordinator::run(counted, options, stop).await.unwrap() }
    });
    let worker = harness.spawn_worker(&store, harness.worker_options("w"), &stop);
    rekindle::clock::sleep(Duration::from_secs(5)).await;
    let before = counted.metrics().list;
    rekindle::clock::sleep(Duration::from_secs(30)).await;
    let lists = counted.metrics().list - before;
    // The watch lists the heartbeats every 200 ms (150 times); a full tick lists the index's
    // 10 pages as 16 sub-range listings, 4 times. Listing the index every scan interval would
    // take 60 passes.
    assert!(lists < 400, "{lists} LISTs in 30 s");
    harness.crashed_host("late", 1).await;
    let died = tokio::time::Instant::now();
    harness
        .until(Duration::from_secs(20), "the late run admitted", || async {
            harness.record("late").await.is_some()
        })
        .await;
    let admitted = died.elapsed();
    assert!(
        admitted < TTL + Duration::from_secs(2),
        "admitted {admitted:?} after its host died (TTL {TTL:?})"
    );
    harness
        .until(
            Duration::from_secs(30),
            "the late run recovered",
            || async {
                harness.record("late").await.map(|r| r.state) == Some(RecoveryState::Finished)
            },
        )
        .await;
    harness.audit("late", 1);
    stop.store(true, Ordering::SeqCst);
    coordinator.await.unwrap();
    worker.await.unwrap().unwrap();
    if let Some(beating) = beating {
        beating.abort();
    }
}
