//! `rekindle demo`: a whole fleet in one process, breaking and recovering runs.
//!
//! A coordinator and several workers share a store (a local directory by default); hosts
//! start runs with the scripted model and a command tool that appends every call to a
//! side-effect ledger. Some hosts "crash" part-way (their tasks and heartbeats stop dead);
//! one worker is killed mid-recovery. The fleet must finish every run, and the ledger proves
//! that no tool call ran more often than once per interruption of its run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::clock::SystemClock;
use crate::core::fact::RunId;
use crate::core::rng::SplitMix;
/// What the demo returns: its own error, outside the library's public one.
pub type Result<T, E = DemoError> = std::result::Result<T, E>;
use crate::fleet::coordinator::{self, CoordinatorOptions};
use crate::fleet::runner::Stopped;
use crate::fleet::worker::{self, WorkerOptions, WorkerStats};
use crate::fleet::{Agent, Node};
use crate::host::config::Config;
use crate::store::lease::Holder;
use crate::store::log::LogDir;
use crate::store::{Store, StoreSettings, StoreUrl};

/// The demo's size, where it keeps its state, and how long it may take.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// How many runs the hosts start, one host each.
    pub runs: usize,
    /// How many workers execute recoveries; with more than one, the first is killed mid-work.
    pub workers: usize,
    /// The store; a fresh temporary directory when `None`.
    pub store: Option<StoreUrl>,
    /// How the store is opened (also the temporary one: sealing keys apply to it too).
    pub store_settings: StoreSettings,
    /// Where logs, the ledger and the config go; a temporary directory when `None`.
    pub work_dir: Option<PathBuf>,
    /// Seeds which hosts crash and when, so a demo's crash pattern can be repeated.
    pub seed: u64,
    /// How long the fleet gets to finish every run before the demo fails.
    pub timeout: Duration,
    /// Whether to draw a progress bar on the terminal.
    pub progress: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            runs: 100,
            workers: 3,
            store: None,
            store_settings: StoreSettings::default(),
            work_dir: None,
            seed: 7,
            timeout: Duration::from_secs(300),
            progress: true,
        }
    }
}

/// What a demo did and what the bucket and the side-effect ledger say about it afterwards.
#[derive(Clone, Debug, Serialize)]
pub struct DemoSummary {
    /// How many runs the hosts started.
    pub runs: usize,
    /// Runs that ended, on their own chain or their recovery's: must equal `runs`.
    pub completed: usize,
    /// Runs their host finished itself, without a recovery.
    pub completed_by_host: usize,
    /// Hosts that crashed part-way through their run.
    pub hosts_crashed: usize,
    /// Workers killed mid-recovery.
    pub workers_killed: usize,
    /// Distinct recoveries the workers finished.
    pub recoveries: u64,
    /// Recovery attempts the workers started, including ones cut short by a kill.
    pub recovery_attempts: u64,
    /// Tool calls the ledger recorded, repeats included.
    pub tool_calls: usize,
    /// Ledger entries that repeat a call already recorded for the same run.
    pub tool_calls_reexecuted: usize,
    /// Runs whose tool calls repeated more often than they were interrupted: must be 0.
    pub runs_over_budget: usize,
    /// Store requests made by the coordinator and the workers (hosts not counted).
    pub fleet_requests: u64,
    /// Fleet requests per finished recovery; 0 when none finished.
    pub requests_per_recovery: f64,
    /// How long the demo took, in seconds.
    pub seconds: f64,
    /// The URL of the store the demo ran on.
    pub store: String,
}

impl DemoSummary {
    /// What the demo proves, broken: a run left unfinished, or a tool call re-run more often
    /// than its run was interrupted. `None` when everything held.
    pub fn violation(&self) -> Option<String> {
        if self.runs_over_budget > 0 {
            Some(format!(
                "the demo broke an invariant: {} runs re-executed tool calls beyond their interruptions",
                self.runs_over_budget
            ))
        } else if self.completed < self.runs {
            Some(format!(
                "the demo broke an invariant: {} of {} runs were left unfinished",
                self.runs - self.completed,
                self.runs
            ))
        } else {
            None
        }
    }
}

