//! `rekindle recover`: one run, or every interrupted run after an outage (`--all`), and the
//! wait for their outcomes.

use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use rekindle::core::fact::{RecoveryId, RunId};
use rekindle::core::record::{Phase, RecoveryState};
use rekindle::fleet;
use rekindle::fleet::admission::{self, Takeover};
use rekindle::fleet::liveness::{self, Watched};
use rekindle::store::Store;
use rekindle::store::index::IndexScan;
use rekindle::store::lease::Holder;
use rekindle::store::recovery;

use super::commands::CLI_TTL;
use super::render;
use super::shared::{self, StoreArgs};

/// Admissions `recover --all` runs at once: each is a chain of round trips to the store, so
/// many go side by side.
const ADMISSION_CONCURRENCY: usize = rekindle::fleet::bench::ADMISSIONS_AT_ONCE;

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
