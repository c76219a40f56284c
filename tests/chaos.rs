//! The chaos sweep: real hosts, two coordinators and three workers against one store, broken
//! on purpose by a seed — SIGKILL of hosts, workers and the leading coordinator (then
//! restarts), SIGSTOP of a worker past its lease TTL (a zombie that must be fenced), store
//! faults injected into the workers (503s, latency, lost responses) and one worker cut off
//! from the store while it keeps running. An auditor then checks the invariants from the
//! bucket and the side-effect ledger.
//!
//! A second sweep injects stalls into the coordinators only (requests that hang past the
//! lease TTL inside their ticks) and kills only hosts: every other process keeps beating, so
//! no live host's run may be taken and every recovery must finish at its first attempt.
//!
//! Replay or scale it with `REKINDLE_CHAOS_SEEDS=17` (or `1-200` for a long sweep) and
//! `REKINDLE_CHAOS_RUNS=20`: `cargo nextest run --test chaos` after starting the S3 test
//! server as `scripts/test` does (or just `scripts/test`). Each sweep prints one summary line.

#![allow(clippy::disallowed_methods)] // real processes on real time: deadlines and pauses are wall time.

mod common;

use rekindle::core::record::RecoveryState;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rekindle::core::assignment::recovery_id_for;
use rekindle::core::fact::{FactBody, RunId};
use rekindle::core::layout;
use rekindle::core::rng::SplitMix;
use rekindle::store::Store;
use rekindle::store::generation::{self, GenerationError};
use rekindle::store::recovery::{self};

const TTL_MS: u64 = 800;
/// The coordinator-stall sweep's TTL, and how long each of its stalls hangs (past the TTL).
const STALL_TTL_MS: u64 = 1_500;
const STALL_MS: u64 = 2_000;

/// Which processes the seed breaks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Kills, pauses, store faults and a partition across the fleet.
    Everything,
    /// Stalls in the coordinators' requests only; hosts are killed, nothing else is.
    CoordinatorStalls,
}

#[derive(Default, Debug)]
struct Totals {
    seeds: u64,
    /// Seeds whose bucket the two coordinators split into partitions (both own a share).
    split: u64,
    kills: u64,
    /// Of the kills, coordinators' (the leader, or a partition owner).
    coordinator_kills: u64,
    pauses: u64,
    partitions: u64,
    fault_processes: u64,
    runs: u64,
    completed: u64,
    never_started: u64,
    /// Runs whose live host was judged silent before its first commit: the coordinator's fence
    /// took slot 1, the host's start failed fenced, nothing was acknowledged.
    fenced_before_start: u64,
    violations: Vec<String>,
}

/// How each seed's hosts ended, by run index.
struct HostOutcomes {
    killed: BTreeSet<usize>,
    succeeded: Vec<bool>,
}

struct Harness {
    dir: PathBuf,
    store_url: String,
    config: PathBuf,
    seed: u64,
    mode: Mode,
    /// The partitions the coordinators split the bucket into (`None`: one leads).
    partitions: Option<u32>,
}

impl Harness {
    fn ttl_ms(&self) -> String {
        match self.mode {
            Mode::Everything => TTL_MS,
            Mode::CoordinatorStalls => STALL_TTL_MS,
        }
        .to_string()
    }

