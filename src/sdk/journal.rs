//! A host's heartbeat and the runs whose loop a host drives itself: each fact recorded on a
//! [`Journal`] is durable (local log, then one conditional PUT) before the call returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use super::{Failure, Result, lift, state_json};
use crate::core::fact::{CallId, FactBody, ModelTurn, Outcome, QuestionId, RunId, ToolCall, Usage};
use crate::fleet::{Answer, Journaled, Node};
use crate::store::lease::Holder;

/// A process's lease holder, beating from [`Beating::start`] until [`Beating::close`] (or
/// until dropped): the runs it holds stay its own while it beats, and are recovered once it
/// stops.
pub struct Beating {
    holder: Arc<Holder>,
    stop: Arc<AtomicBool>,
}

impl Beating {
    /// Beats once (so a holder ID in use by a live process is refused at once), then keeps
    /// beating on the current runtime.
    pub async fn start(holder: Arc<Holder>) -> Result<Beating> {
        lift(holder.beat().await.map_err(Into::into))?;
        let stop = Arc::new(AtomicBool::new(false));
        let beating = Arc::clone(&holder);
        let flag = Arc::clone(&stop);
        tokio::spawn(async move {
            let _ = beating.spawn_heartbeat(flag).await;
        });
        Ok(Beating { holder, stop })
    }

    /// The holder that beats.
    pub fn holder(&self) -> &Arc<Holder> {
        &self.holder
    }

    /// Whether [`Beating::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Stops beating and removes the heartbeat, so the fleet sees this process gone at once;
    /// a second call does nothing.
    pub async fn close(&self) -> Result<()> {
        if self.stop.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        lift(self.holder.retire().await.map_err(Into::into))
    }
}

impl Drop for Beating {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A journal run's state on this host: open, or handed back (and how).
enum Slot {
    Open(Box<Journaled>),
    HandedBack(&'static str),
}

impl Slot {
    fn open(&mut self) -> Option<&mut Journaled> {
        match self {
            Slot::Open(journaled) => Some(journaled),
            Slot::HandedBack(_) => None,
        }
    }

    /// Hands the run back: records where it stands, releases its lease.
    async fn hand_back(&mut self, node: &Node) -> crate::Result<()> {
        if let Slot::Open(journaled) = self {
            node.close_journaled(journaled).await?;
            let state = journaled.state();
            *self = Slot::HandedBack(if state.terminal().is_some() {
                "it finished"
            } else if state.parked().is_some() {
                "it parked"
            } else {
                "it was closed"
            });
        }
        Ok(())
    }
}

/// A run whose loop the host drives. Cloning gives another handle on the same run; calls on
/// it are serialised.
#[derive(Clone)]
pub struct Journal {
    node: Node,
    run: RunId,
    /// Keeps the host's heartbeat alive while this run is open, even if the host is gone.
    _beating: Arc<Beating>,
    slot: Arc<tokio::sync::Mutex<Slot>>,
}

impl Journal {
    /// The journal of `journaled`, begun or continued on `node`.
    pub fn new(node: Node, beating: Arc<Beating>, journaled: Journaled) -> Self {
        Journal {
            node,
            run: journaled.run_id().clone(),
            _beating: beating,
            slot: Arc::new(tokio::sync::Mutex::new(Slot::Open(Box::new(journaled)))),
        }
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.run
    }

    /// Records one fact and answers the state after it; with `close`, then hands the run back
    /// (it ended or parked). A hand-back whose fact landed but whose index update failed is
    /// finished by calling it again.
    pub async fn record(&self, body: FactBody, close: bool) -> Result<Value> {
        let mut guard = self.slot.lock().await;
        let journaled = match &mut *guard {
            Slot::Open(journaled) => journaled,
            Slot::HandedBack(why) => {
                return Err(Failure::from(crate::Error::from(
                    crate::fleet::FleetError::HandedBack {
                        run: self.run.clone(),
                        why: (*why).to_owned(),
                    },
                )));
            }
        };
        if !(close && journaled.last_is(&body)) {
            let now = self.node.store.clock().wall_ms();
            lift(journaled.record(body, now).await)?;
        }
        let state = state_json(journaled.state());
        if close {
            lift(guard.hand_back(&self.node).await)?;
        }
        Ok(state)
    }

    /// The committed state, or `None` once handed back.
    pub async fn state(&self) -> Option<Value> {
        self.slot.lock().await.open().map(|j| state_json(j.state()))
    }

    /// The lease epoch this host journals at (a tool's idempotency key includes it), or
    /// `None` once handed back.
    pub async fn epoch(&self) -> Option<u64> {
        self.slot.lock().await.open().map(|j| j.epoch().0)
    }

    /// Hands the run back unfinished: its lease is released, and the fleet recovers it once
    /// this host stops beating (or this host resumes it later). Nothing once handed back.
    pub async fn close(&self) -> Result<()> {
        lift(self.slot.lock().await.hand_back(&self.node).await)
    }
}

/// A model turn from a package: its text, tool calls (`[{"id", "name", "arguments"}]`,
/// arguments a JSON string or an object), usage and reasoning.
pub fn model_turn(
    run: &RunId,
    content: Option<String>,
    tool_calls: Option<Value>,
    usage: Usage,
    reasoning: Option<String>,
) -> Result<FactBody> {
    let mut calls = Vec::new();
    let items = match tool_calls {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(Failure::invalid(format!(
                "run \"{run}\": the tool calls must be a list of {{\"id\", \"name\", \"arguments\"}}"
            )));
        }
    };
    for (i, value) in items.iter().enumerate() {
        let id = value["id"].as_str().ok_or_else(|| {
            Failure::invalid(format!("run \"{run}\": tool call {i} needs a string 'id'"))
        })?;
        let name = value["name"].as_str().ok_or_else(|| {
            Failure::invalid(format!(
                "run \"{run}\": tool call '{id}' needs a string 'name'"
            ))
        })?;
        let arguments = match &value["arguments"] {
            Value::String(text) => text.clone(),
            Value::Null => "{}".into(),
            other => other.to_string(),
        };
        calls.push(ToolCall {
            id: CallId::new(id),
            name: name.to_owned(),
            arguments,
        });
    }
    Ok(FactBody::ModelTurn(ModelTurn {
        content,
        tool_calls: calls,
        reasoning,
        usage,
    }))
}

/// A run's outcome from its name (completed, failed, cancelled, budget, step_cap).
pub fn outcome(run: &RunId, name: &str) -> Result<Outcome> {
    serde_json::from_value(Value::String(name.to_owned())).map_err(|_| {
        Failure::invalid(format!(
            "run \"{run}\": outcome '{name}' is not one of completed, failed, cancelled, budget, step_cap"
        ))
    })
}

/// An answer to a parked run: a confirmation (a call ID and approve) or a question (a
/// question ID and text), and nothing else.
pub fn answer(
    call_id: Option<String>,
    approve: Option<bool>,
    question_id: Option<String>,
    text: Option<String>,
) -> Result<Answer> {
    match (call_id, approve, question_id, text) {
        (Some(call), Some(approve), None, None) => Ok(Answer::Confirm {
            call_id: CallId::new(call),
            approve,
        }),
        (None, None, Some(question), Some(text)) => Ok(Answer::Question {
            question_id: QuestionId::new(question),
            text,
        }),
        _ => Err(Failure::invalid(
            "an answer is either a call ID with approve (a confirmation) or a question ID with text (a question)",
        )),
    }
}
