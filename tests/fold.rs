//! Fold rules and properties: incremental equals from-scratch, every prefix folds, counters
//! derive only from facts, and each rule violation is refused without changing the state.

use proptest::prelude::*;
use rekindle::core::fact::*;
use rekindle::core::fingerprint::Budgets;
use rekindle::core::fold::{Applied, Confirmation, FoldError, Parked, RunState, Step, fold};
use rekindle::core::sample::{self, Builder};

/// A valid run whose shape is decided by `choices` (consumed in order, then zeros).
fn valid_run(choices: &[u32]) -> Vec<Fact> {
    let mut builder = Builder::new("prop-run");
    let mut next = 0;
    let mut choose = |bound: u32| {
        let choice = choices.get(next).copied().unwrap_or(0);
        next += 1;
        choice % bound.max(1)
    };
    for &choice in choices {
        let keep_going = !choice.is_multiple_of(5);
        if !builder.step(&mut choose, keep_going) {
            break;
        }
    }
    if choices.first().is_some_and(|c| c.is_multiple_of(2)) {
        builder.finish(&mut choose);
    }
    builder.into_facts()
}

/// Counts what the counters should say straight from the facts, independently of the fold.
fn recount(facts: &[Fact]) -> (u64, u64, u64, u64, u64, u64) {
    let (mut turns, mut rounds, mut calls, mut results, mut tokens_in, mut tokens_out) =
        (0, 0, 0, 0, 0, 0);
    for fact in facts {
        match &fact.body {
            FactBody::ModelTurn(turn) => {
                turns += 1;
                rounds += u64::from(!turn.tool_calls.is_empty());
                calls += turn.tool_calls.len() as u64;
                tokens_in += turn.usage.input_tokens;
                tokens_out += turn.usage.output_tokens;
            }
            FactBody::ToolResult(_) => results += 1,
            _ => {}
        }
    }
    (turns, rounds, calls, results, tokens_in, tokens_out)
}

proptest! {
    // Proves folding a prefix and then applying the rest equals folding the whole log.
    #[test]
    fn prefix_then_rest_equals_whole(choices in prop::collection::vec(any::<u32>(), 1..120), cut in any::<prop::sample::Index>()) {
        let facts = valid_run(&choices);
        let split = cut.index(facts.len() + 1);
        let mut incremental = fold(facts[..split].to_vec()).unwrap();
        for fact in facts[split..].iter().cloned() {
            prop_assert_eq!(incremental.apply(fact).unwrap(), Applied::Appended);
        }
        let whole = fold(facts.clone()).unwrap();
        prop_assert_eq!(&incremental, &whole);
        prop_assert_eq!(incremental.next_step(), whole.next_step());
    }

    // Proves every prefix of a valid log folds, and counters always match a recount.
    #[test]
    fn every_prefix_folds_and_counters_never_drift(choices in prop::collection::vec(any::<u32>(), 1..80)) {
        let facts = valid_run(&choices);
        for end in 1..=facts.len() {
            let state = fold(facts[..end].to_vec()).unwrap();
            let c = state.counters();
            prop_assert_eq!(
                (c.model_turns, c.tool_rounds, c.tool_calls, c.tool_results, c.input_tokens, c.output_tokens),
                recount(&facts[..end])
            );
            prop_assert_eq!(state.next_iteration(), c.model_turns + 1);
            prop_assert_eq!(state.last_seq(), Seq(end as u64));
        }
    }

    // Proves re-applying any already-folded fact is an idempotent no-op.
    #[test]
    fn repeated_facts_are_no_ops(choices in prop::collection::vec(any::<u32>(), 1..60), pick in any::<prop::sample::Index>()) {
        let facts = valid_run(&choices);
        let mut state = fold(facts.clone()).unwrap();
        let before = state.clone();
        let repeat = facts[pick.index(facts.len())].clone();
        prop_assert_eq!(state.apply(repeat).unwrap(), Applied::Duplicate);
        prop_assert_eq!(state, before);
    }

    // Proves a fact whose seq repeats with different content is refused and changes nothing.
    #[test]
    fn conflicting_repeats_are_refused(choices in prop::collection::vec(any::<u32>(), 1..60), pick in any::<prop::sample::Index>()) {
        let facts = valid_run(&choices);
        let mut state = fold(facts.clone()).unwrap();
        let before = state.clone();
        let mut changed = facts[pick.index(facts.len())].clone();
        changed.at_ms += 1;
        let is_conflict = matches!(state.apply(changed), Err(FoldError::ConflictingDuplicate { .. }));
        prop_assert!(is_conflict);
        prop_assert_eq!(state, before);
    }
}

fn meta(budgets: Budgets) -> Fact {
    let mut fingerprint = sample::fingerprint();
    fingerprint.budgets = budgets;
    fact(
        1,
        FactBody::Meta(Box::new(Meta {
            run_id: RunId::new("r-1"),
            session_id: None,
            fingerprint,
        })),
    )
}

fn fact(seq: u64, body: FactBody) -> Fact {
    Fact {
        seq: Seq(seq),
        at_ms: 1000 + seq,
        body,
    }
}

