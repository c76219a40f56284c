//! Parse and fold throughput of fact logs (10k and 1M facts), next to bare serde_json parses
//! of the same bytes. Run with `cargo bench --bench fold`; figures are in the README.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rekindle::core::{fact, sample};
use rekindle::store::log;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

fn encoded(facts: usize) -> (Vec<u8>, u64) {
    let run = sample::run("bench-run", facts, 42);
    let mut bytes = Vec::new();
    for fact in &run {
        bytes.extend(fact::encode(fact).expect("sample facts encode"));
        bytes.push(b'\n');
    }
    (bytes, run.len() as u64)
}

fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes.split(|b| *b == b'\n').filter(|line| !line.is_empty())
}

fn parse_and_fold(c: &mut Criterion) {
    for size in [10_000usize, 1_000_000] {
        let (bytes, count) = encoded(size);
        let mut group = c.benchmark_group(format!("log_{size}"));
        group.throughput(Throughput::Elements(count));
        if size >= 1_000_000 {
            group.sample_size(10);
            group.measurement_time(Duration::from_secs(20));
        }
        group.bench_function(BenchmarkId::new("bare_parse_ignored_any", count), |b| {
            b.iter(|| {
                for line in lines(&bytes) {
                    let parsed: serde::de::IgnoredAny =
                        serde_json::from_slice(line).expect("valid json");
                    black_box(parsed);
                }
            })
        });
        group.bench_function(BenchmarkId::new("bare_parse_value", count), |b| {
            b.iter(|| {
                for line in lines(&bytes) {
                    let parsed: serde_json::Value =
                        serde_json::from_slice(line).expect("valid json");
                    black_box(parsed);
                }
            })
        });
        group.bench_function(BenchmarkId::new("parse_facts", count), |b| {
            b.iter(|| {
                let contents = log::read_from(Path::new("bench"), &bytes[..]).expect("read");
                black_box(contents.facts.len());
                contents
            })
        });
        group.bench_function(BenchmarkId::new("parse_and_fold", count), |b| {
            b.iter(|| {
                let (state, _) = log::fold_from(Path::new("bench"), &bytes[..]).expect("fold");
                black_box(state.counters().model_turns);
                state
            })
        });
        group.finish();
    }
}

criterion_group!(benches, parse_and_fold);
criterion_main!(benches);
