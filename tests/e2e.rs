//! End to end with real processes: a host killed with -9, then a real coordinator pair and
//! workers; a worker killed mid-recovery; the leading coordinator killed. Every run must
//! complete, and the side-effect ledger must show no committed tool call executed again.

#![allow(clippy::disallowed_methods)] // real processes on real time: deadlines and pauses are wall time.

mod common;

use rekindle::core::record::RecoveryState;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rekindle::core::assignment::recovery_id_for;
use rekindle::core::fact::RunId;
use rekindle::store::Store;
use rekindle::store::recovery::{self};

struct Fleet {
    dir: PathBuf,
    store_url: String,
    config: PathBuf,
    ledger: PathBuf,
}

impl Fleet {
    fn new(dir: &Path, store_url: String) -> Fleet {
        Self::with(dir, store_url, 4, false)
    }

    fn with(dir: &Path, store_url: String, steps: usize, confirm: bool) -> Fleet {
        let ledger = dir.join("ledger.txt");
        let turns: Vec<serde_json::Value> = (1..=steps)
            .map(|i| serde_json::json!({"content": format!("step {i}"), "tool_calls": [{"name": "record", "arguments": {"step": i}}]}))
            .chain(std::iter::once(serde_json::json!({"content": "done"})))
            .collect();
        std::fs::write(dir.join("script.json"), serde_json::to_vec(&turns).unwrap()).unwrap();
        let config = format!(
            r#"system_prompt = "e2e"
[model]
kind = "scripted"
name = "e2e"
script = "script.json"
[[tools]]
name = "record"
command = ["sh", "-c", "printf '%s %s %s\n' \"$REKINDLE_RUN_ID\" \"$REKINDLE_CALL_ID\" \"$REKINDLE_EPOCH\" >> '{}'; sleep 0.4; echo ok"]
timeout_ms = 10000
confirm = {confirm}
"#,
            ledger.display()
        );
        let config_path = dir.join("rekindle.toml");
        std::fs::write(&config_path, config).unwrap();
        Fleet {
            dir: dir.to_owned(),
            store_url,
            config: config_path,
            ledger,
        }
    }

    fn command(&self, binary: &str) -> Command {
        let mut command = Command::new(binary);
        command
            .env("REKINDLE_STORE", &self.store_url)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    fn host(&self, run: &str) -> common::Proc {
        self.command(env!("CARGO_BIN_EXE_rekindle"))
            .args(["run", "--config"])
            .arg(&self.config)
            .args(["--run-id", run, "--lease-ttl-ms", "1000", "--state-dir"])
            .arg(self.dir.join("host"))
            .arg("record four steps")
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    }

    fn worker(&self, id: &str) -> common::Proc {
        self.command(env!("CARGO_BIN_EXE_rekindle-worker"))
            .args(["--config"])
            .arg(&self.config)
            .args([
                "--id",
                id,
                "--lease-ttl-ms",
                "1000",
                "--poll-interval-ms",
                "150",
                "--state-dir",
            ])
            .arg(self.dir.join(id))
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    }

    fn coordinator(&self, id: &str) -> common::Proc {
        self.command(env!("CARGO_BIN_EXE_rekindle-coordinator"))
            .args([
                "--id",
                id,
                "--lease-ttl-ms",
                "1000",
                "--scan-interval-ms",
                "150",
            ])
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        self.command(env!("CARGO_BIN_EXE_rekindle"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    }

    /// Starts a host and kills it with -9 once it has run its first tool call.
    fn crash_host(&self, run: &str) {
        let mut host = self.host(run);
        self.wait_for_ledger(1, Duration::from_secs(30));
        host.kill().unwrap();
        host.wait().unwrap();
    }

    fn ledger_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn wait_for_ledger(&self, lines: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.ledger_lines().len() < lines {
            assert!(
                Instant::now() < deadline,
                "the ledger stayed below {lines} lines"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The lines `child` prints on its piped stdout, as they come.
fn stdout_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    heard
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    child.wait().unwrap()
}

async fn wait_finished(
    store: &Store,
    run: &RunId,
    timeout: Duration,
) -> rekindle::core::record::RecoveryRecord {
    let id = recovery_id_for(run);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some((record, _)) = recovery::read(store, &id).await.unwrap()
            && record.state == RecoveryState::Finished
        {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "recovery of {run} did not finish in {timeout:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(100)).await;
    }
}

/// Each (run, call) ran at most once per incarnation (epoch) of the run, and every one of
/// the four calls ran.
fn audit(lines: &[String], run: &str) {
    audit_calls(lines, run, 4);
}

fn audit_calls(lines: &[String], run: &str, expected_calls: usize) {
    let mut calls = std::collections::BTreeMap::<String, usize>::new();
    let mut epochs = std::collections::BTreeSet::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts[0], run, "{line}");
        *calls.entry(parts[1].to_owned()).or_default() += 1;
        epochs.insert(parts[2].to_owned());
    }
    assert_eq!(calls.len(), expected_calls, "{lines:?}");
    let repeats: usize = calls.values().map(|n| n - 1).sum();
    assert!(
        repeats < epochs.len(),
        "{repeats} repeats over {} incarnations: {lines:?}",
        epochs.len()
    );
}

// Proves a host killed with -9 mid-run is finished by a real fleet, a worker killed -9 in the
// middle of that recovery is replaced, and the ledger shows no committed call run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_host_and_worker_are_recovered_by_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let run = RunId::new("e2e-run");

    fleet.crash_host(run.as_str());

    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut w0 = fleet.worker("w0");
    let mut w1 = fleet.worker("w1");
    // Kill whichever worker holds the recovery as soon as it has run a call.
    let store = common::local(&bucket).await;
    let recovery_run = RunId::new(recovery_id_for(&run).as_str());
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        if let Ok(Some(view)) = rekindle::store::lease::read_lease(&store, &recovery_run).await
            && fleet.ledger_lines().iter().any(|l| !l.ends_with(" 1"))
        {
            break view.lease.holder;
        }
        assert!(Instant::now() < deadline, "the recovery never started");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    };
    let (killed, survivor) = if victim == "w0" {
        (&mut w0, &mut w1)
    } else {
        (&mut w1, &mut w0)
    };
    killed.kill().unwrap();
    killed.wait().unwrap();

    let record = wait_finished(&store, &run, Duration::from_secs(60)).await;
    assert_eq!(
        record.result.unwrap().outcome,
        rekindle::core::fact::Outcome::Completed
    );
    audit(&fleet.ledger_lines(), run.as_str());

    // Graceful stop: both surviving processes exit 0 on SIGTERM.
    assert!(sigterm(survivor).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves a standby coordinator takes over when the leader is killed -9, and the run it
// then finds interrupted is recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_coordinator_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let store = common::local(&bucket).await;

    let mut leader = fleet.coordinator("coordinator-a");
    // Let the first one take the lead before the standby starts.
    let lease = RunId::new(rekindle::core::layout::COORDINATOR_LEASE_RUN);
    let deadline = Instant::now() + Duration::from_secs(30);
    while rekindle::store::lease::read_lease(&store, &lease)
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "no coordinator took the lead");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    let mut standby = fleet.coordinator("coordinator-b");
    let mut worker = fleet.worker("w0");
    leader.kill().unwrap();
    leader.wait().unwrap();

    let run = RunId::new("e2e-standby");
    fleet.crash_host(run.as_str());

    wait_finished(&store, &run, Duration::from_secs(60)).await;
    let view = rekindle::store::lease::read_lease(&store, &lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.lease.holder, "coordinator-b");
    audit(&fleet.ledger_lines(), run.as_str());
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut standby).success());
}

