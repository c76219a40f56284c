//! `rekindle bench`: the fleet benchmarks' arguments, and running one (the benchmarks
//! themselves are the library's `fleet::bench` and `fleet::soak`). One JSON line per report.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;
use rekindle::store::StoreUrl;

use crate::cli;
use crate::cli::shared::StoreSettingsArgs;

/// The workload's shape and the fleet that recovers it.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct WorkloadArgs {
    /// Runs the host starts.
    #[arg(long, default_value_t = 200, value_parser = cli::shared::at_least_one::<usize>)]
    runs: usize,
    /// Steps per run (a model turn calling one tool).
    #[arg(long, default_value_t = 10, value_parser = cli::shared::at_least_one::<usize>)]
    steps: usize,
    /// Workers recovering.
    #[arg(long, default_value_t = 4, value_parser = cli::shared::at_least_one::<usize>)]
    workers: usize,
    /// Recoveries each worker runs at once.
    #[arg(long, default_value_t = 16, value_parser = cli::shared::at_least_one::<u32>)]
    concurrency: u32,
    /// Recoveries that may wait assigned to each worker beyond --concurrency, started as
    /// slots free (default: the --concurrency, as rekindle-worker).
    #[arg(long, allow_negative_numbers = true)]
    queue: Option<u32>,
    /// How long each tool call sleeps, in ms.
    #[arg(long, default_value_t = 5)]
    step_ms: u64,
    /// Lease TTL of the host, workers and coordinator, in ms.
    #[arg(long, default_value_t = 30_000, value_parser = cli::shared::at_least_one::<u64>)]
    ttl_ms: u64,
    /// Latency added to every store request, in ms (S3 is about 20).
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Up to this much more latency per request, uniformly drawn, in ms.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// Store URL. Default: a fresh temporary directory, removed afterwards.
    #[arg(long)]
    store: Option<StoreUrl>,
    #[command(flatten)]
    store_settings: StoreSettingsArgs,
}

