//! The crash-recover workload: a real host process killed -9 half-way, the fleet in this
//! process recovering every run, the ledger audited.

use super::*;

/// What one crash-recover run measured.
#[derive(Clone, Debug, Serialize)]
pub struct CrashRecoverReport {
    /// `crash-recover`.
    pub bench: &'static str,
    /// How the runs came back.
    pub mode: Mode,
    /// Runs started.
    pub runs: usize,
    /// Steps per run.
    pub steps: usize,
    /// Workers.
    pub workers: usize,
    /// Recoveries per worker at once.
    pub concurrency: u32,
    /// Recoveries that may wait on each worker beyond `concurrency`.
    pub queue: u32,
    /// Latency added per store request, and its jitter, in ms.
    pub latency_ms: [u64; 2],
    /// Steps in the ledger when the host was killed.
    pub steps_at_kill: usize,
    /// Runs the host had finished by then.
    pub finished_by_host: usize,
    /// Runs killed before their first commit (nothing acknowledged, nothing to recover).
    pub never_started: usize,
    /// Runs recovered (each by one recovery).
    pub recovered: usize,
    /// Steps the recoveries had left to do.
    pub steps_left: usize,
    /// Runs that ended, on their own chain or their recovery's: must equal `runs` less
    /// `never_started`.
    pub completed: usize,
    /// From the kill to the last recovery finished, in seconds.
    pub recovery_wall_s: f64,
    /// Recovered steps per second over `recovery_wall_s`.
    pub steps_per_s: f64,
    /// From each recovery's admission to its first tool call.
    pub admission_to_first_step: Percentiles,
    /// From the kill to each recovery's first tool call.
    pub interruption_to_resumption: Percentiles,
    /// Ledger lines that repeat a step already recorded for the same run.
    pub tool_calls_reexecuted: usize,
    /// Runs whose steps ran more than twice, or are missing: must be 0.
    pub ledger_violations: usize,
    /// Store requests by the fleet (coordinator, workers and the operator's admissions)
    /// from the kill to the end, per recovered run.
    pub requests_per_recovered_run: Requests,
    /// Of those, by who made them (the coordinator, the workers, the operator's admissions),
    /// each by kind.
    pub requests_per_recovered_run_by_role: BTreeMap<&'static str, Requests>,
    /// The target: 2 × steps left per run + 20.
    pub request_budget_per_run: f64,
    /// Bytes the fleet wrote per recovered run.
    pub bytes_written_per_run: f64,
    /// Peak resident memory of this process (the fleet), in MiB.
    pub peak_rss_mib: f64,
    /// CPU time this process (the fleet, the operator's admissions and the bench's own
    /// done-check) used from the kill to the end, user and system, in seconds (0 where /proc
    /// is not available). The host is another process, dead by then.
    pub recovery_cpu_s: f64,
    /// `recovery_cpu_s` over `recovery_wall_s`: how many of this machine's cores the recovery
    /// kept busy on average. Near `cores`, the throughput is bound by the CPU, not the fleet.
    pub cores_busy: f64,
    /// The cores this process may use (`std::thread::available_parallelism`).
    pub cores: usize,
    /// `recovery_cpu_s` per recovered step, in ms: the whole fleet's CPU cost of a step,
    /// admissions and starts included.
    pub cpu_ms_per_step: f64,
    /// Recovered steps per second of that CPU (`steps_left` over `recovery_cpu_s`): what a
    /// core buys, whatever the number of cores.
    pub steps_per_cpu_s: f64,
}

impl CrashRecoverReport {
    /// What the run broke, if anything: a run left unfinished, or a step missing or run
    /// more often than its interruption allows.
    pub fn violation(&self) -> Option<String> {
        if self.ledger_violations > 0 {
            Some(format!(
                "{} runs have a step missing or repeated beyond their interruption",
                self.ledger_violations
            ))
        } else if self.completed + self.never_started < self.runs {
            Some(format!(
                "{} of {} runs were left unfinished",
                self.runs - self.completed - self.never_started,
                self.runs
            ))
        } else {
            None
        }
    }
}

