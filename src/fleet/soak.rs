//! `rekindle bench soak`: an operator's steady state, held for a while, to show that what the
//! fleet keeps stays bounded by live work.
//!
//! The real binaries at their default pacing — one `rekindle-coordinator` and W
//! `rekindle-worker`s — serve a stream of real `rekindle run` hosts, one every `arrival`;
//! about `kill_percent` of them are killed -9 at a random moment of their run. Every
//! `sample_every` the soak records each fleet process's resident memory, the objects under
//! each top-level prefix of the store (the fleet itself LISTs `index/`, `heartbeats/` and
//! `workers/`; `runs/` and `recoveries/` are history that `rekindle gc` retires after the
//! retention period), the local store's lock files and the files in the workers' state
//! directories. At the end it stops the arrivals, waits for every interrupted run to be
//! recovered, and audits every run from the bucket and a side-effect ledger: each one ended,
//! a recovery continues everything its source acknowledged, and no tool call ran twice except
//! the one in flight when its host was killed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use crate::clock::{Stopwatch, SystemClock};
use crate::core::assignment::recovery_id_for;
use crate::core::fact::{FactBody, RunId};
use crate::core::record::RecoveryState;
use crate::core::rng::SplitMix;
use crate::fleet::bench::Result;
use crate::fleet::bench::{BenchError, WorkDir, setup, write_script};
use crate::store::generation::{self, GenerationError};
use crate::store::index::IndexScan;
use crate::store::{Store, StoreSettings, StoreUrl, recovery};

/// The prefixes a sample counts objects under (the heartbeats without the registrations that
/// live among them, counted as `workers`).
const PREFIXES: [&str; 6] = [
    "heartbeats/",
    "heartbeats/workers/",
    "inbox/",
    "index/",
    "recoveries/",
    "runs/",
];

/// What the soak runs, and for how long.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// How long hosts keep arriving.
    pub duration: Duration,
    /// Time between two hosts' starts.
    pub arrival: Duration,
    /// Share of hosts killed -9, in percent.
    pub kill_percent: u32,
    /// Workers beside the one coordinator.
    pub workers: usize,
    /// Steps (a model turn calling one tool) per run.
    pub steps: usize,
    /// How long each tool call sleeps.
    pub step_time: Duration,
    /// Time between two samples.
    pub sample_every: Duration,
    /// The store; a fresh temporary directory when `None`. The fleet's processes get it as
    /// `REKINDLE_STORE` and take S3 settings from the environment, as in production.
    pub store: Option<StoreUrl>,
    /// How the soak itself opens the store (to sample and audit it).
    pub store_settings: StoreSettings,
    /// The directory holding `rekindle`, `rekindle-worker` and `rekindle-coordinator`.
    pub bin_dir: PathBuf,
    /// The lease TTL of every process; the binaries' default (30 s) when `None`.
    pub ttl: Option<Duration>,
    /// Seeds which hosts are killed and when.
    pub seed: u64,
    /// How long to wait at the end for every interrupted run to be recovered.
    pub settle: Duration,
}

/// One look at the fleet and the store.
#[derive(Clone, Debug, Serialize)]
pub struct SoakSample {
    /// `soak-sample`.
    pub bench: &'static str,
    /// Seconds since the first host arrived.
    pub at_s: f64,
    /// Hosts started so far.
    pub runs_started: usize,
    /// Hosts killed so far.
    pub hosts_killed: usize,
    /// Hosts running now.
    pub hosts_running: usize,
    /// Resident memory of each fleet process, in MiB: its heap (`heap_mib`) and the pages
    /// of its executable and libraries it touched so far (bounded by their size).
    pub rss_mib: BTreeMap<String, f64>,
    /// Resident anonymous memory of each fleet process (heap and stacks), in MiB: what a leak
    /// would grow.
    pub heap_mib: BTreeMap<String, f64>,
    /// Objects under each top-level prefix of the store.
    pub objects: BTreeMap<String, usize>,
    /// Lock files of the local-directory store (none on S3).
    pub lock_files: Option<usize>,
    /// Files in the workers' state directories (their local fact logs).
    pub worker_state_files: usize,
    /// Files in the hosts' state directory (one local fact log per run in flight, and those
    /// killed hosts left, until a process opening the directory removes them an hour on).
    pub host_state_files: usize,
}

