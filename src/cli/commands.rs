//! The `rekindle` subcommands, one function each: open what the command needs, call the
//! library (which decides), print the result. Each returns an error that `main` prints as
//! one line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use rekindle::core::fact::{CallId, QuestionId, RecoveryId, RunId, SessionId};
use rekindle::core::fold;
use rekindle::core::layout;
use rekindle::core::record::{IndexEntry, Phase, RecoveryState};
use rekindle::fleet::admission::{self, Takeover};
use rekindle::fleet::liveness::{self, Watched};
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

pub(crate) async fn recover(
    store: StoreArgs,
    source: String,
    recovery_id: String,
    takeover: bool,
    wait: bool,
    force: bool,
) -> anyhow::Result<()> {
    let store = store.open_existing(false).await.context("open the store")?;
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
    let admitted =
        fleet::spawn_recovery_admitted(&store, &holder, &source, &id, force, takeover).await?;
    let record = &admitted.record;
    // Say a replay is one, rather than report it as a new admission.
    let replay = if admitted.created {
        ":"
    } else {
        " was admitted before (a replay):"
    };
    println!(
        "recovery {id} of run {source}{replay} {}, pinned to generation {}",
        record.state.describe(),
        record.source_generation
    );
    if !wait {
        return Ok(());
    }
    wait_all(&store, std::slice::from_ref(&id)).await
}

/// Waits until every recovery in `ids` finished or was dead-lettered (or parked: it then
/// waits for a person, not the fleet); fails naming the dead-lettered and parked ones. Says
/// why nothing moves when no coordinator leads, and what is stuck when nothing finished for
/// a while, instead of waiting silently.
async fn wait_all(store: &Store, ids: &[RecoveryId]) -> anyhow::Result<()> {
    if ids.is_empty() {
        println!("nothing to wait for");
        return Ok(());
    }
    // Said once, at the first recovery that waits for the fleet: not for ones already ended.
    let mut leader_checked = false;
    let mut dead = Vec::new();
    let mut parked = Vec::new();
    let mut since_progress = rekindle::clock::Stopwatch::start();
    let mut reported = Vec::new();
    let mut outage = Outage::default();
    // The runs' own outcomes, by outcome: each with the recoveries that ended so.
    let mut outcomes: std::collections::BTreeMap<String, Vec<&RecoveryId>> = Default::default();
    for (done, id) in ids.iter().enumerate() {
        loop {
            let found = match recovery::read(store, id).await {
                Ok(found) => found,
                Err(error) => {
                    outage.wait_out(error.into()).await?;
                    continue;
                }
            };
            outage.answered();
            let (record, _) =
                found.with_context(|| format!("the record of recovery {id} vanished"))?;
            match record.state {
                RecoveryState::Finished => {
                    let outcome = record.result.as_ref().map_or_else(
                        || "ended without a result".to_owned(),
                        |r| r.outcome.to_string(),
                    );
                    outcomes.entry(outcome).or_default().push(id);
                    break;
                }
                RecoveryState::DeadLettered => {
                    dead.push(format!(
                        "{id} after {} failed attempts ({})",
                        record.failures,
                        record.last_error.unwrap_or_default()
                    ));
                    break;
                }
                RecoveryState::Parked => {
                    parked.push(format!(
                        "{id} (`rekindle runs show {}` says what it asks; answer with `rekindle answer`)",
                        record.source_run
                    ));
                    break;
                }
                RecoveryState::Admitted | RecoveryState::Running => {
                    if !leader_checked {
                        leader_checked = true;
                        if !fleet::overview::coordinator_leading(store).await? {
                            println!(
                                "no coordinator is running: the recoveries wait until one starts (rekindle-coordinator)"
                            );
                        }
                    }
                    if since_progress.elapsed() > STALL_REPORT {
                        since_progress = rekindle::clock::Stopwatch::start();
                        let stuck = match fleet::overview::stuck_among(store, &ids[done..]).await {
                            Ok(stuck) => stuck,
                            Err(error) => {
                                outage.wait_out(error).await?;
                                continue;
                            }
                        };
                        if stuck != reported {
                            println!(
                                "{} of {} recoveries not done yet",
                                ids.len() - done,
                                ids.len()
                            );
                            for line in &stuck {
                                println!("  {line}");
                            }
                            reported = stuck;
                        }
                    }
                    rekindle::clock::sleep(Duration::from_millis(500)).await
                }
            }
        }
        since_progress = rekindle::clock::Stopwatch::start();
    }
    let all_finished = dead.is_empty() && parked.is_empty();
    // One recovery that finished: its outcome and message. Read again only to print them: a
    // store that stopped answering by now does not turn a finished wait into a failed one.
    if all_finished
        && let [id] = ids
        && let Ok(Some((record, _))) = recovery::read(store, id).await
        && let Some(result) = record.result
    {
        println!("recovery {id}: {} ({})", result.outcome, result.message);
        return Ok(());
    }
    let finished: usize = outcomes.values().map(Vec::len).sum();
    if finished > 0 {
        println!(
            "{} finished: {}",
            recoveries(finished),
            by_outcome(&outcomes)
        );
    }
    if all_finished {
        return Ok(());
    }
    let mut problems = Vec::new();
    if !dead.is_empty() {
        let were = if dead.len() == 1 { "was" } else { "were" };
        problems.push(format!(
            "{} {were} dead-lettered: {}",
            recoveries(dead.len()),
            dead.join(", ")
        ));
    }
    if !parked.is_empty() {
        let are = if parked.len() == 1 { "is" } else { "are" };
        problems.push(format!(
            "{} {are} parked, waiting for a person's answer: {}",
            recoveries(parked.len()),
            parked.join(", ")
        ));
    }
    bail!("{}", problems.join("; "))
}

