//! The `rekindle` command line: parses arguments, calls the library, prints results.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rekindle::fold::{self, Step, Summary};
use rekindle::log;

/// Rekindle recovers interrupted AI-agent runs from checkpoints in object storage.
#[derive(Parser)]
#[command(name = "rekindle", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the folded state of a local fact log: next step, pending tool calls, counters,
    /// parked or terminal state.
    ///
    /// A torn last line (a write cut short by a crash) is skipped with a note; damage
    /// anywhere else is an error naming the line. Exits 1 on any error.
    Fold {
        /// Path to a run's fact log (JSONL, one fact per line).
        path: PathBuf,
        /// Print the state as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fold { path, json } => fold_command(&path, json),
    }
}

fn fold_command(path: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let (state, torn_tail) =
        log::fold(path).with_context(|| format!("fold the fact log {}", path.display()))?;
    let summary = state.summary();
    if json {
        let mut value = serde_json::to_value(&summary).context("encode the summary")?;
        value["torn_tail_line"] = serde_json::json!(torn_tail.map(|t| t.line));
        println!("{value}");
        return Ok(());
    }
    if let Some(torn) = torn_tail {
        eprintln!(
            "note: skipped a torn last line (line {}, {} bytes), left by an interrupted write",
            torn.line, torn.bytes
        );
    }
    print!("{}", render(&summary));
    Ok(())
}

fn render(summary: &Summary) -> String {
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

fn describe_step(step: &Step) -> String {
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
        Step::Parked { parked } => match parked {
            fold::Parked::Confirmation { call_id, prompt } => {
                format!("parked: waiting for confirmation of call {call_id}: {prompt}")
            }
            fold::Parked::Question { question_id, text } => {
                format!("parked: waiting for an answer to question {question_id}: {text}")
            }
        },
        Step::Finish { outcome, reason } => format!("finish as {outcome}: {reason}"),
        Step::Done { terminal } => format!("done: {} ({})", terminal.outcome, terminal.message),
    }
}