/// Runs the crash-recover workload once in `mode`.
pub async fn crash_recover(workload: &Workload, mode: Mode) -> Result<CrashRecoverReport> {
    if workload.store.as_ref().is_some_and(StoreUrl::is_memory) {
        return Err(BenchError::Host(
            "--store memory:// lives inside one process, and the bench's host is another one (it is killed -9): use a directory or an S3 bucket".into(),
        ));
    }
    let dir = WorkDir::new("bench")?;
    let store_url = workload.store.clone().unwrap_or_else(|| StoreUrl::Local {
        root: dir.path().join("store"),
    });
    let settings = with_latency(workload, &workload.store_settings);
    let store = Store::open(&store_url, &settings, SystemClock::shared()).await?;
    let prefix = format!("bench-{}", &store.clock().nonce()[..8]);
    let config = write_config(dir.path(), workload.steps)?;
    let ledger = dir.path().join("ledger");
    std::fs::write(&ledger, b"").map_err(setup("create the ledger"))?;
    let agent = bench_agent(&config, &ledger, workload.step_time)?;

    // The fleet, idle and registered before the outage; each role counts its own requests.
    let fleet = Fleet::start(&store, &agent, dir.path(), workload, &prefix, true).await?;
    let fleet_store = store.with_fresh_metrics();

    // The host: a real process, killed -9 half-way.
    let mut host = tokio::process::Command::new(&workload.exe)
        .args(["bench", "host", "--store"])
        .arg(store_url.to_string())
        .arg("--dir")
        .arg(dir.path())
        .args(["--prefix", &prefix])
        .args(["--runs", &workload.runs.to_string()])
        .args(["--steps", &workload.steps.to_string()])
        .args(["--step-ms", &workload.step_time.as_millis().to_string()])
        .args(["--ttl-ms", &workload.ttl.as_millis().to_string()])
        .args(["--latency-ms", &workload.latency.as_millis().to_string()])
        .args(["--jitter-ms", &workload.jitter.as_millis().to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(setup("start the host process"))?;
    let half = (workload.runs * workload.steps / 2).max(1);
    let wait = Stopwatch::start();
    loop {
        if count_lines(&ledger) >= half {
            break;
        }
        if let Ok(Some(status)) = host.try_wait() {
            return Err(BenchError::Host(format!(
                "the host exited early ({status})"
            )));
        }
        if wait.elapsed() > Duration::from_secs(600) {
            return Err(BenchError::Host(
                "the host made no progress for 600 s".into(),
            ));
        }
        crate::clock::sleep(Duration::from_millis(1)).await;
    }
    let _ = host.start_kill();
    let _ = host.wait().await;
    let killed_ms = store.clock().wall_ms();
    let killed = Stopwatch::start();
    let cpu_at_kill = process_cpu_s();
    let steps_at_kill = count_lines(&ledger);
    let before = fleet.metrics();

    let (entries, _) = IndexScan::default().scan(&store).await?;
    let interrupted: Vec<RunId> = entries
        .into_iter()
        .filter(|e| e.run_id.as_str().starts_with(&prefix) && e.phase == Phase::Running)
        .map(|e| e.run_id)
        .collect();
    if mode == Mode::Takeover {
        let operator = Holder::new(&fleet_store, format!("{prefix}-operator"), workload.ttl);
        let waker = CoordinatorWaker::new(&fleet_store);
        let admitting =
            futures::stream::iter(&interrupted).for_each_concurrent(ADMISSIONS_AT_ONCE, |run| {
                let (store, operator, waker) = (&fleet_store, &operator, &waker);
                async move {
                    match crate::fleet::recover_interrupted(store, operator, run, false, waker)
                        .await
                    {
                        Ok(_) => {}
                        Err(error) => tracing::warn!(run_id = %run, %error, "not admitted"),
                    }
                }
            });
        // As `recover --all`: the coordinator's address is looked up beside the admissions.
        futures::join!(waker.prepare(), admitting);
    }
    // Done when no run of this bench is left in the index (finished recoveries leave it).
    // The index is listed every 20 ms once every run the ledger names has recorded its last
    // step (until then some run is certainly not done, and listing a thousand entries every
    // 20 ms took a fifth of a core from the fleet being measured), and every second before
    // that (a run can end without its last line: a ledger write that failed).
    let mut scan = IndexScan::default();
    let mut tail = LedgerTail::new(&ledger);
    let mut listed = Stopwatch::start();
    loop {
        if tail.every_named_run_at(workload.steps as u64)
            || listed.elapsed() >= Duration::from_secs(1)
        {
            listed = Stopwatch::start();
            let (entries, _) = scan.scan(&store).await?;
            if !entries
                .iter()
                .any(|e| e.run_id.as_str().starts_with(&prefix))
            {
                break;
            }
        }
        if killed.elapsed() > workload.ttl * 4 + Duration::from_secs(600) {
            return Err(BenchError::Host(
                "the fleet did not finish within the bench's timeout".into(),
            ));
        }
        crate::clock::sleep(Duration::from_millis(20)).await;
    }
    let wall = killed.elapsed();
    let recovery_cpu_s = (process_cpu_s() - cpu_at_kill).max(0.0);
    let after = fleet.metrics();
    let operator = fleet_store.metrics();
    fleet.stop().await;
    let by_role = |role: usize| after[role].since(&before[role]);
    let spent = add(&add(&by_role(0), &by_role(1)), &operator);

    // What the bucket and the ledger say.
    let lines = read_ledger(&ledger);
    let mut completed = 0;
    let mut admission_to_first = Vec::new();
    let mut resumption = Vec::new();
    let mut recovered = 0;
    let mut finished_by_host = 0;
    let mut never_started = Vec::new();
    // Each run's record and whether its chain ended, read side by side (on a store with
    // latency, one after another would take longer than the recoveries did).
    let outcomes: Vec<(RunId, Option<RecoveryRecord>, bool)> =
        futures::stream::iter(0..workload.runs)
            .map(|i| {
                let store = &store;
                let run = RunId::new(format!("{prefix}-run-{i:04}"));
                async move {
                    let recovery_id = crate::core::assignment::recovery_id_for(&run);
                    let record = crate::store::recovery::read(store, &recovery_id)
                        .await?
                        .map(|(record, _)| record);
                    let chain = if record.is_some() {
                        RunId::new(recovery_id.as_str())
                    } else {
                        run.clone()
                    };
                    let done = matches!(
                        crate::store::generation::load(store, &chain, None).await,
                        Ok(loaded) if loaded.state.terminal().is_some()
                    );
                    Ok::<_, crate::Error>((run, record, done))
                }
            })
            .buffered(AUDIT_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, crate::Error>>()?;
    for (run, record, done) in outcomes {
        completed += usize::from(done);
        let Some(record) = record else {
            if done {
                finished_by_host += 1;
            } else {
                // Killed before its first commit: nothing was acknowledged, nothing to recover.
                never_started.push(run.to_string());
            }
            continue;
        };
        recovered += 1;
        // The recovery's first tool call: the first ledger line of the run at an epoch
        // above the source's.
        if let Some(first) = lines
            .iter()
            .filter(|l| l.run == run.as_str() && l.epoch > record.source_epoch.0)
            .map(|l| l.at_ms)
            .min()
        {
            admission_to_first.push(first.saturating_sub(record.admitted_at_ms) as f64);
            resumption.push(first.saturating_sub(killed_ms) as f64);
        }
    }
    let (reexecuted, violations) = audit(
        &lines,
        &prefix,
        workload.runs,
        workload.steps,
        &never_started,
    );
    let steps_left =
        workload.runs * workload.steps - steps_at_kill.min(workload.runs * workload.steps);
    Ok(CrashRecoverReport {
        bench: "crash-recover",
        mode,
        runs: workload.runs,
        steps: workload.steps,
        workers: workload.workers,
        concurrency: workload.concurrency,
        queue: workload.queue,
        latency_ms: [
            workload.latency.as_millis() as u64,
            workload.jitter.as_millis() as u64,
        ],
        steps_at_kill,
        finished_by_host,
        never_started: never_started.len(),
        recovered,
        steps_left,
        completed,
        recovery_wall_s: wall.as_secs_f64(),
        steps_per_s: steps_left as f64 / wall.as_secs_f64().max(1e-9),
        admission_to_first_step: Percentiles::of(admission_to_first),
        interruption_to_resumption: Percentiles::of(resumption),
        tool_calls_reexecuted: reexecuted,
        ledger_violations: violations,
        requests_per_recovered_run: Requests::per(&spent, recovered as f64),
        requests_per_recovered_run_by_role: [
            ("coordinator", Requests::per(&by_role(0), recovered as f64)),
            ("workers", Requests::per(&by_role(1), recovered as f64)),
            ("operator", Requests::per(&operator, recovered as f64)),
        ]
        .into_iter()
        .collect(),
        request_budget_per_run: 2.0 * steps_left as f64 / (recovered.max(1) as f64) + 20.0,
        bytes_written_per_run: spent.bytes_written as f64 / recovered.max(1) as f64,
        peak_rss_mib: peak_rss_mib(),
        recovery_cpu_s,
        cores_busy: recovery_cpu_s / wall.as_secs_f64().max(1e-9),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        cpu_ms_per_step: recovery_cpu_s * 1000.0 / steps_left.max(1) as f64,
        steps_per_cpu_s: steps_left as f64 / recovery_cpu_s.max(1e-9),
    })
}
