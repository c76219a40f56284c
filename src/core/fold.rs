//! The fold: facts in, resumable run state out.
//!
//! This module owns the rules that make a sequence of facts a valid run, and the decision of
//! what the run does next. It is pure: it never does I/O, never reads a clock and never
//! generates an ID, so folding the same facts always gives the same state, on any node.
//! Folding is incremental — [`RunState::apply`] one fact at a time equals [`fold`] over all
//! of them — and a fact that breaks a rule leaves the state untouched.

use serde::Serialize;

use crate::core::fact::{
    CallId, Fact, FactBody, Meta, ModelTurn, Outcome, QuestionId, RunId, Seq, SessionId, Terminal,
    ToolCall,
};

/// Counters derived only from facts; never stored, never incremented outside [`RunState::apply`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Model turns the run has taken.
    pub model_turns: u64,
    /// Model turns that requested at least one tool call.
    pub tool_rounds: u64,
    /// Tool calls the model requested.
    pub tool_calls: u64,
    /// Tool results recorded.
    pub tool_results: u64,
    /// Tool results that report an error, denied calls included.
    pub tool_errors: u64,
    /// Input tokens spent over all model turns.
    pub input_tokens: u64,
    /// Output tokens spent over all model turns.
    pub output_tokens: u64,
}

/// Where a pending tool call stands with respect to human confirmation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Confirmation {
    /// No confirmation was asked for; the call runs unless its tool needs one.
    NotRequested,
    /// A confirmation was asked for; the run is parked until a human answers.
    Requested,
    /// A human approved the call; it runs.
    Approved,
    /// A human denied the call; it gets an error result instead of running.
    Denied,
}

/// A tool call of the last model turn that has no result yet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PendingCall {
    /// The call as the model made it.
    pub call: ToolCall,
    /// Where the call stands with respect to human confirmation.
    pub confirmation: Confirmation,
}

/// The run waits for a human; it takes no step until the answer fact exists.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "waiting_for", rename_all = "snake_case")]
pub enum Parked {
    /// A tool call waits for a human's approval.
    Confirmation {
        /// The call waiting for approval.
        call_id: CallId,
        /// What the human is asked to approve.
        prompt: String,
    },
    /// The run asked a human a question and waits for the answer.
    Question {
        /// The question waiting for an answer.
        question_id: QuestionId,
        /// The question as the human reads it.
        text: String,
    },
}

/// What the run does next, as data for the shell to execute.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// The run has no prompt yet: a user message must be recorded first.
    WaitForInput,
    /// Call the model for iteration `iteration`. With `with_tools` false the tool-round cap
    /// was reached and the model must be called with an empty tool list.
    CallModel {
        /// The model call's number in the run, 1 for the first.
        iteration: u64,
        /// Whether the model is offered the tools.
        with_tools: bool,
    },
    /// Execute these tool calls (each once) and record their results.
    RunTools {
        /// The pending calls, in the order the model made them.
        calls: Vec<PendingCall>,
    },
    /// Waiting for a human's answer.
    Parked {
        /// What the run waits for.
        parked: Parked,
    },
    /// Record a terminal fact with this outcome (final answer given, or a budget ran out).
    Finish {
        /// How the run ends.
        outcome: Outcome,
        /// Why, in words: the terminal fact's message.
        reason: String,
    },
    /// The run has ended.
    Done {
        /// The run's terminal fact.
        terminal: Terminal,
    },
}