/// Why the demo itself failed, apart from its store, configuration and logs.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The demo's own files (the store, the configuration and the logs fail with their own
    /// errors). The I/O error is part of the message, not a `source`.
    #[error("demo setup: cannot {action}: {error}")]
    Setup {
        /// What the demo was doing ("create the work directory", "write the configuration").
        action: &'static str,
        /// The underlying I/O failure.
        error: std::io::Error,
    },
    /// The fleet did not finish every run within [`DemoOptions::timeout`].
    #[error("demo timed out after {seconds} s with {done} of {runs} runs finished")]
    TimedOut {
        /// The timeout that ran out, in seconds.
        seconds: u64,
        /// Runs finished by then, by their host or a recovery.
        done: usize,
        /// Runs the demo started.
        runs: usize,
    },
    /// The library failed under the demo (the store, a lease, a run).
    #[error(transparent)]
    Fleet(#[from] crate::Error),
}

crate::fleet::bench::through_the_public_error!(
    DemoError: crate::store::StoreError,
    crate::store::log::LogError,
    crate::host::config::ConfigError,
    crate::store::lease::LeaseError,
);

const TURNS: usize = 4;

/// The demo's crashes are placed, not timed, so a seed gives the same numbers every time: the
/// tool hangs (and is killed with its host or worker) on a call marked in this directory,
/// after recording it in the ledger. `host-<run>-<call>` hangs the host's call (epoch 1);
/// `worker-<run>` hangs the first call a recovery of the run makes, once.
fn hangs_dir(dir: &Path) -> PathBuf {
    dir.join("hangs")
}

fn write_config(dir: &Path, ledger: &Path) -> std::io::Result<PathBuf> {
    let hangs = hangs_dir(dir);
    std::fs::create_dir_all(&hangs)?;
    let hangs = hangs.display().to_string().replace('\'', "'\\''");
    let turns: Vec<serde_json::Value> = (1..=TURNS)
        .map(|i| {
            serde_json::json!({
                "content": format!("Step {i}: recording progress."),
                "tool_calls": [{"name": "record", "arguments": {"step": i}}]
            })
        })
        .chain(std::iter::once(
            serde_json::json!({"content": "All steps recorded."}),
        ))
        .collect();
    std::fs::write(dir.join("script.json"), serde_json::to_vec_pretty(&turns)?)?;
    let ledger = ledger.display().to_string().replace('\'', "'\\''");
    let config = format!(
        r#"system_prompt = "Record each step exactly once."

[model]
kind = "scripted"
name = "demo-scripted"
script = "script.json"

[budgets]
max_iterations = 20
steps_per_resume = 32

[[tools]]
name = "record"
description = "Append a line to the side-effect ledger"
schema = {{ type = "object", properties = {{ step = {{ type = "integer" }} }} }}
command = ["sh", "-c", "printf '%s %s %s\\n' \"$REKINDLE_RUN_ID\" \"$REKINDLE_CALL_ID\" \"$REKINDLE_EPOCH\" >> '{ledger}'; if [ \"$REKINDLE_EPOCH\" = 1 ] && [ -e '{hangs}'/\"host-$REKINDLE_RUN_ID-$REKINDLE_CALL_ID\" ]; then exec sleep 120; fi; if [ \"$REKINDLE_EPOCH\" != 1 ] && rm '{hangs}'/\"worker-$REKINDLE_RUN_ID\" 2>/dev/null; then exec sleep 120; fi; sleep 0.02; echo recorded"]
timeout_ms = 10000
"#
    );
    let path = dir.join("rekindle.toml");
    std::fs::write(&path, config)?;
    Ok(path)
}