/// How many recoveries' runs ended with each outcome, naming those that did not complete (up
/// to ten each): "3 completed, 1 failed (recovery-of-b)".
fn by_outcome(outcomes: &std::collections::BTreeMap<String, Vec<&RecoveryId>>) -> String {
    const NAMED: usize = 10;
    let completed = rekindle::core::fact::Outcome::Completed.to_string();
    let mut parts = Vec::new();
    if let Some(ids) = outcomes.get(&completed) {
        parts.push(format!("{} {completed}", ids.len()));
    }
    for (outcome, ids) in outcomes
        .iter()
        .filter(|(outcome, _)| **outcome != completed)
    {
        let mut named: Vec<String> = ids.iter().take(NAMED).map(|id| id.to_string()).collect();
        if ids.len() > NAMED {
            named.push(format!("and {} more", ids.len() - NAMED));
        }
        parts.push(format!("{} {outcome} ({})", ids.len(), named.join(", ")));
    }
    parts.join(", ")
}

/// A store that stops answering while `--wait` waits: the recoveries go on without this
/// command, so it says so once and keeps asking, for up to `OUTAGE_PATIENCE`, rather than give
/// up on the first request whose retries ran out. Any other error ends the wait.
#[derive(Default)]
struct Outage {
    since: Option<rekindle::clock::Stopwatch>,
}

/// How long `--wait` waits through a store that does not answer.
const OUTAGE_PATIENCE: Duration = Duration::from_secs(300);

impl Outage {
    async fn wait_out(&mut self, error: rekindle::Error) -> anyhow::Result<()> {
        if error.kind() != rekindle::ErrorKind::Unavailable {
            return Err(error.into());
        }
        let since = self.since.get_or_insert_with(|| {
            println!(
                "the store does not answer ({error}); still waiting, for up to {} s",
                OUTAGE_PATIENCE.as_secs()
            );
            rekindle::clock::Stopwatch::start()
        });
        if since.elapsed() > OUTAGE_PATIENCE {
            return Err(anyhow::Error::from(error).context(format!(
                "stopped waiting: the store did not answer for {} s",
                OUTAGE_PATIENCE.as_secs()
            )));
        }
        rekindle::clock::sleep(Duration::from_secs(1)).await;
        Ok(())
    }

