//! `rekindle bench`: the crash-recover workload, an idle fleet's request bill, and scaling
//! across workers. Each prints figures; none asserts a timing (the machines are shared).
//!
//! The workload: N runs of K steps, each step a scripted model turn that calls one tool,
//! which appends `<run> <step> <epoch> <wall ms>` to a side-effect ledger and sleeps. A host
//! process (`rekindle bench host`, a real child process) starts every run and is killed -9
//! once about half of all steps are in the ledger; a coordinator and W workers in this
//! process (with their wake-up endpoints on loopback, as separate processes would have)
//! recover everything, either at once (`takeover`, an operator-declared outage, as
//! `rekindle recover --all --takeover`) or once the host's lease expires (`lease`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde::Serialize;

use crate::clock::{Stopwatch, SystemClock};
use crate::core::fact::{RunId, ToolCall};
use crate::core::record::{Phase, RecoveryRecord};
/// What the benchmarks return: the tools' own error, outside the library's public one.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
use crate::fleet::coordinator::{self, CoordinatorOptions};
use crate::fleet::runner::Stopped;
use crate::fleet::wake::{self, CoordinatorWaker, Wakeup};
use crate::fleet::worker::{self, WorkerOptions, WorkerStats};
use crate::fleet::{Agent, Node};
use crate::host::config::Config;
use crate::host::{CommandTools, ToolContext, ToolDefinition, ToolOutput, Tools};
use crate::store::index::IndexScan;
use crate::store::lease::Holder;
use crate::store::log::LogDir;
use crate::store::{MetricsSnapshot, Store, StoreSettings, StoreUrl};

mod crash_recover;
mod outage;
mod round_trips;
mod scale;
pub use crash_recover::{CrashRecoverReport, crash_recover};
pub use outage::{
    CoordinatorSample, Outage, OutageReport, SteadyState, coordinator_process, outage,
};
pub use round_trips::{RoundTripsReport, round_trips};
pub use scale::{IdleReport, ScaleRow, idle, scale};

/// S3 Standard request prices (us-east-1), dollars per 1 000 requests: PUT, COPY, POST and
/// LIST; GET, HEAD and the rest. DELETE is free.
pub const PUT_LIST_PRICE: f64 = 0.005;
/// See [`PUT_LIST_PRICE`].
pub const GET_PRICE: f64 = 0.0004;

/// Runs the audit reads at once after a bench.
const AUDIT_CONCURRENCY: usize = 32;

/// Admissions the operator runs at once in takeover mode, as `recover --all` does. Each
/// admission is about ten round trips one after another; an outage's worth of them should
/// not queue behind each other (a store takes thousands of requests at once).
pub const ADMISSIONS_AT_ONCE: usize = 256;

/// What one run of the workload looks like, and the fleet that recovers it.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Runs the host starts.
    pub runs: usize,
    /// Steps (model turn + one tool call) per run.
    pub steps: usize,
    /// Workers recovering.
    pub workers: usize,
    /// Recoveries each worker runs at once.
    pub concurrency: u32,
    /// Recoveries that may wait assigned to each worker beyond `concurrency`.
    pub queue: u32,
    /// How long each tool call sleeps.
    pub step_time: Duration,
    /// The lease TTL of the host, the workers and the coordinator.
    pub ttl: Duration,
    /// The store; a fresh temporary directory when `None`.
    pub store: Option<StoreUrl>,
    /// How the store is opened.
    pub store_settings: StoreSettings,
    /// Latency added to every store request, with up to `jitter` more.
    pub latency: Duration,
    /// See `latency`.
    pub jitter: Duration,
    /// The `rekindle` executable that runs the host (`rekindle bench host`).
    pub exe: PathBuf,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            runs: 200,
            steps: 10,
            workers: 4,
            concurrency: 16,
            queue: 16,
            step_time: Duration::from_millis(5),
            ttl: Duration::from_secs(30),
            store: None,
            store_settings: StoreSettings::default(),
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            exe: PathBuf::from("rekindle"),
        }
    }
}

/// How the interrupted runs come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// An operator declares the outage: every interrupted run is admitted at once, in
    /// parallel, as `rekindle recover --all --takeover` does.
    Takeover,
    /// Nobody intervenes: the coordinator admits each run once its host's lease expired.
    Lease,
}

/// Requests by kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Requests {
    /// GETs.
    pub get: f64,
    /// HEADs.
    pub head: f64,
    /// Unconditional PUTs.
    pub put: f64,
    /// Conditional PUTs (creates and compare-and-swaps).
    pub conditional_put: f64,
    /// LIST pages.
    pub list: f64,
    /// DELETEs.
    pub delete: f64,
    /// All of them.
    pub total: f64,
}