/// What the soak found.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// `soak`.
    pub bench: &'static str,
    /// How long hosts arrived, in minutes.
    pub minutes: f64,
    /// Workers beside the coordinator.
    pub workers: usize,
    /// Runs started (one host each).
    pub runs: usize,
    /// Hosts killed -9.
    pub killed: usize,
    /// Runs whose host finished them.
    pub finished_by_host: usize,
    /// Runs a recovery finished.
    pub recovered: usize,
    /// Killed hosts' runs with nothing acknowledged (killed before their first commit).
    pub never_started: usize,
    /// Tool calls that ran more than once (each at most the one in flight at a kill).
    pub tool_calls_repeated: usize,
    /// From the last arrival until no run was left to recover, in seconds.
    pub settle_s: f64,
    /// The first sample, as the fleet started.
    pub first: SoakSample,
    /// The first sample after the warm-up (a tenth of the run, at least one sample
    /// interval): where memory and object counts should stay from then on. `end` when fewer
    /// than three samples came after the warm-up (a run too short to say).
    pub warm: SoakSample,
    /// The sample half-way between `warm` and the last one before the settle.
    pub middle: SoakSample,
    /// The last sample, after the settle.
    pub end: SoakSample,
    /// Each fleet process's heap growth (`heap_mib`) from `warm` to `middle` and from `middle`
    /// to the last sample before the settle, in MiB per hour: flat memory shows as two
    /// figures near 0, a leak as two similar positive ones. Empty when the run was too short.
    pub heap_growth_mib_per_hour: BTreeMap<String, [f64; 2]>,
    /// Objects left after the fleet stopped gracefully.
    pub objects_after_stop: BTreeMap<String, usize>,
    /// The work directory, kept when something broke (logs of every process).
    pub kept: Option<PathBuf>,
    /// Invariants broken: must be empty.
    pub violations: Vec<String>,
}

/// A host started by the soak, and how it ended.
struct Host {
    run: RunId,
    child: Option<Child>,
    started: Duration,
    /// Where in its run the host is killed, as a fraction of a typical host's life.
    kill_at: Option<f64>,
    killed: bool,
    exited_ok: bool,
}

impl Drop for Host {
    /// A soak that is stopped (its future dropped on a signal) leaves no host running.
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How far the settle got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    /// Waiting for the last hosts to end.
    Hosts,
    /// Waiting for every interrupted run to be recovered.
    Index,
    /// Waiting for the killed hosts' heartbeats to be removed.
    Heartbeats,
    /// Only the fleet's own objects are left.
    Done,
}

/// How long hosts that ran to their end lived: kills are spread over a typical run.
struct Lives {
    typical: Duration,
}

impl Lives {
    fn ended(&mut self, life: Duration) {
        // A moving average: runs slow down as the machine fills up.
        self.typical = self.typical.mul_f64(0.9) + life.mul_f64(0.1);
    }
}