    fn answered(&mut self) {
        if self.since.take().is_some() {
            println!("the store answers again; still waiting");
        }
    }
}

/// "1 recovery", "2 recoveries".
fn recoveries(n: usize) -> String {
    match n {
        1 => "1 recovery".into(),
        n => format!("{n} recoveries"),
    }
}

/// Why `recover --all` found nothing to continue, in its own words (the errors themselves
/// address someone who typed the run ID).
fn nothing_to_continue_why(error: &rekindle::Error) -> &'static str {
    match error {
        rekindle::Error::Recovery(recovery::RecoveryError::NeverStarted { .. }) => {
            "its host stopped before its first commit (that slot is fenced now)"
        }
        rekindle::Error::Recovery(recovery::RecoveryError::NoSuchRun { .. }) => {
            "its index entry names no run in this store (no lease, no generation)"
        }
        _ => "the run was retired or removed",
    }
}

/// How long `--wait` waits with nothing finishing before it says what is stuck.
const STALL_REPORT: Duration = Duration::from_secs(15);

pub(crate) async fn recover_all(
    store: StoreArgs,
    takeover: bool,
    wait: bool,
    force: bool,
) -> anyhow::Result<()> {
    let store = store.open_existing(false).await.context("open the store")?;
    let (entries, bad) = IndexScan::default().scan(&store).await?;
    for bad in bad {
        eprintln!("skipped {}: {}", bad.key, bad.error);
    }
    let judged = if takeover {
        // The operator's word: no holder is looked at.
        liveness::Watch::take_over(entries)
    } else {
        let watch = liveness::Watch::begin(&store, entries).await?;
        let duration = watch.duration();
        if !duration.is_zero() {
            println!(
                "watching {} for {:.1} s (one lease TTL)",
                render::plural(watch.runs() as u64, "running run"),
                duration.as_secs_f64()
            );
        }
        watch.finish(&store).await?
    };
    let holder = Holder::new(&store, shared::default_id("cli"), CLI_TTL);
    let count = |what: Watched| judged.iter().filter(|(_, found)| *found == what).count();
    let (alive, moved_on) = (count(Watched::Alive), count(Watched::MovedOn));
    // Admissions go side by side; the coordinator is woken after each, so the first
    // recoveries run while the rest are still being admitted.
    let waker = rekindle::fleet::wake::CoordinatorWaker::new(&store);
    let admitting = futures::stream::iter(
        judged
            .into_iter()
            .filter(|(_, found)| *found == Watched::Interrupted),
    )
    .map(|(entry, _)| {
        let (store, holder, waker) = (&store, &holder, &waker);
        async move {
            // It wakes the coordinator, naming the recovery, as soon as the record exists.
            let admitted =
                fleet::recover_interrupted(store, holder, &entry.run_id, force, waker).await;
            let admitted = match admitted {
                Ok(record) => {
                    println!(
                        "recovery {} of run {}: pinned to generation {}",
                        record.recovery_id, entry.run_id, record.source_generation
                    );
                    Ok(Some(record.recovery_id))
                }
                // Its host committed the end and died before leaving the index (which the
                // library has now cleared): nothing was lost and nothing is to be done.
                Err(rekindle::Error::Recovery(recovery::RecoveryError::NothingToRecover {
                    outcome, ..
                })) => {
                    println!(
                        "run {}: had already ended ({outcome}) when its host stopped; nothing to recover",
                        entry.run_id
                    );
                    Ok(None)
                }
                // Its host died before its first commit (or the run is gone): nothing a
                // recovery could continue; its stale entry has left the index.
                Err(gone) if admission::nothing_to_continue(&gone) => {
                    println!(
                        "run {}: {}; nothing to recover, removed from the index",
                        entry.run_id,
                        nothing_to_continue_why(&gone)
                    );
                    Ok(None)
                }
                Err(error) => Err(anyhow::Error::from(error)),
            };
            (entry.run_id, admitted)
        }
    })
    .buffer_unordered(ADMISSION_CONCURRENCY)
    .collect::<Vec<(RunId, anyhow::Result<Option<RecoveryId>>)>>();
    // The coordinator's address is looked up while the first admissions run.
    let ((), outcomes) = futures::join!(waker.prepare(), admitting);
    let mut admitted = Vec::new();
    let mut failed = 0;
    for (run, outcome) in outcomes {
        match outcome {
            Ok(Some(id)) => admitted.push(id),
            Ok(None) => {}
            Err(error) => {
                eprintln!("run {run}: {error:#}");
                failed += 1;
            }
        }
    }
    println!(
        "{} admitted",
        render::plural(admitted.len() as u64, "interrupted run")
    );
    if alive > 0 {
        println!(
            "{} left alone: their holders heartbeat (--takeover takes them over now)",
            render::plural(alive as u64, "run")
        );
    }
    if moved_on > 0 {
        println!(
            "{} moved on while watched (a coordinator admitted its recovery, or its host parked or ended it): left alone",
            render::plural(moved_on as u64, "run")
        );
    }
    if wait {
        // Recoveries admitted otherwise (by the coordinator, even while this command watched,
        // or by an earlier `recover --all`) and not done, parked ones included: `--wait`
        // waits for them too. The index is read again for them.
        let (entries, _) = IndexScan::default().scan(&store).await?;
        let mut ids = admitted.clone();
        let earlier: Vec<RecoveryId> = entries
            .into_iter()
            .filter(|entry| matches!(entry.phase, Phase::Recovering | Phase::Parked))
            .filter_map(|entry| entry.recovery_id)
            .filter(|id| !ids.contains(id))
            .collect();
        if !earlier.is_empty() {
            println!(
                "waiting also for {} admitted otherwise",
                recoveries(earlier.len())
            );
            ids.extend(earlier);
        }
        wait_all(&store, &ids).await?;
    }
    if failed > 0 {
        anyhow::bail!("{failed} interrupted runs could not be admitted (each is named above)");
    }
    Ok(())
}