    fn command(&self, binary: &str) -> Command {
        let mut command = Command::new(binary);
        command
            .env("REKINDLE_STORE", &self.store_url)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    fn worker(&self, i: usize) -> common::Proc {
        let mut command = self.command(env!("CARGO_BIN_EXE_rekindle-worker"));
        command
            .args(["--config"])
            .arg(&self.config)
            .args(["--id", &format!("w{i}"), "--lease-ttl-ms", &self.ttl_ms()])
            // Idle-paced as in production, with an idle TTL short enough that a worker
            // restarted under the ID of one killed while idle (it watches the old heartbeat
            // for that TTL first) rejoins within the sweep.
            .args([
                "--poll-interval-ms",
                "100",
                "--idle-ttl-ms",
                "3000",
                "--state-dir",
            ])
            .arg(self.dir.join(format!("w{i}")));
        // Worker 0 sees a faulty store; worker 2 can be cut off by a file.
        if i == 0 && self.mode == Mode::Everything {
            // 503s, lost responses, latency, and stalls longer than the request deadline.
            command
                .env(
                    "REKINDLE_FAULTS",
                    format!(
                        "seed={},error=40,lost=40,stall=10,stall_ms=1200,latency_ms=1",
                        self.seed
                    ),
                )
                .env("REKINDLE_STORE_TIMEOUT_MS", "400");
        }
        if i == 2 && self.mode == Mode::Everything {
            command.env(
                "REKINDLE_FAULTS_PARTITION_FILE",
                self.dir.join("partition-w2"),
            );
        }
        command.spawn().map(common::Proc::new).unwrap()
    }

    fn coordinator(&self, i: usize) -> common::Proc {
        let mut command = self.command(env!("CARGO_BIN_EXE_rekindle-coordinator"));
        if let Some(partitions) = self.partitions {
            command.args(["--partitions", &partitions.to_string()]);
        }
        if self.mode == Mode::CoordinatorStalls {
            // Stalls that hang past the TTL before failing, inside the request deadline.
            command
                .env(
                    "REKINDLE_FAULTS",
                    format!(
                        "seed={},stall=40,stall_ms={STALL_MS},latency_ms=1",
                        self.seed * 7 + i as u64
                    ),
                )
                .env("REKINDLE_STORE_TIMEOUT_MS", (STALL_MS + 1_000).to_string());
        }
        command
            .args(["--id", &format!("c{i}"), "--lease-ttl-ms", &self.ttl_ms()])
            .args(["--scan-interval-ms", "150"])
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    }

    fn host(&self, run: &str) -> common::Proc {
        self.command(env!("CARGO_BIN_EXE_rekindle"))
            .args(["run", "--config"])
            .arg(&self.config)
            .args([
                "--run-id",
                run,
                "--lease-ttl-ms",
                &self.ttl_ms(),
                "--state-dir",
            ])
            .arg(self.dir.join("hosts"))
            .arg("record the steps")
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    }
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status();
}

fn write_config(dir: &Path, ledger: &Path) -> PathBuf {
    let turns: Vec<serde_json::Value> = (1..=4)
        .map(|i| serde_json::json!({"content": format!("step {i}"), "tool_calls": [{"name": "record", "arguments": {"step": i}}]}))
        .chain(std::iter::once(serde_json::json!({"content": "done"})))
        .collect();
    std::fs::write(dir.join("script.json"), serde_json::to_vec(&turns).unwrap()).unwrap();
    let path = dir.join("rekindle.toml");
    std::fs::write(
        &path,
        format!(
            r#"[model]
kind = "scripted"
name = "chaos"
script = "script.json"
[[tools]]
name = "record"
command = ["sh", "-c", "printf '%s %s %s\n' \"$REKINDLE_RUN_ID\" \"$REKINDLE_CALL_ID\" \"$REKINDLE_EPOCH\" >> '{}'; sleep 0.15; echo ok"]
timeout_ms = 10000
"#,
            ledger.display()
        ),
    )
    .unwrap();
    path
}

/// One seeded chaos run; returns what it did and what the auditor found.
async fn chaos(seed: u64, runs: usize, store_url: Option<String>, mode: Mode, totals: &mut Totals) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().to_owned();
    let store_url = store_url.unwrap_or_else(|| dir.join("bucket").display().to_string());
    let ledger = dir.join("ledger.txt");
    let harness = Harness {
        config: write_config(&dir, &ledger),
        dir: dir.clone(),
        store_url: store_url.clone(),
        seed,
        mode,
        // Odd seeds split the bucket: both coordinators own partitions, the one killed leaves
        // its share to the other, and one whose requests stall is judged by the other.
        partitions: (seed % 2 == 1).then_some(4),
    };
    if harness.partitions.is_some() {
        totals.split += 1;
    }
    let store = if store_url.starts_with("s3://") {
        common::s3_store_at(&store_url).await
    } else {
        common::local(Path::new(&store_url)).await
    };
    let mut random = SplitMix::new(seed);
    let prefix = format!("chaos{seed}");
    let mut coordinators: Vec<common::Proc> = (0..2).map(|i| harness.coordinator(i)).collect();
    let mut workers: Vec<common::Proc> = (0..3).map(|i| harness.worker(i)).collect();
    totals.fault_processes += match mode {
        Mode::Everything => 1,
        Mode::CoordinatorStalls => 2,
    };