impl Requests {
    fn per(metrics: &MetricsSnapshot, divisor: f64) -> Self {
        let d = divisor.max(1.0);
        Requests {
            get: metrics.get as f64 / d,
            head: metrics.head as f64 / d,
            put: metrics.put as f64 / d,
            conditional_put: metrics.conditional_put as f64 / d,
            list: metrics.list as f64 / d,
            delete: metrics.delete as f64 / d,
            total: metrics.requests() as f64 / d,
        }
    }

    /// What these requests cost at S3 list prices, in dollars.
    pub fn dollars(&self) -> f64 {
        (self.put + self.conditional_put + self.list) * PUT_LIST_PRICE / 1000.0
            + (self.get + self.head) * GET_PRICE / 1000.0
    }
}

/// Milliseconds at the median and the 99th percentile.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    /// How many samples.
    pub n: usize,
    /// The median.
    pub p50_ms: f64,
    /// The 99th percentile.
    pub p99_ms: f64,
    /// The largest.
    pub max_ms: f64,
}

impl Percentiles {
    fn of(mut samples: Vec<f64>) -> Self {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            n: samples.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: samples[samples.len() - 1],
        }
    }
}

/// The host side of the workload (`rekindle bench host`): starts every run at once under one
/// process identity and drives them until killed.
pub async fn host(
    store: Store,
    dir: &Path,
    prefix: &str,
    runs: usize,
    steps: usize,
    step_time: Duration,
    ttl: Duration,
) -> Result<()> {
    let config = write_config(dir, steps)?;
    let agent = bench_agent(&config, &dir.join("ledger"), step_time)?;
    let holder = Holder::new(&store, format!("{prefix}-host"), ttl);
    let node = Node {
        store: store.clone(),
        agent,
        logs: LogDir::open(dir.join("host"))?,
        holder: Arc::clone(&holder),
        stop: Arc::new(AtomicBool::new(false)),
    };
    // A host beats before its runs start (an index entry naming a heartbeat not yet written
    // reads as a dead holder, which a coordinator fences at once).
    holder.beat().await?;
    // Each run is a task of its own, as a host serving many runs spawns them: one run's
    // fsync or model call does not hold up the others.
    let node = Arc::new(node);
    let mut running = tokio::task::JoinSet::new();
    for i in 0..runs {
        let (node, run) = (
            Arc::clone(&node),
            RunId::new(format!("{prefix}-run-{i:04}")),
        );
        running.spawn(async move {
            match node.start_run(&run, None, "Record every step.").await {
                Ok(Stopped::Finished(_)) => {}
                Ok(other) => tracing::warn!(run_id = %run, ?other, "stopped early"),
                Err(error) => tracing::warn!(run_id = %run, %error, "failed"),
            }
        });
    }
    holder
        .while_beating(async move {
            while let Some(joined) = running.join_next().await {
                // A run that panicked takes the host down with it, as it would inline.
                if let Err(error) = joined
                    && error.is_panic()
                {
                    std::panic::resume_unwind(error.into_panic());
                }
            }
        })
        .await?;
    Ok(())
}

/// Workers in this process, with a coordinator (unless the bench runs its own as
/// processes), each with its own wake-up endpoint.
struct Fleet {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The coordinator's store handle and the workers' (each counts its own requests).
    stores: [Store; 2],
}

