//! The JSON the packages return: a run's folded state, how a driven run stopped, a worker's
//! counts and a store's requests. One shape for every language, in snake_case; a package may
//! rename the keys into its own idiom.

use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use crate::core::fact::RunId;
use crate::core::fold::RunState;
use crate::fleet::runner::Stopped;
use crate::fleet::worker::WorkerStats;
use crate::host::model::chat_messages;

/// `value` as JSON (`null` if it cannot be encoded, which the library's types never are).
pub fn serialize(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A run's folded state: its messages (chat-completions form, no system prompt), pending tool
/// calls, park, end, counters.
pub fn state_json(state: &RunState) -> Value {
    let messages: Vec<Value> = chat_messages("", state).into_iter().skip(1).collect();
    let pending: Vec<Value> = state.pending_calls().iter().map(serialize).collect();
    json!({
        "run_id": state.run_id().map(|r| r.to_string()),
        "session_id": state.session_id().map(|s| s.to_string()),
        "last_seq": state.last_seq().0,
        "next_step": serialize(&state.next_step()),
        "pending_tool_calls": pending,
        "parked": state.parked().map(serialize),
        "terminal": state.terminal().map(serialize),
        "counters": serialize(state.counters()),
        "messages": messages,
    })
}

/// How a driven run stopped: `{"run_id", "status": finished|parked|waiting_for_input|stopped,
/// "terminal" | "parked"}`.
pub fn stopped_json(run: &RunId, stopped: &Stopped) -> Value {
    let (status, detail) = match stopped {
        Stopped::Finished(terminal) => ("finished", json!({"terminal": serialize(terminal)})),
        Stopped::Parked(parked) => ("parked", json!({"parked": serialize(parked)})),
        Stopped::WaitingForInput => ("waiting_for_input", json!({})),
        Stopped::StepCap | Stopped::StopRequested => ("stopped", json!({})),
    };
    let mut value = json!({"run_id": run.to_string(), "status": status});
    if let (Value::Object(map), Value::Object(extra)) = (&mut value, detail) {
        map.extend(extra);
    }
    value
}

/// A worker's counts: attempts started, recoveries finished, attempts failed and fenced.
pub fn stats_json(stats: &WorkerStats) -> Value {
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::SeqCst);
    json!({
        "started": load(&stats.started),
        "finished": load(&stats.finished),
        "failed": load(&stats.failed),
        "fenced": load(&stats.fenced),
    })
}

/// The requests a store handle sent so far, by kind, with `requests` their total.
pub fn requests_json(store: &crate::store::Store) -> Value {
    let metrics = store.metrics();
    let mut value = serialize(&metrics);
    if let Value::Object(map) = &mut value {
        map.insert("requests".into(), metrics.requests().into());
    }
    value
}