    // Hosts start staggered; about half are killed at a random point.
    let mut hosts: Vec<(common::Proc, Option<Instant>)> = Vec::new();
    for i in 0..runs {
        let child = harness.host(&format!("{prefix}-{i}"));
        let kill_at = (random.below(100) < 50)
            .then(|| Instant::now() + Duration::from_millis(200 + u64::from(random.below(1200))));
        hosts.push((child, kill_at));
        rekindle::clock::sleep(Duration::from_millis(u64::from(random.below(120)))).await;
    }

    // The event loop: kills, pauses and a partition, chosen by the seed.
    let started = Instant::now();
    let mut paused: Option<(usize, Instant)> = None;
    let mut partition_until: Option<Instant> = None;
    let mut restarts: Vec<(Instant, usize, bool)> = Vec::new(); // (when, index, is_worker)
    let mut killed: BTreeSet<usize> = BTreeSet::new();
    let chaos_for = Duration::from_millis(2500 + u64::from(random.below(1500)));
    while started.elapsed() < chaos_for {
        let now = Instant::now();
        for (index, (child, kill_at)) in hosts.iter_mut().enumerate() {
            if kill_at.is_some_and(|at| now >= at) {
                let _ = child.kill();
                killed.insert(index);
                totals.kills += 1;
                *kill_at = None;
            }
        }
        let event = match mode {
            Mode::Everything => random.below(40),
            Mode::CoordinatorStalls => u32::MAX,
        };
        match event {
            0 => {
                let i = random.below(3) as usize;
                if paused.map(|(p, _)| p) != Some(i) && !restarts.iter().any(|r| r.1 == i && r.2) {
                    let _ = workers[i].kill();
                    let _ = workers[i].wait();
                    totals.kills += 1;
                    restarts.push((now + Duration::from_millis(300), i, true));
                }
            }
            1 => {
                // The leading coordinator (in a split bucket, partition 0's owner), as the
                // lease names it.
                let lease = RunId::new(layout::COORDINATOR_LEASE_RUN);
                if let Ok(Some(view)) = rekindle::store::lease::read_lease(&store, &lease).await
                    && let Some(i) = view
                        .lease
                        .holder
                        .strip_prefix('c')
                        .and_then(|n| n.parse::<usize>().ok())
                    && i < coordinators.len()
                    && !restarts.iter().any(|r| r.1 == i && !r.2)
                {
                    let _ = coordinators[i].kill();
                    let _ = coordinators[i].wait();
                    totals.kills += 1;
                    totals.coordinator_kills += 1;
                    restarts.push((now + Duration::from_millis(400), i, false));
                }
            }
            2 if paused.is_none() => {
                let i = random.below(3) as usize;
                if !restarts.iter().any(|r| r.1 == i && r.2) {
                    signal(&workers[i], "-STOP");
                    totals.pauses += 1;
                    paused = Some((i, now + Duration::from_millis(TTL_MS * 2)));
                }
            }
            3 if partition_until.is_none() => {
                std::fs::write(dir.join("partition-w2"), b"cut").unwrap();
                totals.partitions += 1;
                partition_until = Some(now + Duration::from_millis(1500));
            }
            _ => {}
        }
        if let Some((i, until)) = paused
            && now >= until
        {
            signal(&workers[i], "-CONT");
            paused = None;
        }
        if partition_until.is_some_and(|until| now >= until) {
            let _ = std::fs::remove_file(dir.join("partition-w2"));
            partition_until = None;
        }
        let due: Vec<_> = restarts.iter().filter(|r| now >= r.0).cloned().collect();
        restarts.retain(|r| now < r.0);
        for (_, i, is_worker) in due {
            if is_worker {
                workers[i] = harness.worker(i);
            } else {
                coordinators[i] = harness.coordinator(i);
            }
        }
        rekindle::clock::sleep(Duration::from_millis(50)).await;
    }
    // Calm: resume everything, restart what is down, let the fleet settle.
    if let Some((i, _)) = paused.take() {
        signal(&workers[i], "-CONT");
    }
    let _ = std::fs::remove_file(dir.join("partition-w2"));
    for (_, i, is_worker) in restarts.drain(..) {
        if is_worker {
            workers[i] = harness.worker(i);
        } else {
            coordinators[i] = harness.coordinator(i);
        }
    }
    // Whether each host reported success: a host whose run never committed must not.
    let succeeded: Vec<bool> = hosts
        .iter_mut()
        .map(|(child, _)| child.wait().is_ok_and(|status| status.success()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (entries, _) = rekindle::store::index::IndexScan::default()
            .scan(&store)
            .await
            .unwrap();
        if !entries
            .iter()
            .any(|e| e.run_id.as_str().starts_with(&prefix))
        {
            break;
        }
        if Instant::now() > deadline {
            totals.violations.push(format!(
                "seed {seed}: runs still unfinished after 120 s: {:?}",
                entries
                    .iter()
                    .map(|e| e.run_id.as_str())
                    .collect::<Vec<_>>()
            ));
            break;
        }
        rekindle::clock::sleep(Duration::from_millis(200)).await;
    }
    for child in workers.iter_mut().chain(coordinators.iter_mut()) {
        signal(child, "-TERM");
        let _ = child.wait();
    }

    let before = totals.violations.len();
    let hosts = HostOutcomes { killed, succeeded };
    audit(&store, &prefix, runs, &ledger, seed, &hosts, totals).await;
    if mode == Mode::CoordinatorStalls {
        nobody_beating_was_fenced(&store, &prefix, runs, seed, &hosts, totals).await;
    }
    if totals.violations.len() > before {
        eprintln!(
            "chaos seed {seed} broke invariants; replay with: REKINDLE_CHAOS_SEEDS={seed} REKINDLE_CHAOS_RUNS={runs} cargo nextest run --test chaos"
        );
    }
    totals.seeds += 1;
    totals.runs += runs as u64;
}

/// Checks every invariant from the bucket and the ledger.
async fn audit(
    store: &Store,
    prefix: &str,
    runs: usize,
    ledger: &Path,
    seed: u64,
    hosts: &HostOutcomes,
    totals: &mut Totals,
) {
    let mut violation = |text: String| totals.violations.push(format!("seed {seed}: {text}"));
    // Ledger: (run, call) -> epochs it ran at.
    let mut ran: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for line in std::fs::read_to_string(ledger).unwrap_or_default().lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        if let [run, call, epoch] = parts[..] {
            ran.entry((run.to_owned(), call.to_owned()))
                .or_default()
                .push(epoch.parse().unwrap_or(0));
        }
    }
    for i in 0..runs {
        let run = RunId::new(format!("{prefix}-{i}"));
        let source = match generation::load(store, &run, None).await {
            Ok(loaded) => loaded,
            Err(GenerationError::NotFound { .. }) => {
                // Killed before its first commit: nothing was acknowledged.
                totals.never_started += 1;
                if ran.keys().any(|(r, _)| r == run.as_str()) {
                    violation(format!("{run} has no generations but its tools ran"));
                }
                continue;
            }
            Err(error) => {
                violation(format!("{run}: source does not load: {error}"));
                continue;
            }
        };
        if source.state.facts().is_empty() {
            // Its first slot holds only a fence: a coordinator judged the host silent before
            // its first commit, so that commit was refused and nothing was acknowledged. The
            // chain must still be sound, no tool may have run, and a host that was not killed
            // must have failed (fenced), never reported the run as done.
            check_chain(store, &run, &mut violation).await;
            if ran.keys().any(|(r, _)| r == run.as_str()) {
                violation(format!("{run} never committed a fact but its tools ran"));
            }
            if hosts.killed.contains(&i) {
                totals.never_started += 1;
            } else {
                totals.fenced_before_start += 1;
                if hosts.succeeded.get(i).copied().unwrap_or(false) {
                    violation(format!(
                        "{run}: its host reported success but the run never committed a fact"
                    ));
                }
            }
            continue;
        }
        // The chain's generations: epochs never go down, seqs have no gaps.
        check_chain(store, &run, &mut violation).await;
        let record = recovery::read(store, &recovery_id_for(&run))
            .await
            .ok()
            .flatten()
            .map(|(r, _)| r);
        let (final_state, commits) = match &record {
            Some(record) => {
                if record.state != RecoveryState::Finished {
                    violation(format!(
                        "{run}: recovery {} ended {:?}",
                        record.recovery_id, record.state
                    ));
                    continue;
                }
                let recovery_run = RunId::new(record.recovery_id.as_str());
                check_chain(store, &recovery_run, &mut violation).await;
                let recovered = match generation::load(store, &recovery_run, None).await {
                    Ok(loaded) => loaded,
                    Err(error) => {
                        violation(format!("{run}: recovery run does not load: {error}"));
                        continue;
                    }
                };
                // Nothing acknowledged is lost: the recovery continues the whole source.
                let pinned = generation::load(store, &run, Some(record.source_generation)).await;
                if let Ok(pinned) = pinned
                    && !recovered.state.facts().starts_with(pinned.state.facts())
                {
                    violation(format!(
                        "{run}: recovery does not start with the source's committed facts"
                    ));
                }
                let commits = commit_epochs(store, &run, &recovery_run).await;
                (recovered.state, commits)
            }
            None => {
                let commits = commit_epochs(store, &run, &run).await;
                (source.state, commits)
            }
        };
        if final_state.terminal().is_none() {
            violation(format!("{run}: never reached a terminal state"));
            continue;
        }
        totals.completed += 1;
        // Every committed tool result's call ran; none ran again after its result was
        // committed; repeats are bounded by the run's interruptions.
        let mut epochs_seen = BTreeSet::new();
        let mut repeats = 0;
        for fact in final_state.facts() {
            if let FactBody::ToolResult(result) = &fact.body {
                let key = (run.to_string(), result.call_id.to_string());
                let Some(epochs) = ran.get(&key) else {
                    violation(format!(
                        "{run}: committed result of {} but the call never ran",
                        result.call_id
                    ));
                    continue;
                };
                epochs_seen.extend(epochs.iter().copied());
                repeats += epochs.len() - 1;
                if let Some(committed_at) = commits.get(&fact.seq.0)
                    && let Some(later) = epochs.iter().find(|e| **e > *committed_at)
                {
                    violation(format!(
                        "{run}: call {} ran at epoch {later} after its result was committed at epoch {committed_at}",
                        result.call_id
                    ));
                }
            }
        }
        if repeats >= epochs_seen.len().max(1) {
            violation(format!(
                "{run}: {repeats} repeated calls over {} incarnations",
                epochs_seen.len()
            ));
        }
    }
}

