//! Workflows: a set of run specs under one workflow ID, executed by the fleet.
//!
//! Each step becomes a run with a deterministic ID (`<workflow>.<step>`), created with its
//! meta and prompt but not executed here: its index entry names no live holder, so the
//! coordinator admits it as interrupted and a worker executes it as a recovery — the steps
//! spread over the fleet. The workflow checkpoint records every finished step's outcome;
//! running the same workflow again, on any node, skips finished steps, waits for dispatched
//! ones and dispatches only the rest.

use crate::core::epoch::Epoch;
use crate::core::record::{IndexEntry, Phase, RecoveryState};
use std::time::Duration;

use serde::Deserialize;

use crate::core::assignment::recovery_id_for;
use crate::core::fact::{Outcome, RunId, SessionId};
use crate::error::Result;
use crate::fleet::Agent;
use crate::store::Store;
use crate::store::checkpoint::{self, StepOutcome};
use crate::store::generation::{GenerationError, RunWriter, SnapshotPolicy};

use crate::store::recovery::{self};

/// One step of a workflow.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// The step's name, unique in its workflow; the step's run ID is `<workflow>.<step>`.
    pub step: String,
    /// The user prompt the step's run starts with.
    pub prompt: String,
    /// The session the step's run belongs to, if any.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// What only this module refuses; everything else [`run`] passes up as the module error that
/// made it, inside the public [`Error`](crate::Error).
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// The workflow's steps are malformed, such as a step name that appears twice.
    #[error("workflow '{workflow}': {message}")]
    Invalid {
        /// The workflow ID.
        workflow: String,
        /// What is wrong with its steps.
        message: String,
    },
    /// A step already dispatched or finished was given again with another prompt or
    /// session: skipping it would silently keep the old result.
    #[error(
        "workflow '{workflow}': step '{step}' already ran with a different {what}; give the changed step a new name (or the workflow a new ID) to run it"
    )]
    StepChanged {
        /// The workflow ID.
        workflow: String,
        /// The step whose spec changed.
        step: String,
        /// What changed ("prompt or session").
        what: &'static str,
    },
    /// A step's recovery failed too often and the coordinator dead-lettered it, so the
    /// workflow cannot finish.
    #[error("workflow '{workflow}': step '{step}' was dead-lettered: {error}")]
    StepDead {
        /// The workflow ID.
        workflow: String,
        /// The step that was dead-lettered.
        step: String,
        /// The last error its recovery recorded.
        error: String,
    },
}

/// What a workflow run did.
#[derive(Clone, Debug, Default)]
pub struct WorkflowReport {
    /// Steps the workflow checkpoint already recorded as finished.
    pub skipped: Vec<String>,
    /// Steps handed to the fleet (or found handed over by an earlier run) and waited for.
    pub dispatched: Vec<String>,
    /// Outcomes of the steps that finished while this run waited.
    pub completed: Vec<StepOutcome>,
}

impl StepSpec {
    /// SHA-256 of what the step's run starts from: its prompt and session.
    pub fn digest(&self) -> String {
        let canonical = serde_json::json!([self.prompt, self.session_id]).to_string();
        crate::core::digest::sha256_hex(canonical.as_bytes())
    }
}

/// The run ID of a workflow step.
pub fn step_run(workflow: &str, step: &str) -> RunId {
    RunId::new(format!("{workflow}.{step}"))
}

