//! A run's timeline: its incarnations (one per lease epoch), where each was interrupted and
//! with which tool call in flight, and the recovery that continued it, so an operator sees at
//! a glance what a recovery did (`rekindle runs show RUN --timeline`).
//!
//! Built from what the bucket keeps forever: the newest generation's list of epoch starts, the
//! first generation of each epoch (gc never deletes one), the folded facts, the lease and the
//! recovery claim and record. Which process held an epoch is in the writer field of the epoch's
//! first generation (`Store::writing_as`); for generations written before it was, the newest
//! epoch's lease still names its holder.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::core::fact::{CallId, FactBody, RecoveryId, RunId, Terminal};
use crate::core::layout;
use crate::store::Store;
use crate::store::generation::{self, Chain};
use crate::store::{lease, recovery};

/// One lease epoch of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Incarnation {
    /// The epoch.
    pub epoch: u64,
    /// Its first generation.
    pub first_generation: u64,
    /// When its first generation was committed (wall-clock milliseconds).
    pub started_at_ms: u64,
    /// The facts it committed itself: `first_seq..=last_seq` (empty when first > last).
    pub first_seq: u64,
    /// See `first_seq`.
    pub last_seq: u64,
    /// Facts it started with that another run committed (a recovery run's seed).
    pub seeded: u64,
    /// Model turns it committed.
    pub model_turns: u64,
    /// Tool results it committed.
    pub tool_results: u64,
    /// The process that held it (its first generation's writer, or the newest epoch's lease).
    pub holder: Option<String>,
    /// The tool call that may have been running when the next epoch began (the first call
    /// without a result that does not wait for a human), so the next incarnation may have
    /// run it again; empty for a fence, an answer, and the newest incarnation.
    pub in_flight_at_end: Vec<(CallId, String)>,
}

/// A run's incarnations, how it ended, and the recovery that continued it.
#[derive(Clone, Debug, Serialize)]
pub struct Timeline {
    /// The run.
    pub run: RunId,
    /// Its incarnations, oldest first.
    pub incarnations: Vec<Incarnation>,
    /// Its terminal fact, once it ended.
    pub ended: Option<Terminal>,
    /// The recovery that continued it, with the recovery run's own timeline.
    pub recovered_by: Option<(RecoveryId, Box<Timeline>)>,
    /// Tool calls that may have run more than once: in flight at an interruption, with a
    /// result committed later (by a later incarnation or the recovery).
    pub ran_again: Vec<(CallId, String)>,
    /// The run was retired by gc: only its outcome is left.
    pub retired: bool,
}

/// Builds the timeline of `run`'s whole lineage: from the run it recovers (if it is a
/// recovery run, back to the first run), through every recovery that continued it. Asked
/// about any run of the lineage, it draws the same picture.
pub async fn build(store: &Store, run: &RunId) -> crate::Result<Timeline> {
    let mut root = run.clone();
    let mut seen = vec![root.clone()];
    while let Some((record, _)) = recovery::read(store, &RecoveryId::new(root.as_str())).await? {
        if seen.contains(&record.source_run) {
            break;
        }
        root = record.source_run;
        seen.push(root.clone());
    }
    let run = &root;
    let mut timeline = member(store, run).await?;
    let mut seen = vec![run.clone()];
    let mut tail = &mut timeline;
    // Follow the lineage (a recovery run may itself have been recovered), without loops.
    while let Some(next) = recovery::claimed_by(store, &tail.run).await? {
        let next_run = RunId::new(next.as_str());
        if seen.contains(&next_run) {
            break;
        }
        seen.push(next_run.clone());
        let continued = member(store, &next_run).await?;
        tail.recovered_by = Some((next, Box::new(continued)));
        tail = tail
            .recovered_by
            .as_mut()
            .map(|(_, t)| t.as_mut())
            .expect("just set");
    }
    // A call in flight at an interruption whose result a later incarnation (or a recovery)
    // committed ran at most twice.
    let mut results: Vec<&CallId> = Vec::new();
    let mut walk = Some(&timeline);
    let mut in_flight: Vec<(CallId, String)> = Vec::new();
    while let Some(t) = walk {
        for incarnation in &t.incarnations {
            in_flight.extend(incarnation.in_flight_at_end.iter().cloned());
        }
        walk = t.recovered_by.as_ref().map(|(_, t)| t.as_ref());
    }
    let loaded_results = completed_calls(store, &timeline).await?;
    results.extend(loaded_results.iter());
    in_flight.retain(|(id, _)| results.contains(&id));
    in_flight.dedup();
    timeline.ran_again = in_flight;
    Ok(timeline)
}

/// One run of the lineage: its incarnations, or what is left of it — nothing yet (a recovery
/// admitted, not started) or its outcome (retired by gc after it ended).
async fn member(store: &Store, run: &RunId) -> crate::Result<Timeline> {
    let empty = |ended: Option<Terminal>, retired: bool| Timeline {
        run: run.clone(),
        incarnations: Vec::new(),
        ended,
        recovered_by: None,
        ran_again: Vec::new(),
        retired,
    };
    match incarnations(store, run).await {
        Ok(timeline) => Ok(timeline),
        Err(crate::Error::Generation(generation::GenerationError::NotFound { .. })) => {
            Ok(empty(None, false))
        }
        Err(crate::Error::Generation(generation::GenerationError::Retired { outcome, .. })) => {
            Ok(empty(
                outcome.map(|outcome| Terminal {
                    outcome,
                    message: "retired by gc after it ended; its steps are no longer kept".into(),
                }),
                true,
            ))
        }
        Err(other) => Err(other),
    }
}

