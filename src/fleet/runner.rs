//! The drive loop: executes a run's next steps, journaling and committing each fact.
//!
//! This module owns the order of effects for one step: decide from the folded state (pure),
//! perform the effect (a model call or a tool call), append the resulting fact to the local
//! log (fsync), commit it to the store (one conditional PUT). It never decides who may run a
//! run: the caller holds the lease and hands in the writer at its epoch.
//!
//! Architecture invariant: a tool call whose result is committed is never executed again
//! (brief, invariant 3), and a committed model turn is never sent again (invariant 4): the
//! next step is always computed from the committed state, and a step's fact is committed
//! before the next step is decided. Only a call whose side effect happened but whose result
//! was not yet committed can run again after a crash — at most the calls in flight.
//!
//! Architecture invariant: a parked run takes no step (invariant 6): `drive` returns as soon
//! as the folded state says parked.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::Clock;
use crate::core::fact::{ConfirmationRequested, Fact, FactBody, Seq, Terminal, ToolResult};
use crate::core::fold::{Confirmation, Parked, Step};
use crate::host::{Model, ModelError, ModelRequest, ToolContext, Tools};
use crate::store::generation::{GenerationError, RunWriter};
use crate::store::lease::{Held, Holder, LeaseError};
use crate::store::log::{FactLog, LogError};

/// Why `drive` returned.
#[derive(Clone, Debug, PartialEq)]
pub enum Stopped {
    /// The run ended; its terminal fact is committed.
    Finished(Terminal),
    /// Waiting for a human's answer.
    Parked(Parked),
    /// The run has no prompt yet.
    WaitingForInput,
    /// The per-resume step cap was reached; everything is committed.
    StepCap,
    /// A graceful stop was requested; the current step finished and was committed.
    StopRequested,
}