/// Why a fact cannot be applied to a run. Each names the fact's seq and kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    #[error("fact seq {seq} ({kind}): the first fact of a run must be meta with seq 1")]
    /// The run's first fact is not `meta` with seq 1.
    FirstNotMeta {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
    },
    #[error("fact seq {seq} (meta): meta may only be the first fact")]
    /// A `meta` fact comes after the first fact.
    MetaNotFirst {
        /// The offending fact's seq.
        seq: Seq,
    },
    #[error("fact seq {seq} ({kind}): expected seq {expected}, facts {expected}..{} are missing", seq.0 - 1)]
    /// The fact skips seqs after the last fact folded.
    Gap {
        /// The offending fact's seq.
        seq: Seq,
        /// The seq the next fact must have.
        expected: Seq,
        /// The offending fact's kind.
        kind: &'static str,
    },
    #[error(
        "fact seq {seq} ({kind}): differs from the fact already recorded at seq {seq} ({existing})"
    )]
    /// The fact repeats a folded seq with different content.
    ConflictingDuplicate {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
        /// The kind of the fact already folded at that seq.
        existing: &'static str,
    },
    #[error("fact seq {seq} ({kind}): the run already ended at seq {terminal_seq}")]
    /// A fact follows the run's terminal fact.
    AfterTerminal {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
        /// The seq of the run's terminal fact.
        terminal_seq: Seq,
    },
    #[error("fact seq {seq} ({kind}): the run is parked waiting for {waiting_for}")]
    /// A fact other than the awaited answer arrives while the run is parked.
    WhileParked {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
        /// What the run waits for, in words.
        waiting_for: String,
    },
    #[error("fact seq {seq} ({kind}): tool calls {} of the last model turn have no result yet", .pending.join(", "))]
    /// A user message or model turn arrives while calls of the last turn have no result.
    ToolCallsPending {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
        /// The IDs of the calls without a result.
        pending: Vec<String>,
    },
    #[error("fact seq {seq} (model.turn): tool call id '{call_id}' appears twice in one turn")]
    /// A model turn names the same tool call ID twice.
    DuplicateCallId {
        /// The offending fact's seq.
        seq: Seq,
        /// The repeated call ID.
        call_id: CallId,
    },
    #[error("fact seq {seq} ({kind}): no pending tool call '{call_id}' in the last model turn")]
    /// A result or confirmation request names a call the last turn did not leave pending.
    UnknownCall {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
        /// The call ID it names.
        call_id: CallId,
    },
    #[error("fact seq {seq} (tool.result): call '{call_id}' already has a result")]
    /// A tool result names a call of the last turn that already has one.
    AlreadyAnswered {
        /// The offending fact's seq.
        seq: Seq,
        /// The call that already has a result.
        call_id: CallId,
    },
    #[error(
        "fact seq {seq} (confirmation.requested): call '{call_id}' was already confirmed or denied"
    )]
    /// A confirmation is requested for a call that was already confirmed or denied.
    ConfirmationRepeated {
        /// The offending fact's seq.
        seq: Seq,
        /// The call already confirmed or denied.
        call_id: CallId,
    },
    #[error(
        "fact seq {seq} ({kind}): nothing is waiting for this answer (the run waits for {waiting_for})"
    )]
    /// An answer arrives that the run is not parked waiting for.
    UnexpectedAnswer {
        /// The offending fact's seq.
        seq: Seq,
        /// The offending fact's kind.
        kind: &'static str,
        /// What the run waits for instead, in words ("nothing" when it is not parked).
        waiting_for: String,
    },
}

/// Whether an applied fact was new or a repeat of one already folded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The fact was new and is now folded.
    Appended,
    /// Same seq and identical content as a fact already folded: an idempotent no-op.
    Duplicate,
}

/// The state of one run, folded from its facts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunState {
    /// Every fact folded so far, in seq order (`facts[i].seq == i + 1`). The conversation is a
    /// view over them, and duplicates are checked against them.
    facts: Vec<Fact>,
    counters: Counters,
    /// Index into `facts` of the last model turn.
    last_turn: Option<usize>,
    /// Calls of the last model turn without a result: (index in its `tool_calls`, status).
    /// Indices, not copies, keep the fold from cloning every call it folds.
    pending: Vec<(usize, Confirmation)>,
    parked: Option<Parked>,
    /// Index into `facts` of the terminal fact.
    terminal: Option<usize>,
    /// True when the last thing that happened calls for the model's next turn.
    awaiting_model: bool,
    has_prompt: bool,
}

