//! Text the `rekindle` commands print: a folded run's summary and its next step in words.

use rekindle::core::fold::{self, Step, Summary};

/// A folded run as `rekindle fold` prints it.
pub(crate) fn summary(summary: &Summary) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let run = summary.run_id.as_ref().map_or("(none)", |id| id.as_str());
    let session = summary
        .session_id
        .as_ref()
        .map_or(String::new(), |s| format!(" (session {s})"));
    let c = &summary.counters;
    let _ = writeln!(out, "run        {run}{session}");
    let _ = writeln!(
        out,
        "facts      {} (last seq {})",
        summary.facts, summary.last_seq
    );
    let _ = writeln!(out, "next step  {}", describe_step(&summary.next_step));
    let _ = writeln!(
        out,
        "counters   {} model turns, {} tool rounds, {} tool calls, {} results ({} errors)",
        c.model_turns, c.tool_rounds, c.tool_calls, c.tool_results, c.tool_errors
    );
    let _ = writeln!(
        out,
        "tokens     {} in, {} out",
        c.input_tokens, c.output_tokens
    );
    if summary.pending_calls.is_empty() {
        let _ = writeln!(out, "pending    none");
    } else {
        let _ = writeln!(
            out,
            "pending    {} tool calls:",
            summary.pending_calls.len()
        );
        for pending in &summary.pending_calls {
            let confirmation = match pending.confirmation {
                fold::Confirmation::NotRequested => "",
                fold::Confirmation::Requested => " [awaiting confirmation]",
                fold::Confirmation::Approved => " [approved]",
                fold::Confirmation::Denied => " [denied]",
            };
            let _ = writeln!(
                out,
                "  {} {} {}{confirmation}",
                pending.call.id, pending.call.name, pending.call.arguments
            );
        }
    }
    let parked = match &summary.parked {
        None => "no".to_owned(),
        Some(fold::Parked::Confirmation { call_id, .. }) => {
            format!("yes, waiting for confirmation of call {call_id}")
        }
        Some(fold::Parked::Question { question_id, .. }) => {
            format!("yes, waiting for an answer to question {question_id}")
        }
    };
    let _ = writeln!(out, "parked     {parked}");
    let terminal = summary
        .terminal
        .as_ref()
        .map_or("no (the run has not ended)".to_owned(), |t| {
            format!("{}: {}", t.outcome, t.message)
        });
    let _ = writeln!(out, "terminal   {terminal}");
    out
}

/// What a parked run waits for, in words (`rekindle run` and `runs show` print it).
pub(crate) fn describe_parked(parked: &fold::Parked) -> String {
    match parked {
        fold::Parked::Confirmation { call_id, prompt } => {
            format!("waiting for confirmation of call {call_id}: {prompt}")
        }
        fold::Parked::Question { question_id, text } => {
            format!("waiting for an answer to question {question_id}: {text}")
        }
    }
}

/// The next step in words (`fold` and `runs show` print it).
pub(crate) fn describe_step(step: &Step) -> String {
    match step {
        Step::WaitForInput => "wait for a user message".into(),
        Step::CallModel {
            iteration,
            with_tools,
        } => format!(
            "call the model (iteration {iteration}{})",
            if *with_tools {
                ""
            } else {
                ", no tools: tool-round cap reached"
            }
        ),
        Step::RunTools { calls } => format!(
            "run tools: {}",
            calls
                .iter()
                .map(|p| format!("{} ({})", p.call.id, p.call.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Step::Parked { parked } => format!("parked: {}", describe_parked(parked)),
        Step::Finish { outcome, reason } => format!("finish as {outcome}: {reason}"),
        Step::Done { terminal } => format!("done: {} ({})", terminal.outcome, terminal.message),
    }
}
