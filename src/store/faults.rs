//! A fault-injecting `ObjectStore` wrapper, driven by a seed, for fault and crash tests.
//!
//! It sits *under* [`Store`](super::Store), so the real retry, adoption and fencing code runs
//! against: transient errors (as a 503 SlowDown surfaces), added latency, stalls past the
//! request deadline, writes that land but whose response is lost, 409 conflicts on conditional
//! creates and updates, writes that finish after their caller gave up, and a full partition
//! (the process keeps running but every request fails). Decisions come from a seeded generator, so
//! a failing seed replays exactly. A [`PauseGate`] holds one chosen read after it completed,
//! so a test can interleave other writers (and gc) between a reader's requests, as a GC pause
//! or a slow network would. Never used in production paths.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use crate::core::rng::SplitMix;

/// What to inject, as probabilities in parts per thousand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// A request fails before reaching the store (503 SlowDown).
    pub error_per_mille: u32,
    /// A write reaches the store, then its response is lost.
    pub lost_response_per_mille: u32,
    /// A request hangs for `stall` before failing (longer than the request deadline).
    pub stall_per_mille: u32,
    /// How long a stalled request hangs before it fails.
    pub stall: Duration,
    /// Latency added to every request.
    pub latency: Duration,
    /// Up to this much more (uniform, per request) on top of `latency`, as a real store's
    /// latency varies.
    pub jitter: Duration,
    /// A conditional create is refused with 409 ConditionalRequestConflict (surfacing as
    /// "already exists") although nothing was written.
    pub conflict_409_per_mille: u32,
    /// A conditional update (If-Match) is refused with 409 ConditionalRequestConflict, which
    /// object_store also reports as "already exists", although nothing was written.
    pub update_conflict_409_per_mille: u32,
    /// Every write takes this long once it has started, and completes even if the caller
    /// stops waiting (as object_store's local backend keeps writing on a blocking thread
    /// after its future is dropped).
    pub detached_write_delay: Duration,
    /// Behave like a server that accepts conditional headers and ignores them.
    pub ignore_conditions: bool,
    /// Behave like a server that checks conditions, then writes without a lock.
    pub racy_conditions: bool,
}

/// Fault injection for a store opened by a real process: a plan, its seed, and a file whose
/// existence cuts the store off (so a test can partition another process).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultSettings {
    /// The probabilities and delays to inject.
    pub plan: FaultPlan,
    /// Seed of the generator that decides each fault, so a failing run replays exactly.
    pub seed: u64,
    /// While this file exists, every request fails as if the store were unreachable.
    pub partition_file: Option<std::path::PathBuf>,
}

/// A fault spec that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("fault setting '{setting}' in '{spec}': {reason}")]
pub struct FaultSpecError {
    /// The whole spec as given.
    pub spec: String,
    /// The `name=value` pair that was refused.
    pub setting: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FaultSettings {
    /// Parses a spec such as `seed=7,error=50,lost=50,stall=5,stall_ms=2000,latency_ms=2`
    /// (rates per mille; also `conflict` and `update_conflict`). Refuses an unknown setting
    /// or a value that is not a number, naming it: a typo must not silently test nothing.
    pub fn parse(spec: &str) -> Result<FaultSettings, FaultSpecError> {
        let mut settings = FaultSettings::default();
        let plan = &mut settings.plan;
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let refuse = |reason: &str| FaultSpecError {
                spec: spec.to_owned(),
                setting: pair.to_owned(),
                reason: reason.to_owned(),
            };
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| refuse("expected name=value"))?;
            let value: u64 = value
                .trim()
                .parse()
                .map_err(|_| refuse("the value is not a whole number"))?;
            let per_mille = || u32::try_from(value.min(1000)).unwrap_or(1000);
            match name.trim() {
                "seed" => settings.seed = value,
                "error" => plan.error_per_mille = per_mille(),
                "lost" => plan.lost_response_per_mille = per_mille(),
                "stall" => plan.stall_per_mille = per_mille(),
                "stall_ms" => plan.stall = Duration::from_millis(value),
                "latency_ms" => plan.latency = Duration::from_millis(value),
                "jitter_ms" => plan.jitter = Duration::from_millis(value),
                "conflict" => plan.conflict_409_per_mille = per_mille(),
                "update_conflict" => plan.update_conflict_409_per_mille = per_mille(),
                _ => {
                    return Err(refuse(
                        "unknown (expected seed, error, lost, stall, stall_ms, latency_ms, jitter_ms, conflict or update_conflict)",
                    ));
                }
            }
        }
        Ok(settings)
    }
}

