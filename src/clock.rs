//! Time and identity sources, injected so a seeded test can replay a failure exactly.
//!
//! This is the one module allowed to read the system clock and generate random IDs (the ban
//! is in `clippy.toml`). Everything else takes a [`Clock`] and asks it. Lease expiry uses only
//! the monotonic reading, never a wall-clock comparison between machines.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::rng::SplitMix;
use std::time::{Duration, Instant};

/// Waits `duration` on tokio's timer, which a paused test runtime turns into virtual time:
/// the one sleep the library uses, so the simulation controls every wait.
#[allow(clippy::disallowed_methods)] // The one place a sleep is started.
pub fn sleep(duration: Duration) -> tokio::time::Sleep {
    tokio::time::sleep(duration)
}

/// How often a stoppable wait looks at its stop flag: a stop is noticed within this long.
pub const STOP_CHECK: Duration = Duration::from_millis(20);

/// Waits `duration`, or until `stop` is set, or until `wake` is notified, whichever comes
/// first; returns whether the wait was cut short. The stop flag (set by a signal handler or a
/// caller) is an in-memory read every [`STOP_CHECK`]; no store is touched. Long waits
/// (heartbeat intervals, scans, polls) go through here, so a process exits promptly.
#[allow(clippy::disallowed_methods)] // A stoppable sleep: reads tokio's (virtual in tests) clock.
pub async fn sleep_unless(
    duration: Duration,
    stop: &std::sync::atomic::AtomicBool,
    wake: Option<&tokio::sync::Notify>,
) -> bool {
    let deadline = tokio::time::Instant::now() + duration;
    let woken = async {
        match wake {
            Some(wake) => wake.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(woken);
    loop {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::select! {
            biased;
            () = &mut woken => return true,
            () = tokio::time::sleep_until((now + STOP_CHECK).min(deadline)) => {}
        }
    }
}

/// Measures elapsed time (tool durations, benchmark timings, deadlines) on tokio's monotonic
/// timer: real time in a process, virtual time under a paused test runtime.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch(tokio::time::Instant);

impl Stopwatch {
    /// Starts timing now.
    #[allow(clippy::disallowed_methods)] // The one place the monotonic clock is read directly.
    pub fn start() -> Self {
        Stopwatch(tokio::time::Instant::now())
    }

    /// The time passed since [`Stopwatch::start`].
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    /// The instant `after` from the start, for `tokio::time::timeout_at`.
    pub fn deadline(&self, after: Duration) -> tokio::time::Instant {
        self.0 + after
    }
}

/// A source of time and fresh IDs.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch, for recording in facts and objects (data only).
    fn wall_ms(&self) -> u64;
    /// A monotonic reading, only ever compared with readings of the same process.
    fn monotonic(&self) -> Duration;
    /// A fresh unique token (writer nonces, holder IDs).
    fn nonce(&self) -> String;
    /// A seed for retry jitter, or `None` for a random one. A seeded clock returns seeds from
    /// its own sequence, so backoff delays (and with them the interleaving) replay exactly.
    fn jitter_seed(&self) -> Option<u64> {
        None
    }
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    /// A real clock whose monotonic readings count from now, shared by everything in the
    /// process.
    #[allow(clippy::disallowed_methods)] // The real clock's origin.
    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(SystemClock {
            start: Instant::now(),
        })
    }
}

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one place the wall clock is read.
    fn wall_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }

    #[allow(clippy::disallowed_methods)] // The one place random IDs are drawn.
    fn nonce(&self) -> String {
        uuid::Uuid::new_v4().simple().to_string()
    }
}

/// A clock that moves only when told to, with deterministic nonces, for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
    next_nonce: AtomicU64,
}

impl ManualClock {
    /// A clock stopped at `start_ms`, for both its wall and its monotonic reading.
    pub fn new(start_ms: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            now_ms: AtomicU64::new(start_ms),
            next_nonce: AtomicU64::new(1),
        })
    }

    /// Moves both readings forward by `by`; nothing else moves them.
    pub fn advance(&self, by: Duration) {
        self.now_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_millis(self.now_ms.load(Ordering::SeqCst))
    }

    fn nonce(&self) -> String {
        format!("n{:016}", self.next_nonce.fetch_add(1, Ordering::SeqCst))
    }
}

/// A clock on tokio's time, with seeded nonces and jitter: under a paused runtime
/// (`tokio::time::pause`, tests only) every reading is virtual, so a whole fleet in one
/// process replays exactly from a seed. Each simulated process gets its own, with its own
/// wall-clock offset (skew between nodes) and its own nonce prefix.
#[derive(Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
    wall_base_ms: u64,
    prefix: String,
    next_nonce: AtomicU64,
    random: Mutex<SplitMix>,
}

impl TokioClock {
    /// `wall_base_ms` is what `wall_ms` reads at creation; `seed` drives nonces and jitter.
    #[allow(clippy::disallowed_methods)] // The virtual clock's origin.
    pub fn new(wall_base_ms: u64, prefix: impl Into<String>, seed: u64) -> Arc<Self> {
        Arc::new(TokioClock {
            start: tokio::time::Instant::now(),
            wall_base_ms,
            prefix: prefix.into(),
            next_nonce: AtomicU64::new(1),
            random: Mutex::new(SplitMix::new(seed)),
        })
    }

    fn next_random(&self) -> u64 {
        let mut random = self.random.lock().unwrap_or_else(|e| e.into_inner());
        random.next_u64()
    }
}

impl Clock for TokioClock {
    fn wall_ms(&self) -> u64 {
        self.wall_base_ms + self.start.elapsed().as_millis() as u64
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }

    fn nonce(&self) -> String {
        format!(
            "{}{:08}{:016x}",
            self.prefix,
            self.next_nonce.fetch_add(1, Ordering::SeqCst),
            self.next_random()
        )
    }

    fn jitter_seed(&self) -> Option<u64> {
        Some(self.next_random())
    }
}