/// A run's state as `runs ls` shows it.
/// What `runs ls` lists.
pub(crate) struct Listing {
    pub state: Option<String>,
    pub all: bool,
    pub after: Option<String>,
    pub limit: usize,
}

/// The `--state`s of runs that left the index: only `--all` lists them.
const LEFT_THE_INDEX: [&str; 8] = [
    "completed",
    "failed",
    "cancelled",
    "budget",
    "step_cap",
    "dead_lettered",
    "retired",
    "unfinished",
];

pub(crate) async fn runs_ls(store: StoreArgs, listing: Listing, json: bool) -> anyhow::Result<()> {
    if let Some(state) = &listing.state
        && !listing.all
        && LEFT_THE_INDEX.contains(&state.as_str())
    {
        // Without --all only the index is read, and it never holds such a run.
        bail!("--state {state}: runs in that state have left the index; add --all to list them");
    }
    let store = store.open_existing(true).await.context("open the store")?;
    let now = store.clock().wall_ms();
    let (entries, bad) = IndexScan::default().scan(&store).await?;
    // By run ID: the order does not depend on the bucket's sharding, and pages follow it.
    let mut rows: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
    for entry in entries {
        let recovery = entry.recovery_id.clone();
        let info = rekindle::fleet::overview::run_info(&store, entry, now).await?;
        rows.insert(
            info.run.to_string(),
            serde_json::json!({
                "run": info.run,
                "state": info.state.describe(),
                "recovery": recovery,
                "updated_at_ms": info.updated_at_ms,
            }),
        );
    }
    for listed in store.list_all(layout::recoveries_prefix()).await? {
        // Read by its key: an encoded ID (`bad/id`) is not its key's last segment.
        if let Ok(Some((record, _))) = recovery::read_listed(&store, &listed.key).await
            && let Some(result) = &record.result
        {
            // The source's own state: a recovery continued it (and ended as `outcome`).
            rows.entry(record.source_run.to_string())
                .or_insert_with(|| {
                    serde_json::json!({
                        "run": record.source_run,
                        "state": "recovered",
                        "outcome": outcome_word(result.outcome),
                        "recovery": record.recovery_id,
                        "updated_at_ms": record.updated_at_ms,
                    })
                });
        }
    }
    let mut unlisted = Vec::new();
    if listing.all {
        for run in all_runs(&store).await? {
            if !rows.contains_key(run.as_str()) {
                unlisted.push(run);
            }
        }
    }
    let after = listing.after.as_deref().unwrap_or("");
    let mut page: Vec<(String, Option<serde_json::Value>)> = rows
        .into_iter()
        .map(|(run, row)| (run, Some(row)))
        .chain(unlisted.into_iter().map(|run| (run.to_string(), None)))
        .filter(|(run, _)| run.as_str() > after)
        .collect();
    page.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    let mut more = false;
    // States only the index (or a finished recovery's record) gives: no need to load the
    // finished runs to filter them out.
    let index_only = listing.state.as_deref().is_some_and(|state| {
        matches!(
            state,
            "running" | "suspect" | "interrupted" | "recovering" | "parked" | "dead"
        )
    });
    for (run, row) in page {
        let row = match row {
            Some(row) => row,
            None if index_only => continue,
            // Finished runs the index no longer lists: their newest generation says how. One
            // that cannot be read is listed as such; the rest still are.
            None => match done_row(&store, &RunId::new(run.clone())).await {
                Ok(row) => row,
                Err(error) => serde_json::json!({
                    "run": run,
                    "state": "unreadable",
                    "error": format!("{error:#}"),
                }),
            },
        };
        if listing
            .state
            .as_ref()
            .is_some_and(|wanted| row["state"] != wanted.as_str())
        {
            continue;
        }
        if out.len() == listing.limit {
            more = true;
            break;
        }
        out.push(row);
    }
    if json {
        println!("{}", serde_json::Value::Array(out.clone()));
        if more {
            let last = out.last().and_then(|r| r["run"].as_str()).unwrap_or("");
            eprintln!("(more: --after {last})");
        }
    } else {
        println!("{:<40} {:<12} RECOVERY", "RUN", "STATE");
        for row in &out {
            let recovery = match (row["recovery"].as_str(), row["outcome"].as_str()) {
                (Some(id), Some(outcome)) => format!("{id} ({outcome})"),
                (Some(id), None) => id.to_owned(),
                (None, _) => "-".to_owned(),
            };
            println!(
                "{:<40} {:<12} {recovery}",
                row["run"].as_str().unwrap_or_default(),
                row["state"].as_str().unwrap_or_default(),
            );
        }
        if more {
            let last = out.last().and_then(|r| r["run"].as_str()).unwrap_or("");
            println!("(more: --after {last})");
        }
        if !listing.all {
            eprintln!("(runs finished by their host are not listed; --all lists every run)");
        } else if out.iter().any(|row| row["state"] == "unfinished") {
            eprintln!(
                "(unfinished: not in the index, never ended, and no recovery continues it; `rekindle runs show RUN` says why, `rekindle recover RUN --recovery-id ID` continues one with commits)"
            );
        }
    }
    for bad in bad {
        eprintln!("skipped {}: {}", bad.key, bad.error);
    }
    Ok(())
}

