//! The `rekindle` command line: parses arguments and hands each subcommand to its one
//! function in `cli::commands`, which calls the library and prints. Nothing here decides.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cli::commands;
use cli::shared::{StoreArgs, StoreSettingsArgs};
use rekindle::store::StoreUrl;

mod cli;

/// Rekindle recovers interrupted AI-agent runs from checkpoints in object storage.
#[derive(Parser)]
#[command(name = "rekindle", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the folded state of a local fact log: next step, pending tool calls, counters,
    /// parked or terminal state.
    ///
    /// A torn last line (a write cut short by a crash) is skipped with a note; damage
    /// anywhere else is an error naming the line. Exits 1 on any error.
    Fold {
        /// Path to a run's fact log (JSONL, one fact per line).
        path: PathBuf,
        /// Print the state as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a whole fleet in one process: hosts start runs and some crash part-way, a worker
    /// is killed mid-run, and the coordinator and workers recover everything. Prints a
    /// progress bar, then a summary (runs completed, recoveries, tool calls re-executed,
    /// requests per recovery, time). Uses a temporary local directory unless --store is set;
    /// takes the same store settings as every other command.
    Demo {
        /// Runs the hosts start (at least 1).
        #[arg(long, default_value_t = 100, value_parser = cli::shared::at_least_one::<usize>)]
        runs: usize,
        /// Workers recovering interrupted runs (at least 1: without one, nothing recovers).
        #[arg(long, default_value_t = 3, value_parser = cli::shared::at_least_one::<usize>)]
        workers: usize,
        /// Store URL: s3://bucket/prefix (e.g. s3://bucket/demo for MinIO), file:///abs/path
        /// (or a plain path), or memory://. Default: a temporary directory (REKINDLE_STORE is
        /// not read: the demo writes only where it is told to).
        #[arg(long)]
        store: Option<StoreUrl>,
        #[command(flatten)]
        store_settings: StoreSettingsArgs,
        /// Seed for which hosts crash and when (the same seed, the same crashes).
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Print the summary as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Start a run on this node and drive it to its end, journaling every fact locally and
    /// committing a generation after every model turn and tool result. Killed at any point,
    /// it leaves an interrupted run the fleet finishes.
    Run {
        #[command(flatten)]
        store: StoreArgs,
        /// The agent configuration (rekindle.toml): model, tools, budgets; its fingerprint goes into the run.
        #[arg(long, env = "REKINDLE_CONFIG")]
        config: PathBuf,
        /// The run's ID; an ID is used once, ever (a second `rekindle run` with it is refused).
        #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
        run_id: String,
        /// The session the run belongs to (recorded in its first fact).
        #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
        session_id: Option<String>,
        /// Directory for local fact logs, one `<run>.jsonl` per run (default:
        /// $XDG_STATE_HOME/rekindle/runs). A run's log is removed once it finished; logs no
        /// process holds that are over an hour old (left by killed processes) are removed
        /// when a process opens the directory.
        #[arg(long, env = "REKINDLE_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// How long this host's heartbeat may stay unchanged before the fleet judges it dead
        /// (at least 1).
        #[arg(long, default_value_t = 30_000, value_parser = cli::shared::at_least_one::<u64>)]
        lease_ttl_ms: u64,
        /// The user's prompt.
        prompt: String,
    },
    /// Admit a recovery of an interrupted run under a chosen ID (idempotent: the same ID
    /// again returns the existing recovery). The fleet executes it.
    #[command(
        override_usage = "rekindle recover --store <STORE> --recovery-id <RECOVERY_ID> <SOURCE_RUN> [--takeover] [--wait] [--force]\n       rekindle recover --store <STORE> --all [--takeover] [--wait] [--force]"
    )]
    Recover {
        #[command(flatten)]
        store: StoreArgs,
        /// The interrupted run.
        #[arg(required_unless_present = "all", conflicts_with = "all", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        source_run: Option<String>,
        /// The ID of the recovery run to admit (with --all, each run gets `recovery-of-<run>`).
        #[arg(
            long,
            required_unless_present = "all",
            conflicts_with = "all",
            value_parser = clap::builder::NonEmptyStringValueParser::new()
        )]
        recovery_id: Option<String>,
        /// Admit every interrupted run (each under its deterministic recovery ID). A run
        /// counts as interrupted when its host's heartbeat is gone or stays unchanged for
        /// one lease TTL.
        #[arg(long)]
        all: bool,
        /// Do not wait a TTL for a holder that still heartbeats: take the run over now. For
        /// an operator who knows the old host is gone. Safe for the run, because fencing
        /// stops the old holder's commits, but its in-flight tool call may run twice.
        /// Without it, a run whose holder's heartbeat changes within its TTL is refused.
        #[arg(long)]
        takeover: bool,
        /// Wait until the recoveries finished, including those admitted otherwise (by the
        /// coordinator, or an earlier run); exits non-zero if one was dead-lettered or is
        /// parked waiting for an answer. A store that stops answering is waited through for
        /// up to 5 minutes.
        #[arg(long)]
        wait: bool,
        /// Resume even if the worker's configuration differs from the run's.
        #[arg(long)]
        force: bool,
    },
    /// Workflows: sets of runs executed by the fleet, with a checkpoint of finished steps.
    Workflow {
        #[command(subcommand)]
        command: WorkflowCommand,
    },
    /// Inspect runs.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Answer a parked run: approve or deny a tool call, or answer a question.
    Answer {
        #[command(flatten)]
        store: StoreArgs,
        /// The parked run.
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        run: String,
        /// The tool call waiting for confirmation.
        #[arg(long, requires = "decision", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        confirm: Option<String>,
        /// Let the tool call run.
        #[arg(long, group = "decision")]
        approve: bool,
        /// Refuse the tool call: it never runs, and the model is told so.
        #[arg(long, group = "decision")]
        deny: bool,
        /// The question waiting for an answer.
        #[arg(long, requires = "text", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        question: Option<String>,
        /// The answer to the question.
        #[arg(long)]
        text: Option<String>,
    },
    /// Fleet overview: workers, assignments, runs by state, oldest interrupted run.
    Status {
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check that the store enforces conditional writes atomically (create-if-absent, stale
    /// compare-and-swap refused, one winner of a concurrent create race). Every command that
    /// writes runs this check first; this command runs only the check. It writes a few probe
    /// objects under probe/ (and, on a new location, the format marker: it is then a store).
    Probe {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete superseded run generations (keeping every epoch's first one, so stale writers
    /// stay fenced) once their snapshot is older than the grace period, and retire runs that
    /// ended longer ago than the retention period: a tombstone stays, with the run's lease,
    /// recovery claim, recovery records and epochs' first generations, so no run, epoch or
    /// recovery ID is ever reused. Also deletes what dead processes left: heartbeats silent
    /// for their TTL plus the grace period (at least eleven TTLs) that no run names, with a
    /// dead worker's registration and inbox, registrations whose heartbeat is gone and inboxes
    /// of unregistered workers (a leading coordinator removes most of these sooner). Ages are
    /// judged on the store's clock (each pass rewrites `gc/clock` to read it), so a node whose
    /// clock is behind cannot make its checkpoints look old.
    Gc {
        #[command(flatten)]
        store: StoreArgs,
        /// Retire runs that ended this many hours ago.
        #[arg(long, default_value_t = 168)]
        retention_hours: u64,
        /// Delete nothing superseded by a snapshot younger than this, and retire no run
        /// sooner: far longer than any request deadline with its retries (at least 1).
        #[arg(long, default_value_t = 60, value_parser = cli::shared::at_least_one::<u64>)]
        grace_minutes: u64,
        /// Report what would be deleted and retired, and change nothing (not even the clock
        /// marker: ages are then judged by the writers' clocks).
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks of the whole fleet: crash and recover a workload, count an idle fleet's
    /// requests, scale across workers. Each prints one JSON line per result; timings are
    /// reported, never asserted.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Measure store costs: requests and bytes per commit of a run, and what loading a long
    /// run costs (requests and median time).
    BenchStore {
        #[command(flatten)]
        store: StoreArgs,
        /// Steps of the committed run (one commit per fact; at least 1).
        #[arg(long, default_value_t = 50, value_parser = cli::shared::at_least_one::<u64>)]
        steps: u64,
        /// Facts in the run that is loaded (at least 1).
        #[arg(long, default_value_t = 10_000, value_parser = cli::shared::at_least_one::<usize>)]
        facts: usize,
        /// Keep the two runs it writes (they are removed afterwards by default).
        #[arg(long)]
        keep: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// The workload's shape and the fleet that recovers it.
#[derive(clap::Args, Clone, Debug)]
struct WorkloadArgs {
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
enum BenchCommand {
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

#[derive(Subcommand)]
enum WorkflowCommand {
    /// Run (or resume) a workflow: dispatch every step not yet finished to the fleet and
    /// wait for all of them, recording each outcome in the workflow checkpoint. Running it
    /// again, on any node, skips finished steps.
    Run {
        #[command(flatten)]
        store: StoreArgs,
        /// The agent configuration (rekindle.toml) the workflow's step runs start with.
        #[arg(long, env = "REKINDLE_CONFIG")]
        config: PathBuf,
        /// The workflow ID.
        #[arg(long)]
        id: String,
        /// JSON file: [{"step": "a", "prompt": "...", "session_id": null}, ...]
        specs: PathBuf,
    },
}

#[derive(Subcommand)]
enum RunsCommand {
    /// List runs by ID: those not done (from the index) and finished recoveries; with --all,
    /// every run in the store, finished ones too (it lists every run's lease: one LIST per
    /// 1000 objects under runs/).
    Ls {
        #[command(flatten)]
        store: StoreArgs,
        /// Only runs in this state. suspect: its holder's heartbeat is older than its TTL, not
        /// yet judged; recovered: continued by a recovery. The states of runs that left the
        /// index (completed, failed, cancelled, budget, step_cap, dead_lettered, retired,
        /// unfinished) need --all.
        #[arg(long, value_parser = ["running", "suspect", "interrupted", "parked", "recovering", "dead", "completed", "failed", "cancelled", "budget", "step_cap", "dead_lettered", "recovered", "retired", "unfinished"])]
        state: Option<String>,
        /// Every run in the store, finished ones too.
        #[arg(long)]
        all: bool,
        /// Start after this run ID (paging: pass the last ID of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// At most this many runs (at least 1).
        #[arg(long, default_value_t = 1000, value_parser = cli::shared::at_least_one::<u64>)]
        limit: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Retire a run now: reserve its lease (no process can hold the run again), fence a run
    /// that has not ended so a holder that only seemed gone cannot commit, write its
    /// tombstone, delete its generations (but each epoch's first) and loop checkpoints and its
    /// index entry. Its lease, recovery claim and recovery records stay, so the run cannot be
    /// resumed, recreated or recovered again. Running it again finishes an interrupted one.
    Rm {
        #[command(flatten)]
        store: StoreArgs,
        /// The run to retire.
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        run: String,
        /// Remove even if a holder still has the lease (only when that holder is gone), or
        /// a recovery of the run has not ended (its record then stays as it is).
        #[arg(long)]
        force: bool,
    },
    /// One run: generations, lease, recovery lineage, folded state, pending tool calls.
    Show {
        #[command(flatten)]
        store: StoreArgs,
        /// The run to show.
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        run: String,
        /// Also draw its timeline: each incarnation (lease epoch), where it was interrupted
        /// and with which tool call in flight, and the recovery that continued it.
        #[arg(long)]
        timeline: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    quiet_on_closed_pipe();
    if std::env::args().nth(1).as_deref() == Some("--help-markdown") {
        print!("{}", cli::shared::environment_markdown());
    }
    cli::shared::help_markdown::<Cli>();
    let cli = Cli::parse();
    // Logs go to stderr; RUST_LOG selects them (default: warnings and errors only).
    cli::shared::init_tracing(false, "warn");
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fold { path, json } => commands::fold(&path, json),
        Command::Demo {
            runs,
            workers,
            store,
            store_settings,
            seed,
            json,
        } => block_on(commands::demo(
            runs,
            workers,
            store,
            store_settings,
            seed,
            json,
        )),
        Command::Run {
            store,
            config,
            run_id,
            session_id,
            state_dir,
            lease_ttl_ms,
            prompt,
        } => block_on(commands::run(
            store,
            config,
            run_id,
            session_id,
            state_dir,
            lease_ttl_ms,
            prompt,
        )),
        Command::Recover {
            store,
            source_run,
            recovery_id,
            all,
            takeover,
            wait,
            force,
        } => match (all, source_run, recovery_id) {
            (true, _, _) => block_on(commands::recover_all(store, takeover, wait, force)),
            (false, Some(source), Some(id)) => {
                block_on(commands::recover(store, source, id, takeover, wait, force))
            }
            _ => Err(anyhow::anyhow!(
                "give SOURCE_RUN --recovery-id ID, or --all"
            )),
        },
        Command::Workflow {
            command:
                WorkflowCommand::Run {
                    store,
                    config,
                    id,
                    specs,
                },
        } => block_on(commands::workflow_run(store, config, id, specs)),
        Command::Runs { command } => match command {
            RunsCommand::Ls {
                store,
                state,
                all,
                after,
                limit,
                json,
            } => block_on(commands::runs_ls(
                store,
                commands::Listing {
                    state,
                    all,
                    after,
                    limit: limit as usize,
                },
                json,
            )),
            RunsCommand::Show {
                store,
                run,
                timeline,
                json,
            } => block_on(commands::runs_show(store, run, timeline, json)),
            RunsCommand::Rm { store, run, force } => block_on(commands::runs_rm(store, run, force)),
        },
        Command::Answer {
            store,
            run,
            confirm,
            approve,
            deny: _,
            question,
            text,
        } => block_on(commands::answer(
            store, run, confirm, approve, question, text,
        )),
        Command::Status { store, json } => block_on(commands::status(store, json)),
        Command::Probe { store } => block_on(commands::probe(store)),
        Command::Gc {
            store,
            retention_hours,
            grace_minutes,
            dry_run,
            json,
        } => block_on(commands::gc(
            store,
            retention_hours,
            grace_minutes,
            dry_run,
            json,
        )),
        Command::BenchStore {
            store,
            steps,
            facts,
            keep,
            json,
        } => block_on(commands::bench_store(store, steps, facts, keep, json)),
        Command::Bench(command) => block_on(bench(command)),
    }
}

/// `rekindle runs ls | head` closes the pipe early: exit quietly (with the status a shell
/// gives a process killed by SIGPIPE) instead of a panic and its backtrace.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

fn block_on(future: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(future)
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

async fn bench(command: BenchCommand) -> anyhow::Result<()> {
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
                Cli::command()
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
            let settings = bench::host_settings(
                &store_settings.settings(false)?,
                Duration::from_millis(latency_ms),
                Duration::from_millis(jitter_ms),
            );
            let store = rekindle::store::Store::open(
                &store,
                &settings,
                rekindle::clock::SystemClock::shared(),
            )
            .await?;
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