/// Runs the soak; `progress` gets every sample as it is taken.
pub async fn soak(
    options: &SoakOptions,
    mut progress: impl FnMut(&SoakSample),
) -> Result<SoakReport> {
    let dir = WorkDir::new("soak")?;
    let store_url = options.store.clone().unwrap_or_else(|| StoreUrl::Local {
        root: dir.path().join("store"),
    });
    let store = Store::open(&store_url, &options.store_settings, SystemClock::shared()).await?;
    let config = write_config(dir.path(), options.steps, options.step_time)?;
    let ledger = dir.path().join("ledger");
    std::fs::write(&ledger, b"").map_err(setup("create the ledger"))?;
    let spawner = Spawner {
        bin_dir: options.bin_dir.clone(),
        store: store_url.to_string(),
        dir: dir.path().to_owned(),
        config,
        ttl: options.ttl,
    };
    let mut fleet = vec![(
        "coordinator".to_owned(),
        spawner.spawn(
            "rekindle-coordinator",
            "coordinator",
            &["--id", "soak-coordinator"],
        )?,
    )];
    for i in 0..options.workers {
        let state = dir.path().join(format!("worker-{i}"));
        let id = format!("soak-worker-{i}");
        let args: [&std::ffi::OsStr; 6] = [
            "--id".as_ref(),
            id.as_ref(),
            "--config".as_ref(),
            spawner.config.as_ref(),
            "--state-dir".as_ref(),
            state.as_ref(),
        ];
        fleet.push((
            format!("worker-{i}"),
            spawner.spawn("rekindle-worker", &format!("worker-{i}"), &args)?,
        ));
    }
    let mut fleet = FleetProcs(fleet);
    // Registered and leading before the first host arrives.
    crate::clock::sleep(Duration::from_secs(2)).await;

    let nonce = &store.clock().nonce()[..8];
    let mut random = SplitMix::new(options.seed);
    // Kills land anywhere in a host's life, as long as finished hosts lived.
    let mut lives = Lives {
        typical: options.steps as u32 * options.step_time,
    };
    let mut hosts: Vec<Host> = Vec::new();
    let mut samples: Vec<SoakSample> = Vec::new();
    let clock = Stopwatch::start();
    let mut next_arrival = Duration::ZERO;
    let mut next_sample = Duration::ZERO;
    let started_dir = dir.path().join("hosts");
    while clock.elapsed() < options.duration {
        let now = clock.elapsed();
        if now >= next_arrival {
            let run = RunId::new(format!("soak-{nonce}-{:06}", hosts.len()));
            let kill_at = (random.below(100) < options.kill_percent)
                .then(|| f64::from(random.below(1000)) / 1000.0);
            let child = spawner.host(&run, &started_dir)?;
            hosts.push(Host {
                run,
                child: Some(child),
                started: now,
                kill_at,
                killed: false,
                exited_ok: false,
            });
            next_arrival += options.arrival;
        }
        reap(&mut hosts, Some(now), &mut lives);
        if now >= next_sample {
            let sample = take_sample(&store, &store_url, &fleet, &hosts, dir.path(), now).await;
            progress(&sample);
            samples.push(sample);
            next_sample += options.sample_every;
        }
        crate::clock::sleep(Duration::from_millis(20)).await;
    }

    // Settle: the last hosts end, every interrupted run is recovered, and what the killed
    // hosts left goes (their heartbeats, three TTLs after their death, at the coordinator's
    // next scan). Samples go on meanwhile, as progress.
    let arrivals_ended = Stopwatch::start();
    let live = 1 + options.workers;
    let mut settled = Settle::Hosts;
    while settled != Settle::Done && arrivals_ended.elapsed() < options.settle {
        settled = match settled {
            Settle::Hosts => {
                reap(&mut hosts, None, &mut lives);
                if hosts.iter().any(|h| h.child.is_some()) {
                    Settle::Hosts
                } else {
                    Settle::Index
                }
            }
            Settle::Index => match IndexScan::default().scan(&store).await {
                Ok((entries, _)) if entries.is_empty() => Settle::Heartbeats,
                Ok(_) => Settle::Index,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the index");
                    Settle::Index
                }
            },
            Settle::Heartbeats => match store.list_all(PREFIXES[0]).await {
                Ok(listed) if heartbeats_only(&listed) <= live => Settle::Done,
                Ok(_) => Settle::Heartbeats,
                Err(error) => {
                    tracing::warn!(%error, "cannot list the heartbeats");
                    Settle::Heartbeats
                }
            },
            Settle::Done => Settle::Done,
        };
        if clock.elapsed() >= next_sample {
            let now = clock.elapsed();
            progress(&take_sample(&store, &store_url, &fleet, &hosts, dir.path(), now).await);
            next_sample += options.sample_every;
        }
        let pause = if settled == Settle::Hosts { 50 } else { 500 };
        crate::clock::sleep(Duration::from_millis(pause)).await;
    }
    let settle_s = arrivals_ended.elapsed().as_secs_f64();
    let mut violations = Vec::new();
    let waited = options.settle.as_secs();
    match settled {
        Settle::Hosts => {
            for host in hosts.iter_mut().filter(|h| h.child.is_some()) {
                violations.push(format!(
                    "{}: its host was still running {waited} s after the arrivals ended",
                    host.run
                ));
                if let Some(mut child) = host.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        Settle::Index => violations.push(format!(
            "runs were still in the index {waited} s after the arrivals ended (not recovered)"
        )),
        Settle::Heartbeats => violations.push(format!(
            "killed hosts' heartbeats were still there {waited} s after the arrivals ended, beside the fleet's {live} (the coordinator removes one three TTLs after its last beat, at its next scan)"
        )),
        Settle::Done => {}
    }
    let end = take_sample(
        &store,
        &store_url,
        &fleet,
        &hosts,
        dir.path(),
        clock.elapsed(),
    )
    .await;
    progress(&end);
    violations.extend(fleet.stop().await);
    let objects_after_stop = count_objects(&store).await;

    let audit = audit(&store, &hosts, &ledger).await;
    violations.extend(audit.violations);
    let first = samples.first().cloned().unwrap_or_else(|| end.clone());
    // After the warm-up (a tenth of the run, at least one sample interval): the samples that
    // should stay flat. Growth needs three of them to say anything.
    let warmup = (options.duration / 10).max(options.sample_every);
    let steady: Vec<&SoakSample> = samples
        .iter()
        .filter(|sample| sample.at_s >= warmup.as_secs_f64())
        .collect();
    let (warm, middle, last) = match steady[..] {
        [warm, .., last] if steady.len() >= 3 => (warm, steady[steady.len() / 2], last),
        _ => (&end, &end, &end),
    };
    let heap_growth_mib_per_hour: BTreeMap<String, [f64; 2]> = if steady.len() >= 3 {
        warm.heap_mib
            .keys()
            .map(|name| {
                let rate = |a: &SoakSample, b: &SoakSample| {
                    let hours = (b.at_s - a.at_s) / 3600.0;
                    let grew = b.heap_mib.get(name).copied().unwrap_or(0.0)
                        - a.heap_mib.get(name).copied().unwrap_or(0.0);
                    if hours > 0.0 { grew / hours } else { 0.0 }
                };
                (name.clone(), [rate(warm, middle), rate(middle, last)])
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let (warm, middle) = (warm.clone(), middle.clone());
    let kept = (!violations.is_empty()).then(|| dir.keep());
    Ok(SoakReport {
        bench: "soak",
        minutes: options.duration.as_secs_f64() / 60.0,
        workers: options.workers,
        runs: hosts.len(),
        killed: hosts.iter().filter(|h| h.killed).count(),
        finished_by_host: audit.finished_by_host,
        recovered: audit.recovered,
        never_started: audit.never_started,
        tool_calls_repeated: audit.repeated,
        settle_s,
        first,
        warm,
        middle,
        end,
        heap_growth_mib_per_hour,
        objects_after_stop,
        kept,
        violations,
    })
}

/// Collects hosts that exited and kills those due (`now`; `None` kills nothing more).
fn reap(hosts: &mut [Host], now: Option<Duration>, lives: &mut Lives) {
    for host in hosts.iter_mut() {
        let Some(child) = host.child.as_mut() else {
            continue;
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                host.exited_ok = status.success();
                host.child = None;
                if let Some(now) = now {
                    lives.ended(now.saturating_sub(host.started));
                }
            }
            Ok(None) => {
                if let (Some(now), Some(at)) = (now, host.kill_at)
                    && now >= host.started + lives.typical.mul_f64(at)
                {
                    let _ = child.kill();
                    let _ = child.wait();
                    host.killed = true;
                    host.child = None;
                }
            }
            Err(_) => host.child = None,
        }
    }
}

/// Starts the binaries against the soak's store, each logging to its own file.
struct Spawner {
    bin_dir: PathBuf,
    store: String,
    dir: PathBuf,
    config: PathBuf,
    ttl: Option<Duration>,
}

impl Spawner {
    fn command(&self, binary: &str, log: &str) -> Result<Command> {
        let log = std::fs::File::create(self.dir.join(format!("{log}.log")))
            .map_err(setup("create a process log"))?;
        let mut command = Command::new(self.bin_dir.join(binary));
        command
            .env("REKINDLE_STORE", &self.store)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        Ok(command)
    }

    /// `--lease-ttl-ms`, when the soak sets a TTL.
    fn ttl_args(&self) -> Vec<String> {
        self.ttl
            .map(|ttl| vec!["--lease-ttl-ms".to_owned(), ttl.as_millis().to_string()])
            .unwrap_or_default()
    }

    fn spawn(
        &self,
        binary: &str,
        log: &str,
        args: &[impl AsRef<std::ffi::OsStr>],
    ) -> Result<Child> {
        self.command(binary, log)?
            .args(args)
            .args(self.ttl_args())
            .spawn()
            .map_err(|error| {
                BenchError::Host(format!(
                    "cannot start {}: {error}",
                    self.bin_dir.join(binary).display()
                ))
            })
    }

    fn host(&self, run: &RunId, state: &Path) -> Result<Child> {
        let mut command = self.command("rekindle", "hosts")?;
        // Hosts share one log, appended.
        if let Ok(log) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join("hosts.log"))
        {
            command.stderr(log);
        }
        command
            .args(["run", "--config"])
            .arg(&self.config)
            .args(["--run-id", run.as_str(), "--state-dir"])
            .arg(state)
            .args(self.ttl_args())
            .arg("Record every step once.")
            .spawn()
            .map_err(|error| BenchError::Host(format!("cannot start a host: {error}")))
    }
}

/// The fleet's processes, stopped gracefully (SIGTERM) by [`FleetProcs::stop`] and killed if
/// dropped before.
struct FleetProcs(Vec<(String, Child)>);

impl FleetProcs {
    /// SIGTERM to each, then waits up to a minute; returns what did not stop cleanly.
    async fn stop(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for (_, child) in &self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let waiting = Stopwatch::start();
        for (name, child) in self.0.iter_mut() {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        problems.push(format!("the {name} exited {status} on SIGTERM"));
                        break;
                    }
                    Ok(None) if waiting.elapsed() < Duration::from_secs(70) => {
                        crate::clock::sleep(Duration::from_millis(50)).await;
                    }
                    _ => {
                        problems.push(format!("the {name} did not stop on SIGTERM"));
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        self.0.clear();
        problems
    }
}

impl Drop for FleetProcs {
    fn drop(&mut self) {
        for (_, child) in self.0.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn take_sample(
    store: &Store,
    url: &StoreUrl,
    fleet: &FleetProcs,
    hosts: &[Host],
    dir: &Path,
    at: Duration,
) -> SoakSample {
    let memory = |field: &str| -> BTreeMap<String, f64> {
        fleet
            .0
            .iter()
            .map(|(name, child)| (name.clone(), resident_mib(child.id(), field)))
            .collect()
    };
    let (rss_mib, heap_mib) = (memory("VmRSS:"), memory("RssAnon:"));
    let lock_files = match url {
        StoreUrl::Local { root } => Some(count_files(&root.join(".rekindle-locks"))),
        _ => None,
    };
    // The fleet is the coordinator and the workers.
    let worker_state_files = (0..fleet.0.len().saturating_sub(1))
        .map(|i| count_files(&dir.join(format!("worker-{i}"))))
        .sum();
    SoakSample {
        bench: "soak-sample",
        at_s: at.as_millis() as f64 / 1000.0,
        runs_started: hosts.len(),
        hosts_killed: hosts.iter().filter(|h| h.killed).count(),
        hosts_running: hosts.iter().filter(|h| h.child.is_some()).count(),
        rss_mib,
        heap_mib,
        objects: count_objects(store).await,
        lock_files,
        worker_state_files,
        host_state_files: count_files(&dir.join("hosts")),
    }
}

async fn count_objects(store: &Store) -> BTreeMap<String, usize> {
    let mut objects = BTreeMap::new();
    for prefix in PREFIXES {
        let count = match store.list_all(prefix).await {
            Ok(listed) if prefix == PREFIXES[0] => heartbeats_only(&listed),
            Ok(listed) => listed.len(),
            Err(error) => {
                tracing::warn!(%error, prefix, "cannot list");
                0
            }
        };
        let label = match prefix {
            "heartbeats/workers/" => "workers",
            other => other.trim_end_matches('/'),
        };
        objects.insert(label.to_owned(), count);
    }
    objects
}

/// How many of `listed` (the heartbeats' prefix) are heartbeats, not registrations.
fn heartbeats_only(listed: &[crate::store::Listed]) -> usize {
    listed
        .iter()
        .filter(|listed| crate::core::layout::is_heartbeat(&listed.key))
        .count()
}

/// A memory figure of a process's `/proc/<pid>/status` (`VmRSS:`, `RssAnon:`), in MiB (0
/// where /proc is not available).
fn resident_mib(pid: u32, field: &str) -> f64 {
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

/// Files under `dir`, recursively.
fn count_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => count_files(&entry.path()),
            Ok(_) => 1,
            Err(_) => 0,
        })
        .sum()
}

/// The agent every host runs: `steps` scripted turns, each calling a tool that appends
/// `<run> <call> <epoch>` to the ledger and sleeps `step_time`.
fn write_config(dir: &Path, steps: usize, step_time: Duration) -> Result<PathBuf> {
    write_script(dir, "soak-script.json", steps, "record")?;
    let ledger = dir.join("ledger");
    let config = format!(
        r#"system_prompt = "Record every step once."

[model]
kind = "scripted"
name = "soak-scripted"
script = "soak-script.json"

[[tools]]
name = "record"
description = "Append the step to the side-effect ledger"
command = ["sh", "-c", "printf '%s %s %s\n' \"$REKINDLE_RUN_ID\" \"$REKINDLE_CALL_ID\" \"$REKINDLE_EPOCH\" >> '{ledger}'; sleep {sleep}; echo ok"]
timeout_ms = 30000
"#,
        ledger = ledger.display(),
        sleep = step_time.as_secs_f64(),
    );
    let path = dir.join("rekindle.toml");
    std::fs::write(&path, config).map_err(setup("write the configuration"))?;
    Ok(path)
}

#[derive(Default)]
struct Audit {
    finished_by_host: usize,
    recovered: usize,
    never_started: usize,
    repeated: usize,
    violations: Vec<String>,
}

/// Checks every run against the bucket and the ledger.
async fn audit(store: &Store, hosts: &[Host], ledger: &Path) -> Audit {
    let mut ran: BTreeMap<(String, String), usize> = BTreeMap::new();
    for line in std::fs::read_to_string(ledger).unwrap_or_default().lines() {
        if let [run, call, _epoch] = line.split(' ').collect::<Vec<_>>()[..] {
            *ran.entry((run.to_owned(), call.to_owned())).or_default() += 1;
        }
    }
    let mut audit = Audit::default();
    for host in hosts {
        let run = &host.run;
        let mut violation = |text: String| audit.violations.push(format!("{run}: {text}"));
        let ran_any = ran.keys().any(|(r, _)| r == run.as_str());
        let source = match generation::load(store, run, None).await {
            Ok(source) if !source.state.facts().is_empty() => source,
            // Nothing committed (or only a fence): nothing was acknowledged, no tool may run.
            Ok(_) | Err(GenerationError::NotFound { .. }) => {
                if !host.killed {
                    violation(format!(
                        "its host was not killed (exit ok: {}) but nothing was committed",
                        host.exited_ok
                    ));
                }
                if ran_any {
                    violation("nothing was committed but its tools ran".into());
                }
                audit.never_started += 1;
                continue;
            }
            Err(error) => {
                violation(format!("does not load: {error}"));
                continue;
            }
        };
        let record = match recovery::read(store, &recovery_id_for(run)).await {
            Ok(record) => record.map(|(record, _)| record),
            Err(error) => {
                violation(format!("its recovery record does not read: {error}"));
                continue;
            }
        };
        let state = match &record {
            Some(record) => {
                if record.state != RecoveryState::Finished {
                    violation(format!(
                        "recovery {} ended {:?}",
                        record.recovery_id, record.state
                    ));
                    continue;
                }
                let recovered =
                    match generation::load(store, &RunId::new(record.recovery_id.as_str()), None)
                        .await
                    {
                        Ok(loaded) => loaded,
                        Err(error) => {
                            violation(format!("its recovery does not load: {error}"));
                            continue;
                        }
                    };
                match generation::load(store, run, Some(record.source_generation)).await {
                    Ok(pinned) if recovered.state.facts().starts_with(pinned.state.facts()) => {}
                    Ok(_) => violation("its recovery lost facts the source acknowledged".into()),
                    Err(error) => violation(format!("its pinned source does not load: {error}")),
                }
                audit.recovered += 1;
                recovered.state
            }
            None => {
                // Its host finished it (perhaps killed after its last commit).
                if source.state.terminal().is_none() {
                    violation("its host did not finish it and no recovery did".into());
                    continue;
                }
                if !host.killed && !host.exited_ok {
                    violation("its host finished it but exited with a failure".into());
                }
                audit.finished_by_host += 1;
                source.state
            }
        };
        if state.terminal().is_none() {
            violation("never reached a terminal state".into());
            continue;
        }
        let mut repeats = 0;
        for fact in state.facts() {
            if let FactBody::ToolResult(result) = &fact.body {
                match ran.get(&(run.to_string(), result.call_id.to_string())) {
                    Some(times) => repeats += times - 1,
                    None => violation(format!(
                        "a result of call {} was committed but the call never ran",
                        result.call_id
                    )),
                }
            }
        }
        // One kill interrupts at most one call in flight.
        let allowed = usize::from(host.killed);
        if repeats > allowed {
            violation(format!(
                "{repeats} tool calls ran twice; its host was killed {allowed} times"
            ));
        }
        audit.repeated += repeats;
    }
    audit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_counted_recursively() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/one"), b"1").unwrap();
        std::fs::write(dir.path().join("two"), b"2").unwrap();
        assert_eq!(count_files(dir.path()), 2);
        assert_eq!(count_files(&dir.path().join("missing")), 0);
    }

    #[test]
    fn a_process_has_resident_memory() {
        assert!(resident_mib(std::process::id(), "VmRSS:") > 0.0);
        assert!(resident_mib(std::process::id(), "RssAnon:") > 0.0);
        assert_eq!(resident_mib(std::process::id(), "NoSuchField:"), 0.0);
    }
}