fn outcome_word(outcome: rekindle::core::fact::Outcome) -> String {
    serde_json::to_value(outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "ended".into())
}

/// Every run in the store, from the lease each run has (the coordinator's own excluded).
async fn all_runs(store: &Store) -> anyhow::Result<Vec<RunId>> {
    let mut runs = Vec::new();
    for listed in store.list_all(layout::runs_prefix()).await? {
        let Some(base) = listed.key.strip_suffix("/lease") else {
            continue;
        };
        let segment = base.rsplit('/').next().unwrap_or_default();
        // A plain ID is its own key segment; an encoded one is named inside its lease.
        let run = if layout::encode_id(segment) == segment {
            RunId::new(segment)
        } else {
            let Some(object) = store.read(&listed.key).await? else {
                continue;
            };
            match layout::decode_object::<lease::Lease>(
                &listed.key,
                lease::LEASE_KIND,
                &object.bytes,
            ) {
                Ok(lease) => lease.run_id,
                Err(_) => continue,
            }
        };
        if !layout::is_coordinator_lease(run.as_str()) {
            runs.push(run);
        }
    }
    Ok(runs)
}

/// A run not in the index: how it ended, or that a recovery continued it, or that it never
/// ended (its holder stopped, and nothing recovered it).
async fn done_row(store: &Store, run: &RunId) -> anyhow::Result<serde_json::Value> {
    let recovery = recovery::claimed_by(store, run).await?;
    // A recovery run is not in the index itself (its source's entry tracks it).
    let recovering = recovery::read(store, &RecoveryId::new(run.as_str()))
        .await?
        .is_some_and(|(record, _)| !record.state.is_terminal());
    let state = match generation::load(store, run, None).await {
        Ok(loaded) => match loaded.state.terminal() {
            Some(terminal) => outcome_word(terminal.outcome),
            None if recovery.is_some() => "recovered".into(),
            None if recovering => "recovering".into(),
            None => "unfinished".into(),
        },
        Err(generation::GenerationError::Retired { .. }) => "retired".into(),
        Err(generation::GenerationError::NotFound { .. }) => "unfinished".into(),
        Err(other) => return Err(other.into()),
    };
    Ok(serde_json::json!({
        "run": run,
        "state": state,
        "recovery": recovery,
        "updated_at_ms": serde_json::Value::Null,
    }))
}

