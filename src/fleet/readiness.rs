//! What `/readyz` says: whether a fleet process can do its work now, and if not, why.
//!
//! A process is ready once it has opened and probed the store and registered (a worker its
//! registration, a coordinator its heartbeat), and stays ready until it starts draining on
//! SIGTERM or its heartbeat cannot be written (the fleet would judge it dead, and its work
//! will move). A coordinator is ready whether it leads or stands by; `/readyz` says which.

use std::sync::{Arc, Mutex};

use crate::store::lease::Holder;

/// The readiness of one process, shared by its loop and its HTTP server.
#[derive(Debug, Default)]
pub struct Readiness {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    started: bool,
    draining: bool,
    holder: Option<Arc<Holder>>,
    leading: Option<bool>,
}

impl Readiness {
    /// The store is open and probed, and the process registered as `holder`, whose
    /// heartbeats must keep succeeding.
    pub fn started(&self, holder: &Arc<Holder>) {
        self.update(|state| {
            state.started = true;
            state.holder = Some(Arc::clone(holder));
        });
    }

    /// A stop was requested: the process takes no new work.
    pub fn draining(&self) {
        self.update(|state| state.draining = true);
    }

    /// A coordinator leads (`true`) or stands by (`false`).
    pub fn leading(&self, leading: bool) {
        self.update(|state| state.leading = Some(leading));
        crate::metrics::set(
            crate::metrics::COORDINATOR_LEADING,
            if leading { 1.0 } else { 0.0 },
        );
    }

    /// Whether `/readyz` answers 200, and the line it answers with (also sets the
    /// `rekindle_ready` gauge).
    pub fn check(&self) -> (bool, String) {
        let verdict = self.verdict();
        crate::metrics::set(crate::metrics::READY, if verdict.0 { 1.0 } else { 0.0 });
        verdict
    }

    fn verdict(&self) -> (bool, String) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.draining {
            return (false, "not ready: draining after a stop request".into());
        }
        if !state.started {
            return (false, "not ready: opening the store and registering".into());
        }
        if let Some(error) = state.holder.as_ref().and_then(|h| h.heartbeat_error()) {
            return (false, format!("not ready: heartbeat failing: {error}"));
        }
        let role = match state.leading {
            Some(true) => ": leading",
            Some(false) => ": standing by",
            None => "",
        };
        (true, format!("ready{role}"))
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_between_start_and_drain_while_beating() {
        let readiness = Readiness::default();
        assert_eq!(
            readiness.check(),
            (
                false,
                "not ready: opening the store and registering".to_owned()
            )
        );
        let store = crate::store::Store::memory(crate::clock::SystemClock::shared());
        let holder = Holder::with_role(&store, "w", std::time::Duration::from_secs(3), "worker");
        readiness.started(&holder);
        assert_eq!(readiness.check(), (true, "ready".to_owned()));
        readiness.leading(false);
        assert_eq!(readiness.check(), (true, "ready: standing by".to_owned()));
        readiness.leading(true);
        assert_eq!(readiness.check(), (true, "ready: leading".to_owned()));
        readiness.draining();
        assert!(!readiness.check().0);
    }
}
