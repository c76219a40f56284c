//! Answering a parked run: the answer committed as a fact by the run's own writer (its host, or
//! a short-lived holder), and the index entry that makes the coordinator continue it.
//!
//! It never decides where the run continues.

use super::*;
use crate::fleet::node::MIN_POLL;

/// Answers a parked run as a short-lived process does (`rekindle answer`): [`answer_run`]
/// while `holder` beats, so nobody who looks meanwhile takes a holder without a heartbeat for
/// gone and fences the answer; the heartbeat is removed afterwards.
pub async fn answer(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    answer: Answer,
) -> Result<()> {
    holder
        .while_beating(answer_run(store, holder, source, answer))
        .await?
}

/// Answers a parked run by its source run ID: commits the answer on the run that holds the
/// newest state (its recovery's run, if it has one), then lets the fleet continue it (for a
/// recovery, the lifecycle's `Answer` event; for a host's own run, an entry with no holder,
/// which the coordinator admits). Safe to repeat after a crash between those writes: an
/// answer already committed is not committed again, the transition is finished.
pub async fn answer_run(
    store: &Store,
    holder: &Arc<Holder>,
    source: &RunId,
    answer: Answer,
) -> Result<()> {
    let not_waiting = || FleetError::NotWaiting {
        run: source.clone(),
        what: answer.describe(),
        now: String::new(),
    };
    let Some(entry) = index::read(store, source).await? else {
        // Not in the index: ended, retired, or never existed (every run that started took a
        // lease, and retirement keeps it, reserved).
        let now = match crate::store::lease::read_lease(store, source).await? {
            None => {
                return Err(FleetError::NoSuchRun {
                    run: source.clone(),
                    what: answer.describe(),
                }
                .into());
            }
            Some(view) if view.lease.retired => ": it was retired (rekindle runs rm, or gc)",
            Some(_) => ": it is not running, parked or recovering",
        };
        return Err(FleetError::NotWaiting {
            run: source.clone(),
            what: answer.describe(),
            now: now.into(),
        }
        .into());
    };
    match &entry.recovery_id {
        Some(id) => {
            let (record, etag) = recovery::read(store, id).await?.ok_or_else(not_waiting)?;
            if record.state != RecoveryState::Parked {
                return Err(not_waiting().into());
            }
            commit_answer(store, holder, &RunId::new(id.as_str()), &answer, false).await?;
            match lifecycle::transition(store, id, Some((record, etag)), Event::Answer).await {
                Ok(_) => {}
                // The coordinator saw the committed answer first and continued the recovery.
                Err(LifecycleError::Refused(refused))
                    if refused.state != RecoveryState::Parked && !refused.state.is_terminal() => {}
                Err(other) => return Err(other.into()),
            }
            // Admitted again: the coordinator assigns it now, not at its next scan.
            wake::wake_coordinator_naming(store, std::slice::from_ref(id)).await;
        }
        None => {
            if entry.phase != Phase::Parked {
                return Err(not_waiting().into());
            }
            match commit_answer(store, holder, source, &answer, true).await {
                Ok(()) => {}
                Err(Error::Fleet(FleetError::BeingRecovered { run, recovery })) => {
                    // An admission claimed the run. If it crashed before its record or its
                    // index entry (a paused host may even have written its own entry over
                    // it), finish it, so the run does not wait on a claim nobody completes:
                    // admitting the claimed ID again is idempotent and re-indexes the run.
                    // The recovery parks where the run did; answer that.
                    admission::admit(store, holder, &run, &recovery, false, Takeover::Now).await?;
                    return Err(FleetError::BeingRecovered { run, recovery }.into());
                }
                Err(other) => return Err(other),
            }
            lifecycle::host_answered(store, &entry).await?;
            // The run now waits for the fleet to continue it: tell the coordinator.
            wake::wake_coordinator(store).await;
        }
    }
    Ok(())
}