/// Folds facts from scratch. Equal to applying them one by one to [`RunState::default`].
pub fn fold(facts: impl IntoIterator<Item = Fact>) -> Result<RunState, FoldError> {
    let facts = facts.into_iter();
    let mut state = RunState::default();
    state.facts.reserve(facts.size_hint().0);
    for fact in facts {
        state.apply(fact)?;
    }
    Ok(state)
}

impl RunState {
    /// Applies one fact, enforcing the run's rules. On error the state is unchanged.
    pub fn apply(&mut self, fact: Fact) -> Result<Applied, FoldError> {
        if self.check(&fact)? == Applied::Duplicate {
            return Ok(Applied::Duplicate);
        }
        self.absorb(&fact);
        self.facts.push(fact);
        Ok(Applied::Appended)
    }

    /// Validates a fact against the current state without changing anything: what
    /// [`Self::apply`] would answer (a host checks a fact before it journals it).
    pub fn check(&self, fact: &Fact) -> Result<Applied, FoldError> {
        let seq = fact.seq;
        let kind = fact.body.kind();
        let expected = Seq(self.facts.len() as u64 + 1);
        if seq < expected {
            // seq 0 never exists; any other earlier seq is a repeat that must match exactly.
            return match seq
                .0
                .checked_sub(1)
                .and_then(|i| self.facts.get(i as usize))
            {
                Some(existing) if existing == fact => Ok(Applied::Duplicate),
                Some(existing) => Err(FoldError::ConflictingDuplicate {
                    seq,
                    kind,
                    existing: existing.body.kind(),
                }),
                None => Err(FoldError::FirstNotMeta { seq, kind }),
            };
        }
        if self.facts.is_empty() {
            return match (&fact.body, seq) {
                (FactBody::Meta(_), Seq(1)) => Ok(Applied::Appended),
                _ => Err(FoldError::FirstNotMeta { seq, kind }),
            };
        }
        if seq > expected {
            return Err(FoldError::Gap {
                seq,
                expected,
                kind,
            });
        }
        if let Some(index) = self.terminal {
            return Err(FoldError::AfterTerminal {
                seq,
                kind,
                terminal_seq: self.facts[index].seq,
            });
        }
        let while_parked = |parked: &Parked| FoldError::WhileParked {
            seq,
            kind,
            waiting_for: describe(parked),
        };
        match &fact.body {
            FactBody::Meta(_) => return Err(FoldError::MetaNotFirst { seq }),
            FactBody::Terminal(_) => {}
            FactBody::UserMessage(_) | FactBody::ModelTurn(_) => {
                if let Some(parked) = &self.parked {
                    return Err(while_parked(parked));
                }
                if !self.pending.is_empty() {
                    return Err(FoldError::ToolCallsPending {
                        seq,
                        kind,
                        pending: self.pending_iter().map(|(c, _)| c.id.0.clone()).collect(),
                    });
                }
                if let FactBody::ModelTurn(turn) = &fact.body {
                    for (i, call) in turn.tool_calls.iter().enumerate() {
                        if turn.tool_calls[..i].iter().any(|c| c.id == call.id) {
                            return Err(FoldError::DuplicateCallId {
                                seq,
                                call_id: call.id.clone(),
                            });
                        }
                    }
                }
            }
            FactBody::ToolResult(result) => {
                if let Some(parked) = &self.parked {
                    return Err(while_parked(parked));
                }
                self.pending_call(seq, kind, &result.call_id)?;
            }
            FactBody::ConfirmationRequested(request) => {
                if let Some(parked) = &self.parked {
                    return Err(while_parked(parked));
                }
                let (_, confirmation) = self.pending_call(seq, kind, &request.call_id)?;
                if confirmation != Confirmation::NotRequested {
                    return Err(FoldError::ConfirmationRepeated {
                        seq,
                        call_id: request.call_id.clone(),
                    });
                }
            }
            FactBody::QuestionAsked(_) => {
                if let Some(parked) = &self.parked {
                    return Err(while_parked(parked));
                }
            }
            FactBody::ConfirmationAnswered(answer) => match &self.parked {
                Some(Parked::Confirmation { call_id, .. }) if *call_id == answer.call_id => {}
                other => return Err(unexpected_answer(seq, kind, other.as_ref())),
            },
            FactBody::QuestionAnswered(answer) => match &self.parked {
                Some(Parked::Question { question_id, .. })
                    if *question_id == answer.question_id => {}
                other => return Err(unexpected_answer(seq, kind, other.as_ref())),
            },
        }
        Ok(Applied::Appended)
    }

