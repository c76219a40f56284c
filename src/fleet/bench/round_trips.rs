//! `rekindle bench round-trips`: how many store round trips one after another lie on a
//! recovery's path from its admission to its first tool call.
//!
//! Counting requests does not tell this (requests made side by side cost one round trip), so
//! the bench measures it as the path's time bought by latency: one run is killed and
//! recovered by takeover on a store with no injected latency, then again with `latency` added
//! to every request and no jitter. The extra time from the admission (the record's
//! `admitted_at_ms`, taken before the record is written) to the recovery's first tool call,
//! over `latency`, is the number of sequential round trips on that path; what does not
//! depend on the store (the wake-ups, the model, the tool's start) cancels out. The step is
//! committed one round trip later (the tool result's generation).

use serde::Serialize;

use super::{BenchError, Mode, Result, Workload, crash_recover};

/// What `round-trips` measured.
#[derive(Clone, Debug, Serialize)]
pub struct RoundTripsReport {
    /// `round-trips`.
    pub bench: &'static str,
    /// The latency added to every request in the second run of each pair, in ms.
    pub latency_ms: u64,
    /// Pairs of runs measured.
    pub pairs: usize,
    /// Admission → first tool call without injected latency, in ms, each pair's.
    pub without_latency_ms: Vec<f64>,
    /// The same with `latency_ms` on every request.
    pub with_latency_ms: Vec<f64>,
    /// The median of `(with − without) / latency_ms`: sequential store round trips from
    /// the admission to the recovery's first tool call.
    pub round_trips_to_first_tool_call: f64,
    /// That plus the tool result's commit: round trips to the first committed step.
    pub round_trips_to_first_committed_step: f64,
}

/// Measures `pairs` pairs of one-run recoveries (see the module documentation).
pub async fn round_trips(
    workload: &Workload,
    latency: std::time::Duration,
    pairs: usize,
) -> Result<RoundTripsReport> {
    if latency.is_zero() {
        return Err(BenchError::Host(
            "round-trips needs a latency above 0 ms to divide by".into(),
        ));
    }
    let one = |latency| Workload {
        runs: 1,
        workers: 1,
        latency,
        jitter: std::time::Duration::ZERO,
        ..workload.clone()
    };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..pairs.max(1) {
        for (latency, into) in [
            (std::time::Duration::ZERO, &mut without),
            (latency, &mut with),
        ] {
            let report = crash_recover(&one(latency), Mode::Takeover).await?;
            if let Some(broken) = report.violation() {
                return Err(BenchError::Host(format!(
                    "the benchmark broke an invariant: {broken}"
                )));
            }
            if report.admission_to_first_step.n != 1 {
                return Err(BenchError::Host(format!(
                    "the run was not recovered after its host was killed ({} recovered, {} finished by the host): nothing to measure",
                    report.recovered, report.finished_by_host
                )));
            }
            into.push(report.admission_to_first_step.p50_ms);
        }
    }
    let per_ms = latency.as_secs_f64() * 1000.0;
    let mut trips: Vec<f64> = without
        .iter()
        .zip(&with)
        .map(|(a, b)| (b - a) / per_ms)
        .collect();
    trips.sort_by(f64::total_cmp);
    let median = trips[trips.len() / 2];
    Ok(RoundTripsReport {
        bench: "round-trips",
        latency_ms: latency.as_millis() as u64,
        pairs: trips.len(),
        without_latency_ms: without,
        with_latency_ms: with,
        round_trips_to_first_tool_call: median,
        round_trips_to_first_committed_step: median + 1.0,
    })
}
