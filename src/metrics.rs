//! The metrics every fleet process exports, named in one place.
//!
//! The library records through the `metrics` facade: without an installed recorder (tests,
//! the library used from a host) every call is a no-op. The fleet binaries install the
//! Prometheus recorder with [`install`], labelled with their component, and serve its text on
//! `/metrics` (`crate::serve`). The catalogue below is what dashboards, alerts and the
//! autoscaler in `deploy/` are written against: renaming a metric is a breaking change.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

/// Store requests by `kind` (get, head, put, conditional_put, list, delete) and `outcome`
/// (ok, conflict, error), every attempt counted, retries included.
pub const STORE_REQUESTS: &str = "rekindle_store_requests_total";
/// Store request latency by `kind` and `outcome`, per attempt.
pub const STORE_REQUEST_DURATION: &str = "rekindle_store_request_duration_seconds";
/// Store requests retried after a transient failure, by `kind`.
pub const STORE_RETRIES: &str = "rekindle_store_retries_total";
/// Payload bytes moved, by `direction` (read, written).
pub const STORE_BYTES: &str = "rekindle_store_bytes_total";
/// 1 while `/readyz` answers 200.
pub const READY: &str = "rekindle_ready";
/// 1 while this coordinator leads, 0 while it stands by.
pub const COORDINATOR_LEADING: &str = "rekindle_coordinator_leading";
/// How many of the bucket's partitions this coordinator owns (in a bucket of one partition,
/// 1 while it leads).
pub const COORDINATOR_PARTITIONS: &str = "rekindle_coordinator_partitions";
/// Runs not yet done by `state` (running, interrupted, recovering, parked, dead_lettered), as
/// the leading coordinator last saw the index.
pub const RUNS: &str = "rekindle_runs";
/// Recoveries not yet ended by `phase` (admitted: waiting for a worker; assigned: offered,
/// not started; running), as the leading coordinator last saw them.
pub const RECOVERIES: &str = "rekindle_recoveries";
/// Seconds since the oldest run that is interrupted or waits for its recovery was admitted
/// or last changed (0 when there is none).
pub const OLDEST_INTERRUPTED_AGE: &str = "rekindle_oldest_interrupted_run_age_seconds";
/// Workers the leading coordinator judges alive.
pub const WORKERS_LIVE: &str = "rekindle_workers_live";
/// Recoveries admitted (by the coordinator, an operator or a host).
pub const RECOVERIES_ADMITTED: &str = "rekindle_recoveries_admitted_total";
/// Recoveries offered to a worker.
pub const RECOVERIES_ASSIGNED: &str = "rekindle_recoveries_assigned_total";
/// Offers a stopping worker declined (handed back to the coordinator unstarted).
pub const OFFERS_DECLINED: &str = "rekindle_offers_declined_total";
/// Recovery attempts a worker started.
pub const ATTEMPTS_STARTED: &str = "rekindle_recovery_attempts_started_total";
/// Recoveries a worker finished.
pub const RECOVERIES_FINISHED: &str = "rekindle_recoveries_finished_total";
/// Recovery attempts that failed.
pub const RECOVERIES_FAILED: &str = "rekindle_recoveries_failed_total";
/// Recoveries given up after too many failed attempts.
pub const RECOVERIES_DEAD_LETTERED: &str = "rekindle_recoveries_dead_lettered_total";
/// Leases taken over from another holder: one judged gone, or a run fenced at its admission
/// (which also counts in [`FENCES`]).
pub const TAKEOVERS: &str = "rekindle_takeovers_total";
/// Runs fenced at admission (a new epoch that refuses the old holder's commits).
pub const FENCES: &str = "rekindle_fences_total";
/// Tool calls that were in flight at an interruption and ran again.
pub const TOOL_CALLS_REEXECUTED: &str = "rekindle_tool_calls_reexecuted_total";
/// Heartbeats that could not be written.
pub const HEARTBEAT_FAILURES: &str = "rekindle_heartbeat_failures_total";
/// Dead processes whose heartbeat (and a worker's registration and inbox) the coordinator
/// removed.
pub const DEAD_PROCESSES_REMOVED: &str = "rekindle_dead_processes_removed_total";
/// Recoveries this worker runs now.
pub const WORKER_IN_FLIGHT: &str = "rekindle_worker_in_flight";
/// Recoveries this worker runs at most at once (`--concurrency`).
pub const WORKER_CAPACITY: &str = "rekindle_worker_capacity";
/// In-flight recoveries over capacity, 0 to 1: the autoscaler's signal.
pub const WORKER_UTILIZATION: &str = "rekindle_worker_utilization";
/// From a recovery's admission to its first step, on the worker that ran it.
pub const ADMISSION_TO_FIRST_STEP: &str = "rekindle_admission_to_first_step_seconds";
/// From the source run's last commit to its recovery's first step.
pub const INTERRUPTION_TO_RESUMPTION: &str = "rekindle_interruption_to_resumption_seconds";
/// One step of a run, by `kind` (model, tool).
pub const STEP_DURATION: &str = "rekindle_step_duration_seconds";

