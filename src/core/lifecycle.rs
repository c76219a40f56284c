//! The recovery lifecycle's rules: every change to a recovery record, and to the index entry
//! of the run it continues, is an [`Event`] that [`apply`] allows or refuses.
//!
//! It owns the states ([`RecoveryState`]), the events (each sent by one kind of process), the
//! pure transition function [`apply`] that says which event may happen in which state, and
//! [`entry_for`], the index entry a record implies. The executor that writes the result with
//! compare-and-swap, record first and index entry second, is `fleet::lifecycle::transition`;
//! admission is `fleet::admission::admit`. The coordinator, the worker, the fleet, workflows
//! and the CLI change either object only through those two. Nothing here does I/O.
//!
//! ```text
//!              Admit (coordinator, CLI, library)
//!                  |
//!                  v          Assign (coordinator), Decline (worker stopping, not started)
//!   +------------> Admitted <-------------------+
//!   |               |   ^  ^                    |
//!   | Answer (CLI)  |   |  | Yield / Fail (worker), Abandon (coordinator: worker died)
//!   |        Start  |   |  +--------------------+
//!   |      (worker) v   |                       |
//! Parked <------- Running ----------------------+
//!         Park      |
//!       (worker)    | Finish (worker)             Admitted --DeadLetter (coordinator,
//!                   v                                         failures >= max)--> DeadLettered
//!                Finished
//! ```
//!
//! Architecture invariant: a terminal record never changes — [`apply`] refuses every event
//! on `Finished` and `DeadLettered`, so a stale coordinator cannot reopen a finished recovery
//! and a recovery ID never executes twice (brief, invariant 5).
//!
//! Architecture invariant: an attempt starts only on a worker the coordinator offered the
//! recovery to, or, for a fresh admission nobody was offered ([`unclaimed`]: never declined,
//! started or failed), on any worker that claims it — both by compare-and-swap, so one start
//! wins. A recovery that ran once goes only through `Assign`, so a name a worker kept for a
//! long time cannot restart it, and failures and dead-lettering stay the coordinator's.
//!
//! Architecture invariant: only failures count toward dead-lettering, and dead-lettering
//! never preempts a live attempt — `Fail` and `Abandon` are the only events that raise
//! `failures`; `DeadLetter` is refused unless the record is `Admitted` (no attempt runs), and
//! the executor's compare-and-swap refuses it if an attempt started since it was decided.
//!
//! Architecture invariant: the record is the truth and the index entry follows it — every
//! multi-object change writes the record first, then the index entry; a crash in between
//! leaves an entry the coordinator repairs from the record on its next scan ([`entry_for`]),
//! so no record is stranded by a crash between two writes.

use crate::core::fact::RecoveryId;
use crate::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryResult, RecoveryState};

/// What happens to a recovery, and who says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The coordinator offers the recovery to a live worker.
    Assign {
        /// The worker offered the recovery.
        worker: String,
    },
    /// The worker it was offered to declines it before starting (it is stopping): the offer
    /// goes back to the coordinator, which offers it to another worker.
    Decline {
        /// The worker declining the offer.
        worker: String,
    },
    /// The worker it was offered to starts an attempt; any worker may start a fresh
    /// admission nobody was offered yet ([`unclaimed`]), which then becomes its.
    Start {
        /// The worker starting the attempt.
        worker: String,
    },
    /// The attempt stopped with everything committed (step cap, or a graceful stop) and hands
    /// the recovery back; `keep_assignment` lets the same worker continue at once.
    Yield {
        /// The worker whose attempt stopped.
        worker: String,
        /// The attempt's number, as its `Start` counted it.
        attempt: u32,
        /// Whether the recovery stays assigned to the same worker.
        keep_assignment: bool,
    },
    /// The attempt stopped because the run waits for a human; `generation` is the recovery
    /// run's newest generation then.
    Park {
        /// The worker whose attempt parked.
        worker: String,
        /// The attempt's number, as its `Start` counted it.
        attempt: u32,
        /// The recovery run's newest generation when it parked.
        generation: u64,
    },
    /// A human's answer was committed to the run; it may continue.
    Answer,
    /// The attempt failed with an error.
    Fail {
        /// The worker whose attempt failed.
        worker: String,
        /// The attempt's number, as its `Start` counted it.
        attempt: u32,
        /// What went wrong, in words; kept as the record's last error.
        error: String,
    },
    /// The coordinator saw the attempt's worker die (heartbeat silent for its TTL).
    Abandon {
        /// The worker that died.
        worker: String,
        /// The attempt's number, as its `Start` counted it.
        attempt: u32,
    },
    /// The attempt ended the run; its terminal fact is committed.
    Finish {
        /// The worker whose attempt ended the run.
        worker: String,
        /// The attempt's number, as its `Start` counted it.
        attempt: u32,
        /// How the run ended.
        result: RecoveryResult,
    },
    /// The coordinator gives up after `max_failures` failed attempts.
    DeadLetter {
        /// The failed attempts after which a recovery is given up.
        max_failures: u32,
    },
}