fn user(seq: u64) -> Fact {
    fact(
        seq,
        FactBody::UserMessage(UserMessage {
            content: "go".into(),
        }),
    )
}

fn turn(seq: u64, calls: &[&str], tokens: u64) -> Fact {
    fact(
        seq,
        FactBody::ModelTurn(ModelTurn {
            content: Some("thinking".into()),
            tool_calls: calls
                .iter()
                .map(|id| ToolCall {
                    id: CallId::new(*id),
                    name: "shell".into(),
                    arguments: "{}".into(),
                })
                .collect(),
            reasoning: None,
            usage: Usage {
                input_tokens: tokens,
                output_tokens: tokens,
            },
        }),
    )
}

fn result(seq: u64, call: &str) -> Fact {
    fact(
        seq,
        FactBody::ToolResult(ToolResult {
            call_id: CallId::new(call),
            output: "ok".into(),
            is_error: false,
            duration_ms: 1,
        }),
    )
}

fn terminal(seq: u64) -> Fact {
    fact(
        seq,
        FactBody::Terminal(Terminal {
            outcome: Outcome::Completed,
            message: "done".into(),
        }),
    )
}

/// Folds `facts`, then asserts `last` is refused and leaves the state unchanged.
fn refused(facts: Vec<Fact>, last: Fact) -> FoldError {
    let mut state = fold(facts).unwrap();
    let before = state.clone();
    let error = state.apply(last).unwrap_err();
    assert_eq!(state, before, "a refused fact must not change the state");
    error
}

// Proves the first fact must be meta with seq 1.
#[test]
fn first_fact_must_be_meta() {
    let error = fold(vec![user(1)]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "fact seq 1 (user.message): the first fact of a run must be meta with seq 1"
    );
    let mut late_meta = meta(Budgets::default());
    late_meta.seq = Seq(2);
    assert!(matches!(
        fold(vec![late_meta]),
        Err(FoldError::FirstNotMeta { .. })
    ));
    assert!(matches!(
        refused(vec![meta(Budgets::default())], {
            let mut again = meta(Budgets::default());
            again.seq = Seq(2);
            again
        }),
        FoldError::MetaNotFirst { .. }
    ));
}

// Proves a gap in seq is refused, naming the missing range.
#[test]
fn gaps_are_refused() {
    let error = refused(vec![meta(Budgets::default()), user(2)], turn(5, &[], 1));
    assert_eq!(
        error.to_string(),
        "fact seq 5 (model.turn): expected seq 3, facts 3..4 are missing"
    );
}

// Proves a tool result must answer a pending call of the last turn, exactly once.
#[test]
fn tool_results_must_answer_pending_calls() {
    let base = vec![meta(Budgets::default()), user(2), turn(3, &["a", "b"], 1)];
    assert!(matches!(
        refused(base.clone(), result(4, "zzz")),
        FoldError::UnknownCall { .. }
    ));
    let mut with_a = base.clone();
    with_a.push(result(4, "a"));
    let error = refused(with_a, result(5, "a"));
    assert_eq!(
        error.to_string(),
        "fact seq 5 (tool.result): call 'a' already has a result"
    );
}

// Proves the model cannot be called again while tool calls wait for results.
#[test]
fn model_turn_waits_for_pending_results() {
    let base = vec![
        meta(Budgets::default()),
        user(2),
        turn(3, &["a", "b"], 1),
        result(4, "b"),
    ];
    let error = refused(base.clone(), turn(5, &[], 1));
    assert_eq!(
        error.to_string(),
        "fact seq 5 (model.turn): tool calls a of the last model turn have no result yet"
    );
    let state = fold(base).unwrap();
    match state.next_step() {
        Step::RunTools { calls } => {
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].call.id, CallId::new("a"));
        }
        other => panic!("expected RunTools, got {other:?}"),
    }
}

// Proves a turn naming the same call id twice is refused.
#[test]
fn duplicate_call_ids_in_a_turn_are_refused() {
    assert!(matches!(
        refused(
            vec![meta(Budgets::default()), user(2)],
            turn(3, &["a", "a"], 1)
        ),
        FoldError::DuplicateCallId { .. }
    ));
}

// Proves nothing may follow a terminal fact, though repeating the terminal itself is a no-op.
#[test]
fn nothing_after_terminal() {
    let base = vec![
        meta(Budgets::default()),
        user(2),
        turn(3, &[], 1),
        terminal(4),
    ];
    let error = refused(base.clone(), user(5));
    assert_eq!(
        error.to_string(),
        "fact seq 5 (user.message): the run already ended at seq 4"
    );
    let mut state = fold(base).unwrap();
    assert_eq!(state.apply(terminal(4)).unwrap(), Applied::Duplicate);
    assert!(matches!(state.next_step(), Step::Done { .. }));
}