/// Histogram buckets, in seconds: store requests and steps from a millisecond, recovery
/// latencies up to several lease TTLs.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// The Prometheus recorder of this process.
#[derive(Clone)]
pub struct Exporter {
    handle: metrics_exporter_prometheus::PrometheusHandle,
}

impl Exporter {
    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Drains recorded histogram samples into their buckets; run every few seconds so
    /// memory stays bounded between scrapes.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter")
    }
}

/// Installs the Prometheus recorder for this process, every metric labelled
/// `component="<component>"`, and describes the catalogue. Only the first call in a process
/// installs; a later one fails.
pub fn install(component: &'static str) -> Result<Exporter, String> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .add_global_label("component", component)
        .set_buckets(BUCKETS)
        .map_err(|error| error.to_string())?
        .install_recorder()
        .map_err(|error| format!("install the metrics recorder: {error}"))?;
    describe();
    // Counters this component increments start at 0, so a rate over them is defined before
    // the first event.
    let counters: &[&'static str] = match component {
        "coordinator" => &[
            RECOVERIES_ADMITTED,
            RECOVERIES_ASSIGNED,
            RECOVERIES_DEAD_LETTERED,
            FENCES,
            TAKEOVERS,
            HEARTBEAT_FAILURES,
            DEAD_PROCESSES_REMOVED,
        ],
        "worker" => &[
            ATTEMPTS_STARTED,
            OFFERS_DECLINED,
            RECOVERIES_FINISHED,
            RECOVERIES_FAILED,
            TAKEOVERS,
            TOOL_CALLS_REEXECUTED,
            HEARTBEAT_FAILURES,
        ],
        _ => &[HEARTBEAT_FAILURES],
    };
    for name in counters {
        counter!(*name).absolute(0);
    }
    if component == "coordinator" {
        set(COORDINATOR_LEADING, 0.0);
        set(COORDINATOR_PARTITIONS, 0.0);
    }
    set(READY, 0.0);
    Ok(Exporter { handle })
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        STORE_REQUESTS,
        "Store requests by kind and outcome, retries included."
    );
    describe_histogram!(
        STORE_REQUEST_DURATION,
        Unit::Seconds,
        "Store request latency by kind and outcome, per attempt."
    );
    describe_counter!(
        STORE_RETRIES,
        "Store requests retried after a transient failure."
    );
    describe_counter!(
        STORE_BYTES,
        Unit::Bytes,
        "Payload bytes moved to and from the store."
    );
    describe_gauge!(READY, "1 while /readyz answers 200.");
    describe_gauge!(
        COORDINATOR_LEADING,
        "1 while this coordinator leads (owns a partition), 0 while it stands by."
    );
    describe_gauge!(
        COORDINATOR_PARTITIONS,
        "How many of the bucket's partitions this coordinator owns."
    );
    describe_gauge!(
        RUNS,
        "Runs not yet done by state, as the leading coordinator saw the index."
    );
    describe_gauge!(
        RECOVERIES,
        "Recoveries not yet ended by phase (admitted, assigned, running)."
    );
    describe_gauge!(
        OLDEST_INTERRUPTED_AGE,
        Unit::Seconds,
        "Age of the oldest interrupted run or waiting recovery."
    );
    describe_gauge!(
        WORKERS_LIVE,
        "Workers the leading coordinator judges alive."
    );
    describe_counter!(RECOVERIES_ADMITTED, "Recoveries admitted.");
    describe_counter!(RECOVERIES_ASSIGNED, "Recoveries offered to a worker.");
    describe_counter!(
        OFFERS_DECLINED,
        "Offers a stopping worker declined (handed back to the coordinator unstarted)."
    );
    describe_counter!(ATTEMPTS_STARTED, "Recovery attempts started.");
    describe_counter!(RECOVERIES_FINISHED, "Recoveries finished.");
    describe_counter!(RECOVERIES_FAILED, "Recovery attempts that failed.");
    describe_counter!(
        RECOVERIES_DEAD_LETTERED,
        "Recoveries given up after too many failed attempts."
    );
    describe_counter!(
        TAKEOVERS,
        "Leases taken over from another holder (judged gone, or fenced at admission)."
    );
    describe_counter!(FENCES, "Runs fenced at admission.");
    describe_counter!(
        TOOL_CALLS_REEXECUTED,
        "Tool calls in flight at an interruption that ran again."
    );
    describe_counter!(HEARTBEAT_FAILURES, "Heartbeats that could not be written.");
    describe_counter!(
        DEAD_PROCESSES_REMOVED,
        "Heartbeats (with a worker's registration and inbox) of dead processes removed."
    );
    describe_gauge!(WORKER_IN_FLIGHT, "Recoveries this worker runs now.");
    describe_gauge!(
        WORKER_CAPACITY,
        "Recoveries this worker runs at most at once."
    );
    describe_gauge!(
        WORKER_UTILIZATION,
        "In-flight recoveries over capacity (0 to 1)."
    );
    describe_histogram!(
        ADMISSION_TO_FIRST_STEP,
        Unit::Seconds,
        "From a recovery's admission to its first step."
    );
    describe_histogram!(
        INTERRUPTION_TO_RESUMPTION,
        Unit::Seconds,
        "From the source run's last commit to its recovery's first step."
    );
    describe_histogram!(STEP_DURATION, Unit::Seconds, "One step of a run, by kind.");
}