impl Event {
    /// The event's name, for refusals and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Assign { .. } => "assign",
            Event::Decline { .. } => "decline",
            Event::Start { .. } => "start",
            Event::Yield { .. } => "yield",
            Event::Park { .. } => "park",
            Event::Answer => "answer",
            Event::Fail { .. } => "fail",
            Event::Abandon { .. } => "abandon",
            Event::Finish { .. } => "finish",
            Event::DeadLetter { .. } => "dead-letter",
        }
    }
}

/// An event that does not apply to the record as it is now: an expected outcome of a race
/// (a stale decision, a lost attempt), never a bug to panic over.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("recovery '{recovery_id}' is {state}{holder}; cannot {event} it: {reason}", state = state.describe(), holder = assigned.as_ref().map(|w| format!(" on '{w}'")).unwrap_or_default())]
pub struct Refused {
    /// The recovery the event was for.
    pub recovery_id: RecoveryId,
    /// The state the record was in.
    pub state: RecoveryState,
    /// The worker the recovery was assigned to then, if any.
    pub assigned: Option<String>,
    /// The refused event's name.
    pub event: &'static str,
    /// Why the event does not apply, in words.
    pub reason: &'static str,
}

/// Whether any worker may start `record` without an offer: a fresh admission, never offered,
/// declined or started (the coordinator forwards those names to a worker before it reads
/// them; see `coordinator::named::assign_named`). Anything that ran before, failed, was handed back
/// or parked goes through an `Assign`, so the failure count and dead-lettering stay the
/// coordinator's, and a name kept for a long time cannot restart a recovery that ran since.
pub fn unclaimed(record: &RecoveryRecord) -> bool {
    record.state == RecoveryState::Admitted
        && record.assigned_to.is_none()
        && record.declined_by.is_none()
        && record.attempts == 0
        && record.failures == 0
}