pub(crate) async fn runs_rm(store: StoreArgs, run: String, force: bool) -> anyhow::Result<()> {
    let store = store.open_existing(false).await.context("open the store")?;
    let run = RunId::new(run);
    if force && let Some(view) = lease::read_lease(&store, &run).await? {
        if !view.lease.released {
            println!(
                "run {run} is leased by '{}' at epoch {}: --force watches its heartbeat for up to {} (its TTL) and refuses if it beats; if it is gone, the run is retired",
                view.lease.holder,
                view.lease.epoch,
                render::duration_ms(view.lease.ttl_ms)
            );
        }
        println!(
            "--force: any recovery of run {run} is left as it is (an unfinished one is stranded: nothing finds it without the run's index entry)"
        );
    }
    let deleted = removal::remove(&store, &run, force).await?;
    println!(
        "run {run}: retired, {deleted} objects deleted (tombstone, lease, recovery claim and each epoch's first generation kept)"
    );
    Ok(())
}

/// `runs show` of a recovery admitted and not started yet: its record, since it has no
/// generation until a worker starts it.
fn show_unstarted_recovery(
    store: &Store,
    run: &RunId,
    of: &rekindle::core::record::RecoveryRecord,
    json: bool,
) -> anyhow::Result<()> {
    let state = format!(
        "recovering {} ({}, not started: no generation until a worker starts it)",
        of.source_run,
        of.state.describe()
    );
    if json {
        let value = serde_json::json!({
            "run": run,
            "state": state,
            "generation": serde_json::Value::Null,
            "recovery_of": of,
        });
        println!("{value}");
        return Ok(());
    }
    let now = store.clock().wall_ms();
    println!("run         {run}");
    println!("state       {state}");
    println!(
        "recovers    {} from its generation {} (admitted {} ago)",
        of.source_run,
        of.source_generation,
        render::duration_ms(now.saturating_sub(of.admitted_at_ms))
    );
    Ok(())
}

