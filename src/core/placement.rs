//! The coordinator's placement policy: from one observation of the fleet (workers, the runs
//! not done and their recovery records), the pure [`decide`] says what to do next. Each
//! action on a recovery is one lifecycle event; the loop that observes and executes lives in
//! `fleet::coordinator`.

use std::collections::BTreeMap;

use crate::core::assignment::Registration;
use crate::core::fact::{RecoveryId, RunId};
use crate::core::lifecycle as rules;
use crate::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryState};

/// Default number of failed attempts before a recovery is dead-lettered.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// A worker as the coordinator sees it.
#[derive(Clone, Debug)]
pub struct WorkerView {
    /// The worker's registration.
    pub registration: Registration,
    /// Whether the worker's heartbeat was judged alive this tick.
    pub alive: bool,
    /// Whether it may be offered recoveries: false while it does not answer wake-ups. A
    /// recovery it runs is left to it (only a silent heartbeat hands that back), but one
    /// offered and not started moves to another worker.
    pub offer: bool,
    /// Recoveries the owners of other partitions assigned to it, as its inbox last said (a
    /// bucket split into partitions): they take its slots and queue as this view's do, and
    /// count as running (the inbox does not say which started), so what this view queued
    /// behind them moves to an idle slot elsewhere rather than wait on another owner's run.
    pub elsewhere: u32,
}

/// A run being tracked, with its recovery record if it has one (and it was read this tick).
#[derive(Clone, Debug)]
pub struct RunView {
    /// The run's index entry.
    pub entry: IndexEntry,
    /// Whether the run's holder was judged alive this tick.
    pub holder_alive: bool,
    /// The run's recovery record, if it has one and it was read this tick.
    pub recovery: Option<RecoveryRecord>,
    /// The parked recovery's run has a generation after the one it parked at: an answer was
    /// committed whose `Answer` transition never happened (the answering process died).
    pub answered: bool,
}

impl RunView {
    /// The recovery this run's worker holds a slot for, and that worker: a recovery admitted
    /// or running, and assigned. It counts against the worker's capacity and is in its inbox
    /// (except a fresh admission a named assignment left to a worker's claim, counted only).
    pub fn assignment(&self) -> Option<(&RecoveryId, &str)> {
        let record = self.recovery.as_ref()?;
        if !matches!(
            record.state,
            RecoveryState::Admitted | RecoveryState::Running
        ) {
            return None;
        }
        Some((&record.recovery_id, record.assigned_to.as_deref()?))
    }
}

/// What the coordinator does next. Each action on a recovery is one lifecycle event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Admit a recovery of an interrupted run.
    Admit {
        /// The interrupted run to recover.
        source: RunId,
    },
    /// Give a recovery to a worker.
    Assign {
        /// The recovery to assign.
        recovery: RecoveryId,
        /// The live worker with free capacity to give it to.
        worker: String,
    },
    /// The worker running attempt `attempt` died: hand the recovery back (a failed attempt).
    Abandon {
        /// The recovery whose attempt died.
        recovery: RecoveryId,
        /// The worker that died.
        worker: String,
        /// The number of the attempt that died.
        attempt: u32,
    },
    /// Give up on a recovery after too many failed attempts.
    DeadLetter {
        /// The run the recovery continues.
        source: RunId,
        /// The recovery to give up on.
        recovery: RecoveryId,
    },
    /// A parked recovery's run moved on (an answer was committed): finish its `Answer`.
    Answered {
        /// The parked recovery whose run was answered.
        recovery: RecoveryId,
    },
    /// The index entry disagrees with the record (a crash between the two writes, or a
    /// finished recovery): rewrite it from the record, or remove it.
    Reconcile {
        /// The run whose index entry disagrees.
        source: RunId,
        /// The recovery whose record decides the entry.
        recovery: RecoveryId,
    },
}

