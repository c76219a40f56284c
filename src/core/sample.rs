//! Deterministic sample runs: valid fact sequences of any length, for tests, benchmarks and
//! the shipped sample log.
//!
//! A run is built by asking the fold what the run does next and recording a plausible fact
//! for that step, so every generated sequence is valid by construction. The choices come from
//! a caller-supplied source (a seeded generator, or a property test's input), and time and IDs
//! are derived from the seq, so the same choices always give the same bytes. Never does I/O.

use crate::core::fact::{
    CallId, ConfirmationAnswered, ConfirmationRequested, Fact, FactBody, Meta, ModelTurn, Outcome,
    QuestionAnswered, QuestionAsked, QuestionId, RunId, Seq, SessionId, Terminal, ToolCall,
    ToolResult, Usage, UserMessage,
};
use crate::core::fingerprint::{Budgets, Fingerprint, ToolSpec};
use crate::core::fold::{Confirmation, RunState, Step};
use crate::core::rng::SplitMix;

const START_MS: u64 = 1_764_400_000_000;
const TOOLS: [&str; 3] = ["shell", "read_file", "search"];

/// The fingerprint of the sample configuration.
pub fn fingerprint() -> Fingerprint {
    let schema = serde_json::json!({"type": "object", "properties": {"input": {"type": "string"}}});
    let tools: Vec<ToolSpec<'_>> = TOOLS
        .iter()
        .map(|name| ToolSpec {
            name,
            schema: &schema,
        })
        .collect();
    Fingerprint::new(
        "sample-model",
        "You are a careful assistant.",
        &tools,
        None,
        Budgets::default(),
    )
}

/// A complete run of about `facts` facts (at least 5), ending in a terminal fact.
pub fn run(run_id: &str, facts: usize, seed: u64) -> Vec<Fact> {
    let mut random = SplitMix::new(seed);
    let mut builder = Builder::new(run_id);
    while builder.len() + 3 < facts.max(5) {
        builder.step(&mut |bound| random.below(bound), true);
    }
    builder.finish(&mut |bound| random.below(bound));
    builder.into_facts()
}

/// Builds a valid run one step at a time.
pub struct Builder {
    state: RunState,
    next_call: u64,
    next_question: u64,
}

impl Builder {
    /// Starts a run: its meta fact and the user's prompt.
    pub fn new(run_id: &str) -> Self {
        let mut builder = Builder {
            state: RunState::default(),
            next_call: 1,
            next_question: 1,
        };
        builder.push(FactBody::Meta(Box::new(Meta {
            run_id: RunId::new(run_id),
            session_id: Some(SessionId::new("sample-session")),
            fingerprint: fingerprint(),
        })));
        builder.push(FactBody::UserMessage(UserMessage {
            content: "Find the failing test in the repository, fix it, and explain the fix.".into(),
        }));
        builder
    }

    /// How many facts the run has so far.
    pub fn len(&self) -> usize {
        self.state.facts().len()
    }

    /// Whether the run has no facts yet.
    pub fn is_empty(&self) -> bool {
        self.state.facts().is_empty()
    }

    /// The fold of the facts recorded so far.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// The run's facts, in seq order.
    pub fn into_facts(self) -> Vec<Fact> {
        self.state.into_facts()
    }

