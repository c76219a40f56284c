//! The `rekindle` subcommands that talk to a store. Each prints its result and returns an
//! error that `main` prints as one line.

use rekindle::core::record::{IndexEntry, Phase, RecoveryState};
use rekindle::fleet::admission::Takeover;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use rekindle::cli::{self, StoreArgs};
use rekindle::core::fact::{CallId, QuestionId, RecoveryId, RunId, SessionId};
use rekindle::core::fold;
use rekindle::core::layout;

use rekindle::core::assignment::Registration;
use rekindle::fleet::coordinator;
use rekindle::fleet::runner::Stopped;
use rekindle::fleet::{self, Agent, Answer, Node};
use rekindle::host::config::Config;
use rekindle::store::Store;
use rekindle::store::generation;
use rekindle::store::index::{self, IndexScan};
use rekindle::store::lease::{self, Holder};
use rekindle::store::log::LogDir;
use rekindle::store::recovery::{self};

const CLI_TTL: Duration = Duration::from_secs(10);

pub(crate) async fn run(
    store: StoreArgs,
    config: PathBuf,
    run_id: String,
    session_id: Option<String>,
    state_dir: Option<PathBuf>,
    lease_ttl_ms: u64,
    prompt: String,
) -> anyhow::Result<()> {
    let stop = cli::stop_on_signals();
    let config = Config::load(&config).context("load the configuration")?;
    let agent = Agent::from_config(config).context("set up the model")?;
    let store = store.open(false).await.context("open the store")?;
    let logs = LogDir::open(cli::state_dir(state_dir)?).context("open the state directory")?;
    let holder = Holder::new(
        &store,
        cli::default_id("host"),
        Duration::from_millis(lease_ttl_ms),
    );
    holder.beat().await.context("write the heartbeat")?;
    let beating_stop = Arc::new(AtomicBool::new(false));
    let beating = holder.spawn_heartbeat(Arc::clone(&beating_stop));
    let node = Node {
        store: store.clone(),
        agent,
        logs,
        holder: Arc::clone(&holder),
        stop,
    };
    let run = RunId::new(run_id);
    let result = node
        .start_run(&run, session_id.map(SessionId::new), &prompt)
        .await;
    beating_stop.store(true, Ordering::SeqCst);
    let _ = beating.await;
    // A stopped host's heartbeat disappears, so the fleet resumes its run at once.
    let _ = holder.retire().await;
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
                crate::describe_parked(&parked)
            )
        }
        Stopped::WaitingForInput => println!("run {run}: waiting for input"),
        Stopped::StepCap | Stopped::StopRequested => {
            println!("run {run}: stopped after committing its last step; the fleet will resume it")
        }
    }
    Ok(())
}

async fn admit(
    store: &Store,
    source: &RunId,
    recovery_id: &RecoveryId,
    force: bool,
    takeover: Takeover,
) -> anyhow::Result<rekindle::core::record::RecoveryRecord> {
    let holder = Holder::new(store, cli::default_id("cli"), CLI_TTL);
    Ok(fleet::spawn_recovery(store, &holder, source, recovery_id, force, takeover).await?)
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
        if let Some(view) = lease::read_lease(&store, &source).await?
            && !view.lease.released
            && recovery::read(&store, &id).await?.is_none()
        {
            println!(
                "run {source} is held by '{}': watching its heartbeat for up to {:.1} s (its lease TTL) to be sure it is gone",
                view.lease.holder,
                view.lease.ttl_ms as f64 / 1000.0
            );
        }
        Takeover::IfSilent
    };
    let record = admit(&store, &source, &id, force, takeover).await?;
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
    let running: Vec<IndexEntry> = entries
        .into_iter()
        .filter(|e| e.phase == Phase::Running)
        .collect();
    // Interrupted: no heartbeat, or (unless taking over) a heartbeat that does not change
    // for a whole TTL, observed on this machine's clock.
    let mut first = Vec::new();
    for entry in &running {
        let beat = match &entry.holder {
            Some(key) => lease::read_heartbeat(&store, key).await?,
            None => None,
        };
        first.push(beat);
    }
    let ttl = first
        .iter()
        .flatten()
        .map(|(beat, _)| Duration::from_millis(beat.ttl_ms))
        .max()
        .unwrap_or_default();
    if !takeover && !ttl.is_zero() {
        println!(
            "watching {} running runs for {:.1} s (one lease TTL)",
            running.len(),
            ttl.as_secs_f64()
        );
        rekindle::clock::sleep(ttl).await;
    }
    let mut admitted = Vec::new();
    let mut alive = 0;
    for (entry, before) in running.iter().zip(first) {
        let interrupted = match (&before, &entry.holder) {
            _ if takeover => true,
            (None, _) | (_, None) => true,
            (Some((_, etag)), Some(key)) => {
                lease::read_heartbeat(&store, key)
                    .await?
                    .map(|(_, now)| now)
                    == Some(etag.clone())
            }
        };
        if !interrupted {
            alive += 1;
            continue;
        }
        let id = rekindle::core::assignment::recovery_id_for(&entry.run_id);
        // Judged silent above (or taken over on the operator's word): fence now.
        match admit(&store, &entry.run_id, &id, force, Takeover::Now).await {
            Ok(record) => {
                println!(
                    "recovery {id} of run {}: pinned to generation {}",
                    entry.run_id, record.source_generation
                );
                admitted.push(id);
            }
            Err(error) => eprintln!("run {}: {error:#}", entry.run_id),
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
    Ok(())
}

/// A run's state as `runs ls` shows it.
async fn state_of(store: &Store, entry: &IndexEntry) -> anyhow::Result<&'static str> {
    Ok(match entry.phase {
        Phase::Parked => "parked",
        Phase::Recovering => "recovering",
        Phase::Dead => "dead",
        Phase::Running => match &entry.holder {
            Some(key) if store.head(key).await?.is_some() => "running",
            _ => "interrupted",
        },
    })
}