    /// Finds a pending call, telling an answered call apart from one that never existed.
    fn pending_call(
        &self,
        seq: Seq,
        kind: &'static str,
        call_id: &CallId,
    ) -> Result<(&ToolCall, Confirmation), FoldError> {
        if let Some(found) = self.pending_iter().find(|(call, _)| call.id == *call_id) {
            return Ok(found);
        }
        let made_by_last_turn = self.last_turn_calls().iter().any(|c| c.id == *call_id);
        Err(if made_by_last_turn && kind == "tool.result" {
            FoldError::AlreadyAnswered {
                seq,
                call_id: call_id.clone(),
            }
        } else {
            FoldError::UnknownCall {
                seq,
                kind,
                call_id: call_id.clone(),
            }
        })
    }

    /// The tool calls of the last model turn (empty before the first).
    fn last_turn_calls(&self) -> &[ToolCall] {
        match self.last_turn.map(|i| &self.facts[i].body) {
            Some(FactBody::ModelTurn(turn)) => &turn.tool_calls,
            _ => &[],
        }
    }

    /// Pending calls with their confirmation status, in the order the model made them.
    fn pending_iter(&self) -> impl Iterator<Item = (&ToolCall, Confirmation)> {
        let calls = self.last_turn_calls();
        self.pending
            .iter()
            .map(move |&(i, status)| (&calls[i], status))
    }

    /// Updates counters and derived state for a fact that passed [`Self::check`].
    fn absorb(&mut self, fact: &Fact) {
        match &fact.body {
            FactBody::Meta(_) => {}
            FactBody::UserMessage(_) => {
                self.has_prompt = true;
                self.awaiting_model = true;
            }
            FactBody::ModelTurn(turn) => {
                let counters = &mut self.counters;
                counters.model_turns += 1;
                counters.input_tokens += turn.usage.input_tokens;
                counters.output_tokens += turn.usage.output_tokens;
                counters.tool_calls += turn.tool_calls.len() as u64;
                if !turn.tool_calls.is_empty() {
                    counters.tool_rounds += 1;
                }
                self.last_turn = Some(self.facts.len());
                self.pending.clear();
                self.pending
                    .extend((0..turn.tool_calls.len()).map(|i| (i, Confirmation::NotRequested)));
                // A turn with tool calls waits for their results; one without is a final answer.
                self.awaiting_model = false;
            }
            FactBody::ToolResult(result) => {
                self.counters.tool_results += 1;
                if result.is_error {
                    self.counters.tool_errors += 1;
                }
                let calls = match self.last_turn.map(|i| &self.facts[i].body) {
                    Some(FactBody::ModelTurn(turn)) => &turn.tool_calls[..],
                    _ => &[],
                };
                self.pending.retain(|&(i, _)| calls[i].id != result.call_id);
                if self.pending.is_empty() {
                    self.awaiting_model = true;
                }
            }
            FactBody::ConfirmationRequested(request) => {
                self.set_confirmation(&request.call_id, Confirmation::Requested);
                self.parked = Some(Parked::Confirmation {
                    call_id: request.call_id.clone(),
                    prompt: request.prompt.clone(),
                });
            }
            FactBody::ConfirmationAnswered(answer) => {
                let decision = if answer.approved {
                    Confirmation::Approved
                } else {
                    Confirmation::Denied
                };
                self.set_confirmation(&answer.call_id, decision);
                self.parked = None;
            }
            FactBody::QuestionAsked(question) => {
                self.parked = Some(Parked::Question {
                    question_id: question.question_id.clone(),
                    text: question.text.clone(),
                });
            }
            FactBody::QuestionAnswered(_) => {
                self.parked = None;
                self.has_prompt = true;
                if self.pending.is_empty() {
                    self.awaiting_model = true;
                }
            }
            FactBody::Terminal(_) => self.terminal = Some(self.facts.len()),
        }
    }

