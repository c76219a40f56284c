//! End to end with real processes: a host killed with -9, then a real coordinator pair and
//! workers; a worker killed mid-recovery; the leading coordinator killed. Every run must
//! complete, and the side-effect ledger must show no committed tool call executed again.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rekindle::coordinator::recovery_id_for;
use rekindle::fact::RunId;
use rekindle::recovery::{self, RecoveryState};
use rekindle::store::Store;

struct Fleet {
    dir: PathBuf,
    store_url: String,
    config: PathBuf,
    ledger: PathBuf,
}

impl Fleet {
    fn new(dir: &Path, store_url: String) -> Fleet {
        let ledger = dir.join("ledger.txt");
        let turns: Vec<serde_json::Value> = (1..=4)
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

    fn host(&self, run: &str) -> Child {
        self.command(env!("CARGO_BIN_EXE_rekindle"))
            .args(["run", "--config"])
            .arg(&self.config)
            .args(["--run-id", run, "--lease-ttl-ms", "1000", "--state-dir"])
            .arg(self.dir.join("host"))
            .arg("record four steps")
            .spawn()
            .unwrap()
    }

    fn worker(&self, id: &str) -> Child {
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
            .unwrap()
    }

    fn coordinator(&self, id: &str) -> Child {
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
            .unwrap()
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

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    child.wait().unwrap()
}

async fn wait_finished(store: &Store, run: &RunId, timeout: Duration) -> recovery::RecoveryRecord {
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each (run, call) ran at most once per incarnation (epoch) of the run, and every one of
/// the four calls ran.
fn audit(lines: &[String], run: &str) {
    let mut calls = std::collections::BTreeMap::<String, usize>::new();
    let mut epochs = std::collections::BTreeSet::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts[0], run, "{line}");
        *calls.entry(parts[1].to_owned()).or_default() += 1;
        epochs.insert(parts[2].to_owned());
    }
    assert_eq!(calls.len(), 4, "{lines:?}");
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

    let mut host = fleet.host(run.as_str());
    fleet.wait_for_ledger(1, Duration::from_secs(30));
    host.kill().unwrap();
    host.wait().unwrap();

    let mut coordinator = fleet.coordinator("coordinator-a");
    let mut w0 = fleet.worker("w0");
    let mut w1 = fleet.worker("w1");
    // Kill whichever worker holds the recovery as soon as it has run a call.
    let store = common::local(&bucket).await;
    let recovery_run = RunId::new(recovery_id_for(&run).as_str());
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        if let Ok(Some(view)) = rekindle::lease::read_lease(&store, &recovery_run).await
            && fleet.ledger_lines().iter().any(|l| !l.ends_with(" 1"))
        {
            break view.lease.holder;
        }
        assert!(Instant::now() < deadline, "the recovery never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
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
        rekindle::fact::Outcome::Completed
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
    let lease = RunId::new(rekindle::layout::COORDINATOR_LEASE_RUN);
    let deadline = Instant::now() + Duration::from_secs(30);
    while rekindle::lease::read_lease(&store, &lease)
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "no coordinator took the lead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut standby = fleet.coordinator("coordinator-b");
    let mut worker = fleet.worker("w0");
    leader.kill().unwrap();
    leader.wait().unwrap();

    let run = RunId::new("e2e-standby");
    let mut host = fleet.host(run.as_str());
    fleet.wait_for_ledger(1, Duration::from_secs(30));
    host.kill().unwrap();
    host.wait().unwrap();

    wait_finished(&store, &run, Duration::from_secs(60)).await;
    let view = rekindle::lease::read_lease(&store, &lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.lease.holder, "coordinator-b");
    audit(&fleet.ledger_lines(), run.as_str());
    assert!(sigterm(&mut worker).success());
    assert!(sigterm(&mut standby).success());
}
