//! Text the `rekindle` commands print: a folded run's summary and its next step in words.

use rekindle::core::fact::CallId;
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

/// Seconds, for people: `12.3 s`, `4 min 5 s`, `2 h 3 min`.
pub(crate) fn duration_ms(ms: u64) -> String {
    let secs = ms / 1000;
    if secs < 60 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if secs < 3600 {
        format!("{} min {} s", secs / 60, secs % 60)
    } else {
        format!("{} h {} min", secs / 3600, (secs % 3600) / 60)
    }
}

fn liveliness(l: &rekindle::fleet::overview::Liveliness) -> String {
    match l.last_beat_ago_ms {
        Some(ago) => format!(
            "{}, last beat {} ago{}",
            l.beat.describe(),
            duration_ms(ago),
            l.ttl_ms
                .map(|ttl| format!(" (TTL {})", duration_ms(ttl)))
                .unwrap_or_default()
        ),
        None => format!("{} (no heartbeat)", l.beat.describe()),
    }
}

/// The fleet as `rekindle status` prints it.
pub(crate) fn overview(o: &rekindle::fleet::overview::Overview, now_ms: u64) -> String {
    use rekindle::fleet::overview::{Beat, RunState};
    use std::fmt::Write;
    let mut out = String::new();
    match &o.leader {
        Some(leader) => {
            // A split bucket has no leader: the lease it names is partition 0's (the owners
            // of all of them follow on the `partitions` line).
            let (role, after) = if o.partitions.is_empty() {
                (
                    "leads",
                    "a standby takes over once the leader's TTL has passed",
                )
            } else {
                (
                    "owns partition 0",
                    "another coordinator takes its partitions over once its TTL has passed",
                )
            };
            let _ = writeln!(
                out,
                "coordinator  {} {role} (epoch {}): {}",
                leader.id,
                leader.epoch,
                liveliness(&leader.liveliness)
            );
            if leader.liveliness.beat != Beat::Alive {
                let _ = writeln!(
                    out,
                    "             {after}; with none running, nothing admits or assigns"
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "coordinator  none is running: nothing admits or assigns recoveries (start rekindle-coordinator)"
            );
        }
    }
    if !o.partitions.is_empty() {
        let mut by_owner: std::collections::BTreeMap<&str, usize> = Default::default();
        let mut unowned = Vec::new();
        for (partition, owner) in o.partitions.iter().enumerate() {
            match owner {
                Some(owner) => *by_owner.entry(owner.as_str()).or_default() += 1,
                None => unowned.push(partition.to_string()),
            }
        }
        let owners: Vec<String> = by_owner
            .iter()
            .map(|(owner, n)| format!("{owner} ({n})"))
            .collect();
        let _ = write!(
            out,
            "partitions   {}, owned by {}",
            o.partitions.len(),
            if owners.is_empty() {
                "nobody".to_owned()
            } else {
                owners.join(", ")
            }
        );
        if !unowned.is_empty() {
            let _ = write!(
                out,
                "; unowned: {} (their runs wait for a coordinator)",
                unowned.join(", ")
            );
        }
        let _ = writeln!(out);
    }
    if o.workers.is_empty() {
        let _ = writeln!(out, "workers      none registered");
    } else {
        let alive = o
            .workers
            .iter()
            .filter(|w| w.liveliness.beat == Beat::Alive)
            .count();
        let _ = writeln!(out, "workers      {alive} of {} alive", o.workers.len());
        for w in &o.workers {
            let queue = match w.queue {
                0 => String::new(),
                n => format!(" + a queue of {n}"),
            };
            let draining = if w.draining {
                "; draining (stopping)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {:<36} {}; {} assigned for {}{queue}{draining}",
                w.id,
                liveliness(&w.liveliness),
                w.assigned,
                plural(u64::from(w.capacity), "slot")
            );
        }
    }
    if o.runs.is_empty() {
        let _ = writeln!(
            out,
            "runs         none in the index (nothing running, parked or recovering)"
        );
    } else {
        let mut counts = std::collections::BTreeMap::<RunState, usize>::new();
        for run in &o.runs {
            *counts.entry(run.state).or_default() += 1;
        }
        let counts: Vec<String> = counts
            .iter()
            .map(|(state, n)| format!("{n} {}", state.describe()))
            .collect();
        let _ = writeln!(out, "runs         {}", counts.join(", "));
        let oldest = o
            .runs
            .iter()
            .filter(|r| matches!(r.state, RunState::Interrupted | RunState::Suspect))
            .map(|r| r.updated_at_ms)
            .min();
        if let Some(since) = oldest {
            let _ = writeln!(
                out,
                "             oldest interrupted: last changed {} ago",
                duration_ms(now_ms.saturating_sub(since))
            );
        }
        for run in o.runs.iter().filter(|r| r.state == RunState::Suspect) {
            let _ = writeln!(
                out,
                "  {:<36} suspect: its holder's heartbeat is older than its TTL; the coordinator admits its recovery once it has watched it for that TTL",
                run.run.as_str()
            );
        }
    }
    if o.stuck.is_empty() {
        let _ = writeln!(out, "stuck        nothing");
    } else {
        let _ = writeln!(out, "stuck        {}", o.stuck.len());
        for stuck in &o.stuck {
            let _ = writeln!(out, "  {:<36} {}", stuck.run.as_str(), stuck.reason);
        }
    }
    for (key, error) in &o.unreadable {
        let _ = writeln!(out, "unreadable   {key}: {error}");
    }
    out
}

/// A run's timeline as `runs show --timeline` draws it, times relative to its first commit.
pub(crate) fn timeline(timeline: &rekindle::fleet::timeline::Timeline) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let origin = timeline.incarnations.first().map_or(0, |i| i.started_at_ms);
    let _ = writeln!(out, "timeline    (t = time since the first commit)");
    let mut walk = Some(timeline);
    while let Some(t) = walk {
        let _ = writeln!(out, "  {}", t.run);
        if t.retired {
            let _ = writeln!(out, "    retired by gc: its steps are no longer kept");
        } else if t.incarnations.is_empty() {
            let _ = writeln!(out, "    not started yet");
        }
        for i in &t.incarnations {
            let at = i.started_at_ms.saturating_sub(origin);
            let mut line = format!(
                "    epoch {:<3} t+{:<9} gen {:<4}",
                i.epoch,
                duration_ms(at),
                i.first_generation
            );
            if i.seeded > 0 {
                let _ = write!(line, " seeded with seq 1-{} from its source;", i.seeded);
            }
            if i.first_seq > i.last_seq && i.seeded > 0 {
                line.push_str(" no steps of its own yet");
            } else if i.first_seq > i.last_seq {
                line.push_str(" no steps (a fence: the run was taken over here)");
            } else {
                let _ = write!(
                    line,
                    " seq {}-{}: {}, {}",
                    i.first_seq,
                    i.last_seq,
                    plural(i.model_turns, "model turn"),
                    plural(i.tool_results, "tool result")
                );
            }
            if let Some(holder) = &i.holder {
                let _ = write!(line, "; held by {holder}");
            }
            let _ = writeln!(out, "{line}");
            if !i.in_flight_at_end.is_empty() {
                let calls: Vec<String> = i
                    .in_flight_at_end
                    .iter()
                    .map(|(id, name)| format!("{id} ({name})"))
                    .collect();
                let _ = writeln!(
                    out,
                    "              interrupted; {} may have been running",
                    calls.join(", ")
                );
            }
        }
        if let Some(terminal) = &t.ended {
            let _ = writeln!(
                out,
                "    ended: {} ({})",
                terminal.outcome, terminal.message
            );
        }
        if let Some((id, _)) = &t.recovered_by {
            let _ = writeln!(out, "    continued by recovery {id}:");
        }
        walk = t.recovered_by.as_ref().map(|(_, next)| next.as_ref());
    }
    if timeline.ran_again.is_empty() {
        let _ = writeln!(out, "  no tool call ran more than once");
    } else {
        // A call in flight at k interruptions may have run k + 1 times.
        let mut in_flight: Vec<&CallId> = Vec::new();
        let mut walk = Some(timeline);
        while let Some(t) = walk {
            for i in &t.incarnations {
                in_flight.extend(i.in_flight_at_end.iter().map(|(id, _)| id));
            }
            walk = t.recovered_by.as_ref().map(|(_, next)| next.as_ref());
        }
        let calls: Vec<String> = timeline
            .ran_again
            .iter()
            .map(|(id, name)| {
                let runs = 1 + in_flight.iter().filter(|c| **c == id).count();
                if runs > 2 {
                    format!("{id} ({name}, up to {runs} times)")
                } else {
                    format!("{id} ({name})")
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "  may have run more than once (in flight at an interruption, run again after it): {}",
            calls.join(", ")
        );
    }
    out
}

/// `1 model turn`, `2 model turns`.
pub(crate) fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}
