//! Liveness, judged one way everywhere: a holder is alive while its lease object or its
//! heartbeat changes, and silent once both were seen unchanged for a whole TTL on the
//! observer's own monotonic clock. Pure: the caller supplies the readings and the time.
//!
//! Architecture invariant: no process trusts another machine's clock — expiry is measured
//! only between two observations made by the same process ([`ExpiryWatch`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::core::layout::ETag;

/// Whether a watched lease is still alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Alive,
    Expired,
}

#[derive(Clone, Debug)]
struct Observation {
    lease: ETag,
    heartbeat: Option<ETag>,
    since: Duration,
}

/// Judges lease expiry from observations on this process's monotonic clock alone: a lease
/// is expired once its object and its holder's heartbeat were seen unchanged for a full TTL.
/// Pure: the caller supplies the readings and the time.
#[derive(Debug, Default)]
pub struct ExpiryWatch {
    observed: HashMap<String, Observation>,
}

impl ExpiryWatch {
    pub fn observe(
        &mut self,
        key: &str,
        lease: &ETag,
        heartbeat: Option<&ETag>,
        ttl: Duration,
        now: Duration,
    ) -> Verdict {
        let entry = self
            .observed
            .entry(key.to_owned())
            .or_insert_with(|| Observation {
                lease: lease.clone(),
                heartbeat: heartbeat.cloned(),
                since: now,
            });
        if entry.lease != *lease || entry.heartbeat.as_ref() != heartbeat {
            *entry = Observation {
                lease: lease.clone(),
                heartbeat: heartbeat.cloned(),
                since: now,
            };
        }
        if now.saturating_sub(entry.since) >= ttl {
            Verdict::Expired
        } else {
            Verdict::Alive
        }
    }

    pub fn forget(&mut self, key: &str) {
        self.observed.remove(key);
    }
}

/// Judges each listed heartbeat: alive unless its listed ETag stayed the same for its holder's
/// TTL. The TTL is the longest of the observer's own and any the holder declared
/// (`declared`: heartbeat key, TTL in ms), so a host that beats every 10 s under a 30 s TTL is
/// never judged by a coordinator's 3 s TTL. A heartbeat that is not listed is not judged here:
/// callers treat it as gone.
pub fn judge_heartbeats<'a>(
    watch: &mut ExpiryWatch,
    own_ttl: Duration,
    declared: impl IntoIterator<Item = (&'a str, u64)>,
    heartbeats: Vec<(String, ETag)>,
    now: Duration,
) -> HashMap<String, bool> {
    let mut longest: HashMap<&str, u64> = HashMap::new();
    for (key, ttl_ms) in declared {
        let slot = longest.entry(key).or_default();
        *slot = (*slot).max(ttl_ms);
    }
    let mut alive = HashMap::new();
    for (key, etag) in heartbeats {
        let declared = longest.get(key.as_str()).copied().unwrap_or(0);
        let ttl = own_ttl.max(Duration::from_millis(declared));
        let verdict = watch.observe(&key, &etag, None, ttl, now);
        alive.insert(key, verdict == Verdict::Alive);
    }
    alive
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves expiry depends only on ETags observed over the observer's own monotonic time:
    // a lease is alive while its heartbeat keeps changing, expires a full TTL after the last
    // change seen, and any change to the lease restarts the observation.
    #[test]
    fn expiry_is_judged_on_the_observers_clock() {
        let run = "r";
        let ttl = Duration::from_secs(10);
        let lease = ETag("l1".into());
        let mut watch = ExpiryWatch::default();
        let at = Duration::from_secs;
        for (i, second) in [0, 4, 8, 12, 16].into_iter().enumerate() {
            let beat = ETag(format!("b{i}"));
            assert_eq!(
                watch.observe(run, &lease, Some(&beat), ttl, at(second)),
                Verdict::Alive
            );
        }
        let last = ETag("b4".into());
        assert_eq!(
            watch.observe(run, &lease, Some(&last), ttl, at(25)),
            Verdict::Alive
        );
        assert_eq!(
            watch.observe(run, &lease, Some(&last), ttl, at(26)),
            Verdict::Expired
        );
        // A new lease version (a takeover or release by someone else) starts over.
        let moved = ETag("l2".into());
        assert_eq!(
            watch.observe(run, &moved, Some(&last), ttl, at(27)),
            Verdict::Alive
        );
        assert_eq!(
            watch.observe(run, &moved, None, ttl, at(36)),
            Verdict::Alive
        );
        assert_eq!(
            watch.observe(run, &moved, None, ttl, at(46)),
            Verdict::Expired
        );
    }
}