/// Why `drive` failed; each variant carries the error of the module that stopped the step.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Appending the step's fact to the local log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// Committing the step's fact failed, or a newer epoch fenced the commit.
    #[error(transparent)]
    Generation(#[from] GenerationError),
    /// The model call failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The lease check before a step or a tool call found the lease lost or unreadable.
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

/// Everything one run's execution needs.
pub struct Runner {
    /// Commits the run's facts at the held lease's epoch; its state is the committed run.
    pub writer: RunWriter,
    /// The run's local fact log, where each fact is journaled before it is committed.
    pub log: FactLog,
    /// The model asked for each turn.
    pub model: Arc<dyn Model>,
    /// The tools the model's calls run on.
    pub tools: Arc<dyn Tools>,
    /// The system prompt sent with every model request.
    pub system_prompt: String,
    /// How many steps one `drive` takes before it returns [`Stopped::StepCap`].
    pub steps_per_resume: u32,
    /// Stamps each fact with its wall-clock time.
    pub clock: Arc<dyn Clock>,
    /// The lease, checked (one GET) before a tool call unless a commit succeeded within the
    /// last third of its TTL, so a holder that lost the run does not start side effects;
    /// commits are fenced regardless.
    pub lease: Option<(Arc<Holder>, Held)>,
    /// When this runner's last commit succeeded (or, at the start, when its lease was taken
    /// and its writer's first generation landed). A tool call always follows the commit that
    /// recorded it: if that commit succeeded, no takeover had fenced the run yet, and one that
    /// comes after it makes this the call in flight, the one call a recovery may repeat. So a
    /// recent commit stands in for the lease check (one GET per step saved); an old one (a
    /// slow model, a paused process) does not.
    pub committed_at: Option<crate::clock::Stopwatch>,
    /// Set to ask for a graceful stop after the current step.
    pub stop: Arc<AtomicBool>,
    /// Set by a background lease watcher when the lease may be lost; the next step then
    /// confirms with one read and stops with the error if it is.
    pub lease_suspect: Arc<AtomicBool>,
    /// For an attempt that resumes after an interruption (a recovery's first, or one after a
    /// worker died): looked at once, at its first step, for the metrics.
    pub resumed: Option<Resumed>,
}

/// An attempt resuming after an interruption, for the metrics.
#[derive(Clone, Copy, Debug)]
pub struct Resumed {
    /// For a recovery's first attempt: when it was admitted (from its record) and when its
    /// source last committed (wall-clock milliseconds), measured against its first step.
    pub latency: Option<(u64, u64)>,
}

impl Runner {
    /// Takes steps until the run ends, parks, hits the step cap, or is asked to stop.
    pub async fn drive(&mut self) -> Result<Stopped, RunError> {
        let mut steps = 0u32;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(Stopped::StopRequested);
            }
            if self.lease_suspect.swap(false, Ordering::SeqCst)
                && let Some((holder, held)) = &self.lease
            {
                holder.check(held).await?;
            }
            if steps >= self.steps_per_resume {
                return Ok(Stopped::StepCap);
            }
            if let Some(resumed) = self.resumed.take() {
                if let Some((admitted_at_ms, interrupted_at_ms)) = resumed.latency {
                    let now = self.clock.wall_ms();
                    let since = |at: u64| std::time::Duration::from_millis(now.saturating_sub(at));
                    crate::metrics::observe(
                        crate::metrics::ADMISSION_TO_FIRST_STEP,
                        since(admitted_at_ms),
                    );
                    crate::metrics::observe(
                        crate::metrics::INTERRUPTION_TO_RESUMPTION,
                        since(interrupted_at_ms),
                    );
                }
                if let Step::RunTools { calls } = self.writer.state().next_step()
                    && calls[0].confirmation == Confirmation::NotRequested
                {
                    // The next call has no result and waits for nobody: it may have been
                    // running when the source was interrupted, and runs (again) now. (A call
                    // a human approved is run after the answer, not again.)
                    crate::metrics::count(crate::metrics::TOOL_CALLS_REEXECUTED);
                }
            }
            let stopwatch = crate::clock::Stopwatch::start();
            match self.writer.state().next_step() {
                Step::Done { terminal } => return Ok(Stopped::Finished(terminal)),
                Step::Parked { parked } => return Ok(Stopped::Parked(parked)),
                Step::WaitForInput => return Ok(Stopped::WaitingForInput),
                Step::Finish { outcome, reason } => {
                    let terminal = Terminal {
                        outcome,
                        message: reason,
                    };
                    self.record(FactBody::Terminal(terminal.clone())).await?;
                    return Ok(Stopped::Finished(terminal));
                }
                Step::CallModel { with_tools, .. } => {
                    let tools = if with_tools {
                        self.tools.definitions()
                    } else {
                        Vec::new()
                    };
                    let turn = self
                        .model
                        .complete(ModelRequest {
                            system_prompt: &self.system_prompt,
                            state: self.writer.state(),
                            tools: &tools,
                        })
                        .await?;
                    crate::metrics::step("model", stopwatch.elapsed());
                    // A final answer ends the run: its terminal fact, which follows from the
                    // facts alone, goes in the same commit (one request, not two).
                    if let Some(terminal) = self.ending_with(&turn) {
                        self.record_all(vec![
                            FactBody::ModelTurn(turn),
                            FactBody::Terminal(terminal.clone()),
                        ])
                        .await?;
                        return Ok(Stopped::Finished(terminal));
                    }
                    self.record(FactBody::ModelTurn(turn)).await?;
                }
                Step::RunTools { calls } => {
                    // One call per step, in the order the model made them.
                    let pending = &calls[0];
                    let call = pending.call.clone();
                    let body = match pending.confirmation {
                        Confirmation::NotRequested if self.tools.needs_confirmation(&call.name) => {
                            FactBody::ConfirmationRequested(ConfirmationRequested {
                                call_id: call.id.clone(),
                                prompt: format!("Allow {} with {}?", call.name, call.arguments),
                            })
                        }
                        Confirmation::Denied => FactBody::ToolResult(ToolResult {
                            call_id: call.id.clone(),
                            output: "The user denied this tool call.".into(),
                            is_error: true,
                            duration_ms: 0,
                        }),
                        _ => {
                            if let Some((holder, held)) = &self.lease
                                && self
                                    .committed_at
                                    .is_none_or(|at| at.elapsed() >= holder.ttl() / 3)
                            {
                                holder.check(held).await?;
                            }
                            // The run's original ID (from its meta) stays the same across
                            // recoveries, so (run, call) identifies one logical call downstream.
                            let origin = self.writer.state().run_id().map_or_else(
                                || self.writer.run_id().to_string(),
                                |id| id.to_string(),
                            );
                            let context = ToolContext {
                                run_id: origin,
                                epoch: self.writer.epoch(),
                            };
                            let output = self.tools.call(&call, &context).await;
                            crate::metrics::step("tool", stopwatch.elapsed());
                            FactBody::ToolResult(ToolResult {
                                call_id: call.id.clone(),
                                output: output.output,
                                is_error: output.is_error,
                                duration_ms: output.duration_ms,
                            })
                        }
                    };
                    self.record(body).await?;
                }
            }
            steps += 1;
        }
    }

    /// Journals one fact locally, then commits it. Returns once it is in the store.
    pub async fn record(&mut self, body: FactBody) -> Result<(), RunError> {
        self.record_all(vec![body]).await
    }

    /// Journals facts locally, then commits them together (one generation). Returns once
    /// they are in the store.
    async fn record_all(&mut self, bodies: Vec<FactBody>) -> Result<(), RunError> {
        let (first, at_ms) = (self.writer.state().last_seq().0 + 1, self.clock.wall_ms());
        let facts: Vec<Fact> = bodies
            .into_iter()
            .zip(first..)
            .map(|(body, seq)| Fact {
                seq: Seq(seq),
                at_ms,
                body,
            })
            .collect();
        self.log.append_all(&facts)?;
        self.writer.commit(facts).await?;
        self.committed_at = Some(crate::clock::Stopwatch::start());
        Ok(())
    }

    /// The terminal fact the run ends with once `turn` is applied, if it is a final answer
    /// (no tool calls) that ends it. Only then is the state copied, so once per run.
    fn ending_with(&self, turn: &crate::core::fact::ModelTurn) -> Option<Terminal> {
        if !turn.tool_calls.is_empty() {
            return None;
        }
        let mut after = self.writer.state().clone();
        let fact = Fact {
            seq: Seq(after.last_seq().0 + 1),
            at_ms: self.clock.wall_ms(),
            body: FactBody::ModelTurn(turn.clone()),
        };
        after.apply(fact).ok()?;
        match after.next_step() {
            Step::Finish { outcome, reason } => Some(Terminal {
                outcome,
                message: reason,
            }),
            _ => None,
        }
    }
}