// Proves two coordinator binaries share a split bucket and one killed -9 leaves its share to
// the other: both own partitions, the survivor owns all four once the other's TTL ran out,
// and runs whose hosts crash in every partition are each recovered once. A third started with
// another count refuses to start, naming the marker and both counts, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_sharing_a_split_bucket_survive_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let store = common::local(&bucket).await;
    let sharing = |id: &str| {
        fleet
            .command(env!("CARGO_BIN_EXE_rekindle-coordinator"))
            .args([
                "--id",
                id,
                "--lease-ttl-ms",
                "1000",
                "--scan-interval-ms",
                "150",
            ])
            .args(["--partitions", "4"])
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    };
    let owners = || async {
        let mut owners = Vec::new();
        for partition in 0..4 {
            let lease = RunId::new(rekindle::core::layout::partition_lease(partition));
            owners.push(
                match rekindle::store::lease::read_lease(&store, &lease)
                    .await
                    .unwrap()
                {
                    Some(view) if !view.lease.released => Some(view.lease.holder),
                    _ => None,
                },
            );
        }
        owners
    };
    let mut first = sharing("coordinator-a");
    let mut second = sharing("coordinator-b");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let owners = owners().await;
        let by = |id: &str| owners.iter().flatten().any(|owner| owner == id);
        if owners.iter().all(Option::is_some) && by("coordinator-a") && by("coordinator-b") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the partitions were not shared: {owners:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    let status = stdout(&fleet.cli(&["status"]));
    assert!(
        status.contains("partitions   4, owned by coordinator-a (")
            && status.contains("coordinator-b (")
            && status.contains(" owns partition 0 (epoch "),
        "{status}"
    );
    let refused = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-coordinator"))
        .args(["--id", "coordinator-c", "--partitions", "8"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("rekindle-format")
            && stderr.contains("split into 4 partitions; 8 were asked for"),
        "{stderr}"
    );
    assert_eq!(rekindle::store::partitions::read(&store).await.unwrap(), 4);
    let mut worker = fleet.worker("w0");
    first.kill().unwrap();
    first.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while owners()
        .await
        .iter()
        .any(|owner| owner.as_deref() != Some("coordinator-b"))
    {
        assert!(
            Instant::now() < deadline,
            "the killed one's share was not taken over"
        );
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    let runs: Vec<String> = (0..4).map(|i| format!("e2e-split-{i}")).collect();
    for run in &runs {
        // Killed after its first tool call.
        let mut host = fleet.host(run);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !fleet
            .ledger_lines()
            .iter()
            .any(|line| line.starts_with(&format!("{run} ")))
        {
            assert!(Instant::now() < deadline, "{run} made no tool call");
            std::thread::sleep(Duration::from_millis(20));
        }
        host.kill().unwrap();
        host.wait().unwrap();
    }
    for run in &runs {
        wait_finished(&store, &RunId::new(run.as_str()), Duration::from_secs(60)).await;
        let lines: Vec<String> = fleet
            .ledger_lines()
            .into_iter()
            .filter(|line| line.starts_with(&format!("{run} ")))
            .collect();
        audit(&lines, run);
    }
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut second).success());
    // The survivor let go of every partition on the way out, and `status` says so.
    assert!(owners().await.iter().all(Option::is_none));
    let status = stdout(&fleet.cli(&["status"]));
    assert!(
        status.contains("partitions   4, owned by nobody; unowned: 0, 1, 2, 3"),
        "{status}"
    );
}

fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

// Proves a parked run takes no step until it is answered through the CLI, and is then
// finished by the fleet, its approved tool call executed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_run_is_answered_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::with(dir.path(), bucket.display().to_string(), 1, true);
    let run = RunId::new("e2e-parked");
    let host = fleet
        .host(run.as_str())
        .into_inner()
        .wait_with_output()
        .unwrap();
    assert!(host.status.success(), "{host:?}");
    let listed = stdout(&fleet.cli(&["runs", "ls", "--state", "parked", "--json"]));
    assert!(listed.contains("e2e-parked"), "{listed}");
    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut worker = fleet.worker("w0");
    rekindle::clock::sleep(Duration::from_millis(1500)).await;
    assert!(fleet.ledger_lines().is_empty(), "a parked run took a step");
    let shown = stdout(&fleet.cli(&["runs", "show", "e2e-parked"]));
    assert!(shown.contains("confirmation"), "{shown}");

    let answered = fleet.cli(&["answer", "e2e-parked", "--confirm", "call_1_1", "--approve"]);
    assert!(answered.status.success(), "{answered:?}");
    let store = common::local(&bucket).await;
    wait_finished(&store, &run, Duration::from_secs(60)).await;
    let lines = fleet.ledger_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    audit_calls(&lines, run.as_str(), 1);
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves admitting the same recovery ID twice returns the existing recovery and the run is
// executed once; a different ID for the same run is refused naming the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_recovery_id_twice_executes_once() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let run = "e2e-twice";
    fleet.crash_host(run);

    // The killed host's lease is still held: the first admission watches it for its TTL.
    let first = stdout(&fleet.cli(&["recover", run, "--recovery-id", "mine"]));
    assert!(first.contains("watching its heartbeat"), "{first}");
    let second = stdout(&fleet.cli(&["recover", run, "--recovery-id", "mine"]));
    // The replay reports the same recovery, and says that it is one.
    let replayed =
        first
            .lines()
            .last()
            .unwrap()
            .replacen(": ", " was admitted before (a replay): ", 1);
    assert_eq!(second.lines().last(), Some(replayed.as_str()), "{second}");
    assert!(!first.contains("a replay"), "{first}");
    assert_eq!(
        second.lines().count(),
        1,
        "a replay waits for nothing: {second}"
    );
    let other = fleet.cli(&["recover", run, "--recovery-id", "other"]);
    assert_eq!(other.status.code(), Some(1));
    let error = String::from_utf8_lossy(&other.stderr);
    assert!(
        error.contains("is already being recovered as 'mine'"),
        "{error}"
    );

    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut worker = fleet.worker("w0");
    let waited = fleet.cli(&["recover", run, "--recovery-id", "mine", "--wait"]);
    assert!(stdout(&waited).contains("recovery mine: completed"));
    let store = common::local(&bucket).await;
    let (record, _) = recovery::read(&store, &rekindle::core::fact::RecoveryId::new("mine"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempts, 1);
    audit(&fleet.ledger_lines(), run);
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves the killed-host recovery on the S3 test server, with real processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_host_is_recovered_on_s3() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}/e2e-{}",
        common::s3_url().trim_end_matches('/'),
        std::process::id()
    );
    let fleet = Fleet::new(dir.path(), url.clone());
    let run = RunId::new("e2e-s3");
    fleet.crash_host(run.as_str());
    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut worker = fleet.worker("w0");
    let store = common::s3_store_at(&url).await;
    wait_finished(&store, &run, Duration::from_secs(60)).await;
    audit(&fleet.ledger_lines(), run.as_str());
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves the fleet binaries serve health, readiness and Prometheus metrics.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GETs `path` from a fleet process's endpoint: (status, body), or `None` while it does not
/// answer.
async fn probe(port: u16, path: &str) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// Waits until `path` answers with a body for which `until` holds; returns it.
async fn probe_until(
    port: u16,
    path: &str,
    timeout: Duration,
    until: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        if let Some((status, body)) = probe(port, path).await {
            if until(status, &body) {
                return (status, body);
            }
            last = Some((status, body));
        }
        assert!(
            Instant::now() < deadline,
            "{path} on port {port} never answered as expected; last: {last:?}"
        );
        rekindle::clock::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of one sample line `name{labels} value` in a metrics text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

// Proves the fleet binaries export the metrics catalogue through the Prometheus recorder:
// counters typed as counters with `_total`, gauges, histograms, and that a real recovery
// moves them (admitted, assigned, started, finished, the latency histograms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binaries_export_the_metrics_a_recovery_moves() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    fleet.crash_host("e2e-metrics");
    let (worker_port, coordinator_port) = (free_port(), free_port());
    let mut worker = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-worker"))
        .args(["--config"])
        .arg(&fleet.config)
        .args(["--id", "w-metrics", "--lease-ttl-ms", "1000", "--listen"])
        .arg(format!("127.0.0.1:{worker_port}"))
        .arg("--state-dir")
        .arg(dir.path().join("w"))
        .spawn()
        .map(common::Proc::new)
        .unwrap();
    let mut coordinator = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-coordinator"))
        .args(["--id", "c-metrics", "--lease-ttl-ms", "1000"])
        .args(["--scan-interval-ms", "150", "--listen"])
        .arg(format!("127.0.0.1:{coordinator_port}"))
        .spawn()
        .map(common::Proc::new)
        .unwrap();
    let store = common::local(&bucket).await;
    wait_finished(&store, &RunId::new("e2e-metrics"), Duration::from_secs(60)).await;

    let (_, text) = probe_until(
        worker_port,
        "/metrics",
        Duration::from_secs(10),
        |_, body| {
            sample(
                body,
                "rekindle_recoveries_finished_total{component=\"worker\"}",
            ) == Some(1.0)
        },
    )
    .await;
    for line in [
        "# TYPE rekindle_recoveries_finished_total counter",
        "# TYPE rekindle_recovery_attempts_started_total counter",
        "# TYPE rekindle_worker_utilization gauge",
        "# TYPE rekindle_admission_to_first_step_seconds histogram",
        "# TYPE rekindle_interruption_to_resumption_seconds histogram",
        "# TYPE rekindle_step_duration_seconds histogram",
        "# TYPE rekindle_store_request_duration_seconds histogram",
        "# TYPE rekindle_store_requests_total counter",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let worker_series = |series: &str| sample(&text, series);
    assert_eq!(
        worker_series("rekindle_recovery_attempts_started_total{component=\"worker\"}"),
        Some(1.0)
    );
    assert_eq!(
        worker_series("rekindle_worker_capacity{component=\"worker\"}"),
        Some(4.0)
    );
    assert_eq!(
        worker_series("rekindle_admission_to_first_step_seconds_count{component=\"worker\"}"),
        Some(1.0)
    );
    assert_eq!(
        worker_series("rekindle_interruption_to_resumption_seconds_count{component=\"worker\"}"),
        Some(1.0)
    );
    // The host was killed after its first tool call ran and before (or as) it committed:
    // the recovery ran the rest, each step timed.
    assert!(
        worker_series("rekindle_step_duration_seconds_count{component=\"worker\",kind=\"tool\"}")
            .is_some_and(|n| n >= 3.0),
        "{text}"
    );
    assert!(
        worker_series(
            "rekindle_store_requests_total{component=\"worker\",kind=\"conditional_put\",outcome=\"ok\"}"
        )
        .is_some_and(|n| n > 0.0),
        "{text}"
    );
    // No hand-written gauges for counts any more.
    assert!(!text.contains("rekindle_recoveries_finished{"), "{text}");

    let (_, text) = probe_until(
        coordinator_port,
        "/metrics",
        Duration::from_secs(10),
        |_, body| {
            sample(
                body,
                "rekindle_recoveries_assigned_total{component=\"coordinator\"}",
            )
            .is_some_and(|n| n >= 1.0)
        },
    )
    .await;
    let coordinator_series = |series: &str| sample(&text, series);
    assert_eq!(
        coordinator_series("rekindle_coordinator_leading{component=\"coordinator\"}"),
        Some(1.0)
    );
    assert_eq!(
        coordinator_series("rekindle_recoveries_admitted_total{component=\"coordinator\"}"),
        Some(1.0)
    );
    assert!(
        coordinator_series("rekindle_fences_total{component=\"coordinator\"}")
            .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        coordinator_series("rekindle_workers_live{component=\"coordinator\"}"),
        Some(1.0)
    );
    assert!(text.contains("rekindle_runs{component=\"coordinator\",state=\"interrupted\"}"));
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves /readyz means something: 503 while the store is being opened (an endpoint that does
// not answer), 200 once registered, 503 naming the heartbeat while heartbeats fail (a
// partition), 200 again once they succeed; a coordinator says whether it leads or stands by;
// and a --listen address in use is a startup error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store_the_heartbeats_and_leadership() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());

    // Nobody answers at this endpoint: the store cannot be opened, the process stays unready.
    let unreachable = free_port();
    let port = free_port();
    let _opening = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-worker"))
        .env("REKINDLE_STORE", "s3://nowhere/prefix")
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "x")
        .env("AWS_REGION", "us-east-1")
        .args(["--allow-http", "--endpoint"])
        .arg(format!("http://127.0.0.1:{unreachable}"))
        .args(["--config"])
        .arg(&fleet.config)
        .args(["--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(dir.path().join("opening"))
        .spawn()
        .map(common::Proc::new)
        .unwrap();
    let (status, body) = probe_until(port, "/readyz", Duration::from_secs(20), |_, _| true).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("opening the store"), "{body}");
    assert_eq!(probe(port, "/healthz").await.map(|(s, _)| s), Some(200));

    // A worker whose heartbeats fail while a file exists (the fault layer's partition).
    let partition = dir.path().join("partition");
    let port = free_port();
    let mut worker = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-worker"))
        .env("REKINDLE_FAULTS_PARTITION_FILE", &partition)
        .args(["--config"])
        .arg(&fleet.config)
        .args([
            "--id",
            "w-ready",
            "--lease-ttl-ms",
            "600",
            "--idle-ttl-ms",
            "0",
        ])
        .args(["--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(dir.path().join("w"))
        .spawn()
        .map(common::Proc::new)
        .unwrap();
    let (_, body) = probe_until(port, "/readyz", Duration::from_secs(30), |s, _| s == 200).await;
    assert_eq!(body.trim(), "ready");
    std::fs::write(&partition, "").unwrap();
    // Not ready once no heartbeat landed for a TTL (the beat is still being retried), and
    // still not ready once it failed.
    let (_, body) = probe_until(port, "/readyz", Duration::from_secs(60), |s, _| s == 503).await;
    assert!(body.contains("heartbeat failing"), "{body}");
    let (_, metrics) = probe_until(port, "/metrics", Duration::from_secs(60), |_, body| {
        sample(
            body,
            "rekindle_heartbeat_failures_total{component=\"worker\"}",
        )
        .is_some_and(|n| n >= 1.0)
    })
    .await;
    assert_eq!(
        sample(&metrics, "rekindle_ready{component=\"worker\"}"),
        Some(0.0)
    );
    assert!(
        sample(
            &metrics,
            "rekindle_heartbeat_failures_total{component=\"worker\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    std::fs::remove_file(&partition).unwrap();
    probe_until(port, "/readyz", Duration::from_secs(30), |s, _| s == 200).await;

    // The same address again: refused at startup, naming it.
    let taken = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-worker"))
        .args(["--config"])
        .arg(&fleet.config)
        .args(["--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(dir.path().join("w2"))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!taken.status.success());
    let stderr = String::from_utf8_lossy(&taken.stderr);
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(sigterm(&mut worker).success());

    // Two coordinators: one leads, the other stands by, and both are ready.
    let (first, second) = (free_port(), free_port());
    let mut leader = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-coordinator"))
        .args(["--id", "c-first", "--lease-ttl-ms", "1000", "--listen"])
        .arg(format!("127.0.0.1:{first}"))
        .spawn()
        .map(common::Proc::new)
        .unwrap();
    probe_until(first, "/readyz", Duration::from_secs(30), |_, body| {
        body.trim() == "ready: leading"
    })
    .await;
    let mut standby = fleet
        .command(env!("CARGO_BIN_EXE_rekindle-coordinator"))
        .args(["--id", "c-second", "--lease-ttl-ms", "1000", "--listen"])
        .arg(format!("127.0.0.1:{second}"))
        .spawn()
        .map(common::Proc::new)
        .unwrap();
    let (status, _) = probe_until(second, "/readyz", Duration::from_secs(30), |_, body| {
        body.trim() == "ready: standing by"
    })
    .await;
    assert_eq!(status, 200);
    let (_, metrics) = probe_until(second, "/metrics", Duration::from_secs(5), |_, _| true).await;
    assert_eq!(
        sample(
            &metrics,
            "rekindle_coordinator_leading{component=\"coordinator\"}"
        ),
        Some(0.0)
    );
    assert!(sigterm(&mut standby).success());
    assert!(sigterm(&mut leader).success());
}

// Proves `recover --all` finds a run whose host was killed (its heartbeat stops changing for
// a TTL), admits it, and with --wait returns once the fleet finished it. With no coordinator,
// --wait says so instead of waiting silently, but not for a recovery that already ended; run
// again, it waits for the recovery an earlier run admitted instead of returning at once
// (new-user findings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_all_admits_interrupted_runs() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    fleet.crash_host("e2e-all");
    let text = stdout(&fleet.cli(&["recover", "--all"]));
    assert!(text.contains("1 interrupted run admitted"), "{text}");
    let mut waiting = fleet
        .command(env!("CARGO_BIN_EXE_rekindle"))
        .args(["recover", "--all", "--wait"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let heard = stdout_lines(&mut waiting);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|l: &String| l.contains("no coordinator is running"))
    {
        match heard.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => seen.push(line),
            Err(error) => panic!("{error}; printed so far: {seen:?}"),
        }
    }
    assert!(
        seen.iter()
            .any(|l| l.contains("waiting also for 1 recovery admitted otherwise")),
        "{seen:?}"
    );
    assert!(waiting.try_wait().unwrap().is_none(), "it stopped waiting");
    waiting.kill().unwrap();
    waiting.wait().unwrap();
    let mut worker = fleet.worker("w0");
    let mut coordinator = fleet.coordinator("coordinator-a");
    let text = stdout(&fleet.cli(&["recover", "--all", "--wait"]));
    assert!(text.contains("0 interrupted runs admitted"), "{text}");
    assert!(
        text.contains("recovery recovery-of-e2e-all: completed"),
        "waited for the earlier admission: {text}"
    );
    // A replay of a recovery that ended waits for nothing, so it does not warn that no
    // coordinator runs, with none running.
    assert!(sigterm(&mut coordinator).success());
    let text = stdout(&fleet.cli(&[
        "recover",
        "e2e-all",
        "--recovery-id",
        "recovery-of-e2e-all",
        "--wait",
    ]));
    assert!(
        text.contains("recovery recovery-of-e2e-all: completed"),
        "{text}"
    );
    assert!(!text.contains("no coordinator is running"), "{text}");
    audit(&fleet.ledger_lines(), "e2e-all");
    assert!(sigterm(&mut worker).success());
}

// Proves `recover --wait` rides out a store that stops answering: cut off (the fault layer's
// partition) for longer than the store's own retries last, it says so and keeps waiting, and
// returns once the fleet finished the recovery (a new-user finding: one read whose retries
// ran out ended a long wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_wait_rides_out_a_store_outage() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    fleet.crash_host("e2e-outage");
    let partition = dir.path().join("partition");
    let mut waiting = fleet
        .command(env!("CARGO_BIN_EXE_rekindle"))
        .args(["recover", "e2e-outage", "--recovery-id", "after-outage"])
        .args(["--takeover", "--wait"])
        .env("REKINDLE_FAULTS_PARTITION_FILE", &partition)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let heard = stdout_lines(&mut waiting);
    let mut seen = Vec::new();
    let mut until = |wanted: &str, timeout: Duration| {
        while !seen.iter().any(|l: &String| l.contains(wanted)) {
            match heard.recv_timeout(timeout) {
                Ok(line) => seen.push(line),
                Err(error) => panic!("{error} waiting for {wanted:?}; printed so far: {seen:?}"),
            }
        }
        seen.clone()
    };
    until("no coordinator is running", Duration::from_secs(30));
    std::fs::write(&partition, "").unwrap();
    // The store's own retries take about ten seconds to run out.
    until("the store does not answer", Duration::from_secs(90));
    assert!(waiting.try_wait().unwrap().is_none(), "it stopped waiting");
    std::fs::remove_file(&partition).unwrap();
    until("the store answers again", Duration::from_secs(30));
    let mut worker = fleet.worker("w0");
    let mut coordinator = fleet.coordinator("coordinator-a");
    let printed = until("recovery after-outage: completed", Duration::from_secs(60));
    assert!(waiting.wait().unwrap().success(), "{printed:?}");
    audit(&fleet.ledger_lines(), "e2e-outage");
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves the shipped deploy/demo configuration loads.
#[test]
fn deploy_demo_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/demo/rekindle.toml");
    let config = rekindle::host::config::Config::load(&path).unwrap();
    rekindle::fleet::Agent::from_config(config).unwrap();
}

// Proves `runs rm` refuses a run whose lease is held, and retires a finished run so it cannot
// come back: it keeps its lease and a tombstone, `runs show` says it was retired, and running
// the same run ID again is refused without executing a tool call (runs rm resurrected runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_rm_retires_a_finished_run_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::with(dir.path(), bucket.display().to_string(), 1, false);
    let host = fleet
        .host("e2e-rm")
        .into_inner()
        .wait_with_output()
        .unwrap();
    assert!(host.status.success(), "{host:?}");
    let shown = stdout(&fleet.cli(&["runs", "show", "e2e-rm", "--json"]));
    assert!(shown.contains("\"outcome\":\"completed\""), "{shown}");

    let store = common::local(&bucket).await;
    let holder = rekindle::store::lease::Holder::new(&store, "someone", Duration::from_secs(60));
    let held = holder.acquire(&RunId::new("e2e-rm")).await.unwrap();
    let refused = fleet.cli(&["runs", "rm", "e2e-rm"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is leased by 'someone'"));
    holder.release(&held).await.unwrap();

    let removed = stdout(&fleet.cli(&["runs", "rm", "e2e-rm"]));
    assert!(removed.contains("objects deleted"), "{removed}");
    let gone = fleet.cli(&["runs", "show", "e2e-rm"]);
    assert_eq!(gone.status.code(), Some(1));
    let gone = String::from_utf8_lossy(&gone.stderr).into_owned();
    assert!(
        gone.contains("run \"e2e-rm\" was retired after it ended (completed)"),
        "{gone}"
    );
    let base = rekindle::core::layout::run_base("e2e-rm");
    for key in [format!("{base}/lease"), format!("{base}/tombstone")] {
        assert!(store.head(&key).await.unwrap().is_some(), "{key} is gone");
    }
    // The retirement reserved the lease: nobody holds the run again, and an answer says why.
    let taken = holder.acquire(&RunId::new("e2e-rm")).await;
    assert!(
        matches!(
            taken,
            Err(rekindle::store::lease::LeaseError::Retired { .. })
        ),
        "a retired run's lease was taken: {taken:?}"
    );
    let answered = fleet.cli(&["answer", "e2e-rm", "--question", "q1", "--text", "late"]);
    assert_eq!(answered.status.code(), Some(1), "{answered:?}");
    let answered = String::from_utf8_lossy(&answered.stderr).into_owned();
    assert!(
        answered.contains("e2e-rm") && answered.contains("retired"),
        "{answered}"
    );
    // Retiring it again finishes nothing new and says so.
    let again = stdout(&fleet.cli(&["runs", "rm", "e2e-rm"]));
    assert!(again.contains("0 objects deleted"), "{again}");
    let calls = std::fs::read_to_string(&fleet.ledger).unwrap();
    let again = fleet
        .host("e2e-rm")
        .into_inner()
        .wait_with_output()
        .unwrap();
    assert!(!again.status.success(), "the retired run ran again");
    assert_eq!(
        std::fs::read_to_string(&fleet.ledger).unwrap(),
        calls,
        "a retired run executed tool calls again"
    );

    // A run ID that never existed (a typo) is refused, and no tombstone reserves it.
    let typo = fleet.cli(&["runs", "rm", "e2e-never-was"]);
    assert_eq!(typo.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&typo.stderr).contains("run \"e2e-never-was\" does not exist"),
        "{typo:?}"
    );
    let never = rekindle::core::layout::run_base("e2e-never-was");
    assert!(
        store
            .head(&format!("{never}/tombstone"))
            .await
            .unwrap()
            .is_none()
    );
}

// Proves an interrupted workflow, resumed by running it again, skips finished steps and
// completes the rest on the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_workflow_resumes_and_skips_finished_steps() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::with(dir.path(), bucket.display().to_string(), 1, false);
    let specs = dir.path().join("specs.json");
    std::fs::write(
        &specs,
        r#"[{"step": "a", "prompt": "first"}, {"step": "b", "prompt": "second"}, {"step": "c", "prompt": "third"}]"#,
    )
    .unwrap();
    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut worker = fleet.worker("w0");
    let workflow = |fleet: &Fleet| {
        fleet
            .command(env!("CARGO_BIN_EXE_rekindle"))
            .args(["workflow", "run", "--config"])
            .arg(&fleet.config)
            .args(["--id", "wf"])
            .arg(&specs)
            .stdout(Stdio::piped())
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    };
    let mut first = workflow(&fleet);
    let store = common::local(&bucket).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while rekindle::store::checkpoint::load_workflow(&store, "wf")
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "no step finished");
        rekindle::clock::sleep(Duration::from_millis(20)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();

    let second = workflow(&fleet).into_inner().wait_with_output().unwrap();
    let text = stdout(&second);
    let skipped: usize = text
        .split("workflow wf: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(skipped >= 1, "{text}");
    let (saved, _) = rekindle::store::checkpoint::load_workflow(&store, "wf")
        .await
        .unwrap()
        .unwrap();
    let mut steps: Vec<&str> = saved.completed.iter().map(|s| s.step.as_str()).collect();
    steps.sort();
    assert_eq!(steps, ["a", "b", "c"]);
    let lines = fleet.ledger_lines();
    for step in ["a", "b", "c"] {
        let mine: Vec<String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("wf.{step} ")))
            .cloned()
            .collect();
        audit_calls(&mine, &format!("wf.{step}"), 1);
    }
    // The same workflow with a finished step's prompt changed: refused, naming the step,
    // never skipped with the old result.
    std::fs::write(
        &specs,
        r#"[{"step": "a", "prompt": "first"}, {"step": "b", "prompt": "second, reworded"}, {"step": "c", "prompt": "third"}]"#,
    )
    .unwrap();
    let changed = fleet
        .command(env!("CARGO_BIN_EXE_rekindle"))
        .args(["workflow", "run", "--config"])
        .arg(&fleet.config)
        .args(["--id", "wf"])
        .arg(&specs)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!changed.status.success());
    let error = String::from_utf8_lossy(&changed.stderr);
    assert!(
        error.contains("step 'b' already ran with a different prompt or session"),
        "{error}"
    );
    let (again, _) = rekindle::store::checkpoint::load_workflow(&store, "wf")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.completed.len(),
        3,
        "the refused re-run changed the checkpoint"
    );
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves SIGTERM is graceful: a worker in the middle of a recovery finishes its step,
// commits, releases the lease and exits 0, and another worker resumes the run without
// waiting for a lease to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_recovery_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let run = RunId::new("e2e-term");
    fleet.crash_host(run.as_str());
    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut w0 = fleet.worker("w0");
    // Stop w0 as soon as it has started a call of the recovery.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fleet.ledger_lines().iter().any(|l| !l.ends_with(" 1")) {
        assert!(Instant::now() < deadline, "the recovery never started");
        rekindle::clock::sleep(Duration::from_millis(10)).await;
    }
    let stopping = Instant::now();
    assert!(sigterm(&mut w0).success());
    assert!(stopping.elapsed() < Duration::from_secs(10));
    let store = common::local(&bucket).await;
    let recovery_run = RunId::new(recovery_id_for(&run).as_str());
    let lease = rekindle::store::lease::read_lease(&store, &recovery_run)
        .await
        .unwrap()
        .unwrap();
    assert!(
        lease.lease.released,
        "w0 left its lease held: {:?}",
        lease.lease
    );
    let mut w1 = fleet.worker("w1");
    wait_finished(&store, &run, Duration::from_secs(60)).await;
    audit(&fleet.ledger_lines(), run.as_str());
    assert!(sigterm(&mut w1).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves: `runs rm` does not strand a recovery in progress. A killed host's run is admitted
// for recovery (its lease released by the fence, its index entry pointing at the
// recovery); removing the source then would delete the only index entry the coordinator
// finds the recovery by, leaving its record non-terminal forever. It is refused unless
// --force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_rm_refuses_a_run_whose_recovery_is_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let run = "e2e-rm-recovering";
    fleet.crash_host(run);
    let admitted = fleet.cli(&["recover", run, "--recovery-id", "mine", "--takeover"]);
    assert!(admitted.status.success(), "{admitted:?}");
    let refused = fleet.cli(&["runs", "rm", run]);
    let store = common::local(&bucket).await;
    let entry = rekindle::store::index::read(&store, &RunId::new(run))
        .await
        .unwrap();
    assert_eq!(
        refused.status.code(),
        Some(1),
        "runs rm retired a run being recovered; index entry now {entry:?}"
    );
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(error.contains("'mine'"), "{error}");
    assert!(entry.is_some_and(|e| e.recovery_id.is_some()));
}

// Proves what an operator sees of an outage: `status` calls a killed host's run suspect (its
// heartbeat older than its TTL) before any coordinator judged it, and names what is stuck and
// why (no coordinator); once a fleet recovered it under a chosen recovery ID, `runs show`
// names the lineage both ways, `runs ls --all` lists both runs, and `status` names the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_runs_show_an_outage_and_its_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    fleet.crash_host("e2e-outage");
    std::thread::sleep(Duration::from_millis(1500));
    let text = stdout(&fleet.cli(&["status"]));
    assert!(text.contains("coordinator  none is running"), "{text}");
    assert!(text.contains("runs         1 suspect"), "{text}");
    assert!(
        text.contains("e2e-outage") && text.contains("no coordinator is running"),
        "{text}"
    );
    let listed = stdout(&fleet.cli(&["runs", "ls", "--state", "suspect", "--json"]));
    assert!(listed.contains("\"run\":\"e2e-outage\""), "{listed}");

    // Recovered under an ID of the operator's choosing.
    stdout(&fleet.cli(&[
        "recover",
        "e2e-outage",
        "--recovery-id",
        "ops-retry-1",
        "--takeover",
    ]));
    let text = stdout(&fleet.cli(&["status"]));
    assert!(
        text.contains("admitted, and no coordinator is running to assign it"),
        "{text}"
    );
    let mut worker = fleet.worker("w-outage");
    let mut coordinator = fleet.coordinator("c-outage");
    let store = common::local(&bucket).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let record = recovery::read(
            &store,
            &rekindle::core::fact::RecoveryId::new("ops-retry-1"),
        )
        .await
        .unwrap()
        .map(|(r, _)| r.state);
        if record == Some(RecoveryState::Finished) {
            break;
        }
        assert!(Instant::now() < deadline, "not finished: {record:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let source = stdout(&fleet.cli(&["runs", "show", "e2e-outage"]));
    assert!(source.contains("recovered by ops-retry-1"), "{source}");
    let recovery = stdout(&fleet.cli(&["runs", "show", "ops-retry-1"]));
    assert!(recovery.contains("recovers    e2e-outage"), "{recovery}");
    assert!(recovery.contains("state       completed"), "{recovery}");
    let drawn = stdout(&fleet.cli(&["runs", "show", "e2e-outage", "--timeline"]));
    assert!(drawn.contains("timeline"), "{drawn}");
    assert!(drawn.contains("epoch 1"), "{drawn}");
    assert!(drawn.contains("no steps (a fence"), "{drawn}");
    assert!(
        drawn.contains("continued by recovery ops-retry-1"),
        "{drawn}"
    );
    assert!(drawn.contains("seeded with seq 1-"), "{drawn}");
    assert!(drawn.contains("ended: completed"), "{drawn}");
    // Each incarnation names the process that held it: the host, the operator's admission
    // (the fence) and the worker.
    let epochs: Vec<&str> = drawn
        .lines()
        .filter(|l| l.trim_start().starts_with("epoch "))
        .collect();
    assert_eq!(epochs.len(), 3, "{drawn}");
    assert!(epochs[0].contains("held by host-"), "{drawn}");
    assert!(epochs[1].contains("held by cli-"), "{drawn}");
    assert!(epochs[2].contains("held by w-outage"), "{drawn}");
    // The host was killed while (or right after) its first tool call ran: that call was in
    // flight, or its result was committed and nothing was.
    let ledger = fleet.ledger_lines();
    let first_call = ledger[0].split(' ').nth(1).unwrap();
    let ran_twice = ledger
        .iter()
        .filter(|line| line.split(' ').nth(1) == Some(first_call))
        .count()
        == 2;
    assert_eq!(
        drawn.contains(&format!(
            "may have run more than once (in flight at an interruption, run again after it): {first_call}"
        )),
        ran_twice,
        "{drawn}\n{ledger:?}"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&fleet.cli(&[
        "runs",
        "show",
        "ops-retry-1",
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["recovery_of"]["source_run"], "e2e-outage", "{json}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&fleet.cli(&[
        "runs",
        "show",
        "e2e-outage",
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["recovery"]["recovery_id"], "ops-retry-1", "{json}");

    let all: Vec<serde_json::Value> =
        serde_json::from_str(&stdout(&fleet.cli(&["runs", "ls", "--all", "--json"]))).unwrap();
    let states: Vec<(String, String)> = all
        .iter()
        .map(|row| {
            (
                row["run"].as_str().unwrap().to_owned(),
                row["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("e2e-outage".to_owned(), "recovered".to_owned()),
            ("ops-retry-1".to_owned(), "completed".to_owned()),
        ]
    );
    let page: Vec<serde_json::Value> = serde_json::from_str(&stdout(&fleet.cli(&[
        "runs",
        "ls",
        "--all",
        "--json",
        "--limit",
        "1",
        "--after",
        "e2e-outage",
    ])))
    .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0]["run"], "ops-retry-1");

    let text = stdout(&fleet.cli(&["status"]));
    assert!(text.contains("coordinator  c-outage leads"), "{text}");
    assert!(text.contains("workers      1 of 1 alive"), "{text}");
    assert!(text.contains("stuck        nothing"), "{text}");
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut coordinator).success());
}

// Proves a worker restarted under the ID of one killed while idle (it watches the old
// heartbeat for its idle TTL, ten minutes, before taking the ID over) still stops on SIGTERM
// at once, instead of after that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waiting_to_take_its_id_over_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let fleet = Fleet::new(dir.path(), bucket.display().to_string());
    let start = |fleet: &Fleet| {
        fleet
            .command(env!("CARGO_BIN_EXE_rekindle-worker"))
            .args(["--config"])
            .arg(&fleet.config)
            .args(["--id", "w-same", "--state-dir"])
            .arg(dir.path().join("w"))
            .spawn()
            .map(common::Proc::new)
            .unwrap()
    };
    let mut first = start(&fleet);
    let store = common::local(&bucket).await;
    let heartbeat = rekindle::core::layout::heartbeat("w-same");
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.read(&heartbeat).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the first worker never beat");
        rekindle::clock::sleep(Duration::from_millis(50)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = start(&fleet);
    // It is watching the dead worker's heartbeat (idle TTL: ten minutes).
    rekindle::clock::sleep(Duration::from_millis(500)).await;
    assert!(second.try_wait().unwrap().is_none(), "it did not wait");
    let status = sigterm(&mut second);
    assert!(status.success(), "{status:?}");
}
