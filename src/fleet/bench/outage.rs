//! `rekindle bench outage`: a mass outage in a big bucket. M active runs are written directly
//! as their hosts would have left them (a lease, an index entry naming the holder, the first
//! generation), spread over live hosts that keep beating and a few that die at once holding K
//! of them; C coordinators run as child processes (`rekindle bench coordinator`, so that each
//! one's memory and requests are its own) and W workers in this process recover the K runs'
//! last step. Nothing here asserts a timing: it prints figures.

use super::*;

/// The outage's shape. The workers, their slots, the TTL, the store and its latency come from
/// `workload` (its `runs` and `steps` do not apply: every interrupted run has one step left).
#[derive(Clone, Debug)]
pub struct Outage {
    /// Active runs in the bucket (M).
    pub active: usize,
    /// Of those, the runs whose hosts die at once (K).
    pub interrupted: usize,
    /// Coordinator processes (C).
    pub coordinators: usize,
    /// Partitions the coordinators split the bucket into (1: one leads).
    pub partitions: u32,
    /// Live host processes the healthy runs are spread over (their heartbeats keep beating).
    pub hosts: usize,
    /// Host processes that die, holding the K interrupted runs between them.
    pub dead_hosts: usize,
    /// Seconds of warm-up before the steady state is measured (the coordinators' first scans).
    pub warmup: Duration,
    /// How long the steady state (M active runs, nothing dying) is measured.
    pub steady: Duration,
    /// The fleet and the store.
    pub workload: Workload,
}

/// A coordinator's counters at one moment, as its process prints them.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct CoordinatorSample {
    /// Its store requests so far.
    pub requests: MetricsSnapshot,
    /// Resident memory now, and its peak, in MiB.
    pub rss_mib: f64,
    /// See `rss_mib`.
    pub peak_rss_mib: f64,
    /// CPU time used so far, user and system, in seconds.
    pub cpu_s: f64,
}

/// The steady state: M active runs, nothing dying.
#[derive(Clone, Debug, Serialize)]
pub struct SteadyState {
    /// The window measured, in seconds.
    pub seconds: f64,
    /// The coordinators' requests per second, all of them together, by kind.
    pub coordinator_requests_per_s: Requests,
    /// Those requests for an hour at S3 list prices, in dollars.
    pub coordinator_dollars_per_hour: f64,
    /// Each coordinator's resident memory at the end of the window, in MiB.
    pub coordinator_rss_mib: Vec<f64>,
    /// The largest of those over M, in bytes: an upper bound on what a coordinator keeps per
    /// active run (the process's own baseline included).
    pub coordinator_bytes_per_active_run: f64,
}

/// What one outage measured.
#[derive(Clone, Debug, Serialize)]
pub struct OutageReport {
    /// `outage`.
    pub bench: &'static str,
    /// M.
    pub active: usize,
    /// K.
    pub interrupted: usize,
    /// C.
    pub coordinators: usize,
    /// The partitions they split the bucket into.
    pub partitions: u32,
    /// W.
    pub workers: usize,
    /// Slots per worker (recoveries at once), and queued beyond them.
    pub concurrency: u32,
    /// See `concurrency`.
    pub queue: u32,
    /// The lease TTL of every process, in ms.
    pub ttl_ms: u64,
    /// Latency added per store request, and its jitter, in ms.
    pub latency_ms: [u64; 2],
    /// How long writing the bucket took, in seconds.
    pub build_s: f64,
    /// Before the outage.
    pub steady: SteadyState,
    /// From the dead hosts' TTL expiry (their last beat plus the TTL) until the last
    /// interrupted run was admitted (its record's admission time), in seconds; and the median
    /// run's, in ms.
    pub admitted_all_after_expiry_s: f64,
    /// See `admitted_all_after_expiry_s`.
    pub admitted_p50_after_expiry_ms: f64,
    /// From the expiry until the last interrupted run's tool call began again, in seconds.
    pub resumed_all_after_expiry_s: f64,
    /// From the expiry until every interrupted run's recovery had finished, in seconds.
    pub finished_all_after_expiry_s: f64,
    /// From the hosts' death (their last beat) to each run's first tool call after it.
    pub interruption_to_resumption: Percentiles,
    /// Interrupted runs recovered (their record finished).
    pub recovered: usize,
    /// Store requests from the death to the end, coordinators and workers, per recovered run.
    pub requests_per_recovered_run: Requests,
    /// Of those, by role.
    pub requests_per_recovered_run_by_role: BTreeMap<&'static str, Requests>,
    /// `requests_per_recovered_run` at S3 list prices, in dollars.
    pub dollars_per_recovered_run: f64,
    /// Each coordinator's peak resident memory over the whole bench, in MiB.
    pub coordinator_peak_rss_mib: Vec<f64>,
    /// CPU from the death to the end, this process (workers, the bench's own polling) and the
    /// coordinators' processes, in seconds.
    pub recovery_cpu_s: f64,
    /// The cores this machine gives this process.
    pub cores: usize,
    /// Ledger lines that repeat an interrupted run's step.
    pub tool_calls_reexecuted: usize,
    /// Interrupted runs whose step is missing or ran more than twice, and healthy runs that
    /// ran anything or were admitted for recovery: must be 0.
    pub ledger_violations: usize,
}