pub(crate) async fn runs_ls(
    store: StoreArgs,
    state: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let store = store.open(true).await.context("open the store")?;
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
    let store = store.open(false).await.context("open the store")?;
    let run = RunId::new(run);
    let lease = lease::read_lease(&store, &run).await?;
    // Every run that ever started took a lease first, and retirement keeps it: without
    // one, the ID is a typo, and a tombstone would reserve it for nothing.
    let Some(view) = lease else {
        bail!("run \"{run}\" does not exist (it has no lease); nothing to retire");
    };
    if !view.lease.released && !force {
        bail!(
            "run \"{run}\" is leased by '{}' at epoch {}; stop it first (or --force if that holder is gone)",
            view.lease.holder,
            view.lease.epoch
        );
    }
    // A recovery continuing this run is found by the coordinator through the run's index
    // entry, which retiring removes: its record would stay non-terminal forever.
    if let Some(recovery) = rekindle::store::recovery::claimed_by(&store, &run).await?
        && !force
    {
        let state = rekindle::store::recovery::read(&store, &recovery)
            .await?
            .map(|(record, _)| record.state);
        if !state.is_some_and(|state| state.is_terminal()) {
            bail!(
                "run \"{run}\" is being recovered as '{recovery}' ({}); let the recovery end first (or --force to strand it)",
                state.map_or("admission not finished", |state| state.describe())
            );
        }
    }
    // "Retire now": the same retirement gc does after the retention period, so the run keeps
    // its lease, claim, epochs' first slots and a tombstone and cannot come back to life.
    let deleted =
        rekindle::store::gc::retire(&store, &run, rekindle::store::tombstone::RetiredBy::Removal)
            .await
            // gc's errors name the run or its object; the context does not repeat it.
            .context("retire the run")?;
    index::remove(&store, &run).await?;
    println!(
        "run {run}: retired, {deleted} objects deleted (tombstone, lease, recovery claim and each epoch's first generation kept)"
    );
    Ok(())
}

pub(crate) async fn runs_show(store: StoreArgs, run: String, json: bool) -> anyhow::Result<()> {
    let store = store.open(true).await.context("open the store")?;
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
    println!("next step   {}", crate::describe_step(&summary.next_step));
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
    let store = store.open(false).await.context("open the store")?;
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
    let holder = Holder::new(&store, cli::default_id("cli"), CLI_TTL);
    // The answer is committed under the run's lease: beat while holding it, or anyone who
    // looks (`rekindle recover` without --takeover) takes a holder with no heartbeat for
    // gone and fences the answer.
    holder.beat().await.context("write the heartbeat")?;
    let beating_stop = Arc::new(AtomicBool::new(false));
    let beating = holder.spawn_heartbeat(Arc::clone(&beating_stop));
    let answered = fleet::answer_run(&store, &holder, &source, answer).await;
    beating_stop.store(true, Ordering::SeqCst);
    let _ = beating.await;
    let _ = holder.retire().await;
    answered?;
    println!("run {source}: answered; the fleet resumes it");
    Ok(())
}

pub(crate) async fn status(store: StoreArgs, json: bool) -> anyhow::Result<()> {
    let store = store.open(true).await.context("open the store")?;
    let now = store.clock().wall_ms();
    let mut workers = Vec::new();
    for listed in store.list(layout::workers_prefix(), None, 10_000).await? {
        let Some(object) = store.read(&listed.key).await? else {
            continue;
        };
        let Ok(registration) =
            layout::decode_object::<Registration>(&listed.key, "worker", &object.bytes)
        else {
            continue;
        };
        let alive = store.head(&registration.heartbeat).await?.is_some();
        let assigned = coordinator::read_inbox(&store, &registration.worker)
            .await?
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