    fn set_confirmation(&mut self, call_id: &CallId, confirmation: Confirmation) {
        let calls = match self.last_turn.map(|i| &self.facts[i].body) {
            Some(FactBody::ModelTurn(turn)) => &turn.tool_calls[..],
            _ => &[],
        };
        if let Some(pending) = self
            .pending
            .iter_mut()
            .find(|(i, _)| calls[*i].id == *call_id)
        {
            pending.1 = confirmation;
        }
    }

    /// What the run does next. Decided from facts alone.
    pub fn next_step(&self) -> Step {
        if let Some(terminal) = self.terminal() {
            return Step::Done {
                terminal: terminal.clone(),
            };
        }
        if let Some(parked) = &self.parked {
            return Step::Parked {
                parked: parked.clone(),
            };
        }
        if !self.pending.is_empty() {
            return Step::RunTools {
                calls: self.pending_calls(),
            };
        }
        if !self.has_prompt {
            return Step::WaitForInput;
        }
        if !self.awaiting_model {
            return Step::Finish {
                outcome: Outcome::Completed,
                reason: "the model gave its final answer".into(),
            };
        }
        let budgets = self
            .meta()
            .map(|m| m.fingerprint.budgets)
            .unwrap_or_default();
        let counters = &self.counters;
        if let Some(max) = budgets.max_iterations
            && counters.model_turns >= max
        {
            return Step::Finish {
                outcome: Outcome::Budget,
                reason: format!("iteration budget of {max} model turns is used up"),
            };
        }
        let tokens = counters.input_tokens + counters.output_tokens;
        if let Some(max) = budgets.max_tokens
            && tokens >= max
        {
            return Step::Finish {
                outcome: Outcome::Budget,
                reason: format!("token budget of {max} is used up ({tokens} spent)"),
            };
        }
        Step::CallModel {
            iteration: self.next_iteration(),
            with_tools: budgets
                .max_tool_rounds
                .is_none_or(|max| counters.tool_rounds < max),
        }
    }

    /// The iteration number of the next model call (1 for the first).
    pub fn next_iteration(&self) -> u64 {
        self.counters.model_turns + 1
    }

    /// The run's counters, derived from its facts.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Every fact folded so far, in seq order.
    pub fn facts(&self) -> &[Fact] {
        &self.facts
    }

    /// The folded facts, in seq order, without the state derived from them.
    pub fn into_facts(self) -> Vec<Fact> {
        self.facts
    }

    /// The seq of the last fact folded (0 before the first).
    pub fn last_seq(&self) -> Seq {
        Seq(self.facts.len() as u64)
    }

    /// The run's meta fact, once folded.
    pub fn meta(&self) -> Option<&Meta> {
        match self.facts.first().map(|f| &f.body) {
            Some(FactBody::Meta(meta)) => Some(meta),
            _ => None,
        }
    }

    /// The run's ID, from its meta fact.
    pub fn run_id(&self) -> Option<&RunId> {
        self.meta().map(|m| &m.run_id)
    }

    /// The run's session, from its meta fact, if it has one.
    pub fn session_id(&self) -> Option<&SessionId> {
        self.meta().and_then(|m| m.session_id.as_ref())
    }