/// Decides from one observation. Pure: the same observation gives the same actions. The
/// record decides, the index entry follows (see `core/lifecycle.rs`).
pub fn decide(workers: &[WorkerView], runs: &[RunView], max_failures: u32) -> Vec<Action> {
    let mut actions = Vec::new();
    // Each live worker with the recoveries assigned to it (offered or running), and those of
    // them running: see [`Load`].
    let mut load = loads(workers.iter().filter(|w| w.alive), runs);
    for run in runs {
        let source = &run.entry.run_id;
        let Some(record) = &run.recovery else {
            match run.entry.phase {
                Phase::Running if !run.holder_alive => actions.push(Action::Admit {
                    source: source.clone(),
                }),
                // Recovering but no record was found: admission crashed part-way, or the
                // entry was written by hand. Admitting again is idempotent.
                Phase::Recovering => actions.push(Action::Admit {
                    source: source.clone(),
                }),
                _ => {}
            }
            continue;
        };
        if rules::index_phase(record.state) != Some(run.entry.phase)
            || run.entry.recovery_id.as_ref() != Some(&record.recovery_id)
        {
            actions.push(Action::Reconcile {
                source: source.clone(),
                recovery: record.recovery_id.clone(),
            });
        }
        let assigned_alive = record
            .assigned_to
            .as_deref()
            .is_some_and(|w| load.contains_key(w));
        match record.state {
            RecoveryState::Parked if run.answered => actions.push(Action::Answered {
                recovery: record.recovery_id.clone(),
            }),
            RecoveryState::Finished | RecoveryState::DeadLettered | RecoveryState::Parked => {}
            RecoveryState::Running => {
                if !assigned_alive && let Some(worker) = &record.assigned_to {
                    actions.push(Action::Abandon {
                        recovery: record.recovery_id.clone(),
                        worker: worker.clone(),
                        attempt: record.attempts,
                    });
                }
            }
            RecoveryState::Admitted => {
                if record.failures >= max_failures {
                    actions.push(Action::DeadLetter {
                        source: source.clone(),
                        recovery: record.recovery_id.clone(),
                    });
                    continue;
                }
                // Workers that may take it: alive and configured alike. Those that do not
                // answer wake-ups are passed over, unless no other one may take it (then
                // they find it at their poll).
                let matching = |w: &&WorkerView| {
                    w.alive
                        && (record.force
                            || w.registration.fingerprint_sha256 == run.entry.fingerprint_sha256)
                };
                // A draining worker (stopping) is offered nothing, even when no other worker
                // may take the recovery: it waits for one rather than bounce off it.
                let matching = |w: &&WorkerView| matching(w) && !w.registration.draining;
                let any_offerable = workers.iter().filter(matching).any(|w| w.offer);
                let offerable = |w: &&WorkerView| matching(w) && (w.offer || !any_offerable);
                let offered_alive = record.assigned_to.as_deref().is_some_and(|name| {
                    workers
                        .iter()
                        .filter(offerable)
                        .any(|w| w.registration.worker == name)
                });
                if offered_alive {
                    // Waiting on a worker whose slots all run: another worker with an idle
                    // slot takes it now (the worker that had it starts it only by
                    // compare-and-swap on the record, so one of the two wins).
                    let Some(from) = record
                        .assigned_to
                        .as_deref()
                        .filter(|w| load.get(w).is_some_and(Load::full))
                    else {
                        continue;
                    };
                    let to = workers
                        .iter()
                        .filter(offerable)
                        .filter(|w| w.registration.worker != from)
                        .map(|w| {
                            let name = w.registration.worker.as_str();
                            (load.get(name).map_or(0, Load::idle), name)
                        })
                        .filter(|(slots, _)| *slots > 0)
                        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)));
                    if let Some((_, to)) = to {
                        for (worker, by) in [(to, 1), (from, -1)] {
                            if let Some(load) = load.get_mut(worker) {
                                load.assigned += by;
                            }
                        }
                        actions.push(Action::Assign {
                            recovery: record.recovery_id.clone(),
                            worker: to.to_owned(),
                        });
                    }
                    continue;
                }
                // Idle slots first, then room in a queue.
                let eligible = workers.iter().filter(offerable);
                let best = eligible
                    .map(|w| {
                        let name = w.registration.worker.as_str();
                        let room = load
                            .get(name)
                            .map_or((0, 0), |load| (load.idle().max(0), load.room()));
                        (room, &w.registration.worker)
                    })
                    .filter(|((_, room), _)| *room > 0)
                    .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)));
                if let Some((_, worker)) = best {
                    if let Some(load) = load.get_mut(worker.as_str()) {
                        load.assigned += 1;
                    }
                    actions.push(Action::Assign {
                        recovery: record.recovery_id.clone(),
                        worker: worker.clone(),
                    });
                }
            }
        }
    }
    actions
}