/// With only the coordinators stalling and only hosts killed: a live host's run was never
/// taken (it succeeded and no recovery was admitted for it), and every recovery finished at
/// its first attempt (no worker's attempt was abandoned or failed).
async fn nobody_beating_was_fenced(
    store: &Store,
    prefix: &str,
    runs: usize,
    seed: u64,
    hosts: &HostOutcomes,
    totals: &mut Totals,
) {
    for i in 0..runs {
        let run = RunId::new(format!("{prefix}-{i}"));
        let record = recovery::read(store, &recovery_id_for(&run))
            .await
            .ok()
            .flatten()
            .map(|(r, _)| r);
        let mut violation = |text: String| totals.violations.push(format!("seed {seed}: {text}"));
        if !hosts.killed.contains(&i) {
            if !hosts.succeeded.get(i).copied().unwrap_or(false) {
                violation(format!("{run}: its host kept beating but did not succeed"));
            }
            if let Some(record) = &record {
                violation(format!(
                    "{run}: its host kept beating but recovery {} was admitted",
                    record.recovery_id
                ));
            }
        }
        if let Some(record) = record
            && record.attempts != 1
        {
            violation(format!(
                "{run}: recovery {} took {} attempts with every worker beating (last error: {})",
                record.recovery_id,
                record.attempts,
                record.last_error.as_deref().unwrap_or("none")
            ));
        }
    }
}