#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// Kill -9 a host half-way through N runs of K steps, recover everything with W workers,
    /// and report recovery wall time, admission→first step and interruption→resumption
    /// (p50/p99), tool calls re-executed, requests per recovered run by kind, bytes written
    /// per run and peak memory.
    CrashRecover {
        #[command(flatten)]
        workload: WorkloadArgs,
        /// How the runs come back: `takeover` (an operator declares the outage, as
        /// `recover --all --takeover`), `lease` (the coordinator waits out the host's lease
        /// TTL), or `both`.
        #[arg(long, default_value = "both", value_parser = ["takeover", "lease", "both"])]
        mode: String,
    },
    /// Run a coordinator and workers with nothing to do at the binaries' default pacing,
    /// count their requests, and print what that costs a month at S3 list prices.
    Idle {
        /// Workers in the fleet, beside one coordinator.
        #[arg(long, default_value_t = 10, value_parser = cli::shared::at_least_one::<usize>)]
        workers: usize,
        /// Store URL. Default: a fresh temporary directory, removed afterwards.
        #[arg(long)]
        store: Option<StoreUrl>,
        #[command(flatten)]
        store_settings: StoreSettingsArgs,
        /// Minutes to measure (after a minute's warm-up).
        #[arg(long, default_value_t = 10, value_parser = cli::shared::at_least_one::<u64>)]
        minutes: u64,
        /// Seconds of warm-up not counted (registration, first scans).
        #[arg(long, default_value_t = 60)]
        warmup_s: u64,
    },
    /// An operator's steady state for a while: the real coordinator and workers at their
    /// default pacing serve a new `rekindle run` host every --arrival-ms, about --kill-percent
    /// of them killed -9. Prints a sample line (memory per process, objects per prefix, lock
    /// and state files) every --sample-s, then settles, audits every run and prints a report;
    /// exits non-zero if an invariant broke.
    Soak {
        /// Minutes hosts keep arriving (fractions allowed: 0.5).
        #[arg(long, default_value_t = 10.0, value_parser = cli::shared::above_zero)]
        minutes: f64,
        /// Milliseconds between two hosts' starts.
        #[arg(long, default_value_t = 500, value_parser = cli::shared::at_least_one::<u64>)]
        arrival_ms: u64,
        /// Share of hosts killed -9 at a random moment of their run, in percent.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=100))]
        kill_percent: u32,
        /// Workers beside the coordinator.
        #[arg(long, default_value_t = 2, value_parser = cli::shared::at_least_one::<usize>)]
        workers: usize,
        /// Steps per run (a model turn calling one tool).
        #[arg(long, default_value_t = 4, value_parser = cli::shared::at_least_one::<usize>)]
        steps: usize,
        /// How long each tool call sleeps, in ms.
        #[arg(long, default_value_t = 200)]
        step_ms: u64,
        /// Seconds between two samples.
        #[arg(long, default_value_t = 30, value_parser = cli::shared::at_least_one::<u64>)]
        sample_s: u64,
        /// Seconds to wait at the end for every interrupted run to be recovered and the killed
        /// hosts' heartbeats to be removed (three TTLs after their death, at the coordinator's
        /// next scan: up to a minute once the fleet is idle).
        #[arg(long, default_value_t = 300, value_parser = cli::shared::at_least_one::<u64>)]
        settle_s: u64,
        /// Seeds which hosts are killed, and when.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Lease TTL of every process, in ms (default: the binaries' 30 000).
        #[arg(long, value_parser = cli::shared::at_least_one::<u64>)]
        ttl_ms: Option<u64>,
        /// Store URL. Default: a fresh temporary directory, removed afterwards. The fleet's
        /// processes get it as REKINDLE_STORE and take S3 settings from the AWS environment.
        #[arg(long)]
        store: Option<StoreUrl>,
        #[command(flatten)]
        store_settings: StoreSettingsArgs,
    },
    /// The crash-recover workload (takeover) with 1, 2, 4 and 8 workers: recovered steps
    /// per second and efficiency against the smallest count (one worker by default). Add
    /// --latency-ms 20 --jitter-ms 10 for S3-like latency. --counts sets the worker counts
    /// (there is no --workers here).
    #[command(mut_arg("workers", |arg| arg.hide(true)))]
    Scale {
        #[command(flatten)]
        workload: WorkloadArgs,
        /// Worker counts to measure, comma-separated (measured smallest first, each once).
        #[arg(long, default_value = "1,2,4,8", value_delimiter = ',', value_parser = parse_worker_count)]
        counts: Vec<usize>,
    },
    /// Count the store round trips one after another from a recovery's admission to its
    /// first tool call: one run killed and recovered by takeover without injected latency,
    /// then with --latency-ms (50 if 0 or not given) on every request, no jitter; the extra time over the latency
    /// is the count. Prints both times of each pair and the median count.
    RoundTrips {
        #[command(flatten)]
        workload: WorkloadArgs,
        /// Pairs of runs to measure (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = cli::shared::at_least_one::<usize>)]
        pairs: usize,
    },
    /// A mass outage in a big bucket: --active runs written as their hosts left them, of which
    /// --interrupted are held by hosts that die at once; --coordinators coordinator processes
    /// and the workers recover them (one step each). Reports the steady state before (the
    /// coordinators' requests per second and memory per active run), then the time from the
    /// TTL's expiry until every interrupted run is admitted, resumed and finished,
    /// interruption→resumption p50/p99, requests and dollars per recovered run; exits non-zero
    /// if an interrupted run was not recovered, a step is missing or repeated twice, or a
    /// healthy run was recovered.
    #[command(mut_arg("runs", |arg| arg.hide(true)), mut_arg("steps", |arg| arg.hide(true)))]
    Outage {
        #[command(flatten)]
        workload: WorkloadArgs,
        /// Active runs in the bucket (M).
        #[arg(long, default_value_t = 100_000, value_parser = cli::shared::at_least_one::<usize>)]
        active: usize,
        /// Runs whose hosts die at once (K), at most --active.
        #[arg(long, default_value_t = 10_000, value_parser = cli::shared::at_least_one::<usize>)]
        interrupted: usize,
        /// Coordinator processes.
        #[arg(long, default_value_t = 1, value_parser = cli::shared::at_least_one::<usize>)]
        coordinators: usize,
        /// Partitions the coordinators split the bucket into (default: 1 for one coordinator,
        /// 16 for several, so that each owns a share).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
        partitions: Option<u32>,
        /// Live hosts holding the healthy runs (they keep beating).
        #[arg(long, default_value_t = 20, value_parser = cli::shared::at_least_one::<usize>)]
        hosts: usize,
        /// Hosts that die, holding the interrupted runs between them.
        #[arg(long, default_value_t = 10, value_parser = cli::shared::at_least_one::<usize>)]
        dead_hosts: usize,
        /// Seconds after the fleet starts before the steady state is measured (the
        /// coordinators' first scan of the bucket).
        #[arg(long, default_value_t = 15)]
        warmup_s: u64,
        /// Seconds of steady state measured before the outage.
        #[arg(long, default_value_t = 20, value_parser = cli::shared::at_least_one::<u64>)]
        steady_s: u64,
    },
    /// A coordinator of the outage bench (started and stopped by it).
    #[command(hide = true)]
    Coordinator {
        #[arg(long)]
        store: StoreUrl,
        #[command(flatten)]
        store_settings: StoreSettingsArgs,
        #[arg(long)]
        id: String,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        #[arg(long, default_value_t = 0)]
        jitter_ms: u64,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
    },
    /// The host side of crash-recover (started and killed by it).
    #[command(hide = true)]
    Host {
        #[arg(long)]
        store: StoreUrl,
        #[command(flatten)]
        store_settings: StoreSettingsArgs,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        prefix: String,
        #[arg(long)]
        runs: usize,
        #[arg(long)]
        steps: usize,
        #[arg(long)]
        step_ms: u64,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        #[arg(long, default_value_t = 0)]
        jitter_ms: u64,
    },
}

