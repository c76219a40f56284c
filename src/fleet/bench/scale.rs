//! An idle fleet's request bill, and the crash-recover workload across worker counts.

use super::*;

/// What an idle fleet cost over the measured window.
#[derive(Clone, Debug, Serialize)]
pub struct IdleReport {
    /// `idle`.
    pub bench: &'static str,
    /// Workers in the fleet (plus one coordinator).
    pub workers: usize,
    /// The window measured, in seconds.
    pub seconds: f64,
    /// Requests made in the window, by kind.
    pub requests: Requests,
    /// Those requests extrapolated to 30 days, at S3 list prices.
    pub dollars_per_month: f64,
}

/// Runs a coordinator and `workers` workers with the binaries' default pacing and nothing to
/// do, and counts their requests for `duration` (after a minute's warm-up is excluded:
/// registration and the first scans are not the steady state).
pub async fn idle(workload: &Workload, duration: Duration, warmup: Duration) -> Result<IdleReport> {
    let dir = WorkDir::new("bench-idle")?;
    let store_url = workload.store.clone().unwrap_or_else(|| StoreUrl::Local {
        root: dir.path().join("store"),
    });
    let store = Store::open(&store_url, &workload.store_settings, SystemClock::shared()).await?;
    let config = write_config(dir.path(), workload.steps)?;
    let agent = bench_agent(&config, &dir.path().join("ledger"), workload.step_time)?;
    let prefix = format!("idle-{}", &store.clock().nonce()[..8]);
    let fleet = Fleet::start(&store, &agent, dir.path(), workload, &prefix, true).await?;
    crate::clock::sleep(warmup).await;
    let before = fleet.metrics();
    let window = Stopwatch::start();
    crate::clock::sleep(duration).await;
    let seconds = window.elapsed().as_secs_f64();
    let after = fleet.metrics();
    fleet.stop().await;
    let spent = add(&after[0].since(&before[0]), &after[1].since(&before[1]));
    let requests = Requests::per(&spent, 1.0);
    let month = 30.0 * 24.0 * 3600.0;
    Ok(IdleReport {
        bench: "idle",
        workers: workload.workers,
        seconds,
        dollars_per_month: requests.dollars() * month / seconds,
        requests,
    })
}

/// One row of the scaling bench.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRow {
    /// Workers.
    pub workers: usize,
    /// Recovered steps per second.
    pub steps_per_s: f64,
    /// `steps_per_s` over `workers` times the one-worker figure.
    pub efficiency: f64,
    /// Recovered steps per CPU-second of the run (see [`CrashRecoverReport::steps_per_cpu_s`]),
    /// which does not depend on how many cores the machine has.
    pub steps_per_cpu_s: f64,
    /// The crash-recover run behind the row.
    pub run: CrashRecoverReport,
}

/// Runs the crash-recover workload (takeover) with each worker count in `counts` (1, 2, 4
/// and 8 by default), in the order given; efficiency is against the first row's throughput
/// per worker (the CLI sorts the counts, so that is the smallest).
pub async fn scale(workload: &Workload, counts: &[usize]) -> Result<Vec<ScaleRow>> {
    let mut rows: Vec<ScaleRow> = Vec::new();
    for &workers in counts {
        let run = crash_recover(
            &Workload {
                workers,
                ..workload.clone()
            },
            Mode::Takeover,
        )
        .await?;
        let base = rows
            .first()
            .map(|row| row.steps_per_s / row.workers as f64)
            .unwrap_or(run.steps_per_s / workers as f64);
        rows.push(ScaleRow {
            workers,
            steps_per_s: run.steps_per_s,
            efficiency: run.steps_per_s / (workers as f64 * base),
            steps_per_cpu_s: run.steps_per_cpu_s,
            run,
        });
    }
    Ok(rows)
}