    /// Records one plausible fact for the run's next step. `choose(n)` returns a number below
    /// `n`. With `keep_going`, model turns always call tools, so the run does not end.
    /// Returns false once the run has ended.
    pub fn step(&mut self, choose: &mut dyn FnMut(u32) -> u32, keep_going: bool) -> bool {
        let body = match self.state.next_step() {
            Step::Done { .. } => return false,
            Step::WaitForInput => FactBody::UserMessage(UserMessage {
                content: "Please continue.".into(),
            }),
            Step::CallModel { iteration, .. } => {
                let calls = if keep_going { 1 + choose(3) } else { choose(3) };
                self.model_turn(iteration, calls)
            }
            Step::Finish { outcome, reason } => FactBody::Terminal(Terminal {
                outcome,
                message: reason,
            }),
            Step::Parked { parked } => match parked {
                crate::core::fold::Parked::Confirmation { call_id, .. } => {
                    FactBody::ConfirmationAnswered(ConfirmationAnswered {
                        call_id,
                        approved: choose(4) != 0,
                        note: None,
                    })
                }
                crate::core::fold::Parked::Question { question_id, .. } => {
                    FactBody::QuestionAnswered(QuestionAnswered {
                        question_id,
                        text: "Yes, the integration tests too.".into(),
                    })
                }
            },
            Step::RunTools { calls } => {
                let pending = &calls[0];
                match (pending.confirmation, choose(20)) {
                    (Confirmation::NotRequested, 0) => {
                        FactBody::ConfirmationRequested(ConfirmationRequested {
                            call_id: pending.call.id.clone(),
                            prompt: format!("Allow `{}` to run?", pending.call.name),
                        })
                    }
                    (_, 1) => {
                        let id = self.next_question;
                        self.next_question += 1;
                        FactBody::QuestionAsked(QuestionAsked {
                            question_id: QuestionId::new(format!("q{id}")),
                            text: "Should I also run the integration tests?".into(),
                        })
                    }
                    (confirmation, roll) => {
                        let denied = confirmation == Confirmation::Denied;
                        FactBody::ToolResult(ToolResult {
                            call_id: pending.call.id.clone(),
                            output: if denied {
                                "denied by the user".into()
                            } else {
                                format!(
                                    "test result: FAILED. 41 passed; 1 failed; finished in 0.{roll:02}s\n\
                                     failures:\n    parser::tests::rejects_torn_tail (line {})",
                                    100 + roll
                                )
                            },
                            is_error: denied || roll == 2,
                            duration_ms: 40 + u64::from(roll),
                        })
                    }
                }
            }
        };
        self.push(body);
        true
    }

    /// Drives the run to its end: pending work is finished, then a final answer and terminal.
    pub fn finish(&mut self, choose: &mut dyn FnMut(u32) -> u32) {
        while let Step::RunTools { .. } | Step::Parked { .. } = self.state.next_step() {
            self.step(choose, false);
        }
        if let Step::CallModel { iteration, .. } = self.state.next_step() {
            let body = self.model_turn(iteration, 0);
            self.push(body);
        }
        while self.step(choose, false) {}
    }

    fn model_turn(&mut self, iteration: u64, calls: u32) -> FactBody {
        let tool_calls = (0..calls)
            .map(|i| {
                let id = self.next_call;
                self.next_call += 1;
                let name = TOOLS[(id as usize + i as usize) % TOOLS.len()];
                ToolCall {
                    id: CallId::new(format!("call_{id}")),
                    name: name.to_owned(),
                    arguments: format!(r#"{{"input":"cargo test --package parser -- {id}"}}"#),
                }
            })
            .collect::<Vec<_>>();
        let content = if tool_calls.is_empty() {
            "The failing test expected a torn tail to be an error; the log now tolerates exactly one torn last line, as documented. All tests pass.".to_owned()
        } else {
            format!(
                "Iteration {iteration}: I will run the tests and read the failing module to see why the parser rejects the input."
            )
        };
        FactBody::ModelTurn(ModelTurn {
            content: Some(content),
            tool_calls,
            reasoning: None,
            usage: Usage {
                input_tokens: 900 + iteration * 40,
                output_tokens: 60 + u64::from(calls) * 25,
            },
        })
    }

    fn push(&mut self, body: FactBody) {
        let seq = self.len() as u64 + 1;
        let fact = Fact {
            seq: Seq(seq),
            at_ms: START_MS + seq * 137,
            body,
        };
        // The builder only ever records the step the fold asked for.
        if let Err(error) = self.state.apply(fact) {
            panic!("sample builder produced an invalid fact: {error}");
        }
    }
}

/// The terminal fact's outcome of a finished sample run, for assertions.
pub fn outcome(facts: &[Fact]) -> Option<Outcome> {
    facts.iter().rev().find_map(|fact| match &fact.body {
        FactBody::Terminal(terminal) => Some(terminal.outcome),
        _ => None,
    })
}