/// Runs (or resumes) a workflow until every step finished.
pub async fn run(
    store: &Store,
    agent: &Agent,
    workflow: &str,
    steps: &[StepSpec],
    poll: Duration,
) -> Result<WorkflowReport> {
    let invalid = |message: String| WorkflowError::Invalid {
        workflow: workflow.to_owned(),
        message,
    };
    for (i, spec) in steps.iter().enumerate() {
        if steps[..i].iter().any(|s| s.step == spec.step) {
            return Err(invalid(format!("step '{}' appears twice", spec.step)).into());
        }
    }
    let (mut completed, mut generation) = match checkpoint::load_workflow(store, workflow).await? {
        Some((saved, generation)) => (saved.completed, Some(generation)),
        None => (Vec::new(), None),
    };
    let changed = |spec: &StepSpec| WorkflowError::StepChanged {
        workflow: workflow.to_owned(),
        step: spec.step.clone(),
        what: "prompt or session",
    };
    // Every step is checked before any is dispatched: a refused re-run starts nothing.
    for spec in steps {
        match completed.iter().find(|c| c.step == spec.step) {
            Some(done)
                if done
                    .spec_sha256
                    .as_ref()
                    .is_some_and(|d| *d != spec.digest()) =>
            {
                return Err(changed(spec).into());
            }
            Some(_) => {}
            None if !dispatched_as(store, workflow, spec).await? => {
                return Err(changed(spec).into());
            }
            None => {}
        }
    }
    let mut report = WorkflowReport::default();
    let mut waiting = Vec::new();
    for spec in steps {
        if completed.iter().any(|c| c.step == spec.step) {
            report.skipped.push(spec.step.clone());
            continue;
        }
        dispatch(store, agent, workflow, spec).await?;
        report.dispatched.push(spec.step.clone());
        waiting.push(spec);
    }
    if !waiting.is_empty() {
        // The steps are runs nobody holds: the coordinator admits them now, not at its next
        // (possibly idle-paced) scan.
        crate::fleet::wake::wake_coordinator(store).await;
    }
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for spec in waiting {
            let run = step_run(workflow, &spec.step);
            let record = recovery::read(store, &recovery_id_for(&run))
                .await?
                .map(|(record, _)| record);
            match record {
                Some(record) if record.state == RecoveryState::Finished => {
                    let result = record
                        .result
                        .unwrap_or(crate::core::record::RecoveryResult {
                            outcome: Outcome::Failed,
                            message: "finished without a result".into(),
                            final_generation: 0,
                        });
                    let outcome = StepOutcome {
                        step: spec.step.clone(),
                        run_id: run,
                        outcome: result.outcome,
                        message: result.message,
                        spec_sha256: Some(spec.digest()),
                    };
                    completed.push(outcome.clone());
                    generation = Some(
                        checkpoint::save_workflow(store, workflow, completed.clone(), generation)
                            .await?,
                    );
                    report.completed.push(outcome);
                }
                Some(record) if record.state == RecoveryState::DeadLettered => {
                    return Err(WorkflowError::StepDead {
                        workflow: workflow.to_owned(),
                        step: spec.step.clone(),
                        error: record.last_error.unwrap_or_default(),
                    }
                    .into());
                }
                _ => still.push(spec),
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            crate::clock::sleep(poll).await;
        }
    }
    Ok(report)
}

/// Whether the step's run, if an earlier run of the workflow dispatched it, started from this
/// spec (its first facts are its prompt and session); true when it was never dispatched.
async fn dispatched_as(store: &Store, workflow: &str, spec: &StepSpec) -> Result<bool> {
    let run = step_run(workflow, &spec.step);
    // Never dispatched: no generation 1 (one look, not a load, which needs the chain).
    let first = crate::core::layout::generation(&crate::core::layout::run_base(run.as_str()), 1);
    if store.head(&first).await?.is_none() {
        return Ok(true);
    }
    let existing = crate::store::generation::load(store, &run, Some(1)).await?;
    let prompt = existing.state.facts().iter().find_map(|f| match &f.body {
        crate::core::fact::FactBody::UserMessage(m) => Some(m.content.as_str()),
        _ => None,
    });
    let session = spec.session_id.clone().map(SessionId::new);
    Ok(prompt == Some(spec.prompt.as_str()) && existing.state.session_id() == session.as_ref())
}

/// Creates a step's run (meta and prompt) and hands it to the fleet, unless it exists.
async fn dispatch(store: &Store, agent: &Agent, workflow: &str, spec: &StepSpec) -> Result<()> {
    let run = step_run(workflow, &spec.step);
    let now = store.clock().wall_ms();
    let session = spec.session_id.clone().map(SessionId::new);
    let facts = crate::fleet::opening_facts(&run, session.clone(), agent, &spec.prompt, now);
    match RunWriter::create_as(
        store,
        run.clone(),
        facts,
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await
    {
        Ok(_) => {}
        // Dispatched by an earlier, interrupted run of this workflow. If that one died before
        // indexing the step (and nothing recovered it yet), index it now; then wait for it.
        Err(GenerationError::AlreadyExists { .. }) => {
            let recovering = recovery::read(store, &recovery_id_for(&run))
                .await?
                .is_some();
            let indexed = store
                .head(&crate::core::layout::index_entry(run.as_str()))
                .await?
                .is_some();
            if recovering || indexed {
                return Ok(());
            }
        }
        Err(other) => return Err(other.into()),
    }
    // No holder: the coordinator sees a run nobody is running and admits it.
    let entry = IndexEntry::new(
        run,
        session,
        Phase::Running,
        agent.fingerprint_sha256(),
        now,
    );
    crate::fleet::lifecycle::host_started(store, &entry).await?;
    Ok(())
}