impl Fleet {
    async fn start(
        store: &Store,
        agent: &Agent,
        dir: &Path,
        workload: &Workload,
        prefix: &str,
        with_coordinator: bool,
    ) -> Result<Fleet> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let stores = [store.with_fresh_metrics(), store.with_fresh_metrics()];
        let endpoint = || async {
            let wakeup: Wakeup = Arc::new(wake::WakeSignal::new());
            let url = wake::serve_loopback(Arc::clone(&wakeup))
                .await
                .map_err(setup("serve a wake-up endpoint"))?;
            Ok::<_, BenchError>((wakeup, Some(url)))
        };
        if with_coordinator {
            let mut options =
                CoordinatorOptions::new(format!("{prefix}-coordinator"), workload.ttl);
            options.wake = Some(endpoint().await?);
            let (task_store, task_stop) = (stores[0].clone(), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                if let Err(error) = coordinator::run(task_store, options, task_stop).await {
                    tracing::error!(%error, "the coordinator stopped");
                }
            }));
        }
        for i in 0..workload.workers {
            let mut options = WorkerOptions::new(
                format!("{prefix}-worker-{i}"),
                workload.concurrency,
                workload.ttl,
            );
            options.queue = workload.queue;
            options.poll_interval = Duration::from_secs(30);
            options.idle_ttl = Some(Duration::from_secs(600));
            options.wake = Some(endpoint().await?);
            let logs = LogDir::open(dir.join(format!("worker-{i}")))?;
            let (task_store, task_stop, agent) =
                (stores[1].clone(), Arc::clone(&stop), agent.clone());
            tasks.push(tokio::spawn(async move {
                let stats = Arc::new(WorkerStats::default());
                if let Err(error) =
                    worker::run(task_store, agent, logs, options, task_stop, stats).await
                {
                    tracing::error!(%error, "a worker stopped");
                }
            }));
        }
        // Registered and led before the workload starts.
        crate::clock::sleep(Duration::from_millis(500)).await;
        Ok(Fleet {
            stop,
            tasks,
            stores,
        })
    }

    fn metrics(&self) -> [MetricsSnapshot; 2] {
        [self.stores[0].metrics(), self.stores[1].metrics()]
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Why a bench could not run (the store, configuration and logs fail with their own errors).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The bench's own files or processes.
    #[error("bench setup: cannot {action}: {error}")]
    Setup {
        /// What the bench was doing.
        action: &'static str,
        /// The underlying I/O failure.
        error: std::io::Error,
    },
    /// The host process or the fleet did not behave.
    #[error("bench: {0}")]
    Host(String),
    /// The library failed under the bench (the store, a lease, a run).
    #[error(transparent)]
    Fleet(#[from] crate::Error),
}

/// Converts the library's module errors a tool meets directly into the tool's error, each
/// through the public error (`$target::Fleet`).
macro_rules! through_the_public_error {
    ($target:ident: $($error:ty),* $(,)?) => {
        $(impl From<$error> for $target {
            fn from(error: $error) -> Self {
                $target::Fleet(error.into())
            }
        })*
    };
}
pub(crate) use through_the_public_error;
through_the_public_error!(
    BenchError:
    crate::store::StoreError,
    crate::store::lease::LeaseError,
    crate::store::generation::GenerationError,
    crate::store::index::IndexError,
    crate::store::recovery::RecoveryError,
    crate::fleet::lifecycle::LifecycleError,
    crate::host::config::ConfigError,
    crate::fleet::FleetError,
    crate::store::log::LogError,
);

pub(crate) fn setup(action: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |error| BenchError::Setup { action, error }
}

fn add(a: &MetricsSnapshot, b: &MetricsSnapshot) -> MetricsSnapshot {
    MetricsSnapshot {
        get: a.get + b.get,
        head: a.head + b.head,
        put: a.put + b.put,
        conditional_put: a.conditional_put + b.conditional_put,
        list: a.list + b.list,
        delete: a.delete + b.delete,
        bytes_written: a.bytes_written + b.bytes_written,
        bytes_read: a.bytes_read + b.bytes_read,
    }
}

fn with_latency(workload: &Workload, settings: &StoreSettings) -> StoreSettings {
    let mut settings = settings.clone();
    if !workload.latency.is_zero() || !workload.jitter.is_zero() {
        let mut faults = settings.faults.clone().unwrap_or_default();
        faults.plan.latency = workload.latency;
        faults.plan.jitter = workload.jitter;
        settings.faults = Some(faults);
    }
    settings
}

/// The store settings of the host process: `settings` with the workload's latency.
pub fn host_settings(
    settings: &StoreSettings,
    latency: Duration,
    jitter: Duration,
) -> StoreSettings {
    with_latency(
        &Workload {
            latency,
            jitter,
            ..Workload::default()
        },
        settings,
    )
}

/// Writes `dir/file`: a scripted model's `steps` turns, each calling `tool` with its step
/// number, then a last turn that ends the run.
pub(crate) fn write_script(dir: &Path, file: &str, steps: usize, tool: &str) -> Result<()> {
    let turns: Vec<serde_json::Value> = (1..=steps)
        .map(|i| {
            serde_json::json!({
                "content": format!("Step {i}."),
                "tool_calls": [{"name": tool, "arguments": {"step": i}}]
            })
        })
        .chain(std::iter::once(serde_json::json!({"content": "Done."})))
        .collect();
    let script = serde_json::to_vec(&turns).unwrap_or_default();
    std::fs::write(dir.join(file), script).map_err(setup("write the script"))
}

fn write_config(dir: &Path, steps: usize) -> Result<PathBuf> {
    write_script(dir, "bench-script.json", steps, "ledger")?;
    let config = format!(
        r#"system_prompt = "Record every step once."

[model]
kind = "scripted"
name = "bench-scripted"
script = "bench-script.json"

[budgets]
max_iterations = {iterations}
steps_per_resume = {iterations}

# Run in-process by the bench (see src/fleet/bench.rs); the command is never started.
[[tools]]
name = "ledger"
description = "Append the step to the side-effect ledger"
schema = {{ type = "object", properties = {{ step = {{ type = "integer" }} }} }}
command = ["true"]
"#,
        iterations = steps * 2 + 4
    );
    let path = dir.join("bench.toml");
    std::fs::write(&path, config).map_err(setup("write the configuration"))?;
    Ok(path)
}

fn bench_agent(config: &Path, ledger: &Path, step_time: Duration) -> Result<Agent> {
    let mut agent = Agent::from_config(Config::load(config)?)?;
    agent.tools = Arc::new(LedgerTool {
        definitions: CommandTools::new(agent.config.tools.clone()),
        ledger: ledger.to_owned(),
        step_time,
    });
    Ok(agent)
}

/// The workload's tool: appends `<run> <step> <epoch> <wall ms>` to the ledger, then sleeps.
struct LedgerTool {
    definitions: CommandTools,
    ledger: PathBuf,
    step_time: Duration,
}

#[async_trait]
impl Tools for LedgerTool {
    fn definitions(&self) -> Vec<ToolDefinition> {
        self.definitions.definitions()
    }

    fn needs_confirmation(&self, _name: &str) -> bool {
        false
    }

    async fn call(&self, call: &ToolCall, context: &ToolContext) -> ToolOutput {
        let step = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .ok()
            .and_then(|args| args.get("step").and_then(serde_json::Value::as_u64))
            .unwrap_or(0);
        let at_ms = SystemClock::shared().wall_ms();
        let line = format!("{} {step} {} {at_ms}\n", context.run_id, context.epoch.0);
        // One write of a short line to a file opened for appending lands whole, between
        // processes too.
        let written = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.ledger)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        crate::clock::sleep(self.step_time).await;
        ToolOutput {
            output: format!("recorded step {step}"),
            is_error: written.is_err(),
            duration_ms: self.step_time.as_millis() as u64,
        }
    }
}