/// Counts of what was injected.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Requests failed with an injected error (503 SlowDown or a 409 conflict).
    pub errors: AtomicU64,
    /// Writes that landed but whose response was dropped.
    pub lost_responses: AtomicU64,
    /// Requests that hung past their deadline before failing.
    pub stalls: AtomicU64,
    /// Requests refused because the store was partitioned.
    pub partitioned: AtomicU64,
    /// Requests delayed by the plan's latency (a local compare-and-swap once, as on S3).
    pub delayed: AtomicU64,
}

/// An `ObjectStore` that injects the faults of a [`FaultPlan`] into every request it
/// passes on to the store it wraps.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    plan: Mutex<FaultPlan>,
    random: Mutex<SplitMix>,
    partitioned: AtomicBool,
    /// While this file exists, the store is cut off (lets a test partition another process).
    partition_file: Option<std::path::PathBuf>,
    /// The read to hold after it completes, if armed (one-shot).
    pause: Mutex<Option<PauseGate>>,
    /// What has been injected so far.
    pub counts: FaultCounts,
}

/// Marks the read a local compare-and-swap makes under its lock before it writes. S3 swaps in
/// one conditional PUT, so injected latency is charged once per swap, on its write: the read
/// half adds none (its other faults still apply). Without it a store with injected latency
/// made every compare-and-swap on the local backend take two round trips, where S3 takes one.
#[derive(Clone, Copy, Debug)]
pub struct ReadHalfOfSwap;

/// Holds the first GET (not HEAD) of a key ending in `suffix` after its response arrived,
/// until the test releases it: the reader has seen the old bytes and is paused before its
/// next request.
#[derive(Clone, Debug)]
pub struct PauseGate {
    suffix: String,
    reached: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

impl PauseGate {
    /// Waits until the paused reader has read its key.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the paused reader continue.
    pub fn release(&self) {
        self.release.notify_one();
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

enum Fault {
    None,
    Error,
    Stall,
    LoseResponse,
}

impl FaultyStore {
    /// Wraps `inner`, injecting `plan` with decisions drawn from `seed`.
    pub fn new(inner: Arc<dyn ObjectStore>, plan: FaultPlan, seed: u64) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            plan: Mutex::new(plan),
            random: Mutex::new(SplitMix::new(seed)),
            partitioned: AtomicBool::new(false),
            partition_file: None,
            pause: Mutex::new(None),
            counts: FaultCounts::default(),
        })
    }

    /// Arms a one-shot [`PauseGate`] on the next GET of a key ending in `suffix`.
    pub fn pause_after_read(&self, suffix: &str) -> PauseGate {
        let gate = PauseGate {
            suffix: suffix.to_owned(),
            reached: Arc::new(tokio::sync::Notify::new()),
            release: Arc::new(tokio::sync::Notify::new()),
        };
        if let Ok(mut pause) = self.pause.lock() {
            *pause = Some(gate.clone());
        }
        gate
    }

    /// Takes the armed gate if this read matches it.
    fn take_pause(&self, location: &Path, options: &GetOptions) -> Option<PauseGate> {
        if options.head {
            return None;
        }
        let mut pause = self.pause.lock().ok()?;
        if pause
            .as_ref()
            .is_some_and(|gate| location.as_ref().ends_with(&gate.suffix))
        {
            pause.take()
        } else {
            None
        }
    }