impl OutageReport {
    /// What the run broke, if anything.
    pub fn violation(&self) -> Option<String> {
        if self.ledger_violations > 0 {
            Some(format!(
                "{} runs broke the ledger's rules (a step missing or repeated, or a healthy run recovered)",
                self.ledger_violations
            ))
        } else if self.recovered < self.interrupted {
            Some(format!(
                "{} of {} interrupted runs were not recovered",
                self.interrupted - self.recovered,
                self.interrupted
            ))
        } else {
            None
        }
    }
}

/// Writes the bucket at once, this many runs at a time.
const BUILD_CONCURRENCY: usize = 256;

/// Runs the outage once.
pub async fn outage(outage: &Outage) -> Result<OutageReport> {
    let workload = &outage.workload;
    if outage.interrupted > outage.active || outage.hosts == 0 || outage.dead_hosts == 0 {
        return Err(BenchError::Host(
            "--interrupted must not exceed --active, and --hosts and --dead-hosts must be at least 1".into(),
        ));
    }
    if workload.store.as_ref().is_some_and(StoreUrl::is_memory) {
        return Err(BenchError::Host(
            "--store memory:// lives inside one process, and the coordinators are other processes: use a directory or an S3 bucket".into(),
        ));
    }
    let dir = WorkDir::new("bench-outage")?;
    let store_url = workload.store.clone().unwrap_or_else(|| StoreUrl::Local {
        root: dir.path().join("store"),
    });
    // The bucket is written without injected latency; the fleet meets it.
    let plain = Store::open(&store_url, &workload.store_settings, SystemClock::shared()).await?;
    let store = Store::open(
        &store_url,
        &with_latency(workload, &workload.store_settings),
        SystemClock::shared(),
    )
    .await?;
    let prefix = format!("outage-{}", &store.clock().nonce()[..8]);
    let config = write_config(dir.path(), 1)?;
    let ledger = dir.path().join("ledger");
    std::fs::write(&ledger, b"").map_err(setup("create the ledger"))?;
    let agent = bench_agent(&config, &ledger, workload.step_time)?;

    // The hosts: live ones beat until the end, dying ones until the outage.
    let holders = |what: &str, n: usize| -> Vec<Arc<Holder>> {
        (0..n)
            .map(|i| Holder::new(&plain, format!("{prefix}-{what}-{i}"), workload.ttl))
            .collect()
    };
    let (live, dying) = (
        holders("host", outage.hosts),
        holders("dying", outage.dead_hosts),
    );
    for holder in live.iter().chain(&dying) {
        holder.beat().await?;
    }
    let live_stop = Arc::new(AtomicBool::new(false));
    let live_beats: Vec<_> = live
        .iter()
        .map(|holder| holder.spawn_heartbeat(Arc::clone(&live_stop)))
        .collect();
    let dying_stop = Arc::new(AtomicBool::new(false));
    let dying_beats: Vec<_> = dying
        .iter()
        .map(|holder| holder.spawn_heartbeat(Arc::clone(&dying_stop)))
        .collect();

    // The bucket: run i < K is held by a dying host, the rest by live ones.
    let built = Stopwatch::start();
    let run_id = |i: usize| RunId::new(format!("{prefix}-run-{i:07}"));
    let holder_of = |i: usize| {
        if i < outage.interrupted {
            &dying[i % dying.len()]
        } else {
            &live[i % live.len()]
        }
    };
    let written: Vec<Result<(), crate::Error>> = futures::stream::iter(0..outage.active)
        .map(|i| {
            let (run, holder, agent, plain) = (run_id(i), holder_of(i), &agent, &plain);
            async move {
                let held = holder.acquire_new(&run).await?;
                let now = plain.clock().wall_ms();
                let mut entry = crate::core::record::IndexEntry::new(
                    run.clone(),
                    None,
                    Phase::Running,
                    agent.fingerprint_sha256(),
                    now,
                );
                entry.holder = Some(holder.heartbeat_key());
                entry.holder_ttl_ms = Some(holder.ttl().as_millis() as u64);
                crate::fleet::lifecycle::host_started(plain, &entry).await?;
                let facts =
                    crate::fleet::opening_facts(&run, None, agent, "Record every step.", now);
                crate::store::generation::RunWriter::create_as(
                    &plain.writing_as(holder.id()),
                    run,
                    facts,
                    held.epoch,
                    crate::store::generation::SnapshotPolicy::default(),
                )
                .await?;
                Ok(())
            }
        })
        .buffer_unordered(BUILD_CONCURRENCY)
        .collect()
        .await;
    written.into_iter().collect::<Result<(), _>>()?;
    let build_s = built.elapsed().as_secs_f64();

    // The fleet: coordinators as processes, workers here.
    let mut coordinators = Vec::new();
    for i in 0..outage.coordinators {
        coordinators.push(CoordinatorProcess::start(
            outage,
            &store_url,
            dir.path(),
            &prefix,
            i,
        )?);
    }
    let fleet = Fleet::start(&store, &agent, dir.path(), workload, &prefix, false).await?;
    crate::clock::sleep(outage.warmup).await;
    let mut steady_before = Vec::new();
    for coordinator in &mut coordinators {
        steady_before.push(coordinator.sample().await?);
    }
    let window = Stopwatch::start();
    crate::clock::sleep(outage.steady).await;
    let seconds = window.elapsed().as_secs_f64();
    let mut steady_after = Vec::new();
    for coordinator in &mut coordinators {
        steady_after.push(coordinator.sample().await?);
    }
    let steady_spent = sum(steady_after
        .iter()
        .zip(&steady_before)
        .map(|(after, before)| after.requests.since(&before.requests)));
    let per_s = Requests::per(&steady_spent, seconds);
    let rss: Vec<f64> = steady_after.iter().map(|s| s.rss_mib).collect();
    let steady = SteadyState {
        seconds,
        coordinator_dollars_per_hour: per_s.dollars() * 3600.0,
        coordinator_requests_per_s: per_s,
        coordinator_bytes_per_active_run: rss.iter().copied().fold(0.0, f64::max) * 1048576.0
            / outage.active as f64,
        coordinator_rss_mib: rss,
    };

    // The outage: the dying hosts stop beating, after one last beat each at the same moment.
    dying_stop.store(true, Ordering::SeqCst);
    for beat in dying_beats {
        let _ = beat.await;
    }
    for holder in &dying {
        holder.beat().await?;
    }
    let died_ms = store.clock().wall_ms();
    let expiry_ms = died_ms + workload.ttl.as_millis() as u64;
    let died = Stopwatch::start();
    let cpu_at_death = process_cpu_s() + coordinators.iter().map(|c| c.cpu_s()).sum::<f64>();
    let workers_before = fleet.metrics()[1];
    let mut coordinators_before = Vec::new();
    for coordinator in &mut coordinators {
        coordinators_before.push(coordinator.sample().await?);
    }

    // Done when every interrupted run's recovery has finished: the ledger first (cheap), then
    // the records, read again until each says finished.
    let ids: Vec<RunId> = (0..outage.interrupted).map(run_id).collect();
    let timeout = workload.ttl * 4 + Duration::from_secs(600);
    while count_lines(&ledger) < outage.interrupted {
        if died.elapsed() > timeout {
            break;
        }
        crate::clock::sleep(Duration::from_millis(20)).await;
    }
    let mut records: BTreeMap<RunId, RecoveryRecord> = BTreeMap::new();
    loop {
        let missing: Vec<&RunId> = ids
            .iter()
            .filter(|run| {
                records
                    .get(*run)
                    .is_none_or(|r| r.state != crate::core::record::RecoveryState::Finished)
            })
            .collect();
        if missing.is_empty() || died.elapsed() > timeout {
            break;
        }
        let read: Vec<_> = futures::stream::iter(missing)
            .map(|run| {
                let store = &plain;
                async move {
                    let id = crate::core::assignment::recovery_id_for(run);
                    (run.clone(), crate::store::recovery::read(store, &id).await)
                }
            })
            .buffer_unordered(AUDIT_CONCURRENCY * 4)
            .collect()
            .await;
        for (run, record) in read {
            if let Ok(Some((record, _))) = record {
                records.insert(run, record);
            }
        }
        crate::clock::sleep(Duration::from_millis(50)).await;
    }
    let finished_ms = store.clock().wall_ms();
    let mut coordinators_after = Vec::new();
    for coordinator in &mut coordinators {
        coordinators_after.push(coordinator.sample().await?);
    }
    let recovery_cpu_s = (process_cpu_s() + coordinators.iter().map(|c| c.cpu_s()).sum::<f64>()
        - cpu_at_death)
        .max(0.0);
    let workers_spent = fleet.metrics()[1].since(&workers_before);
    live_stop.store(true, Ordering::SeqCst);
    fleet.stop().await;
    let mut peak = Vec::new();
    for coordinator in coordinators {
        peak.push(coordinator.stop().await?.peak_rss_mib);
    }
    for beat in live_beats {
        let _ = beat.await;
    }
    let coordinators_spent = sum(coordinators_after
        .iter()
        .zip(&coordinators_before)
        .map(|(after, before)| after.requests.since(&before.requests)));

    // What the ledger and the bucket say.
    let lines = read_ledger(&ledger);
    let mut by_run: BTreeMap<&str, Vec<&LedgerLine>> = BTreeMap::new();
    for line in &lines {
        by_run.entry(line.run.as_str()).or_default().push(line);
    }
    let interrupted: BTreeSet<String> = ids.iter().map(ToString::to_string).collect();
    let mut violations = by_run
        .keys()
        .filter(|run| !interrupted.contains(**run))
        .count();
    // A recovery of a healthy run is a fenced live process, whether or not it ran anything.
    let listed = plain
        .list_all(crate::core::layout::recoveries_prefix())
        .await?;
    let expected: BTreeSet<String> = ids
        .iter()
        .map(|run| {
            crate::core::layout::recovery(crate::core::assignment::recovery_id_for(run).as_str())
        })
        .collect();
    violations += listed
        .iter()
        .filter(|listed| !expected.contains(&listed.key))
        .count();
    let mut reexecuted = 0;
    let mut resumption = Vec::new();
    let mut resumed_last = 0;
    for run in &ids {
        let steps = by_run.get(run.as_str()).map_or(0, Vec::len);
        reexecuted += steps.saturating_sub(1);
        if steps == 0 || steps > 2 {
            violations += 1;
        }
        if let Some(first) = by_run
            .get(run.as_str())
            .and_then(|lines| lines.iter().map(|l| l.at_ms).min())
        {
            resumption.push(first.saturating_sub(died_ms) as f64);
            resumed_last = resumed_last.max(first);
        }
    }
    let finished: Vec<&RecoveryRecord> = records
        .values()
        .filter(|r| r.state == crate::core::record::RecoveryState::Finished)
        .collect();
    let mut admitted: Vec<f64> = records
        .values()
        .map(|r| r.admitted_at_ms.saturating_sub(expiry_ms) as f64)
        .collect();
    admitted.sort_by(f64::total_cmp);
    let after_expiry = |ms: u64| ms.saturating_sub(expiry_ms) as f64 / 1000.0;
    let recovered = finished.len();
    let spent = add(&workers_spent, &coordinators_spent);
    let per_run = Requests::per(&spent, recovered as f64);
    Ok(OutageReport {
        bench: "outage",
        active: outage.active,
        interrupted: outage.interrupted,
        coordinators: outage.coordinators,
        partitions: outage.partitions,
        workers: workload.workers,
        concurrency: workload.concurrency,
        queue: workload.queue,
        ttl_ms: workload.ttl.as_millis() as u64,
        latency_ms: [
            workload.latency.as_millis() as u64,
            workload.jitter.as_millis() as u64,
        ],
        build_s,
        steady,
        admitted_all_after_expiry_s: admitted.last().copied().unwrap_or(0.0) / 1000.0,
        admitted_p50_after_expiry_ms: Percentiles::of(admitted).p50_ms,
        resumed_all_after_expiry_s: after_expiry(resumed_last),
        finished_all_after_expiry_s: after_expiry(finished_ms),
        interruption_to_resumption: Percentiles::of(resumption),
        recovered,
        dollars_per_recovered_run: per_run.dollars(),
        requests_per_recovered_run: per_run,
        requests_per_recovered_run_by_role: [
            (
                "coordinators",
                Requests::per(&coordinators_spent, recovered as f64),
            ),
            ("workers", Requests::per(&workers_spent, recovered as f64)),
        ]
        .into_iter()
        .collect(),
        coordinator_peak_rss_mib: peak,
        recovery_cpu_s,
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        tool_calls_reexecuted: reexecuted,
        ledger_violations: violations,
    })
}

