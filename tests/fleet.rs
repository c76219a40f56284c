//! The fleet in one process: hosts crash part-way, a worker is killed mid-recovery, and the
//! coordinator and workers must finish every run without re-running committed tool calls.

mod common;

use std::time::Duration;

use rekindle::demo::{self, DemoOptions};

fn options(runs: usize, seed: u64, store: Option<String>) -> DemoOptions {
    DemoOptions {
        runs,
        workers: 3,
        store,
        work_dir: None,
        seed,
        timeout: Duration::from_secs(120),
        progress: false,
    }
}

// Proves every run completes and re-executions stay within one per interruption, on the
// local directory store, for several seeds.
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
        assert!(summary.recoveries > 0);
        assert_eq!(
            summary.tool_calls,
            4 * summary.runs + summary.tool_calls_reexecuted
        );
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