    /// Builds the injector a real process asked for in its settings (the chaos tests set
    /// them through `REKINDLE_FAULTS` and `REKINDLE_FAULTS_PARTITION_FILE`).
    pub fn with_settings(inner: Arc<dyn ObjectStore>, settings: &FaultSettings) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            plan: Mutex::new(settings.plan),
            random: Mutex::new(SplitMix::new(settings.seed)),
            partitioned: AtomicBool::new(false),
            partition_file: settings.partition_file.clone(),
            pause: Mutex::new(None),
            counts: FaultCounts::default(),
        })
    }

    fn is_partitioned(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
            || self
                .partition_file
                .as_ref()
                .is_some_and(|file| file.exists())
    }

    /// Replaces the fault plan for the requests that follow.
    pub fn set_plan(&self, plan: FaultPlan) {
        if let Ok(mut current) = self.plan.lock() {
            *current = plan;
        }
    }

    /// Cuts the store off (every request fails) or reconnects it.
    pub fn set_partitioned(&self, partitioned: bool) {
        self.partitioned.store(partitioned, Ordering::SeqCst);
    }

    fn plan(&self) -> FaultPlan {
        self.plan.lock().map(|p| *p).unwrap_or_default()
    }

    fn roll(&self, per_mille: u32) -> bool {
        per_mille > 0
            && self
                .random
                .lock()
                .map(|mut r| r.below(1000) < per_mille)
                .unwrap_or(false)
    }

    /// Decides this request's fault and applies latency and stalls.
    async fn before(&self, is_write: bool) -> Result<Fault> {
        self.before_charged(is_write, true).await
    }

    /// [`Self::before`]; without `latency`, the request adds no latency of its own (see
    /// [`ReadHalfOfSwap`]).
    async fn before_charged(&self, is_write: bool, latency: bool) -> Result<Fault> {
        let plan = self.plan();
        let jitter = match plan.jitter.as_micros() as u64 {
            0 => 0,
            range => self
                .random
                .lock()
                .map(|mut r| r.next_u64() % range)
                .unwrap_or(0),
        };
        let delay = plan.latency + Duration::from_micros(jitter);
        if latency && !delay.is_zero() {
            self.counts.delayed.fetch_add(1, Ordering::Relaxed);
            crate::clock::sleep(delay).await;
        }
        if self.is_partitioned() {
            self.counts.partitioned.fetch_add(1, Ordering::Relaxed);
            return Err(transient("connection refused (injected partition)"));
        }
        let fault = if self.roll(plan.error_per_mille) {
            Fault::Error
        } else if self.roll(plan.stall_per_mille) {
            Fault::Stall
        } else if is_write && self.roll(plan.lost_response_per_mille) {
            Fault::LoseResponse
        } else {
            Fault::None
        };
        match fault {
            Fault::Error => {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
                Err(transient("503 SlowDown (injected)"))
            }
            Fault::Stall => {
                self.counts.stalls.fetch_add(1, Ordering::Relaxed);
                crate::clock::sleep(plan.stall).await;
                Err(transient("request stalled (injected)"))
            }
            other => Ok(other),
        }
    }
}