/// Calls with a committed result in the newest run of the lineage (which holds every fact of
/// those before it), excluding those the interrupted incarnations already had.
async fn completed_calls(store: &Store, timeline: &Timeline) -> crate::Result<Vec<CallId>> {
    let mut newest = timeline;
    while let Some((_, next)) = &newest.recovered_by {
        if next.incarnations.is_empty() {
            break;
        }
        newest = next;
    }
    let loaded = match generation::load(store, &newest.run, None).await {
        Ok(loaded) => loaded,
        // The newest readable run was retired meanwhile: nothing left to compare against.
        Err(generation::GenerationError::Retired { .. }) => return Ok(Vec::new()),
        Err(other) => return Err(other.into()),
    };
    Ok(loaded
        .state
        .facts()
        .iter()
        .filter_map(|fact| match &fact.body {
            FactBody::ToolResult(result) => Some(result.call_id.clone()),
            _ => None,
        })
        .collect())
}

/// One run's incarnations, from its epoch starts.
async fn incarnations(store: &Store, run: &RunId) -> crate::Result<Timeline> {
    let loaded = generation::load(store, run, None).await?;
    let chain = Chain::new(store, layout::run_base(run.as_str()));
    // Where each epoch's own facts begin: a delta's first seq; a fence or a resumed snapshot
    // carries no new facts, so after its last seq; generation 1 from seq 1 (for a recovery
    // run, its seed: facts another run committed).
    let mut starts: Vec<(u64, u64, u64, u64, bool)> = Vec::new();
    let mut writers: Vec<Option<String>> = Vec::new();
    let mut seed_last_seq = 0;
    for (epoch, first) in &loaded.epoch_starts {
        let key = chain.key(*first);
        let Some(object) = store.read(&key).await? else {
            continue;
        };
        let header = generation::decode_with(store.sealer(), &key, run, &object.bytes)?;
        if *first == 1 {
            seed_last_seq = header.last_seq;
        }
        let begins = if *first == 1 {
            1
        } else if header.snapshot {
            header.last_seq + 1
        } else {
            header.first_seq
        };
        starts.push((epoch.0, *first, header.at_ms, begins, *first == 1));
        writers.push(header.writer_holder().map(str::to_owned));
    }
    let facts = loaded.state.facts();
    let last_seq = loaded.state.last_seq().0;
    // A recovery run begins with its source's facts: its generation 1 holds exactly those.
    let is_recovery = recovery::read(store, &RecoveryId::new(run.as_str()))
        .await?
        .is_some();
    let seed = if is_recovery { seed_last_seq } else { 0 };
    let newest_holder = lease::read_lease(store, run)
        .await?
        .filter(|view| view.lease.epoch == loaded.epoch)
        .map(|view| view.lease.holder);
    // Calls of the model's turns without a result, in the order they run (one per step), and
    // those waiting for a human's confirmation, which cannot be running.
    let mut open: Vec<(CallId, String)> = Vec::new();
    let mut awaiting: BTreeSet<CallId> = BTreeSet::new();
    let mut incarnations = Vec::new();
    for (i, (epoch, first, at, begins, is_first)) in starts.iter().enumerate() {
        let ends = starts
            .get(i + 1)
            .map_or(last_seq, |next| next.3.saturating_sub(1));
        let seeded = if *is_first { seed.min(ends) } else { 0 };
        let own_from = (*begins).max(seeded + 1);
        let mut model_turns = 0;
        let mut tool_results = 0;
        for fact in facts
            .iter()
            .filter(|f| f.seq.0 >= *begins && f.seq.0 <= ends)
        {
            let own = fact.seq.0 >= own_from;
            match &fact.body {
                FactBody::ModelTurn(turn) => {
                    model_turns += u64::from(own);
                    open.extend(
                        turn.tool_calls
                            .iter()
                            .map(|c| (c.id.clone(), c.name.clone())),
                    );
                }
                FactBody::ToolResult(result) => {
                    tool_results += u64::from(own);
                    open.retain(|(id, _)| *id != result.call_id);
                    awaiting.remove(&result.call_id);
                }
                FactBody::ConfirmationRequested(asked) => {
                    awaiting.insert(asked.call_id.clone());
                }
                FactBody::ConfirmationAnswered(answer) => {
                    awaiting.remove(&answer.call_id);
                }
                _ => {}
            }
        }
        // Only an incarnation that drove the run (committed a turn or a result of its own)
        // and was followed by another can have been cut short while running a call: the
        // next call, unless it waits for a human. A fence or an answer runs no tool.
        let drove = model_turns + tool_results > 0;
        let followed = i + 1 < starts.len();
        let in_flight_at_end = if drove && followed {
            open.iter()
                .find(|(id, _)| !awaiting.contains(id))
                .cloned()
                .into_iter()
                .collect()
        } else {
            Vec::new()
        };
        incarnations.push(Incarnation {
            epoch: *epoch,
            first_generation: *first,
            started_at_ms: *at,
            first_seq: own_from,
            last_seq: ends,
            seeded,
            model_turns,
            tool_results,
            // The epoch's first generation names its writer (newer builds); else, for the
            // newest epoch, its lease does.
            holder: writers[i].clone().or_else(|| {
                if followed {
                    None
                } else {
                    newest_holder.clone()
                }
            }),
            in_flight_at_end,
        });
    }
    Ok(Timeline {
        run: run.clone(),
        incarnations,
        ended: loaded.state.terminal().cloned(),
        recovered_by: None,
        ran_again: Vec::new(),
        retired: false,
    })
}