/// Commits a human's answer to parked run `run`, taking its lease briefly (waiting out a
/// holder that died before releasing it). A run that is no longer parked (and has not ended)
/// was answered before a crash: nothing more to commit. With `unless_claimed`, a run that a
/// recovery has claimed meanwhile is refused: its recovery continues it, and is what to
/// answer once it parks.
pub(crate) async fn commit_answer(
    store: &Store,
    holder: &Arc<Holder>,
    run: &RunId,
    answer: &Answer,
    unless_claimed: bool,
) -> Result<()> {
    // Checked before anything is written: a wrong call ID, an ended run or a run that is not
    // parked is refused without taking the lease (which would fence the run).
    let loaded = generation::load(store, run, None).await?;
    if answer_fact(run, &loaded.state, answer)?.is_none() {
        tracing::info!(run_id = %run, "already answered; finishing the hand-back");
        return Ok(());
    }
    let ttl = crate::store::lease::read_lease(store, run)
        .await?
        .map_or(holder.ttl(), |view| {
            std::time::Duration::from_millis(view.lease.ttl_ms)
        });
    let held = holder
        .acquire_or_wait(run, (ttl / 6).max(MIN_POLL), ttl * 2 + ttl / 2)
        .await?;
    // Checked after taking the lease: an admission claims before it fences, so either the
    // claim is visible now or the admission's fence comes after anything committed here.
    if unless_claimed && let Some(recovery) = recovery::claimed_by(store, run).await? {
        holder.release(&held).await?;
        return Err(FleetError::BeingRecovered {
            run: run.clone(),
            recovery,
        }
        .into());
    }
    let result = async {
        let mut writer = RunWriter::resume(
            &store.writing_as(holder.id()),
            run,
            held.epoch,
            SnapshotPolicy::default(),
        )
        .await?;
        // Decided again on the state as it is now that this process holds the run.
        let Some(body) = answer_fact(run, writer.state(), answer)? else {
            tracing::info!(run_id = %run, "already answered; finishing the hand-back");
            return Ok(());
        };
        let fact = Fact {
            seq: Seq(writer.state().last_seq().0 + 1),
            at_ms: store.clock().wall_ms(),
            body,
        };
        writer.commit(vec![fact]).await?;
        Ok(())
    }
    .await;
    holder.release(&held).await?;
    result
}

/// The fact that records `answer` on a run in `state`; `None` if the run already moved on
/// past its park (answered before); refused if it waits for something else or has ended.
pub(crate) fn answer_fact(
    run: &RunId,
    state: &crate::core::fold::RunState,
    answer: &Answer,
) -> Result<Option<FactBody>> {
    let parked = state.parked().cloned();
    let refuse = |now: String| FleetError::NotWaiting {
        run: run.clone(),
        what: answer.describe(),
        now,
    };
    if let Some(terminal) = state.terminal() {
        return Err(refuse(format!("; it has ended ({})", terminal.outcome)).into());
    }
    let body = match (answer, parked) {
        (_, None) => return Ok(None),
        (
            Answer::Confirm { call_id, approve },
            Some(crate::core::fold::Parked::Confirmation {
                call_id: waiting, ..
            }),
        ) if *call_id == waiting => FactBody::ConfirmationAnswered(ConfirmationAnswered {
            call_id: call_id.clone(),
            approved: *approve,
            note: None,
        }),
        (
            Answer::Question { question_id, text },
            Some(crate::core::fold::Parked::Question {
                question_id: waiting,
                ..
            }),
        ) if *question_id == waiting => FactBody::QuestionAnswered(QuestionAnswered {
            question_id: question_id.clone(),
            text: text.clone(),
        }),
        (_, Some(crate::core::fold::Parked::Confirmation { call_id, .. })) => {
            return Err(refuse(format!("; it waits for confirmation of call '{call_id}'")).into());
        }
        (_, Some(crate::core::fold::Parked::Question { question_id, .. })) => {
            return Err(refuse(format!(
                "; it waits for an answer to question '{question_id}'"
            ))
            .into());
        }
    };
    Ok(Some(body))
}

/// A human's answer.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Approves or rejects a tool call the run parked on for confirmation.
    Confirm {
        /// The tool call waiting for confirmation.
        call_id: crate::core::fact::CallId,
        /// Whether the human lets the call run.
        approve: bool,
    },
    /// Answers a question the agent asked the human.
    Question {
        /// The question the run parked on.
        question_id: crate::core::fact::QuestionId,
        /// The human's answer.
        text: String,
    },
}

impl Answer {
    fn describe(&self) -> String {
        match self {
            Answer::Confirm { call_id, .. } => format!("confirmation of call '{call_id}'"),
            Answer::Question { question_id, .. } => {
                format!("an answer to question '{question_id}'")
            }
        }
    }
}