    /// Tool calls of the last model turn without a result: what a recovery would run again.
    pub fn pending_calls(&self) -> Vec<PendingCall> {
        self.pending_iter()
            .map(|(call, confirmation)| PendingCall {
                call: call.clone(),
                confirmation,
            })
            .collect()
    }

    /// What the run waits for, while it is parked.
    pub fn parked(&self) -> Option<&Parked> {
        self.parked.as_ref()
    }

    /// The run's terminal fact, once the run has ended.
    pub fn terminal(&self) -> Option<&Terminal> {
        match self.terminal.map(|i| &self.facts[i].body) {
            Some(FactBody::Terminal(terminal)) => Some(terminal),
            _ => None,
        }
    }

    /// The committed conversation, in order, as the model will be shown it.
    pub fn messages(&self) -> impl Iterator<Item = Message<'_>> {
        self.facts.iter().filter_map(|fact| match &fact.body {
            FactBody::UserMessage(m) => Some(Message::User(&m.content)),
            FactBody::QuestionAnswered(a) => Some(Message::User(&a.text)),
            FactBody::ModelTurn(turn) => Some(Message::Assistant(turn)),
            FactBody::ToolResult(r) => Some(Message::Tool {
                call_id: &r.call_id,
                output: &r.output,
                is_error: r.is_error,
            }),
            _ => None,
        })
    }

    /// A serializable overview for `rekindle fold` and `rekindle runs show`.
    pub fn summary(&self) -> Summary {
        Summary {
            run_id: self.run_id().cloned(),
            session_id: self.session_id().cloned(),
            facts: self.facts.len() as u64,
            last_seq: self.last_seq(),
            last_at_ms: self.facts.last().map(|f| f.at_ms),
            next_iteration: self.next_iteration(),
            counters: self.counters,
            next_step: self.next_step(),
            pending_calls: self.pending_calls(),
            parked: self.parked.clone(),
            terminal: self.terminal().cloned(),
        }
    }
}

/// One entry of the conversation, borrowed from the facts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Message<'a> {
    /// A user message, or a human's answer to a question the run asked.
    User(&'a str),
    /// A model turn.
    Assistant(&'a ModelTurn),
    /// A tool result.
    Tool {
        /// The call the result answers.
        call_id: &'a CallId,
        /// What the tool returned.
        output: &'a str,
        /// Whether the call failed or was denied.
        is_error: bool,
    },
}

/// An overview of a run's folded state, for `rekindle fold` and `rekindle runs show`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The run's ID, once its meta fact is folded.
    pub run_id: Option<RunId>,
    /// The run's session, if it has one.
    pub session_id: Option<SessionId>,
    /// How many facts were folded.
    pub facts: u64,
    /// The seq of the last fact folded.
    pub last_seq: Seq,
    /// The time the host recorded for the last fact, if any.
    pub last_at_ms: Option<u64>,
    /// The iteration number of the next model call.
    pub next_iteration: u64,
    /// The run's counters.
    pub counters: Counters,
    /// What the run does next.
    pub next_step: Step,
    /// Tool calls of the last model turn without a result.
    pub pending_calls: Vec<PendingCall>,
    /// What the run waits for, while it is parked.
    pub parked: Option<Parked>,
    /// The run's terminal fact, once it has ended.
    pub terminal: Option<Terminal>,
}

fn describe(parked: &Parked) -> String {
    match parked {
        Parked::Confirmation { call_id, .. } => format!("confirmation of call '{call_id}'"),
        Parked::Question { question_id, .. } => format!("an answer to question '{question_id}'"),
    }
}

fn unexpected_answer(seq: Seq, kind: &'static str, parked: Option<&Parked>) -> FoldError {
    FoldError::UnexpectedAnswer {
        seq,
        kind,
        waiting_for: parked.map_or_else(|| "nothing".to_owned(), describe),
    }
}