/// The worker each of `names` freshly named recoveries is forwarded to before its record is
/// read (see `coordinator::named::assign_named`), in order: an alive worker that advertises and
/// answers wake-ups and is not draining, with the most idle slots as `runs`, the earlier `forwarded` (one
/// worker name per forward) and the forwards before it fill them (ties to the lower name); `None` once no slot is idle. Records are not known yet, so
/// fingerprints are not matched here: the worker claims only a recovery it may run, and the
/// coordinator assigns the rest once it has read them.
pub fn forward_targets(
    workers: &[WorkerView],
    runs: &[RunView],
    forwarded: &[String],
    names: usize,
) -> Vec<Option<String>> {
    let mut load = loads(
        workers
            .iter()
            .filter(|w| w.alive && w.offer && !w.registration.draining)
            .filter(|w| w.registration.wake.is_some()),
        runs,
    );
    for worker in forwarded {
        if let Some(load) = load.get_mut(worker.as_str()) {
            load.assigned += 1;
        }
    }
    (0..names)
        .map(|_| {
            let (_, name) = load
                .iter()
                .map(|(name, load)| (load.idle(), *name))
                .filter(|(idle, _)| *idle > 0)
                .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))?;
            if let Some(load) = load.get_mut(name) {
                load.assigned += 1;
            }
            Some(name.to_owned())
        })
        .collect()
}

/// Each of `workers` with what `runs` assign it (offered or running), and of those the ones
/// running: see [`Load`].
fn loads<'a>(
    workers: impl Iterator<Item = &'a WorkerView>,
    runs: &[RunView],
) -> BTreeMap<&'a str, Load> {
    let mut load: BTreeMap<&str, Load> = workers
        .map(|w| {
            let mut load = Load::of(&w.registration);
            load.assigned = i64::from(w.elsewhere);
            load.running = i64::from(w.elsewhere);
            (w.registration.worker.as_str(), load)
        })
        .collect();
    for run in runs {
        if let Some((_, worker)) = run.assignment()
            && let Some(load) = load.get_mut(worker)
        {
            load.assigned += 1;
            if run
                .recovery
                .as_ref()
                .is_some_and(|r| r.state == RecoveryState::Running)
            {
                load.running += 1;
            }
        }
    }
    load
}

/// What a live worker holds as one observation sees it, against what it registered.
#[derive(Clone, Copy, Debug)]
struct Load {
    /// Recoveries it runs at once.
    slots: i64,
    /// Recoveries that may wait assigned to it beyond its slots.
    queue: i64,
    /// Recoveries assigned to it, offered or running (and decided this tick).
    assigned: i64,
    /// Of those, the ones running.
    running: i64,
}

impl Load {
    fn of(registration: &Registration) -> Load {
        Load {
            slots: i64::from(registration.capacity),
            queue: i64::from(registration.queue.unwrap_or(0)),
            assigned: 0,
            running: 0,
        }
    }

    /// Slots nobody is assigned to (negative while recoveries wait in its queue).
    fn idle(&self) -> i64 {
        self.slots - self.assigned
    }

    /// Room left in its slots and its queue together.
    fn room(&self) -> i64 {
        self.slots + self.queue - self.assigned
    }