fn transient(message: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faults",
        source: message.to_owned().into(),
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let fault = self.before(true).await?;
        let plan = self.plan();
        if opts.mode == PutMode::Create && self.roll(plan.conflict_409_per_mille) {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "409 ConditionalRequestConflict (injected)".into(),
            });
        }
        if matches!(opts.mode, PutMode::Update(_)) && self.roll(plan.update_conflict_409_per_mille)
        {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "409 ConditionalRequestConflict on If-Match (injected)".into(),
            });
        }
        let mut opts = opts;
        if plan.ignore_conditions {
            opts.mode = PutMode::Overwrite;
        } else if plan.racy_conditions && opts.mode != PutMode::Overwrite {
            let current = match self.inner.head(location).await {
                Ok(meta) => Some(meta),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(other) => return Err(other),
            };
            let holds = match (&opts.mode, &current) {
                (PutMode::Create, None) => true,
                (PutMode::Update(version), Some(meta)) => version.e_tag == meta.e_tag,
                _ => false,
            };
            if !holds {
                let path = location.to_string();
                let source = "condition not met (racy server)".into();
                return Err(match opts.mode {
                    PutMode::Create => object_store::Error::AlreadyExists { path, source },
                    _ => object_store::Error::Precondition { path, source },
                });
            }
            // The window in which another request's check also passes.
            crate::clock::sleep(Duration::from_millis(5)).await;
            opts.mode = PutMode::Overwrite;
        }
        let result = if plan.detached_write_delay.is_zero() {
            self.inner.put_opts(location, payload, opts).await
        } else {
            // A spawned task runs to completion even when this future is dropped.
            let inner = Arc::clone(&self.inner);
            let location = location.clone();
            let delay = plan.detached_write_delay;
            tokio::spawn(async move {
                crate::clock::sleep(delay).await;
                inner.put_opts(&location, payload, opts).await
            })
            .await
            .map_err(|error| object_store::Error::JoinError { source: error })?
        };
        if matches!(fault, Fault::LoseResponse) && result.is_ok() {
            self.counts.lost_responses.fetch_add(1, Ordering::Relaxed);
            return Err(transient("response lost after the write landed (injected)"));
        }
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.before(true).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let latency = options.extensions.get::<ReadHalfOfSwap>().is_none();
        self.before_charged(false, latency).await?;
        let pause = self.take_pause(location, &options);
        let result = self.inner.get_opts(location, options).await;
        if let Some(gate) = pause {
            // The response is complete (the memory store hands out a snapshot of the bytes):
            // the reader holds what the store returned then, however it changes meanwhile.
            gate.reached.notify_one();
            gate.release.notified().await;
        }
        result
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.before(false).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        if self.is_partitioned() {
            self.counts.partitioned.fetch_add(1, Ordering::Relaxed);
            return futures::stream::once(async {
                Err(transient("connection refused (injected partition)"))
            })
            .boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.is_partitioned() || self.roll(self.plan().error_per_mille) {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            return futures::stream::once(async { Err(transient("503 SlowDown (injected)")) })
                .boxed();
        }
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.is_partitioned() || self.roll(self.plan().error_per_mille) {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            return futures::stream::once(async { Err(transient("503 SlowDown (injected)")) })
                .boxed();
        }
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.before(false).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.before(true).await?;
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves a fault spec parses into its plan and seed, and that a typo or a bad value is
    // refused naming the setting instead of silently injecting nothing.
    #[test]
    fn fault_spec_parses_and_refuses_typos() {
        let settings =
            FaultSettings::parse("seed=7, error=40,lost=40,stall=10,stall_ms=1200,latency_ms=1")
                .unwrap();
        assert_eq!(settings.seed, 7);
        assert_eq!(settings.plan.error_per_mille, 40);
        assert_eq!(settings.plan.lost_response_per_mille, 40);
        assert_eq!(settings.plan.stall_per_mille, 10);
        assert_eq!(settings.plan.stall, Duration::from_millis(1200));
        assert_eq!(settings.plan.latency, Duration::from_millis(1));
        assert_eq!(FaultSettings::parse("").unwrap(), FaultSettings::default());
        let typo = FaultSettings::parse("seed=1,eror=5").unwrap_err();
        assert_eq!(typo.setting, "eror=5");
        assert!(typo.to_string().contains("unknown"), "{typo}");
        let bad = FaultSettings::parse("error=lots").unwrap_err();
        assert!(bad.to_string().contains("not a whole number"), "{bad}");
    }
}