struct LedgerLine {
    run: String,
    step: u64,
    epoch: u64,
    at_ms: u64,
}

fn read_ledger(path: &Path) -> Vec<LedgerLine> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            Some(LedgerLine {
                run: parts.next()?.to_owned(),
                step: parts.next()?.parse().ok()?,
                epoch: parts.next()?.parse().ok()?,
                at_ms: parts.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// The ledger read as it grows, only the bytes appended since the last look: the runs it
/// names, and how many of them recorded a given step.
struct LedgerTail {
    path: PathBuf,
    offset: u64,
    /// An incomplete last line, kept until its newline is appended.
    partial: Vec<u8>,
    /// Each run named, and whether it recorded the step asked for.
    runs: BTreeMap<String, bool>,
    reached: usize,
}

impl LedgerTail {
    fn new(path: &Path) -> Self {
        LedgerTail {
            path: path.to_owned(),
            offset: 0,
            partial: Vec::new(),
            runs: BTreeMap::new(),
            reached: 0,
        }
    }

    /// Whether every run the ledger names has recorded step `last` (the same `last` on
    /// every call). A file that cannot be read counts as nothing new.
    fn every_named_run_at(&mut self, last: u64) -> bool {
        use std::io::{Read, Seek};
        let mut appended = Vec::new();
        let read = std::fs::File::open(&self.path).and_then(|mut file| {
            file.seek(std::io::SeekFrom::Start(self.offset))?;
            file.read_to_end(&mut appended)
        });
        if let Ok(n) = read {
            self.offset += n as u64;
            self.partial.extend_from_slice(&appended);
            let complete = self
                .partial
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let lines: Vec<u8> = self.partial.drain(..complete).collect();
            for line in String::from_utf8_lossy(&lines).lines() {
                let mut parts = line.split(' ');
                let (Some(run), Some(step)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let at_last = step.parse::<u64>().is_ok_and(|step| step == last);
                let seen = self.runs.entry(run.to_owned()).or_insert(false);
                if at_last && !*seen {
                    *seen = true;
                    self.reached += 1;
                }
            }
        }
        self.reached == self.runs.len()
    }
}

fn count_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|bytes| bytes.iter().filter(|b| **b == b'\n').count())
        .unwrap_or(0)
}

/// Repeats, and runs whose steps are missing or ran more than twice (one interruption
/// allows one repeat of the step in flight).
fn audit(
    lines: &[LedgerLine],
    prefix: &str,
    runs: usize,
    steps: usize,
    never_started: &[String],
) -> (usize, usize) {
    let mut counts: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    for line in lines {
        *counts.entry((line.run.as_str(), line.step)).or_default() += 1;
    }
    let repeats = counts.values().map(|n| n - 1).sum();
    let mut bad = BTreeSet::new();
    for i in 0..runs {
        let run = format!("{prefix}-run-{i:04}");
        if never_started.contains(&run) {
            continue;
        }
        let mut repeated = 0;
        for step in 1..=steps as u64 {
            match counts.get(&(run.as_str(), step)).copied().unwrap_or(0) {
                0 => {
                    bad.insert(run.clone());
                }
                1 => {}
                n => repeated += n - 1,
            }
        }
        if repeated > 1 {
            bad.insert(run);
        }
    }
    (repeats, bad.len())
}

/// Peak resident memory of this process, in MiB (0 where /proc is not available).
pub fn peak_rss_mib() -> f64 {
    status_mib("self", "VmHWM:")
}

/// Resident memory of process `pid` (`self` for this one) now, in MiB.
pub fn rss_mib_of(pid: &str) -> f64 {
    status_mib(pid, "VmRSS:")
}

fn status_mib(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// CPU time this process has used, user and system, in seconds (0 where /proc is not
/// available).
pub fn process_cpu_s() -> f64 {
    process_cpu_s_of("self")
}

/// CPU time process `pid` has used, user and system, in seconds (0 where /proc is not
/// available): fields 14 and 15 of `/proc/<pid>/stat`, in the kernel's `USER_HZ` ticks, which
/// Linux fixes at 100 for every architecture's user-space ABI.
pub fn process_cpu_s_of(pid: &str) -> f64 {
    const USER_HZ: f64 = 100.0;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The command name (field 2) may hold spaces; the fields after it are plain.
            let after_name = &stat[stat.rfind(')')? + 1..];
            let mut fields = after_name.split_whitespace().skip(11);
            let user: f64 = fields.next()?.parse().ok()?;
            let system: f64 = fields.next()?.parse().ok()?;
            Some((user + system) / USER_HZ)
        })
        .unwrap_or(0.0)
}

