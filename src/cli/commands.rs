//! The `rekindle` subcommands, one function each: open what the command needs, call the
//! library (which decides), print the result. Each returns an error that `main` prints as
//! one line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use rekindle::core::fact::{CallId, QuestionId, RunId, SessionId};
use rekindle::core::fold;
use rekindle::core::layout;
use rekindle::fleet::runner::Stopped;
use rekindle::fleet::{self, Agent, Answer, Node};
use rekindle::host::config::Config;
use rekindle::store::StoreUrl;
use rekindle::store::lease::Holder;
use rekindle::store::log::{self, LogDir};

use super::render;
use super::shared::{self, StoreArgs, StoreSettingsArgs};

/// The TTL of the leases the CLI's own commands hold.
pub(crate) const CLI_TTL: Duration = Duration::from_secs(10);

pub(crate) async fn run(
    store: StoreArgs,
    config: PathBuf,
    run_id: String,
    session_id: Option<String>,
    state_dir: Option<PathBuf>,
    lease_ttl_ms: u64,
    prompt: String,
) -> anyhow::Result<()> {
    let stop = shared::stop_on_signals();
    let config = Config::load(&config).context("load the configuration")?;
    let agent = Agent::from_config(config).context("set up the model")?;
    let store = store.open_for_runs().await.context("open the store")?;
    let logs = LogDir::open(shared::state_dir(state_dir)?).context("open the state directory")?;
    let holder = Holder::new(
        &store,
        shared::default_id("host"),
        Duration::from_millis(lease_ttl_ms),
    );
    let node = Node {
        store: store.clone(),
        agent,
        logs,
        holder: std::sync::Arc::clone(&holder),
        stop,
    };
    let run = RunId::new(run_id);
    // A stopped host's heartbeat disappears with it, so the fleet resumes its run at once.
    let result = holder
        .while_beating(node.start_run(&run, session_id.map(SessionId::new), &prompt))
        .await
        .context("write the heartbeat")?;
    // Most errors already name the run; prefix the others with it, not both.
    let result = result.map_err(|error| {
        let error = anyhow::Error::from(error);
        if format!("{error:#}").contains(&format!("run \"{run}\"")) {
            error
        } else {
            error.context(format!("run \"{run}\""))
        }
    });
    match result? {
        Stopped::Finished(terminal) => {
            println!("run {run}: {} ({})", terminal.outcome, terminal.message)
        }
        Stopped::Parked(parked) => {
            let how = match &parked {
                fold::Parked::Confirmation { call_id, .. } => {
                    format!("rekindle answer {run} --confirm {call_id} --approve (or --deny)")
                }
                fold::Parked::Question { question_id, .. } => {
                    format!("rekindle answer {run} --question {question_id} --text ANSWER")
                }
            };
            println!(
                "run {run}: parked, {}; answer it with `{how}`",
                render::describe_parked(&parked)
            )
        }
        Stopped::WaitingForInput => println!("run {run}: waiting for input"),
        Stopped::StepCap | Stopped::StopRequested => {
            println!("run {run}: stopped after committing its last step; the fleet will resume it")
        }
    }
    Ok(())
}

pub(crate) async fn answer(
    store: StoreArgs,
    run: String,
    confirm: Option<String>,
    approve: bool,
    question: Option<String>,
    text: Option<String>,
) -> anyhow::Result<()> {
    let store = store.open_existing(false).await.context("open the store")?;
    let answer = match (confirm, question) {
        (Some(call), None) => Answer::Confirm {
            call_id: CallId::new(call),
            approve,
        },
        (None, Some(question)) => Answer::Question {
            question_id: QuestionId::new(question),
            text: text.unwrap_or_default(),
        },
        _ => bail!("give either --confirm CALL_ID --approve|--deny or --question ID --text TEXT"),
    };
    let source = RunId::new(run);
    let holder = Holder::new(&store, shared::default_id("cli"), CLI_TTL);
    fleet::answer(&store, &holder, &source, answer).await?;
    println!("run {source}: answered; the fleet resumes it");
    Ok(())
}

pub(crate) async fn status(store: StoreArgs, json: bool) -> anyhow::Result<()> {
    let store = store.open_existing(true).await.context("open the store")?;
    let overview = rekindle::fleet::overview::observe(&store).await?;
    if json {
        println!("{}", serde_json::to_string(&overview)?);
    } else {
        print!("{}", render::overview(&overview, store.clock().wall_ms()));
    }
    Ok(())
}