/// One store request attempt of `kind` that ended with `outcome` after `elapsed`.
pub(crate) fn store_request(kind: &'static str, outcome: &'static str, elapsed: Duration) {
    counter!(STORE_REQUESTS, "kind" => kind, "outcome" => outcome).increment(1);
    histogram!(STORE_REQUEST_DURATION, "kind" => kind, "outcome" => outcome)
        .record(elapsed.as_secs_f64());
}

/// A store request of `kind` retried.
pub(crate) fn store_retry(kind: &'static str) {
    counter!(STORE_RETRIES, "kind" => kind).increment(1);
}

/// Payload bytes moved in `direction` (read, written).
pub(crate) fn store_bytes(direction: &'static str, bytes: u64) {
    counter!(STORE_BYTES, "direction" => direction).increment(bytes);
}

/// Adds one to the counter `name`.
pub(crate) fn count(name: &'static str) {
    counter!(name).increment(1);
}

/// Sets the gauge `name`.
pub(crate) fn set(name: &'static str, value: f64) {
    gauge!(name).set(value);
}

/// Sets the gauge `name` for one value of `label`.
pub(crate) fn set_labelled(name: &'static str, label: &'static str, value: &'static str, to: f64) {
    gauge!(name, label => value).set(to);
}

/// Records `elapsed` in the histogram `name`.
pub(crate) fn observe(name: &'static str, elapsed: Duration) {
    histogram!(name).record(elapsed.as_secs_f64());
}

/// Records one step of `kind` (model, tool).
pub(crate) fn step(kind: &'static str, elapsed: Duration) {
    histogram!(STEP_DURATION, "kind" => kind).record(elapsed.as_secs_f64());
}