/// Runs the demo and returns its summary.
pub async fn run(options: DemoOptions) -> Result<DemoSummary> {
    let setup = |action| move |error| DemoError::Setup { action, error };
    let temp = tempdir_for(&options).map_err(setup("create the work directory"))?;
    let dir = temp.path().to_owned();
    let store_url = options.store.clone().unwrap_or_else(|| StoreUrl::Local {
        root: dir.join("bucket"),
    });
    let ledger = dir.join("ledger.txt");
    let config_path = write_config(&dir, &ledger).map_err(setup("write the configuration"))?;
    let config = Config::load(&config_path)?;
    let agent = Agent::from_config(config)?;
    let store = Store::open(&store_url, &options.store_settings, SystemClock::shared()).await?;
    let fleet_store = store.with_fresh_metrics();
    let ttl = Duration::from_millis(600);
    let started = crate::clock::Stopwatch::start();
    let prefix = format!("demo-{}", store.clock().nonce()[..8].to_owned());

    // The fleet.
    let stop = Arc::new(AtomicBool::new(false));
    let coordinator_task = tokio::spawn(coordinator::run(
        fleet_store.clone(),
        CoordinatorOptions {
            id: format!("{prefix}-coordinator"),
            ttl,
            scan_interval: Duration::from_millis(150),
            max_attempts: crate::core::placement::DEFAULT_MAX_ATTEMPTS,
            idle_scan_interval: Duration::from_millis(150),
            watch_interval: Duration::from_millis(150),
            wake: None,
            readiness: None,
            partitions: None,
        },
        Arc::clone(&stop),
    ));
    let stats = Arc::new(WorkerStats::default());
    let crash_switches: Vec<Arc<AtomicBool>> = (0..options.workers)
        .map(|_| Arc::new(AtomicBool::new(false)))
        .collect();
    let mut worker_tasks = Vec::new();
    for (i, crash) in crash_switches.iter().enumerate() {
        let logs = LogDir::open(dir.join(format!("worker-{i}")))?;
        worker_tasks.push(tokio::spawn(worker::run(
            fleet_store.clone(),
            agent.clone(),
            logs,
            WorkerOptions {
                id: format!("{prefix}-worker-{i}"),
                // One recovery at a time, so the placed worker kill cuts short exactly one.
                concurrency: 1,
                // Nothing waits on a worker either: each kill cuts short one recovery.
                queue: 0,
                ttl,
                poll_interval: Duration::from_millis(100),
                shutdown_deadline: Duration::from_secs(30),
                crash: Some(Arc::clone(crash)),
                idle_ttl: None,
                wake: None,
                readiness: None,
            },
            Arc::clone(&stop),
            Arc::clone(&stats),
        )));
    }

    // The hosts: each its own process identity; some crash part-way.
    let mut random = SplitMix::new(options.seed);
    let completed_by_host = Arc::new(AtomicU64::new(0));
    let hosts_done = Arc::new(AtomicU64::new(0));
    let mut hosts_crashed = 0;
    let host_logs = LogDir::open(dir.join("hosts"))?;
    // Which hosts crash, and on which call (the first turn is committed by then, so each
    // crashed run has something to recover): drawn from the seed, nothing else.
    let hangs = hangs_dir(&dir);
    let mut first_crashed: Option<RunId> = None;
    for i in 0..options.runs {
        let run = RunId::new(format!("{prefix}-run-{i:04}"));
        let crash_on = (random.below(100) < 40).then(|| 1 + random.below(TURNS as u32 - 1));
        if let Some(turn) = crash_on {
            hosts_crashed += 1;
            let call = format!("call_{turn}_1");
            std::fs::write(hangs.join(format!("host-{run}-{call}")), "")
                .map_err(setup("write a crash marker"))?;
            if first_crashed.is_none() && options.workers > 1 {
                // Its recovery's first call hangs too, and the worker running it is killed.
                std::fs::write(hangs.join(format!("worker-{run}")), "")
                    .map_err(setup("write a crash marker"))?;
                first_crashed = Some(run.clone());
            }
        }
        let holder = Holder::new(&store, format!("{prefix}-host-{i}"), ttl);
        let host_stop = Arc::new(AtomicBool::new(false));
        let node = Node {
            store: store.clone(),
            agent: agent.clone(),
            logs: host_logs.clone(),
            holder: Arc::clone(&holder),
            stop: Arc::clone(&host_stop),
        };
        let done = Arc::clone(&completed_by_host);
        let host_done = Arc::clone(&hosts_done);
        let ledger = ledger.clone();
        tokio::spawn(async move {
            let _ = holder.beat().await;
            let beating = holder.spawn_heartbeat(Arc::clone(&host_stop));
            let started = run.clone();
            let work = tokio::spawn(async move {
                if let Ok(Stopped::Finished(_)) =
                    node.start_run(&started, None, "Record four steps.").await
                {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
            if let Some(turn) = crash_on {
                // The host dies while its marked call runs (the tool hangs on it once it is
                // in the ledger): its work stops there, its heartbeat goes silent.
                let line = format!("{run} call_{turn}_1 1");
                while !work.is_finished() && !ledger_has(&ledger, &line) {
                    crate::clock::sleep(Duration::from_millis(5)).await;
                }
                work.abort();
                beating.abort();
            } else {
                let _ = work.await;
                host_stop.store(true, Ordering::SeqCst);
                let _ = beating.await;
            }
            host_done.fetch_add(1, Ordering::Relaxed);
        });
    }

    let bar = options.progress.then(|| {
        let bar = indicatif::ProgressBar::new(options.runs as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} runs finished {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut workers_killed = 0;
    let timeout = options.timeout;
    let mut index = crate::store::index::IndexScan::default();
    loop {
        let done = completed_by_host.load(Ordering::Relaxed) as usize
            + stats.finished.load(Ordering::Relaxed) as usize;
        if let Some(bar) = &bar {
            bar.set_position(done.min(options.runs) as u64);
            bar.set_message(format!(
                "({} recoveries)",
                stats.finished.load(Ordering::Relaxed)
            ));
        }
        // Settled: every host has finished or crashed, and no run of ours is left in the index.
        if hosts_done.load(Ordering::Relaxed) as usize >= options.runs
            && let Ok((entries, _)) = index.scan(&store).await
            && !entries
                .iter()
                .any(|e| e.run_id.as_str().starts_with(&prefix))
        {
            break;
        }
        // Kill the worker whose recovery hangs on its marked call (it runs nothing else:
        // one recovery at a time), so the kill cuts exactly that call short.
        if workers_killed == 0
            && let Some(run) = &first_crashed
            && let Some(worker) = hung_worker(&store, &ledger, run).await
            && let Some(switch) = (0..options.workers)
                .find(|i| worker == format!("{prefix}-worker-{i}"))
                .map(|i| &crash_switches[i])
        {
            switch.store(true, Ordering::SeqCst);
            workers_killed = 1;
        }
        if started.elapsed() > timeout {
            stop.store(true, Ordering::SeqCst);
            return Err(DemoError::TimedOut {
                seconds: options.timeout.as_secs(),
                done,
                runs: options.runs,
            });
        }
        crate::clock::sleep(Duration::from_millis(100)).await;
    }
    if let Some(bar) = &bar {
        bar.finish();
    }
    stop.store(true, Ordering::SeqCst);
    for task in worker_tasks {
        let _ = task.await;
    }
    let _ = coordinator_task.await;

    // What the bucket says: a run is complete when its own chain or its recovery's ended.
    let mut done = 0;
    for i in 0..options.runs {
        let run = RunId::new(format!("{prefix}-run-{i:04}"));
        let recovery = RunId::new(crate::core::assignment::recovery_id_for(&run).as_str());
        for candidate in [&recovery, &run] {
            if let Ok(loaded) = crate::store::generation::load(&store, candidate, None).await
                && loaded.state.terminal().is_some()
            {
                done += 1;
                break;
            }
        }
    }
    let (tool_calls, reexecuted, over_budget) = audit_ledger(&ledger);
    let recoveries = stats.finished.load(Ordering::Relaxed);
    let fleet_requests = fleet_store.metrics().requests();
    Ok(DemoSummary {
        runs: options.runs,
        completed: done,
        completed_by_host: completed_by_host.load(Ordering::Relaxed) as usize,
        hosts_crashed,
        workers_killed,
        recoveries,
        recovery_attempts: stats.started.load(Ordering::Relaxed),
        tool_calls,
        tool_calls_reexecuted: reexecuted,
        runs_over_budget: over_budget,
        fleet_requests,
        requests_per_recovery: if recoveries == 0 {
            0.0
        } else {
            fleet_requests as f64 / recoveries as f64
        },
        seconds: started.elapsed().as_secs_f64(),
        store: store_url.to_string(),
    })
}

/// Whether the ledger has this line.
fn ledger_has(ledger: &Path, line: &str) -> bool {
    std::fs::read_to_string(ledger).is_ok_and(|text| text.lines().any(|l| l == line))
}

/// The worker running `run`'s recovery once its marked call hangs (a ledger line of the run
/// at a recovery epoch), from the recovery record.
async fn hung_worker(store: &Store, ledger: &Path, run: &RunId) -> Option<String> {
    let text = std::fs::read_to_string(ledger).ok()?;
    let prefix = format!("{run} ");
    let recovering = text
        .lines()
        .any(|line| line.starts_with(&prefix) && !line.ends_with(" 1"));
    if !recovering {
        return None;
    }
    let id = crate::core::assignment::recovery_id_for(run);
    let (record, _) = crate::store::recovery::read(store, &id).await.ok()??;
    (record.state == crate::core::record::RecoveryState::Running)
        .then_some(record.assigned_to)
        .flatten()
}

/// Reads the ledger: total calls, repeats, and runs whose repeats exceed their interruptions
/// (an interruption shows as a new epoch executing the run's calls).
pub fn audit_ledger(ledger: &Path) -> (usize, usize, usize) {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let mut calls: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut epochs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut total = 0;
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (Some(run), Some(call), Some(epoch)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        total += 1;
        *calls.entry((run.to_owned(), call.to_owned())).or_default() += 1;
        epochs
            .entry(run.to_owned())
            .or_default()
            .insert(epoch.to_owned());
    }
    let reexecuted: usize = calls.values().map(|n| n - 1).sum();
    let mut repeats_per_run: BTreeMap<&str, usize> = BTreeMap::new();
    for ((run, _), n) in &calls {
        *repeats_per_run.entry(run.as_str()).or_default() += n - 1;
    }
    let over_budget = repeats_per_run
        .iter()
        .filter(|(run, repeats)| {
            let interruptions = epochs.get(**run).map_or(0, |e| e.len().saturating_sub(1));
            **repeats > interruptions
        })
        .count();
    (total, reexecuted, over_budget)
}

/// The demo's working directory: the given one, or a fresh temporary one.
fn tempdir_for(options: &DemoOptions) -> std::io::Result<WorkDir> {
    match &options.work_dir {
        Some(path) => {
            std::fs::create_dir_all(path)?;
            Ok(WorkDir::Given(path.clone()))
        }
        None => {
            let base = std::env::temp_dir().join(format!("rekindle-demo-{}", std::process::id()));
            std::fs::create_dir_all(&base)?;
            Ok(WorkDir::Temporary(base))
        }
    }
}

enum WorkDir {
    Given(PathBuf),
    Temporary(PathBuf),
}

impl WorkDir {
    fn path(&self) -> &Path {
        match self {
            WorkDir::Given(path) | WorkDir::Temporary(path) => path,
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let WorkDir::Temporary(path) = self {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}