pub(crate) async fn workflow_run(
    store: StoreArgs,
    config: PathBuf,
    id: String,
    specs: PathBuf,
) -> anyhow::Result<()> {
    let config = Config::load(&config).context("load the configuration")?;
    let agent = Agent::from_config(config).context("set up the model")?;
    let text =
        std::fs::read_to_string(&specs).with_context(|| format!("read {}", specs.display()))?;
    let steps: Vec<rekindle::fleet::workflow::StepSpec> =
        serde_json::from_str(&text).with_context(|| format!("parse {}", specs.display()))?;
    let store = store.open_for_runs().await.context("open the store")?;
    let report =
        rekindle::fleet::workflow::run(&store, &agent, &id, &steps, Duration::from_millis(500))
            .await?;
    println!(
        "workflow {id}: {} steps skipped (already finished), {} dispatched",
        report.skipped.len(),
        report.dispatched.len()
    );
    for step in &report.completed {
        println!("  {} ({}): {}", step.step, step.run_id, step.outcome);
    }
    Ok(())
}

pub(crate) fn fold(path: &Path, json: bool) -> anyhow::Result<()> {
    let (state, torn_tail) = log::fold(path).context("fold the fact log")?;
    let summary = state.summary();
    if json {
        let mut value = serde_json::to_value(&summary).context("encode the summary")?;
        value["torn_tail_line"] = serde_json::json!(torn_tail.map(|t| t.line));
        println!("{value}");
        return Ok(());
    }
    if let Some(torn) = torn_tail {
        eprintln!(
            "note: skipped a torn last line (line {}, {} bytes), left by an interrupted write",
            torn.line, torn.bytes
        );
    }
    print!("{}", render::summary(&summary));
    Ok(())
}

pub(crate) async fn demo(
    runs: usize,
    workers: usize,
    store: Option<StoreUrl>,
    store_settings: StoreSettingsArgs,
    seed: u64,
    json: bool,
) -> anyhow::Result<()> {
    let temporary = store.is_none();
    let options = rekindle::fleet::demo::DemoOptions {
        runs,
        workers,
        store,
        store_settings: store_settings.settings(false)?,
        seed,
        progress: !json,
        ..rekindle::fleet::demo::DemoOptions::default()
    };
    let summary = rekindle::fleet::demo::run(options)
        .await
        .context("run the demo")?;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{} of {} runs completed ({} by their hosts, {} by recoveries) in {:.1} s",
            summary.completed,
            summary.runs,
            summary.completed_by_host,
            summary.recoveries,
            summary.seconds
        );
        println!(
            "{} hosts crashed mid tool call (after their first commit: one recovery each), {} worker killed mid recovery; {} recovery attempts",
            summary.hosts_crashed, summary.workers_killed, summary.recovery_attempts
        );
        println!(
            "{} tool calls, {} re-executed (at most one per interruption: {} runs over that bound)",
            summary.tool_calls, summary.tool_calls_reexecuted, summary.runs_over_budget
        );
        println!(
            "{} fleet requests, {:.1} per recovery (these and the time vary with pacing; the rest is fixed by --seed); store {}{}",
            summary.fleet_requests,
            summary.requests_per_recovery,
            summary.store,
            if temporary {
                " (temporary, removed; --store keeps one)"
            } else {
                ""
            }
        );
    }
    match summary.violation() {
        Some(violation) => bail!(violation),
        None => Ok(()),
    }
}

pub(crate) async fn probe(store: StoreArgs) -> anyhow::Result<()> {
    // Opening for writing runs the probe (and writes the format marker on a new store).
    store.open(false).await.context("open the store")?;
    println!(
        "store {}: conditional writes are enforced and atomic (create-if-absent, compare-and-swap, 8-way create race)",
        store.store
    );
    Ok(())
}