/// The epoch of the generation that first committed each seq (source first, then recovery).
async fn commit_epochs(store: &Store, source: &RunId, run: &RunId) -> BTreeMap<u64, u64> {
    let mut epochs = BTreeMap::new();
    for chain_run in [source, run] {
        let chain =
            rekindle::store::generation::Chain::new(store, layout::run_base(chain_run.as_str()));
        let Ok(Some(latest)) = chain.latest().await else {
            continue;
        };
        for n in 1..=latest {
            let Ok(Some(object)) = store.read(&chain.key(n)).await else {
                continue;
            };
            let Ok(generation) = generation::decode(&chain.key(n), chain_run, &object.bytes) else {
                continue;
            };
            for seq in generation.first_seq..=generation.last_seq {
                epochs.entry(seq).or_insert(generation.epoch.get());
            }
        }
    }
    epochs
}

/// Reads every generation of a run in order: epochs never decrease, seqs never skip.
async fn check_chain(store: &Store, run: &RunId, violation: &mut impl FnMut(String)) {
    let chain = rekindle::store::generation::Chain::new(store, layout::run_base(run.as_str()));
    let Ok(Some(latest)) = chain.latest().await else {
        return;
    };
    let (mut epoch, mut last_seq) = (rekindle::core::epoch::Epoch::ZERO, 0);
    for n in 1..=latest {
        let key = chain.key(n);
        let generation = match store.read(&key).await {
            Ok(Some(object)) => match generation::decode(&key, run, &object.bytes) {
                Ok(generation) => generation,
                Err(error) => return violation(format!("{run}: {error}")),
            },
            _ => return violation(format!("{run}: generation {n} is missing")),
        };
        if generation.epoch < epoch {
            violation(format!(
                "{run}: generation {n} has epoch {} after epoch {epoch}",
                generation.epoch
            ));
        }
        if !generation.snapshot && generation.first_seq != last_seq + 1 {
            violation(format!(
                "{run}: generation {n} starts at seq {} after {last_seq}",
                generation.first_seq
            ));
        }
        epoch = generation.epoch;
        last_seq = generation.last_seq.max(last_seq);
    }
}

