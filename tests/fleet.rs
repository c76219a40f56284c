//! The fleet in one process: hosts crash part-way, a worker is killed mid-recovery, and the
//! coordinator and workers must finish every run without re-running committed tool calls.

mod common;

use std::time::Duration;

use rekindle::fleet::demo::{self, DemoOptions};

fn options(runs: usize, seed: u64, store: Option<String>) -> DemoOptions {
    DemoOptions {
        runs,
        workers: 3,
        store: store.map(|url| url.parse().unwrap()),
        // The demo's own retry policy; only the S3 test server's plain HTTP from the test's.
        store_settings: rekindle::store::StoreSettings {
            allow_http: common::settings().allow_http,
            ..rekindle::store::StoreSettings::default()
        },
        work_dir: None,
        seed,
        timeout: Duration::from_secs(120),
        progress: false,
    }
}

// Proves every run completes and re-executions stay within one per interruption, on the
// local directory store, for several seeds; that the summary adds up (every crashed host left
// one recovery, every crash and the worker kill cut exactly one call short); and that a seed
// gives the same numbers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_recovers_everything_on_a_local_directory() {
    for seed in [1, 2, 3] {
        let summary = demo::run(options(24, seed, None)).await.unwrap();
        assert_eq!(summary.completed, summary.runs, "seed {seed}: {summary:?}");
        assert_eq!(summary.runs_over_budget, 0, "seed {seed}: {summary:?}");
        assert_eq!(summary.workers_killed, 1);
        assert!(
            summary.hosts_crashed > 0,
            "seed {seed}: nothing was interrupted"
        );
        assert_eq!(
            summary.recoveries as usize, summary.hosts_crashed,
            "{summary:?}"
        );
        assert_eq!(
            summary.completed_by_host + summary.hosts_crashed,
            summary.runs,
            "{summary:?}"
        );
        assert_eq!(
            summary.tool_calls_reexecuted,
            summary.hosts_crashed + summary.workers_killed,
            "{summary:?}"
        );
        assert_eq!(
            summary.recovery_attempts as usize,
            summary.hosts_crashed + summary.workers_killed,
            "{summary:?}"
        );
        assert_eq!(
            summary.tool_calls,
            4 * summary.runs + summary.tool_calls_reexecuted
        );
        if seed == 1 {
            let again = demo::run(options(24, seed, None)).await.unwrap();
            let fixed = |s: &demo::DemoSummary| {
                (
                    s.completed_by_host,
                    s.hosts_crashed,
                    s.recoveries,
                    s.recovery_attempts,
                    s.tool_calls,
                    s.tool_calls_reexecuted,
                )
            };
            assert_eq!(fixed(&summary), fixed(&again));
        }
    }
}

// Proves the same against the S3 test server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_recovers_everything_on_s3() {
    let url = format!(
        "{}/fleet-{}",
        common::s3_url().trim_end_matches('/'),
        std::process::id()
    );
    let summary = demo::run(options(12, 5, Some(url))).await.unwrap();
    assert_eq!(summary.completed, summary.runs, "{summary:?}");
    assert_eq!(summary.runs_over_budget, 0, "{summary:?}");
}

// Proves a run whose lease is taken over stops at once: no further tool call starts, and
// the old holder is told it lost the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stops_when_its_lease_is_taken() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use rekindle::ErrorKind;
    use rekindle::core::fact::RunId;
    use rekindle::fleet::{Agent, Node};
    use rekindle::host::config::Config;
    use rekindle::store::lease::Holder;
    use rekindle::store::log::LogDir;

    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let turns: Vec<serde_json::Value> = (1..=6)
        .map(|i| serde_json::json!({"content": format!("step {i}"), "tool_calls": [{"name": "record", "arguments": {}}]}))
        .collect();
    std::fs::write(
        dir.path().join("script.json"),
        serde_json::to_vec(&turns).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("rekindle.toml"),
        format!(
            "[model]\nkind = \"scripted\"\nname = \"m\"\nscript = \"script.json\"\n[[tools]]\nname = \"record\"\ncommand = [\"sh\", \"-c\", \"echo $REKINDLE_CALL_ID >> '{}'; sleep 0.3\"]\n",
            ledger.display()
        ),
    )
    .unwrap();
    let agent =
        Agent::from_config(Config::load(&dir.path().join("rekindle.toml")).unwrap()).unwrap();
    let store = common::local(&dir.path().join("bucket")).await;
    let holder = Holder::new(&store, "host", Duration::from_millis(900));
    holder.beat().await.unwrap();
    let node = Node {
        store: store.clone(),
        agent,
        logs: LogDir::open(dir.path().join("logs")).unwrap(),
        holder,
        stop: Arc::new(AtomicBool::new(false)),
    };
    let run = RunId::new("taken");
    let task = tokio::spawn(async move { node.start_run(&run, None, "go").await });
    while std::fs::read_to_string(&ledger)
        .unwrap_or_default()
        .lines()
        .count()
        < 1
    {
        rekindle::clock::sleep(Duration::from_millis(10)).await;
    }
    let thief = Holder::new(&store, "thief", Duration::from_secs(60));
    let view = rekindle::store::lease::read_lease(&store, &RunId::new("taken"))
        .await
        .unwrap()
        .unwrap();
    thief.take_over(&view).await.unwrap();
    let error = task.await.unwrap().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Fenced, "{error}");
    rekindle::clock::sleep(Duration::from_millis(500)).await;
    let calls = std::fs::read_to_string(&ledger).unwrap().lines().count();
    assert!(
        calls <= 2,
        "{calls} calls ran; the run should stop after the one in flight"
    );
}