pub(crate) async fn gc(
    store: StoreArgs,
    retention_hours: u64,
    grace_minutes: u64,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<()> {
    let opened = store
        .open_existing(dry_run)
        .await
        .context("open the store")?;
    let now = opened.clock().wall_ms();
    let policy = rekindle::store::gc::GcPolicy {
        retention: Duration::from_secs(retention_hours.saturating_mul(3600)),
        grace: Duration::from_secs(grace_minutes.saturating_mul(60)),
    };
    let report = if dry_run {
        rekindle::store::gc::dry_run(&opened, &policy, now).await
    } else {
        rekindle::store::gc::collect(&opened, &policy, now).await
    }
    .context("collect garbage")?;
    if json {
        let mut value = serde_json::to_value(&report)?;
        value["dry_run"] = dry_run.into();
        println!("{value}");
    } else {
        // Counts in words that agree with them ("1 run scanned", "2 runs scanned").
        let count = |n: u64, one: &str, many: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {many}")
            }
        };
        let runs = count(report.runs_scanned, "run", "runs");
        let generations = count(
            report.generations_deleted,
            "superseded generation",
            "superseded generations",
        );
        let retired = count(report.runs_retired, "finished run", "finished runs");
        let heartbeats = count(
            report.heartbeats_deleted,
            "heartbeat of a long-dead process",
            "heartbeats of long-dead processes",
        );
        let workers = count(
            report.workers_deleted,
            "registration or inbox of a dead or stopped worker",
            "registrations or inboxes of dead or stopped workers",
        );
        let in_grace = report.generations_in_grace;
        if dry_run {
            println!(
                "gc --dry-run (nothing changed): {runs} scanned, {generations} would be deleted ({in_grace} kept within the grace period), {retired} would be retired, {heartbeats} would be deleted, {workers} would be deleted"
            );
        } else {
            println!(
                "gc: {runs} scanned, {generations} deleted ({in_grace} kept within the grace period), {retired} retired (tombstone, lease, claim and recovery records kept), {heartbeats} deleted, {workers} deleted"
            );
        }
    }
    if !json {
        for skipped in &report.skipped {
            eprintln!("skipped: {skipped}");
        }
    }
    Ok(())
}

pub(crate) async fn bench_store(
    store: StoreArgs,
    steps: u64,
    facts: usize,
    keep: bool,
    json: bool,
) -> anyhow::Result<()> {
    let opened = store.open(false).await.context("open the store")?;
    let nonce = opened.clock().nonce();
    let runs = [
        format!("bench-commit-{nonce}"),
        format!("bench-load-{nonce}"),
    ];
    let measured = async {
        let commit = rekindle::store::measure::commit_cost(&opened, &runs[0], steps)
            .await
            .context("measure commits")?;
        let load = rekindle::store::measure::load_cost(&opened, &runs[1], facts, 10, 5)
            .await
            .context("measure loads")?;
        anyhow::Ok((commit, load))
    }
    .await;
    // What it wrote goes, whether the measurement worked or not, unless asked to keep it.
    let mut removed = 0;
    if !keep {
        for run in &runs {
            for listed in opened.list_all(&layout::run_base(run)).await? {
                opened.delete(&listed.key).await?;
                removed += 1;
            }
        }
    }
    let (commit, load) = measured?;
    if json {
        println!(
            "{}",
            serde_json::json!({"commit": commit, "load": load, "runs": runs, "objects_removed": removed, "kept": keep})
        );
        return Ok(());
    }
    if keep {
        eprintln!("kept the measured runs {} and {}", runs[0], runs[1]);
    } else {
        eprintln!(
            "removed the {removed} objects of the measured runs {} and {}",
            runs[0], runs[1]
        );
    }
    let r = &commit.requests;
    println!("store {}", store.store);
    println!(
        "commit: {}-step run, {} commits: {:.2} requests/commit ({:.2} conditional PUTs), {} GET, {} HEAD, {} PUT, {} LIST",
        commit.steps,
        commit.commits,
        commit.requests_per_commit,
        commit.conditional_puts_per_commit,
        r.get,
        r.head,
        r.put,
        r.list
    );
    println!(
        "        {} bytes written for {} bytes of facts ({:.2}x)",
        r.bytes_written, commit.fact_bytes, commit.write_amplification
    );
    let l = &load.requests;
    println!(
        "load:   {} facts in {} generations: {} requests ({} GET, {} HEAD, {} LIST), {} bytes read, median {:.1} ms of {} loads",
        load.facts,
        load.generations,
        l.requests(),
        l.get,
        l.head,
        l.list,
        l.bytes_read,
        load.median_ms,
        load.loads
    );
    Ok(())
}
