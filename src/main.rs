//! The `rekindle` command line: parses arguments and hands each subcommand to its one
//! function in `cli::commands`, which calls the library and prints. Nothing here decides.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cli::bench::BenchCommand;
use cli::shared::{StoreArgs, StoreSettingsArgs};
use cli::{commands, recover, runs};
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
        /// counts as interrupted when its entry names no host (the host stopped and let go of
        /// it), or when its host's heartbeat stays unchanged, or absent, for one lease TTL.
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
    /// of unregistered workers (a leading coordinator removes dead hosts' heartbeats sooner;
    /// dead workers' are gc's alone, so run it regularly). Ages are
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
            (true, _, _) => block_on(recover::recover_all(store, takeover, wait, force)),
            (false, Some(source), Some(id)) => {
                block_on(recover::recover(store, source, id, takeover, wait, force))
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
            } => block_on(runs::runs_ls(
                store,
                runs::Listing {
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
            } => block_on(runs::runs_show(store, run, timeline, json)),
            RunsCommand::Rm { store, run, force } => block_on(runs::runs_rm(store, run, force)),
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
        Command::Bench(command) => block_on(cli::bench::run(command)),
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