/// Why `run` has no generation, in words: never leased (a wrong ID), or leased and never
/// committed.
async fn never_committed(store: &Store, run: &RunId) -> anyhow::Result<String> {
    if layout::is_coordinator_lease(run.as_str()) {
        return Ok(format!(
            "{run} is the coordinators' leadership lease, not a run (`rekindle status` shows the leader)"
        ));
    }
    Ok(match lease::read_lease(store, run).await? {
        None => format!(
            "run {run} does not exist in this store: no generation and no lease (check the ID, and the --store)"
        ),
        Some(view) if view.lease.released => format!(
            "run {run} has no committed generation: '{}' leased it at epoch {} and released it without committing; nothing was acknowledged and there is nothing to recover",
            view.lease.holder, view.lease.epoch
        ),
        Some(view) => format!(
            "run {run} has no committed generation: '{}' leased it at epoch {} and has not made its first commit; it is still starting, or it stopped before (then nothing was acknowledged and there is nothing to recover)",
            view.lease.holder, view.lease.epoch
        ),
    })
}

pub(crate) async fn runs_show(
    store: StoreArgs,
    run: String,
    timeline: bool,
    json: bool,
) -> anyhow::Result<()> {
    let store = store.open_existing(true).await.context("open the store")?;
    let run = RunId::new(run);
    let loaded = match generation::load(&store, &run, None).await {
        Ok(loaded) => loaded,
        Err(generation::GenerationError::NotFound { .. }) => {
            // A recovery admitted and not started yet has a record and no generation.
            if let Some((of, _)) = recovery::read(&store, &RecoveryId::new(run.as_str())).await? {
                return show_unstarted_recovery(&store, &run, &of, json);
            }
            // Otherwise say which it is: a wrong ID, or a host that leased the run and has
            // not committed (or died before its first commit, so nothing was acknowledged).
            bail!("{}", never_committed(&store, &run).await?);
        }
        Err(other) => return Err(other.into()),
    };
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
    // is gone, and the run's recovery claim still names its recovery, under whatever ID.
    let recovery_id = match entry.as_ref().and_then(|e| e.recovery_id.clone()) {
        Some(id) => Some(id),
        None => recovery::claimed_by(&store, &run).await?,
    };
    let record = match &recovery_id {
        Some(id) => recovery::read(&store, id).await?.map(|(r, _)| r),
        None => None,
    };
    // A recovery run's own record (its ID is the recovery ID): the run it continues.
    let recovery_of = recovery::read(&store, &RecoveryId::new(run.as_str()))
        .await?
        .map(|(r, _)| r);
    let now = store.clock().wall_ms();
    let state = match (loaded.state.terminal(), &entry, &record) {
        (Some(terminal), _, _) => {
            format!("{} ({})", outcome_word(terminal.outcome), terminal.message)
        }
        (None, Some(entry), _) => {
            let info = rekindle::fleet::overview::run_info(&store, entry.clone(), now).await?;
            match (&info.state, &record) {
                (rekindle::fleet::overview::RunState::Recovering, Some(record)) => format!(
                    "recovering as {} ({}{})",
                    record.recovery_id,
                    record.state.describe(),
                    record
                        .assigned_to
                        .as_ref()
                        .map(|w| format!(" on {w}"))
                        .unwrap_or_default()
                ),
                (state, _) => state.describe().to_owned(),
            }
        }
        (None, None, Some(record)) => format!(
            "recovered by {} ({})",
            record.recovery_id,
            match &record.result {
                Some(result) => format!("finished: {}", outcome_word(result.outcome)),
                None => record.state.describe().to_owned(),
            }
        ),
        (None, None, None) => match &recovery_of {
            Some(of) if !of.state.is_terminal() => format!(
                "recovering {} ({}{})",
                of.source_run,
                of.state.describe(),
                of.assigned_to
                    .as_ref()
                    .map(|w| format!(" on {w}"))
                    .unwrap_or_default()
            ),
            // The first slot holds only a fence: its host stopped before its first commit.
            _ if loaded.state.meta().is_none() => "never started: its host stopped before its first commit and an admission fenced the run; nothing was acknowledged, nothing to recover".to_owned(),
            _ => "unfinished: not in the index, and no recovery continues it".to_owned(),
        },
    };
    let drawn = if timeline {
        Some(rekindle::fleet::timeline::build(&store, &run).await?)
    } else {
        None
    };
    let summary = loaded.state.summary();
    if json {
        let value = serde_json::json!({
            "run": run,
            "state": state,
            "generation": loaded.generation,
            "snapshot": loaded.base,
            "epoch": loaded.epoch,
            "lease": lease.as_ref().map(|v| serde_json::json!({
                "holder": v.lease.holder, "epoch": v.lease.epoch, "released": v.lease.released,
            })),
            "index": entry,
            "recovery": record,
            "recovery_of": recovery_of,
            "summary": summary,
            "timeline": drawn,
        });
        println!("{value}");
        return Ok(());
    }
    println!("run         {run}");
    println!("state       {state}");
    if let Some(of) = &recovery_of {
        println!(
            "recovers    {} from its generation {} (admitted {} ago)",
            of.source_run,
            of.source_generation,
            render::duration_ms(now.saturating_sub(of.admitted_at_ms))
        );
    }
    if let Some(record) = &record {
        println!(
            "recovery    {}: {}{}; {}, {} failed{}",
            record.recovery_id,
            record.state.describe(),
            record
                .assigned_to
                .as_ref()
                .map(|w| format!(" on {w}"))
                .unwrap_or_default(),
            render::plural(u64::from(record.attempts), "attempt"),
            record.failures,
            record
                .last_error
                .as_ref()
                .map(|e| format!("; last error: {e}"))
                .unwrap_or_default()
        );
    }
    println!(
        "generations {} (newest snapshot {}, epoch {})",
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
    println!(
        "facts       {} ({}, {}, {})",
        summary.facts,
        render::plural(summary.counters.model_turns, "model turn"),
        render::plural(summary.counters.tool_calls, "tool call"),
        render::plural(summary.counters.tool_results, "result")
    );
    println!("next step   {}", render::describe_step(&summary.next_step));
    let continued = record.is_some() || loaded.state.terminal().is_some();
    for pending in &summary.pending_calls {
        let note = match pending.confirmation {
            fold::Confirmation::Requested => "waiting for confirmation; it has not run",
            fold::Confirmation::Denied => "denied; it will not run",
            fold::Confirmation::NotRequested | fold::Confirmation::Approved if continued => {
                "no result here: the recovery continues the run from this point"
            }
            fold::Confirmation::NotRequested | fold::Confirmation::Approved => {
                "no result committed: it may have been in flight, and would run again on recovery"
            }
        };
        println!(
            "pending     {} {} {} ({note})",
            pending.call.id, pending.call.name, pending.call.arguments
        );
    }
    if let Some(timeline) = &drawn {
        print!("{}", render::timeline(timeline));
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

#[cfg(test)]
mod tests {
    use super::*;

    // Proves `recover --wait`'s summary counts the runs' outcomes, completed first, and names
    // the recoveries whose runs did not complete, ten at most per outcome.
    #[test]
    fn the_wait_summary_names_runs_that_did_not_complete() {
        let ids: Vec<RecoveryId> = (0..14)
            .map(|i| RecoveryId::new(format!("recovery-of-r{i:02}")))
            .collect();
        let mut outcomes: std::collections::BTreeMap<String, Vec<&RecoveryId>> = Default::default();
        outcomes.insert("completed".into(), ids[..2].iter().collect());
        outcomes.insert("failed".into(), ids[2..3].iter().collect());
        outcomes.insert("budget".into(), ids[3..].iter().collect());
        assert_eq!(
            by_outcome(&outcomes),
            "2 completed, 11 budget (recovery-of-r03, recovery-of-r04, recovery-of-r05, \
             recovery-of-r06, recovery-of-r07, recovery-of-r08, recovery-of-r09, \
             recovery-of-r10, recovery-of-r11, recovery-of-r12, and 1 more), \
             1 failed (recovery-of-r02)"
        );
        outcomes.clear();
        outcomes.insert("completed".into(), ids.iter().collect());
        assert_eq!(by_outcome(&outcomes), "14 completed");
    }
}
