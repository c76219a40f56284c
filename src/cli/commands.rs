//! The `rekindle` subcommands, one function each: open what the command needs, call the
//! library (which decides), print the result. Each returns an error that `main` prints as
//! one line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use rekindle::core::assignment::Registration;
use rekindle::core::fact::{CallId, QuestionId, RecoveryId, RunId, SessionId};
use rekindle::core::fold;
use rekindle::core::layout;
use rekindle::core::liveness::{Liveness, Sighting};
use rekindle::core::record::{IndexEntry, Phase, RecoveryState};
use rekindle::fleet::admission::{self, Takeover};
use rekindle::fleet::coordinator;
use rekindle::fleet::liveness;
use rekindle::fleet::runner::Stopped;
use rekindle::fleet::{self, Agent, Answer, Node, removal};
use rekindle::host::config::Config;
use rekindle::store::generation;
use rekindle::store::index::IndexScan;
use rekindle::store::lease::{self, Holder};
use rekindle::store::log::{self, LogDir};
use rekindle::store::recovery;
use rekindle::store::{Store, StoreUrl};

use super::render;
use super::shared::{self, StoreArgs, StoreSettingsArgs};

const CLI_TTL: Duration = Duration::from_secs(10);

/// Admissions `recover --all` runs at once: each is a chain of round trips to the store, so
/// many go side by side.
const ADMISSION_CONCURRENCY: usize = rekindle::fleet::bench::ADMISSIONS_AT_ONCE;

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
    let store = store.open(false).await.context("open the store")?;
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
            println!(
                "run {run}: parked, {}; answer it with `rekindle answer {run}`",
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

pub(crate) async fn recover(
    store: StoreArgs,
    source: String,
    recovery_id: String,
    takeover: bool,
    wait: bool,
    force: bool,
) -> anyhow::Result<()> {
    let store = store.open(false).await.context("open the store")?;
    let source = RunId::new(source);
    let id = RecoveryId::new(recovery_id);
    let takeover = if takeover {
        Takeover::Now
    } else {
        if let Some(lease) = admission::lease_to_watch(&store, &source, &id).await? {
            println!(
                "run {source} is held by '{}': watching its heartbeat for up to {:.1} s (its lease TTL) to be sure it is gone",
                lease.holder,
                lease.ttl_ms as f64 / 1000.0
            );
        }
        Takeover::IfSilent
    };
    let holder = Holder::new(&store, shared::default_id("cli"), CLI_TTL);
    let record = fleet::spawn_recovery(&store, &holder, &source, &id, force, takeover).await?;
    println!(
        "recovery {id} of run {source}: {}, pinned to generation {}",
        record.state.describe(),
        record.source_generation
    );
    if !wait {
        return Ok(());
    }
    wait_all(&store, std::slice::from_ref(&id)).await
}

/// Waits until every recovery in `ids` finished or was dead-lettered; fails naming the
/// dead-lettered ones.
async fn wait_all(store: &Store, ids: &[RecoveryId]) -> anyhow::Result<()> {
    let mut dead = Vec::new();
    for id in ids {
        loop {
            let (record, _) = recovery::read(store, id)
                .await?
                .context("a recovery record vanished")?;
            match record.state {
                RecoveryState::Finished => break,
                RecoveryState::DeadLettered => {
                    dead.push(format!(
                        "{id} after {} failed attempts ({})",
                        record.failures,
                        record.last_error.unwrap_or_default()
                    ));
                    break;
                }
                _ => rekindle::clock::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    if dead.is_empty() {
        if let [id] = ids
            && let Some((record, _)) = recovery::read(store, id).await?
            && let Some(result) = record.result
        {
            println!("recovery {id}: {} ({})", result.outcome, result.message);
        } else {
            println!("{} recoveries finished", ids.len());
        }
        Ok(())
    } else {
        bail!(
            "{} recoveries were dead-lettered: {}",
            dead.len(),
            dead.join(", ")
        )
    }
}

pub(crate) async fn recover_all(
    store: StoreArgs,
    takeover: bool,
    wait: bool,
    force: bool,
) -> anyhow::Result<()> {
    let store = store.open(false).await.context("open the store")?;
    let (entries, bad) = IndexScan::default().scan(&store).await?;
    for bad in bad {
        eprintln!("skipped {}: {}", bad.key, bad.error);
    }
    let watch = liveness::Watch::begin(&store, entries).await?;
    let judged = if takeover {
        watch.take_over()
    } else {
        let duration = watch.duration();
        if !duration.is_zero() {
            println!(
                "watching {} running runs for {:.1} s (one lease TTL)",
                watch.runs(),
                duration.as_secs_f64()
            );
        }
        watch.finish(&store).await?
    };
    let holder = Holder::new(&store, shared::default_id("cli"), CLI_TTL);
    let alive = judged
        .iter()
        .filter(|(_, judgement)| *judgement == Liveness::Running)
        .count();
    // Admissions go side by side; the coordinator is woken after each, so the first
    // recoveries run while the rest are still being admitted.
    let waker = rekindle::fleet::wake::CoordinatorWaker::new(&store);
    let outcomes: Vec<(RunId, anyhow::Result<RecoveryId>)> = futures::stream::iter(
        judged
            .into_iter()
            .filter(|(_, judgement)| *judgement != Liveness::Running),
    )
    .map(|(entry, _)| {
        let (store, holder, waker) = (&store, &holder, &waker);
        async move {
            let admitted = fleet::recover_interrupted(store, holder, &entry.run_id, force).await;
            if admitted.is_ok() {
                waker.wake().await;
            }
            let admitted = admitted.map(|record| {
                println!(
                    "recovery {} of run {}: pinned to generation {}",
                    record.recovery_id, entry.run_id, record.source_generation
                );
                record.recovery_id
            });
            (entry.run_id, admitted.map_err(anyhow::Error::from))
        }
    })
    .buffer_unordered(ADMISSION_CONCURRENCY)
    .collect()
    .await;
    let mut admitted = Vec::new();
    let mut failed = 0;
    for (run, outcome) in outcomes {
        match outcome {
            Ok(id) => admitted.push(id),
            Err(error) => {
                eprintln!("run {run}: {error:#}");
                failed += 1;
            }
        }
    }
    println!("{} interrupted runs admitted", admitted.len());
    if alive > 0 {
        println!(
            "{alive} runs left alone: their holders heartbeat (--takeover takes them over now)"
        );
    }
    if wait {
        wait_all(&store, &admitted).await?;
    }
    if failed > 0 {
        anyhow::bail!("{failed} interrupted runs could not be admitted (each is named above)");
    }
    Ok(())
}

/// A run's state as `runs ls` shows it.
async fn state_of(store: &Store, entry: &IndexEntry) -> anyhow::Result<&'static str> {
    Ok(match entry.phase {
        Phase::Parked => "parked",
        Phase::Recovering => "recovering",
        Phase::Dead => "dead",
        Phase::Running => match liveness::judge_now(store, entry).await? {
            Liveness::Running => "running",
            Liveness::Interrupted => "interrupted",
        },
    })
}

pub(crate) async fn runs_ls(
    store: StoreArgs,
    state: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let store = store.open_existing(true).await.context("open the store")?;
    let (entries, bad) = IndexScan::default().scan(&store).await?;
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for entry in &entries {
        rows.push(serde_json::json!({
            "run": entry.run_id,
            "state": state_of(&store, entry).await?,
            "recovery": entry.recovery_id,
            "updated_at_ms": entry.updated_at_ms,
        }));
    }
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(layout::recoveries_prefix(), after.as_deref(), 1000)
            .await?;
        for listed in &page {
            let id = listed.key.rsplit('/').next().unwrap_or_default();
            if let Ok(Some((record, _))) = recovery::read(&store, &RecoveryId::new(id)).await
                && let Some(result) = &record.result
            {
                let state = if result.outcome == rekindle::core::fact::Outcome::Completed {
                    "completed"
                } else {
                    "failed"
                };
                rows.push(serde_json::json!({
                    "run": record.source_run,
                    "state": state,
                    "recovery": record.recovery_id,
                    "updated_at_ms": record.updated_at_ms,
                }));
            }
        }
        let full = page.len() == 1000;
        after = page.last().map(|l| l.key.clone());
        if !full {
            break;
        }
    }
    if let Some(wanted) = &state {
        rows.retain(|row| row["state"] == wanted.as_str());
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<40} {:<12} RECOVERY", "RUN", "STATE");
        for row in &rows {
            println!(
                "{:<40} {:<12} {}",
                row["run"].as_str().unwrap_or_default(),
                row["state"].as_str().unwrap_or_default(),
                row["recovery"].as_str().unwrap_or("-")
            );
        }
    }
    for bad in bad {
        eprintln!("skipped {}: {}", bad.key, bad.error);
    }
    Ok(())
}

pub(crate) async fn runs_rm(store: StoreArgs, run: String, force: bool) -> anyhow::Result<()> {
    let store = store.open_existing(false).await.context("open the store")?;
    let run = RunId::new(run);
    let deleted = removal::remove(&store, &run, force).await?;
    println!(
        "run {run}: retired, {deleted} objects deleted (tombstone, lease, recovery claim and each epoch's first generation kept)"
    );
    Ok(())
}

pub(crate) async fn runs_show(store: StoreArgs, run: String, json: bool) -> anyhow::Result<()> {
    let store = store.open_existing(true).await.context("open the store")?;
    let run = RunId::new(run);
    let loaded = generation::load(&store, &run, None).await?;
    let lease = lease::read_lease(&store, &run).await?;
    let entry = store
        .read(&layout::index_entry(run.as_str()))
        .await?
        .and_then(|o| {
            layout::decode_object::<IndexEntry>(
                &layout::index_entry(run.as_str()),
                "index.entry",
                &o.bytes,
            )
            .ok()
        });
    // The index entry names the recovery while the run is indexed; once it is done the entry
    // is gone, and the run's recovery claim still names a recovery under a chosen ID.
    let recovery_id = match entry.as_ref().and_then(|e| e.recovery_id.clone()) {
        Some(id) => id,
        None => recovery::claimed_by(&store, &run)
            .await?
            .unwrap_or_else(|| rekindle::core::assignment::recovery_id_for(&run)),
    };
    let record = recovery::read(&store, &recovery_id).await?.map(|(r, _)| r);
    // A recovery run's own record (its ID is the recovery ID): the run it continues.
    let recovery_of = recovery::read(&store, &RecoveryId::new(run.as_str()))
        .await?
        .map(|(r, _)| r);
    let summary = loaded.state.summary();
    let value = serde_json::json!({
        "run": run,
        "generation": loaded.generation,
        "snapshot": loaded.base,
        "epoch": loaded.epoch,
        "lease": lease.as_ref().map(|v| serde_json::json!({
            "holder": v.lease.holder, "epoch": v.lease.epoch, "released": v.lease.released,
        })),
        "index": entry,
        "recovery": record,
        "recovery_of": recovery_of,
        "state": summary,
    });
    if json {
        println!("{value}");
        return Ok(());
    }
    println!("run         {run}");
    println!(
        "generations {} (snapshot {}, epoch {})",
        loaded.generation, loaded.base, loaded.epoch
    );
    match &lease {
        Some(view) => println!(
            "lease       {} at epoch {}{}",
            view.lease.holder,
            view.lease.epoch,
            if view.lease.released {
                " (released)"
            } else {
                ""
            }
        ),
        None => println!("lease       none"),
    }
    match &record {
        Some(record) => println!(
            "recovery    {} of {} from generation {}: {}{}, {} attempts, {} failed{}",
            record.recovery_id,
            record.source_run,
            record.source_generation,
            record.state.describe(),
            record
                .assigned_to
                .as_ref()
                .map(|w| format!(" on {w}"))
                .unwrap_or_default(),
            record.attempts,
            record.failures,
            record
                .last_error
                .as_ref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default()
        ),
        None => println!("recovery    none"),
    }
    if let Some(of) = &recovery_of {
        println!(
            "recovers    {} from its generation {} ({})",
            of.source_run,
            of.source_generation,
            of.state.describe()
        );
    }
    println!(
        "facts       {} ({} model turns, {} tool calls, {} results)",
        summary.facts,
        summary.counters.model_turns,
        summary.counters.tool_calls,
        summary.counters.tool_results
    );
    println!("next step   {}", render::describe_step(&summary.next_step));
    for pending in &summary.pending_calls {
        let note = match pending.confirmation {
            fold::Confirmation::Requested => "waiting for confirmation; it has not run",
            fold::Confirmation::Denied => "denied; it will not run",
            fold::Confirmation::NotRequested | fold::Confirmation::Approved => match &record {
                Some(record) if record.source_run == run => {
                    "no result committed here: the recovery continues the run from this point"
                }
                _ => {
                    "no result committed: it may have been in flight, and a recovery runs it (again)"
                }
            },
        };
        println!(
            "pending     {} {} {} ({note})",
            pending.call.id, pending.call.name, pending.call.arguments
        );
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
    let now = store.clock().wall_ms();
    let mut workers = Vec::new();
    for listed in store.list_all(layout::workers_prefix()).await? {
        let Some(object) = store.read(&listed.key).await? else {
            continue;
        };
        let Ok(registration) =
            layout::decode_object::<Registration>(&listed.key, "worker", &object.bytes)
        else {
            continue;
        };
        let alive = matches!(
            liveness::look_at(&store, &registration.heartbeat, Duration::ZERO).await?,
            Sighting::Beating { .. }
        );
        let assigned = coordinator::read_inbox(&store, &registration.worker)
            .await?
            .recoveries
            .len();
        workers.push(serde_json::json!({
            "worker": registration.worker, "alive": alive, "capacity": registration.capacity, "assigned": assigned,
        }));
    }
    let (entries, _) = IndexScan::default().scan(&store).await?;
    let mut counts = std::collections::BTreeMap::<&str, u64>::new();
    let mut oldest_interrupted_ms: Option<u64> = None;
    for entry in &entries {
        let state = state_of(&store, entry).await?;
        *counts.entry(state).or_default() += 1;
        if state == "interrupted" {
            let age = now.saturating_sub(entry.updated_at_ms);
            oldest_interrupted_ms = oldest_interrupted_ms.max(Some(age));
        }
    }
    let value = serde_json::json!({
        "workers": workers,
        "runs": counts,
        "oldest_interrupted_age_ms": oldest_interrupted_ms,
    });
    if json {
        println!("{value}");
        return Ok(());
    }
    println!("workers:");
    for worker in &workers {
        println!(
            "  {:<40} {} capacity {} assigned {}",
            worker["worker"].as_str().unwrap_or_default(),
            if worker["alive"] == true {
                "alive"
            } else {
                "silent"
            },
            worker["capacity"],
            worker["assigned"]
        );
    }
    if counts.is_empty() {
        println!("runs: none in the index (nothing running, parked or recovering)");
    } else {
        let counts: Vec<String> = counts
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect();
        println!("runs: {}", counts.join(", "));
    }
    if let Some(age) = oldest_interrupted_ms {
        println!(
            "oldest interrupted run: {:.1} s (by its last index update)",
            age as f64 / 1000.0
        );
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
    let store = store.open(false).await.context("open the store")?;
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
            "{} hosts crashed, {} worker killed; {} recovery attempts",
            summary.hosts_crashed, summary.workers_killed, summary.recovery_attempts
        );
        println!(
            "{} tool calls, {} re-executed (at most one per interruption: {} runs over that bound)",
            summary.tool_calls, summary.tool_calls_reexecuted, summary.runs_over_budget
        );
        println!(
            "{} fleet requests, {:.1} per recovery; store {}",
            summary.fleet_requests, summary.requests_per_recovery, summary.store
        );
    }
    match summary.violation() {
        Some(violation) => bail!(violation),
        None => Ok(()),
    }
}

pub(crate) async fn probe(store: StoreArgs) -> anyhow::Result<()> {
    let opened = store.open(true).await.context("open the store")?;
    opened.probe().await.context("probe the store")?;
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
    json: bool,
) -> anyhow::Result<()> {
    let opened = store.open_existing(false).await.context("open the store")?;
    let now = opened.clock().wall_ms();
    let policy = rekindle::store::gc::GcPolicy {
        retention: Duration::from_secs(retention_hours.saturating_mul(3600)),
        grace: Duration::from_secs(grace_minutes.saturating_mul(60)),
    };
    let report = rekindle::store::gc::collect(&opened, &policy, now)
        .await
        .context("collect garbage")?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "gc: {} runs scanned, {} superseded generations deleted ({} kept within the grace period), {} finished runs retired (tombstone, lease, claim and recovery records kept)",
            report.runs_scanned,
            report.generations_deleted,
            report.generations_in_grace,
            report.runs_retired
        );
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
    json: bool,
) -> anyhow::Result<()> {
    let opened = store.open(false).await.context("open the store")?;
    let nonce = opened.clock().nonce();
    let commit =
        rekindle::store::measure::commit_cost(&opened, &format!("bench-commit-{nonce}"), steps)
            .await
            .context("measure commits")?;
    let load =
        rekindle::store::measure::load_cost(&opened, &format!("bench-load-{nonce}"), facts, 10, 5)
            .await
            .context("measure loads")?;
    if json {
        println!("{}", serde_json::json!({"commit": commit, "load": load}));
        return Ok(());
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