/// The pure transition: the record after `event`, or why the event does not apply. `now_ms`
/// is data, so the same inputs always give the same output.
pub fn apply(
    record: &RecoveryRecord,
    event: &Event,
    now_ms: u64,
) -> Result<RecoveryRecord, Refused> {
    let refuse = |reason: &'static str| Refused {
        recovery_id: record.recovery_id.clone(),
        state: record.state,
        assigned: record.assigned_to.clone(),
        event: event.name(),
        reason,
    };
    if record.state.is_terminal() {
        return Err(refuse("the recovery has ended"));
    }
    // An attempt's outcome counts only for that very attempt: `attempt` is the number its
    // `Start` gave it, so a paused earlier attempt (even of a process with the same worker
    // ID) cannot hand back, park, fail or finish the attempt that replaced it.
    let running_on = |worker: &str, attempt: u32| {
        record.state == RecoveryState::Running
            && record.assigned_to.as_deref() == Some(worker)
            && record.attempts == attempt
    };
    let mut next = record.clone();
    next.updated_at_ms = now_ms;
    // An attempt that ends any other way than abandoned leaves nobody judged gone behind.
    if matches!(
        event,
        Event::Yield { .. } | Event::Park { .. } | Event::Fail { .. } | Event::Finish { .. }
    ) {
        next.abandoned_by = None;
    }
    match event {
        Event::Assign { worker } => {
            if record.state != RecoveryState::Admitted {
                return Err(refuse("only an admitted recovery is assigned"));
            }
            next.assigned_to = Some(worker.clone());
        }
        Event::Decline { worker } => {
            if record.state != RecoveryState::Admitted
                || record.assigned_to.as_deref() != Some(worker.as_str())
            {
                return Err(refuse("it is not offered to this worker"));
            }
            next.assigned_to = None;
            next.declined_by = Some(worker.clone());
        }
        Event::Start { worker } => {
            if record.state != RecoveryState::Admitted
                || !(record.assigned_to.as_deref() == Some(worker.as_str()) || unclaimed(record))
            {
                return Err(refuse("it is not offered to this worker"));
            }
            next.assigned_to = Some(worker.clone());
            next.declined_by = None;
            next.state = RecoveryState::Running;
            next.attempts = record.attempts.saturating_add(1);
        }
        Event::Yield {
            worker,
            attempt,
            keep_assignment,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Admitted;
            if !keep_assignment {
                next.assigned_to = None;
            }
        }
        Event::Park {
            worker,
            attempt,
            generation,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Parked;
            next.assigned_to = None;
            next.parked_at = Some(*generation);
        }
        Event::Answer => {
            if record.state != RecoveryState::Parked {
                return Err(refuse("it is not waiting for an answer"));
            }
            next.state = RecoveryState::Admitted;
            next.parked_at = None;
        }
        Event::Fail {
            worker,
            attempt,
            error,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Admitted;
            next.assigned_to = None;
            next.failures = record.failures.saturating_add(1);
            next.last_error = Some(error.clone());
        }
        Event::Abandon { worker, attempt } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("its attempt is not on that worker"));
            }
            next.state = RecoveryState::Admitted;
            next.assigned_to = None;
            next.abandoned_by = Some(worker.clone());
            next.failures = record.failures.saturating_add(1);
            next.last_error = Some(format!(
                "worker '{worker}' stopped heartbeating during attempt {}",
                record.attempts
            ));
        }
        Event::Finish {
            worker,
            attempt,
            result,
        } => {
            if !running_on(worker, *attempt) {
                return Err(refuse("this worker runs no attempt of it"));
            }
            next.state = RecoveryState::Finished;
            next.result = Some(result.clone());
        }
        Event::DeadLetter { max_failures } => {
            if record.state != RecoveryState::Admitted {
                return Err(refuse("an attempt is live or it is parked"));
            }
            if record.failures < *max_failures {
                return Err(refuse("it has not failed often enough"));
            }
            next.state = RecoveryState::DeadLettered;
            next.assigned_to = None;
        }
    }
    Ok(next)
}

/// Where the index says a run with a recovery in `state` stands; `None`: no entry (done).
pub fn index_phase(state: RecoveryState) -> Option<Phase> {
    match state {
        RecoveryState::Admitted | RecoveryState::Running => Some(Phase::Recovering),
        RecoveryState::Parked => Some(Phase::Parked),
        RecoveryState::DeadLettered => Some(Phase::Dead),
        RecoveryState::Finished => None,
    }
}

/// The index entry of the source run as `record` says it should be; `None`: no entry.
pub fn entry_for(record: &RecoveryRecord) -> Option<IndexEntry> {
    let phase = index_phase(record.state)?;
    let mut entry = IndexEntry::new(
        record.source_run.clone(),
        record.session_id.clone(),
        phase,
        record.fingerprint_sha256.clone(),
        record.updated_at_ms,
    );
    entry.recovery_id = Some(record.recovery_id.clone());
    Some(entry)
}