// Proves a parked run takes no step until its answer fact exists (invariant 6).
#[test]
fn parked_run_takes_no_step_until_answered() {
    let ask = fact(
        5,
        FactBody::ConfirmationRequested(ConfirmationRequested {
            call_id: CallId::new("a"),
            prompt: "rm -rf build?".into(),
        }),
    );
    let base = vec![
        meta(Budgets::default()),
        user(2),
        turn(3, &["a", "b"], 1),
        result(4, "b"),
        ask,
    ];
    let state = fold(base.clone()).unwrap();
    assert!(matches!(
        state.next_step(),
        Step::Parked {
            parked: Parked::Confirmation { .. }
        }
    ));
    let error = refused(base.clone(), result(6, "a"));
    assert_eq!(
        error.to_string(),
        "fact seq 6 (tool.result): the run is parked waiting for confirmation of call 'a'"
    );
    assert!(matches!(
        refused(
            base.clone(),
            fact(
                6,
                FactBody::QuestionAnswered(QuestionAnswered {
                    question_id: QuestionId::new("q"),
                    text: "?".into()
                })
            )
        ),
        FoldError::UnexpectedAnswer { .. }
    ));
    let mut answered = fold(base).unwrap();
    answered
        .apply(fact(
            6,
            FactBody::ConfirmationAnswered(ConfirmationAnswered {
                call_id: CallId::new("a"),
                approved: false,
                note: None,
            }),
        ))
        .unwrap();
    match answered.next_step() {
        Step::RunTools { calls } => assert_eq!(calls[0].confirmation, Confirmation::Denied),
        other => panic!("expected RunTools, got {other:?}"),
    }
}

// Proves a question parks the run and its answer joins the conversation.
#[test]
fn question_parks_and_answer_resumes() {
    let mut state = fold(vec![meta(Budgets::default()), user(2), turn(3, &[], 1)]).unwrap();
    state
        .apply(fact(
            4,
            FactBody::QuestionAsked(QuestionAsked {
                question_id: QuestionId::new("q1"),
                text: "which branch?".into(),
            }),
        ))
        .unwrap();
    assert!(matches!(state.next_step(), Step::Parked { .. }));
    assert!(matches!(
        state.clone().apply(turn(5, &[], 1)),
        Err(FoldError::WhileParked { .. })
    ));
    state
        .apply(fact(
            5,
            FactBody::QuestionAnswered(QuestionAnswered {
                question_id: QuestionId::new("q1"),
                text: "main".into(),
            }),
        ))
        .unwrap();
    assert_eq!(
        state.next_step(),
        Step::CallModel {
            iteration: 2,
            with_tools: true
        }
    );
    assert_eq!(state.messages().count(), 3);
}

// Proves the tool-round cap makes the next model call tool-less, and budgets end the run.
#[test]
fn tool_round_cap_and_budgets() {
    let capped = Budgets {
        max_tool_rounds: Some(1),
        ..Budgets::default()
    };
    let state = fold(vec![
        meta(capped),
        user(2),
        turn(3, &["a"], 1),
        result(4, "a"),
    ])
    .unwrap();
    assert_eq!(
        state.next_step(),
        Step::CallModel {
            iteration: 2,
            with_tools: false
        }
    );

    let iterations = Budgets {
        max_iterations: Some(1),
        ..Budgets::default()
    };
    let state = fold(vec![
        meta(iterations),
        user(2),
        turn(3, &["a"], 1),
        result(4, "a"),
    ])
    .unwrap();
    assert!(matches!(
        state.next_step(),
        Step::Finish {
            outcome: Outcome::Budget,
            ..
        }
    ));

    let tokens = Budgets {
        max_tokens: Some(100),
        ..Budgets::default()
    };
    let state = fold(vec![
        meta(tokens),
        user(2),
        turn(3, &["a"], 50),
        result(4, "a"),
    ])
    .unwrap();
    match state.next_step() {
        Step::Finish { outcome, reason } => {
            assert_eq!(outcome, Outcome::Budget);
            assert_eq!(reason, "token budget of 100 is used up (100 spent)");
        }
        other => panic!("expected Finish, got {other:?}"),
    }
}

// Proves the step sequence of a run: wait for input, call model, finish after a final answer.
#[test]
fn next_step_follows_the_run() {
    let mut state = RunState::default();
    state.apply(meta(Budgets::default())).unwrap();
    assert_eq!(state.next_step(), Step::WaitForInput);
    state.apply(user(2)).unwrap();
    assert_eq!(
        state.next_step(),
        Step::CallModel {
            iteration: 1,
            with_tools: true
        }
    );
    state.apply(turn(3, &[], 7)).unwrap();
    assert!(matches!(
        state.next_step(),
        Step::Finish {
            outcome: Outcome::Completed,
            ..
        }
    ));
    state.apply(terminal(4)).unwrap();
    assert!(matches!(state.next_step(), Step::Done { .. }));
    assert_eq!(state.counters().input_tokens, 7);
}

// Proves generated sample runs of many shapes end in a terminal fact when finished.
#[test]
fn sample_runs_finish() {
    for seed in 0..50 {
        let facts = sample::run("s", 40, seed);
        assert_eq!(sample::outcome(&facts), Some(Outcome::Completed));
        assert!(fold(facts).is_ok());
    }
}