/// A temporary working directory, removed on drop unless kept.
pub(crate) struct WorkDir(PathBuf);

impl WorkDir {
    pub(crate) fn new(name: &str) -> Result<WorkDir> {
        let path = std::env::temp_dir().join(format!(
            "rekindle-{name}-{}-{}",
            std::process::id(),
            &SystemClock::shared().nonce()[..8]
        ));
        std::fs::create_dir_all(&path).map_err(setup("create the work directory"))?;
        Ok(WorkDir(path))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Keeps the directory (for a post-mortem) and returns where it is.
    pub(crate) fn keep(mut self) -> PathBuf {
        std::mem::take(&mut self.0)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.0.as_os_str().is_empty() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the done-check's ledger gate: closed while any run the ledger names lacks its
    // last step, a line split across two reads counted once whole, open once every run
    // named has it, and a run appearing later closes it again.
    #[test]
    fn the_ledger_gate_opens_only_when_every_named_run_reached_its_last_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger");
        let append = |text: &str| {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        };
        let mut tail = LedgerTail::new(&path);
        assert!(tail.every_named_run_at(3), "an empty ledger names no run");
        append("a 1 1 0\nb 1 1 0\na 2 1 0\n");
        assert!(!tail.every_named_run_at(3));
        append("a 3 1 0\nb 3");
        assert!(
            !tail.every_named_run_at(3),
            "b's last line is not whole yet"
        );
        append(" 2 0\n");
        assert!(tail.every_named_run_at(3));
        append("a 3 2 0\nc 1 2 0\n");
        assert!(!tail.every_named_run_at(3), "c appeared");
        append("c 2 2 0\nc 3 2 0\n");
        assert!(tail.every_named_run_at(3));
    }

    // Proves the CPU reading parses /proc/self/stat (a parse that failed would read 0 forever)
    // and counts this process's own work: it grows while the test spins.
    #[test]
    fn process_cpu_time_grows_with_work() {
        let before = process_cpu_s();
        let mut spin = 0u64;
        let mut now = before;
        // Bounded: ten million rounds of hashing take far more than a 10 ms tick anywhere.
        for round in 0..100u64 {
            for i in 0..1_000_000u64 {
                spin = std::hint::black_box(
                    spin.wrapping_mul(6364136223846793005)
                        .wrapping_add(i ^ round),
                );
            }
            now = process_cpu_s();
            if now > before {
                break;
            }
        }
        assert!(now > before, "CPU time stayed at {before} s while spinning");
    }
}
