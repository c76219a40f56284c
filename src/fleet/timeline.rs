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
        // Only an incarnation that drove the run and was followed by another can have been
        // cut short while running a call: the next call, unless it waits for a human. One
        // drove if it committed a turn or a result of its own. So did a recovery run's
        // attempt that committed nothing of its own (its seed, or its resume's fence): a
        // worker drives the run as soon as it holds it, and may have started the call before
        // it died. An admission's fence or an answer runs no tool.
        let committed_own = facts.iter().any(|f| f.seq.0 >= own_from && f.seq.0 <= ends);
        let drove = model_turns + tool_results > 0 || (is_recovery && !committed_own);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::epoch::Epoch;
    use crate::core::fact::{Fact, Seq, ToolResult};
    use crate::core::sample::Builder;
    use crate::fleet::admission::{self, Takeover};
    use crate::store::generation::{RunWriter, SnapshotPolicy};
    use crate::store::lease::Holder;
    use std::time::Duration;

    // Proves a recovery attempt that died before its first commit of its own is drawn as an
    // interruption with the source's in-flight call running: the worker drove the run as
    // soon as it held it. The call was in flight at two interruptions (the host's and that
    // attempt's), so it may have run three times.
    #[tokio::test]
    async fn an_attempt_that_died_before_its_first_commit_was_interrupted() {
        let store = Store::memory(crate::clock::SystemClock::shared());
        let source = RunId::new("src");
        let host = Holder::new(&store, "host", Duration::from_secs(30));
        host.acquire(&source).await.unwrap();
        // The host committed a model turn calling one tool, and died running it.
        let mut builder = Builder::new("src");
        builder.step(&mut |n| if n == 20 { 5 } else { 0 }, true);
        let facts = builder.into_facts();
        let call = match &facts.last().unwrap().body {
            FactBody::ModelTurn(turn) => turn.tool_calls[0].id.clone(),
            other => panic!("expected a model turn, got {other:?}"),
        };
        RunWriter::create(&store, facts, Epoch(1), SnapshotPolicy::default())
            .await
            .unwrap();
        let operator = Holder::new(&store, "operator", Duration::from_secs(30));
        let recovery = RecoveryId::new("rec");
        let record = admission::admit(&store, &operator, &source, &recovery, false, Takeover::Now)
            .await
            .unwrap()
            .record;
        let run = RunId::new("rec");
        let seed = generation::load(&store, &source, None).await.unwrap();
        let first = record.source_epoch.next();
        // Attempt 1 seeds the recovery run, then dies before committing anything of its own.
        RunWriter::create_as(
            &store,
            run.clone(),
            seed.state.into_facts(),
            first,
            SnapshotPolicy::default(),
        )
        .await
        .unwrap();
        // Attempt 2 resumes it and commits the call's result.
        let mut writer = RunWriter::resume(&store, &run, first.next(), SnapshotPolicy::default())
            .await
            .unwrap();
        let last = writer.state().facts().last().unwrap().clone();
        writer
            .commit(vec![Fact {
                seq: Seq(last.seq.0 + 1),
                at_ms: last.at_ms + 1,
                body: FactBody::ToolResult(ToolResult {
                    call_id: call.clone(),
                    output: "ok".into(),
                    is_error: false,
                    duration_ms: 1,
                }),
            }])
            .await
            .unwrap();

        let timeline = build(&store, &source).await.unwrap();
        let (_, recovered) = timeline.recovered_by.as_ref().unwrap();
        let attempts = &recovered.incarnations;
        assert_eq!(attempts.len(), 2, "{attempts:?}");
        assert_eq!(
            attempts[0]
                .in_flight_at_end
                .iter()
                .map(|(id, _)| id)
                .collect::<Vec<_>>(),
            vec![&call],
            "the attempt that died after its seed had the call running"
        );
        assert!(attempts[1].in_flight_at_end.is_empty());
        assert_eq!(
            timeline
                .ran_again
                .iter()
                .map(|(id, _)| id)
                .collect::<Vec<_>>(),
            vec![&call]
        );
    }
}
