//! Store cost measurements: requests and bytes per commit, and the cost of loading a long run.
//!
//! Used by `rekindle bench-store`. Runs sample runs through the real generation writer and
//! loader against any store and reads the store's own request counters.

use serde::Serialize;

use crate::core::epoch::Epoch;
use crate::core::fact::{self, RunId};
use crate::core::rng::SplitMix;
use crate::core::sample::{self, Builder};
use crate::store::generation::{self, GenerationError, RunWriter, SnapshotPolicy};
use crate::store::{MetricsSnapshot, Store};

/// What committing one sample run cost the store, as `rekindle bench-store` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct CommitCost {
    /// Agent steps in the sample run.
    pub steps: u64,
    /// Generations committed, the creating one included.
    pub commits: u64,
    /// Every request the commits made, retries included.
    pub requests: MetricsSnapshot,
    /// Requests per commit, all kinds together.
    pub requests_per_commit: f64,
    /// Conditional PUTs (creates and swaps) per commit.
    pub conditional_puts_per_commit: f64,
    /// Encoded size of all the run's facts, one JSONL line each.
    pub fact_bytes: u64,
    /// Bytes written to the store divided by the encoded size of the facts.
    pub write_amplification: f64,
}

/// What loading one long sample run cost the store, as `rekindle bench-store` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct LoadCost {
    /// Facts in the run.
    pub facts: u64,
    /// Generations in the run's chain.
    pub generations: u64,
    /// The requests of the last load.
    pub requests: MetricsSnapshot,
    /// Median wall time of the loads, in milliseconds.
    pub median_ms: f64,
    /// How many loads were timed.
    pub loads: usize,
}

/// Commits a run of `steps` facts after the meta and prompt, one commit per fact (as a host
/// commits after every model turn and tool result).
pub async fn commit_cost(
    store: &Store,
    run: &str,
    steps: u64,
) -> Result<CommitCost, GenerationError> {
    let mut random = SplitMix::new(7);
    let mut builder = Builder::new(run);
    for _ in 0..steps {
        builder.step(&mut |bound| random.below(bound), true);
    }
    let facts = builder.into_facts();
    let fact_bytes: u64 = facts
        .iter()
        .map(|f| fact::encode(f).map_or(0, |b| b.len() as u64 + 1))
        .sum();
    let before = store.metrics();
    let mut writer = RunWriter::create(
        store,
        facts[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await?;
    for fact in &facts[2..] {
        writer.commit(vec![fact.clone()]).await?;
    }
    let requests = store.metrics().since(&before);
    let commits = facts.len() as u64 - 1;
    Ok(CommitCost {
        steps,
        commits,
        requests,
        requests_per_commit: requests.requests() as f64 / commits as f64,
        conditional_puts_per_commit: requests.conditional_put as f64 / commits as f64,
        fact_bytes,
        write_amplification: requests.bytes_written as f64 / fact_bytes as f64,
    })
}

/// Writes a run of `facts` facts (committed `per_commit` at a time), then loads it `loads`
/// times and reports the requests of one load and the median time.
pub async fn load_cost(
    store: &Store,
    run: &str,
    facts: usize,
    per_commit: usize,
    loads: usize,
) -> Result<LoadCost, GenerationError> {
    let all = sample::run(run, facts, 11);
    let mut writer = RunWriter::create(
        store,
        all[..2].to_vec(),
        Epoch(1),
        SnapshotPolicy::default(),
    )
    .await?;
    for chunk in all[2..].chunks(per_commit.max(1)) {
        writer.commit(chunk.to_vec()).await?;
    }
    let run_id = RunId::new(run);
    let mut times = Vec::with_capacity(loads);
    let mut requests = MetricsSnapshot::default();
    for _ in 0..loads.max(1) {
        let before = store.metrics();
        let started = crate::clock::Stopwatch::start();
        let loaded = generation::load(store, &run_id, None).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        requests = store.metrics().since(&before);
        debug_assert_eq!(loaded.state.facts().len(), all.len());
    }
    times.sort_by(f64::total_cmp);
    Ok(LoadCost {
        facts: all.len() as u64,
        generations: writer.generation(),
        requests,
        median_ms: times[times.len() / 2],
        loads: times.len(),
    })
}