fn workload(args: WorkloadArgs) -> anyhow::Result<rekindle::fleet::bench::Workload> {
    use std::time::Duration;
    Ok(rekindle::fleet::bench::Workload {
        runs: args.runs,
        steps: args.steps,
        workers: args.workers,
        concurrency: args.concurrency,
        queue: args.queue.unwrap_or(args.concurrency),
        step_time: Duration::from_millis(args.step_ms),
        ttl: Duration::from_millis(args.ttl_ms),
        store: args.store,
        store_settings: args.store_settings.settings(false)?,
        latency: Duration::from_millis(args.latency_ms),
        jitter: Duration::from_millis(args.jitter_ms),
        exe: std::env::current_exe().context("find the rekindle executable")?,
    })
}

pub(crate) async fn run(command: BenchCommand) -> anyhow::Result<()> {
    use rekindle::fleet::bench::{self, Mode};
    use std::time::Duration;
    let print = |value: &dyn erased::Json| println!("{}", value.json());
    match command {
        BenchCommand::CrashRecover {
            workload: args,
            mode,
        } => {
            let workload = workload(args)?;
            let modes: &[Mode] = match mode.as_str() {
                "takeover" => &[Mode::Takeover],
                "lease" => &[Mode::Lease],
                _ => &[Mode::Takeover, Mode::Lease],
            };
            let mut broken = Vec::new();
            for mode in modes {
                let report = bench::crash_recover(&workload, *mode).await?;
                print(&report);
                broken.extend(report.violation());
            }
            if !broken.is_empty() {
                anyhow::bail!("the benchmark broke an invariant: {}", broken.join("; "));
            }
        }
        BenchCommand::Idle {
            workers,
            store,
            store_settings,
            minutes,
            warmup_s,
        } => {
            let workload = bench::Workload {
                workers,
                store,
                store_settings: store_settings.settings(false)?,
                ..bench::Workload::default()
            };
            let report = bench::idle(
                &workload,
                Duration::from_secs(minutes * 60),
                Duration::from_secs(warmup_s),
            )
            .await?;
            print(&report);
        }
        BenchCommand::Soak {
            minutes,
            arrival_ms,
            kill_percent,
            workers,
            steps,
            step_ms,
            sample_s,
            settle_s,
            seed,
            ttl_ms,
            store,
            store_settings,
        } => {
            let exe = std::env::current_exe().context("find the rekindle executable")?;
            let options = rekindle::fleet::soak::SoakOptions {
                duration: Duration::from_secs_f64(minutes * 60.0),
                arrival: Duration::from_millis(arrival_ms),
                kill_percent,
                workers,
                steps,
                step_time: Duration::from_millis(step_ms),
                sample_every: Duration::from_secs(sample_s),
                store,
                store_settings: store_settings.settings(false)?,
                bin_dir: exe.parent().map(Path::to_path_buf).unwrap_or_default(),
                seed,
                ttl: ttl_ms.map(Duration::from_millis),
                settle: Duration::from_secs(settle_s),
            };
            // A signal stops the soak: dropping it kills its fleet and hosts and removes its
            // work directory.
            let stop = cli::shared::stop_on_signals();
            let report = tokio::select! {
                biased;
                report = rekindle::fleet::soak::soak(&options, |sample| print(sample)) => report?,
                () = async {
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        rekindle::clock::sleep(Duration::from_millis(50)).await;
                    }
                } => anyhow::bail!("interrupted: the soak's fleet and hosts were stopped and its work directory removed"),
            };
            print(&report);
            if !report.violations.is_empty() {
                let n = report.violations.len();
                anyhow::bail!(
                    "the soak broke {n} invariant{} (first: {}); logs kept in {}",
                    if n == 1 { "" } else { "s" },
                    report.violations[0],
                    report
                        .kept
                        .as_deref()
                        .map_or_else(|| "-".into(), |p| p.display().to_string())
                );
            }
        }
        BenchCommand::Scale {
            workload: args,
            counts,
        } => {
            if args.workers != 4 {
                use clap::CommandFactory;
                crate::Cli::command()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        "bench scale measures each of --counts (default 1,2,4,8); --workers does not apply",
                    )
                    .exit();
            }
            let mut counts = counts;
            counts.sort_unstable();
            counts.dedup();
            let workload = workload(args)?;
            let mut broken = Vec::new();
            for row in bench::scale(&workload, &counts).await? {
                print(&row);
                broken.extend(row.run.violation());
            }
            if !broken.is_empty() {
                anyhow::bail!("the benchmark broke an invariant: {}", broken.join("; "));
            }
        }
        BenchCommand::RoundTrips {
            workload: args,
            pairs,
        } => {
            let latency = if args.latency_ms == 0 {
                50
            } else {
                args.latency_ms
            };
            let workload = workload(args)?;
            let report =
                bench::round_trips(&workload, Duration::from_millis(latency), pairs).await?;
            print(&report);
        }
        BenchCommand::Outage {
            workload: args,
            active,
            interrupted,
            coordinators,
            partitions,
            hosts,
            dead_hosts,
            warmup_s,
            steady_s,
        } => {
            if interrupted > active {
                anyhow::bail!("--interrupted ({interrupted}) must not exceed --active ({active})");
            }
            let outage = bench::Outage {
                active,
                interrupted,
                coordinators,
                partitions: partitions.unwrap_or(if coordinators > 1 { 16 } else { 1 }),
                hosts,
                dead_hosts,
                warmup: Duration::from_secs(warmup_s),
                steady: Duration::from_secs(steady_s),
                workload: workload(args)?,
            };
            let report = bench::outage(&outage).await?;
            print(&report);
            if let Some(broken) = report.violation() {
                anyhow::bail!("the benchmark broke an invariant: {broken}");
            }
        }
        BenchCommand::Coordinator {
            store,
            store_settings,
            id,
            ttl_ms,
            latency_ms,
            jitter_ms,
            partitions,
        } => {
            let store = open_child_store(&store, &store_settings, latency_ms, jitter_ms).await?;
            bench::coordinator_process(store, id, Duration::from_millis(ttl_ms), partitions)
                .await?;
        }
        BenchCommand::Host {
            store,
            store_settings,
            dir,
            prefix,
            runs,
            steps,
            step_ms,
            ttl_ms,
            latency_ms,
            jitter_ms,
        } => {
            let store = open_child_store(&store, &store_settings, latency_ms, jitter_ms).await?;
            bench::host(
                store,
                &dir,
                &prefix,
                runs,
                steps,
                Duration::from_millis(step_ms),
                Duration::from_millis(ttl_ms),
            )
            .await?;
        }
    }
    Ok(())
}

/// The store a bench's child process (a host, a coordinator) opens: the parent's settings,
/// with its injected latency.
async fn open_child_store(
    store: &StoreUrl,
    store_settings: &StoreSettingsArgs,
    latency_ms: u64,
    jitter_ms: u64,
) -> anyhow::Result<rekindle::store::Store> {
    use std::time::Duration;
    let settings = rekindle::fleet::bench::host_settings(
        &store_settings.settings(false)?,
        Duration::from_millis(latency_ms),
        Duration::from_millis(jitter_ms),
    );
    Ok(
        rekindle::store::Store::open(store, &settings, rekindle::clock::SystemClock::shared())
            .await?,
    )
}

/// One JSON line for any report.
mod erased {
    pub(crate) trait Json {
        fn json(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap_or_default()
        }
    }
}

/// One of `bench scale --counts`: a worker count of at least 1.
fn parse_worker_count(given: &str) -> Result<usize, String> {
    match given.trim().parse::<usize>() {
        Ok(count) if count >= 1 => Ok(count),
        _ => Err(format!(
            "'{given}' is not a worker count: expected comma-separated counts of at least 1, e.g. 1,2,4,8"
        )),
    }
}
