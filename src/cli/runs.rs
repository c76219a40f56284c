//! `rekindle runs`: `ls` (every run not yet done, and with `--all` the done ones), `show` (one
//! run's chain, recovery and timeline) and `rm` (retiring a run).

use anyhow::{Context, bail};
use rekindle::core::fact::{RecoveryId, RunId};
use rekindle::core::fold;
use rekindle::core::layout;
use rekindle::core::record::IndexEntry;
use rekindle::fleet::removal;
use rekindle::store::Store;
use rekindle::store::generation;
use rekindle::store::index::IndexScan;
use rekindle::store::lease;
use rekindle::store::recovery;

use super::render;
use super::shared::StoreArgs;

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