    /// Every slot runs a recovery: the rest of its assignments wait.
    fn full(&self) -> bool {
        self.running >= self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::assignment::recovery_id_for;
    use crate::core::epoch::Epoch;

    fn worker(name: &str, capacity: u32, fingerprint: &str, alive: bool) -> WorkerView {
        WorkerView {
            registration: Registration::new(
                name,
                format!("hb/{name}"),
                capacity,
                fingerprint.into(),
            ),
            alive,
            offer: true,
            elsewhere: 0,
        }
    }

    fn run(
        name: &str,
        phase: Phase,
        holder_alive: bool,
        recovery: Option<RecoveryRecord>,
    ) -> RunView {
        let mut entry = IndexEntry::new(RunId::new(name), None, phase, "fp".into(), 0);
        entry.recovery_id = recovery.as_ref().map(|r| r.recovery_id.clone());
        RunView {
            entry,
            holder_alive,
            recovery,
            answered: false,
        }
    }

    fn record(
        name: &str,
        state: RecoveryState,
        assigned: Option<&str>,
        failures: u32,
    ) -> RecoveryRecord {
        RecoveryRecord {
            format: 1,
            kind: "recovery".into(),
            recovery_id: recovery_id_for(&RunId::new(name)),
            source_run: RunId::new(name),
            source_generation: 3,
            source_digest: "d".into(),
            source_base: None,
            source_epoch: Epoch(1),
            state,
            force: false,
            attempts: failures + 40,
            failures,
            last_error: None,
            assigned_to: assigned.map(str::to_owned),
            result: None,
            session_id: None,
            fingerprint_sha256: "fp".into(),
            admitted_at_ms: 0,
            updated_at_ms: 0,
            parked_at: None,
            abandoned_by: None,
            declined_by: None,
        }
    }

    // Proves forwarding before a read: each name goes to the alive, answering, not draining
    // worker with a wake-up address and the most idle slots (what the view assigns and earlier forwards count, ties
    // to the lower name), fingerprints unseen; none once every slot is taken.
    #[test]
    fn forwards_go_to_idle_slots_only() {
        let mut deaf = worker("deaf", 9, "fp", true);
        deaf.offer = false;
        let mut draining = worker("draining", 9, "fp", true);
        draining.registration.draining = true;
        let mut workers = [
            worker("a", 2, "fp", true),
            worker("b", 3, "other", true),
            worker("dead", 9, "fp", false),
            deaf,
            draining,
            worker("polling", 9, "fp", true),
        ];
        for w in workers
            .iter_mut()
            .filter(|w| w.registration.worker != "polling")
        {
            w.registration.wake = Some(format!("http://{}", w.registration.worker));
        }
        // The view runs one recovery on b: a and b have two idle slots each.
        let runs = [run(
            "held",
            Phase::Recovering,
            false,
            Some(record("held", RecoveryState::Running, Some("b"), 0)),
        )];
        let named = |names| {
            forward_targets(&workers, &runs, &[], names)
                .into_iter()
                .map(|t| t.unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(named(5), ["a", "b", "a", "b", ""]);
        // Earlier forwards count like assignments.
        let after = forward_targets(&workers, &runs, &["a".into(), "a".into()], 3);
        assert_eq!(after, [Some("b".into()), Some("b".into()), None]);
    }

    // Proves the decisions: admit runs whose holder is dead, leave live and parked ones,
    // assign by free capacity (counting what each worker already holds; ties go to the first
    // name) to matching workers only, abandon an attempt whose worker died, dead-letter after
    // too many *failures* (never attempts) and never while an attempt runs, and repair an
    // index entry that disagrees with its record (a finished recovery's entry is removed).
    #[test]
    fn decide_assigns_by_capacity_and_fingerprint() {
        let workers = [
            worker("busy", 1, "fp", true),
            worker("roomy", 3, "fp", true),
            worker("other-config", 9, "other", true),
            worker("dead", 9, "fp", false),
        ];
        let runs = [
            run("alive", Phase::Running, true, None),
            run("crashed", Phase::Running, false, None),
            run("parked", Phase::Parked, false, None),
            run(
                "orphaned",
                Phase::Recovering,
                false,
                Some(record("orphaned", RecoveryState::Running, Some("dead"), 1)),
            ),
            run(
                "new",
                Phase::Recovering,
                false,
                Some(record("new", RecoveryState::Admitted, None, 0)),
            ),
            run(
                "failing",
                Phase::Recovering,
                false,
                Some(record("failing", RecoveryState::Admitted, Some("roomy"), 5)),
            ),
            run(
                "failing-but-running",
                Phase::Recovering,
                false,
                Some(record(
                    "failing-but-running",
                    RecoveryState::Running,
                    Some("busy"),
                    7,
                )),
            ),
            run(
                "done",
                Phase::Recovering,
                false,
                Some(record("done", RecoveryState::Finished, Some("roomy"), 1)),
            ),
            run(
                "parked-record",
                Phase::Recovering,
                false,
                Some(record("parked-record", RecoveryState::Parked, None, 0)),
            ),
        ];
        let actions = decide(&workers, &runs, 5);
        let id = |name: &str| recovery_id_for(&RunId::new(name));
        assert_eq!(
            actions,
            vec![
                Action::Admit {
                    source: RunId::new("crashed")
                },
                Action::Abandon {
                    recovery: id("orphaned"),
                    worker: "dead".into(),
                    attempt: 41
                },
                Action::Assign {
                    recovery: id("new"),
                    worker: "roomy".into()
                },
                Action::DeadLetter {
                    source: RunId::new("failing"),
                    recovery: id("failing")
                },
                Action::Reconcile {
                    source: RunId::new("done"),
                    recovery: id("done")
                },
                Action::Reconcile {
                    source: RunId::new("parked-record"),
                    recovery: id("parked-record")
                },
            ]
        );
        // With no matching live worker, nothing is assigned (and nothing goes to a mismatch).
        let only_other = [worker("other-config", 9, "other", true)];
        let actions = decide(&only_other, &runs[4..5], 5);
        assert!(actions.is_empty(), "{actions:?}");
    }

    // Proves offers follow wake-ups: a worker that did not answer one gets no new recovery,
    // a recovery offered to it and not started moves to a worker that answers, and one it
    // runs stays with it (only a silent heartbeat hands that back).
    #[test]
    fn an_unreachable_worker_keeps_its_attempts_but_gets_no_offers() {
        let mut deaf = worker("deaf", 9, "fp", true);
        deaf.offer = false;
        let workers = [deaf, worker("near", 2, "fp", true)];
        let runs = [
            run(
                "offered",
                Phase::Recovering,
                false,
                Some(record("offered", RecoveryState::Admitted, Some("deaf"), 0)),
            ),
            run(
                "running",
                Phase::Recovering,
                false,
                Some(record("running", RecoveryState::Running, Some("deaf"), 0)),
            ),
            run(
                "new",
                Phase::Recovering,
                false,
                Some(record("new", RecoveryState::Admitted, None, 0)),
            ),
        ];
        let actions = decide(&workers, &runs, DEFAULT_MAX_ATTEMPTS);
        let assigned: Vec<(&str, &str)> = actions
            .iter()
            .filter_map(|action| match action {
                Action::Assign { recovery, worker } => Some((recovery.as_str(), worker.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            assigned,
            [("recovery-of-offered", "near"), ("recovery-of-new", "near")],
            "{actions:?}"
        );
        assert!(
            !actions
                .iter()
                .any(|action| matches!(action, Action::Abandon { .. })),
            "{actions:?}"
        );
    }

    fn assigned(actions: &[Action]) -> Vec<(&str, &str)> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Assign { recovery, worker } => Some((recovery.as_str(), worker.as_str())),
                _ => None,
            })
            .collect()
    }

    fn queued(name: &str, capacity: u32, queue: u32) -> WorkerView {
        let mut view = worker(name, capacity, "fp", true);
        view.registration.queue = Some(queue);
        view
    }

    fn recovering(name: &str, state: RecoveryState, on: Option<&str>) -> RunView {
        run(
            name,
            Phase::Recovering,
            false,
            Some(record(name, state, on, 0)),
        )
    }

    // Proves the queue: idle slots are filled before any queue, and a worker is given up to
    // its slots plus its queue (an older worker that declares none, only its slots), no more.
    #[test]
    fn a_worker_is_given_its_slots_and_its_queue() {
        let workers = [queued("q", 1, 2), worker("plain", 1, "fp", true)];
        let runs: Vec<RunView> = (0..6)
            .map(|i| recovering(&format!("r{i}"), RecoveryState::Admitted, None))
            .collect();
        let actions = decide(&workers, &runs, DEFAULT_MAX_ATTEMPTS);
        let given = assigned(&actions);
        let to = |name: &str| given.iter().filter(|(_, w)| *w == name).count();
        assert_eq!((to("q"), to("plain")), (3, 1), "{actions:?}");
        assert_eq!(
            given[..2],
            [("recovery-of-r0", "q"), ("recovery-of-r1", "plain")],
            "idle slots first: {actions:?}"
        );
        // Already holding its slots and queue, it is given nothing more.
        let full = [
            recovering("a", RecoveryState::Running, Some("q")),
            recovering("b", RecoveryState::Admitted, Some("q")),
            recovering("c", RecoveryState::Admitted, Some("q")),
            recovering("d", RecoveryState::Admitted, None),
        ];
        let actions = decide(&workers[..1], &full, DEFAULT_MAX_ATTEMPTS);
        assert!(assigned(&actions).is_empty(), "{actions:?}");
    }

    // Proves what other partitions' owners assigned a worker takes its slots: a worker of
    // two slots with one recovery elsewhere is given one, with two none, and the rest goes to
    // a worker with room.
    #[test]
    fn assignments_elsewhere_take_slots() {
        let mut shared = worker("shared", 2, "fp", true);
        let runs: Vec<RunView> = (0..3)
            .map(|i| recovering(&format!("r{i}"), RecoveryState::Admitted, None))
            .collect();
        shared.elsewhere = 1;
        let actions = decide(std::slice::from_ref(&shared), &runs, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(assigned(&actions).len(), 1, "{actions:?}");
        shared.elsewhere = 2;
        let other = worker("other", 2, "fp", true);
        let actions = decide(&[shared, other], &runs, DEFAULT_MAX_ATTEMPTS);
        let given = assigned(&actions);
        assert_eq!(given.len(), 2, "{actions:?}");
        assert!(given.iter().all(|(_, w)| *w == "other"), "{actions:?}");
        // One queued here behind another owner's recovery moves to an idle slot.
        let mut shared = queued("shared", 1, 2);
        shared.elsewhere = 1;
        let waiting = [recovering("w", RecoveryState::Admitted, Some("shared"))];
        let actions = decide(
            &[shared, queued("idle", 1, 0)],
            &waiting,
            DEFAULT_MAX_ATTEMPTS,
        );
        assert_eq!(
            assigned(&actions),
            [("recovery-of-w", "idle")],
            "{actions:?}"
        );
    }

    // Proves a waiting recovery does not wait for nothing: one queued on a worker whose slots
    // all run moves to a worker with an idle slot (as many as it has idle, no more), while
    // one offered to a worker with a slot free stays (it is about to start it).
    #[test]
    fn a_queued_recovery_moves_to_an_idle_slot() {
        let workers = [queued("busy", 1, 3), queued("idle", 1, 3)];
        let runs = [
            recovering("running", RecoveryState::Running, Some("busy")),
            recovering("w1", RecoveryState::Admitted, Some("busy")),
            recovering("w2", RecoveryState::Admitted, Some("busy")),
        ];
        let actions = decide(&workers, &runs, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(
            assigned(&actions),
            [("recovery-of-w1", "idle")],
            "{actions:?}"
        );
        // Not full: its offer stays with it.
        let runs = [recovering("w1", RecoveryState::Admitted, Some("busy"))];
        let actions = decide(&workers, &runs, DEFAULT_MAX_ATTEMPTS);
        assert!(actions.is_empty(), "{actions:?}");
        // No idle slot anywhere: it waits where it is.
        let runs = [
            recovering("running", RecoveryState::Running, Some("busy")),
            recovering("other", RecoveryState::Running, Some("idle")),
            recovering("w1", RecoveryState::Admitted, Some("busy")),
        ];
        let actions = decide(&workers, &runs, DEFAULT_MAX_ATTEMPTS);
        assert!(actions.is_empty(), "{actions:?}");
    }

    // Proves a draining worker (stopping) is offered nothing, even as the only worker, and
    // what waits in its queue moves to another; and that a worker that declined a recovery
    // once, then came back under its ID (not draining), may be offered it again.
    #[test]
    fn a_draining_worker_is_offered_nothing() {
        let mut stopping = queued("stopping", 4, 4);
        stopping.registration.draining = true;
        let workers = [stopping, queued("other", 1, 0)];
        let mut declined = recovering("r", RecoveryState::Admitted, None);
        if let Some(record) = declined.recovery.as_mut() {
            record.declined_by = Some("stopping".into());
        }
        let actions = decide(
            &workers,
            std::slice::from_ref(&declined),
            DEFAULT_MAX_ATTEMPTS,
        );
        assert_eq!(
            assigned(&actions),
            [("recovery-of-r", "other")],
            "{actions:?}"
        );
        let waiting = recovering("w", RecoveryState::Admitted, Some("stopping"));
        let actions = decide(
            &workers,
            std::slice::from_ref(&waiting),
            DEFAULT_MAX_ATTEMPTS,
        );
        assert_eq!(
            assigned(&actions),
            [("recovery-of-w", "other")],
            "{actions:?}"
        );
        let actions = decide(
            &workers[..1],
            &[declined.clone(), waiting],
            DEFAULT_MAX_ATTEMPTS,
        );
        assert!(assigned(&actions).is_empty(), "{actions:?}");
        let back = [queued("stopping", 4, 4), queued("other", 1, 0)];
        let busy = recovering("busy", RecoveryState::Running, Some("other"));
        let actions = decide(&back, &[busy, declined], DEFAULT_MAX_ATTEMPTS);
        assert_eq!(
            assigned(&actions),
            [("recovery-of-r", "stopping")],
            "{actions:?}"
        );
    }
}