fn sum(snapshots: impl Iterator<Item = MetricsSnapshot>) -> MetricsSnapshot {
    snapshots.fold(MetricsSnapshot::default(), |a, b| add(&a, &b))
}

/// A coordinator process (`rekindle bench coordinator`): a line `sample` on its stdin makes
/// it print a [`CoordinatorSample`]; the end of its stdin stops it (it prints a last one).
struct CoordinatorProcess {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl CoordinatorProcess {
    fn start(
        outage: &Outage,
        store: &StoreUrl,
        dir: &Path,
        prefix: &str,
        i: usize,
    ) -> Result<CoordinatorProcess> {
        use tokio::io::AsyncBufReadExt;
        let workload = &outage.workload;
        let log = std::fs::File::create(dir.join(format!("coordinator-{i}.log")))
            .map_err(setup("create a coordinator's log"))?;
        let mut child = tokio::process::Command::new(&workload.exe)
            .args(["bench", "coordinator", "--store"])
            .arg(store.to_string())
            .args(["--id", &format!("{prefix}-coordinator-{i}")])
            .args(["--ttl-ms", &workload.ttl.as_millis().to_string()])
            .args(["--latency-ms", &workload.latency.as_millis().to_string()])
            .args(["--jitter-ms", &workload.jitter.as_millis().to_string()])
            .args(["--partitions", &outage.partitions.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(setup("start a coordinator process"))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .map(|out| tokio::io::BufReader::new(out).lines())
            .ok_or_else(|| BenchError::Host("a coordinator process has no stdout".into()))?;
        Ok(CoordinatorProcess {
            child,
            stdin,
            stdout,
        })
    }

    async fn sample(&mut self) -> Result<CoordinatorSample> {
        use tokio::io::AsyncWriteExt;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| BenchError::Host("a coordinator process was stopped".into()))?;
        stdin
            .write_all(b"sample\n")
            .await
            .map_err(setup("ask a coordinator for a sample"))?;
        self.read_sample().await
    }

    async fn read_sample(&mut self) -> Result<CoordinatorSample> {
        let line = self
            .stdout
            .next_line()
            .await
            .map_err(setup("read a coordinator's sample"))?
            .ok_or_else(|| {
                BenchError::Host(
                    "a coordinator process exited (see its log in the work directory)".into(),
                )
            })?;
        serde_json::from_str(&line).map_err(|error| {
            BenchError::Host(format!("a coordinator's sample is not JSON: {error}"))
        })
    }

    fn cpu_s(&self) -> f64 {
        self.child
            .id()
            .map_or(0.0, |pid| process_cpu_s_of(&pid.to_string()))
    }

    async fn stop(mut self) -> Result<CoordinatorSample> {
        drop(self.stdin.take());
        let last = self.read_sample().await;
        let _ = self.child.wait().await;
        last
    }
}

/// The coordinator side of the outage (`rekindle bench coordinator`): runs a coordinator with
/// the binaries' default pacing and a wake-up endpoint on loopback, printing a
/// [`CoordinatorSample`] for every `sample` line on stdin, and a last one when stdin ends.
pub async fn coordinator_process(
    store: Store,
    id: String,
    ttl: Duration,
    partitions: u32,
) -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let stop = Arc::new(AtomicBool::new(false));
    let wakeup: Wakeup = Arc::new(wake::WakeSignal::new());
    let url = wake::serve_loopback(Arc::clone(&wakeup))
        .await
        .map_err(setup("serve a wake-up endpoint"))?;
    let mut options = CoordinatorOptions::new(id, ttl);
    options.wake = Some((wakeup, Some(url)));
    options.partitions = (partitions > 1).then_some(partitions);
    let (task_store, task_stop) = (store.clone(), Arc::clone(&stop));
    let running = tokio::spawn(async move {
        if let Err(error) = coordinator::run(task_store, options, task_stop).await {
            tracing::error!(%error, "the coordinator stopped");
        }
    });
    let sample = || CoordinatorSample {
        requests: store.metrics(),
        rss_mib: rss_mib_of("self"),
        peak_rss_mib: peak_rss_mib(),
        cpu_s: process_cpu_s(),
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {
        println!("{}", serde_json::to_string(&sample()).unwrap_or_default());
    }
    stop.store(true, Ordering::SeqCst);
    let _ = running.await;
    println!("{}", serde_json::to_string(&sample()).unwrap_or_default());
    Ok(())
}