fn seeds() -> Vec<u64> {
    let spec = std::env::var("REKINDLE_CHAOS_SEEDS").unwrap_or_else(|_| "1,2".into());
    spec.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().unwrap_or(1)..=b.trim().parse().unwrap_or(1))
                .collect::<Vec<u64>>(),
            None => vec![part.trim().parse().unwrap_or(1)],
        })
        .collect()
}

fn runs() -> usize {
    std::env::var("REKINDLE_CHAOS_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(6)
}

fn report(label: &str, totals: &Totals) {
    println!(
        "chaos {label}: {} seeds ({} split into partitions), {} kills ({} of coordinators), {} pauses, {} partitions, {} fault-injected processes, {} runs: {} completed, {} never started, {} fenced before their first commit, {} violations",
        totals.seeds,
        totals.split,
        totals.kills,
        totals.coordinator_kills,
        totals.pauses,
        totals.partitions,
        totals.fault_processes,
        totals.runs,
        totals.completed,
        totals.never_started,
        totals.fenced_before_start,
        totals.violations.len()
    );
    for violation in &totals.violations {
        println!("  violation: {violation}");
    }
}

// Proves, for each seed, that every invariant holds on the local directory store under kills,
// pauses, store faults and a partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_local_directory() {
    let mut totals = Totals::default();
    for seed in seeds() {
        chaos(seed, runs(), None, Mode::Everything, &mut totals).await;
    }
    report("local", &totals);
    assert!(totals.violations.is_empty(), "{:?}", totals.violations);
    assert!(totals.completed + totals.never_started + totals.fenced_before_start == totals.runs);
}

// Proves the same against the S3 test server (one seed in the default sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_s3() {
    let mut totals = Totals::default();
    let base = common::s3_url();
    for seed in seeds().into_iter().take(1) {
        let url = format!(
            "{}/chaos-{seed}-{}",
            base.trim_end_matches('/'),
            std::process::id()
        );
        chaos(seed, runs(), Some(url), Mode::Everything, &mut totals).await;
    }
    report("s3", &totals);
    assert!(totals.violations.is_empty(), "{:?}", totals.violations);
}

// Proves, for each seed, that stalls past the TTL in the coordinators' requests (inside a
// tick, in the watch, in taking leadership) never get a process that keeps beating fenced:
// no live host's run is taken and every recovery finishes at its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_coordinator_stalls() {
    let mut totals = Totals::default();
    for seed in seeds() {
        chaos(seed, runs(), None, Mode::CoordinatorStalls, &mut totals).await;
    }
    report("coordinator stalls", &totals);
    assert!(totals.violations.is_empty(), "{:?}", totals.violations);
    assert!(totals.kills > 0, "no host was killed: nothing to recover");
    assert!(totals.completed + totals.never_started + totals.fenced_before_start == totals.runs);
}
