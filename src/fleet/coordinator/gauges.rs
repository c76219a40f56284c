//! The leader's view of the fleet as metrics: runs by state, recoveries by phase, workers, the
//! oldest interrupted run.
//!
//! It never decides anything and never touches the store.

use super::*;

pub(super) const RUN_STATES: [&str; 5] = [
    "running",
    "interrupted",
    "recovering",
    "parked",
    "dead_lettered",
];
pub(super) const RECOVERY_PHASES: [&str; 3] = ["admitted", "assigned", "running"];

/// The leader's view of the fleet as gauges: runs by state (`driven`: the runs live hosts
/// drive, kept only as counts), recoveries by phase, the oldest interrupted run's age, live
/// workers. `interrupted_since` remembers when this leader first saw each run interrupted (an
/// index entry's time is when its host started it).
pub(super) fn export_fleet(
    runs: &[RunView],
    driven: usize,
    workers: &[WorkerView],
    now_ms: u64,
    interrupted_since: &mut BTreeMap<RunId, u64>,
) {
    let mut states = RUN_STATES.map(|s| (s, 0.0));
    states[0].1 = driven as f64;
    let mut phases = RECOVERY_PHASES.map(|p| (p, 0.0));
    let mut oldest: Option<u64> = None;
    let mut still = BTreeMap::new();
    for run in runs {
        let (state, waiting_since) = match run.entry.phase {
            Phase::Running if run.holder_alive => (0, None),
            Phase::Running => {
                let since = interrupted_since
                    .get(&run.entry.run_id)
                    .copied()
                    .unwrap_or(now_ms);
                still.insert(run.entry.run_id.clone(), since);
                (1, Some(since))
            }
            Phase::Recovering => (2, None),
            Phase::Parked => (3, None),
            Phase::Dead => (4, None),
        };
        states[state].1 += 1.0;
        let waiting_since = match &run.recovery {
            Some(record) if !record.state.is_terminal() => {
                let phase = match (record.state, &record.assigned_to) {
                    (RecoveryState::Admitted, None) => Some(0),
                    (RecoveryState::Admitted, Some(_)) => Some(1),
                    (RecoveryState::Running, _) => Some(2),
                    _ => None,
                };
                if let Some(phase) = phase {
                    phases[phase].1 += 1.0;
                }
                // Waiting for a worker counts as still interrupted, since the record last
                // changed (its admission, or the attempt that handed it back).
                (record.state == RecoveryState::Admitted)
                    .then_some(record.updated_at_ms)
                    .or(waiting_since)
            }
            _ => waiting_since,
        };
        if let Some(since) = waiting_since {
            oldest = Some(oldest.map_or(since, |o| o.min(since)));
        }
    }
    *interrupted_since = still;
    let age = oldest.map_or(0.0, |since| now_ms.saturating_sub(since) as f64 / 1000.0);
    let live = workers.iter().filter(|w| w.alive).count() as f64;
    publish_fleet(&states, &phases, age, live);
}

pub(super) fn publish_fleet(
    states: &[(&'static str, f64)],
    phases: &[(&'static str, f64)],
    age: f64,
    live: f64,
) {
    use crate::metrics::{
        OLDEST_INTERRUPTED_AGE, RECOVERIES, RUNS, WORKERS_LIVE, set, set_labelled,
    };
    for (state, count) in states {
        set_labelled(RUNS, "state", state, *count);
    }
    for (phase, count) in phases {
        set_labelled(RECOVERIES, "phase", phase, *count);
    }
    set(OLDEST_INTERRUPTED_AGE, age);
    set(WORKERS_LIVE, live);
}
