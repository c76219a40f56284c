//! Liveness, judged one way everywhere: a holder is alive while its lease object or its
//! heartbeat changes, and silent once both were seen unchanged for a whole TTL on the
//! observer's own monotonic clock. Pure: the caller supplies the readings and the time.
//!
//! Architecture invariant: no process trusts another machine's clock — expiry is measured
//! only between two observations made by the same process ([`ExpiryWatch`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::core::layout::ETag;

/// When a reading was taken, on the observer's monotonic clock: when the request that saw it
/// was issued and when it returned. A version it saw existed at some moment between the two,
/// so a version is known unchanged only from the *return* of the request that first saw it
/// to the *issue* of the request that saw it again; anything else overstates silence by the
/// requests' latency (a slow response, a pause of the observer, the rest of a long tick).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// When the request that saw the reading was issued.
    pub issued: Duration,
    /// When it returned.
    pub returned: Duration,
}

impl Seen {
    /// A reading taken in no time at `at` (a test's, or one already in hand).
    pub fn at(at: Duration) -> Seen {
        Seen {
            issued: at,
            returned: at,
        }
    }
}

/// Whether a watched lease is still alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The lease or its heartbeat changed within the last TTL.
    Alive,
    /// The lease and its heartbeat were seen unchanged for a whole TTL.
    Expired,
}

#[derive(Clone, Debug)]
struct Observation {
    lease: ETag,
    heartbeat: Option<ETag>,
    since: Duration,
    /// The TTL it was last judged by.
    ttl: Duration,
}

/// Judges lease expiry from observations on this process's monotonic clock alone: a lease
/// is expired once its object and its holder's heartbeat were seen unchanged for a full TTL.
/// Pure: the caller supplies the readings and the time.
#[derive(Debug, Default)]
pub struct ExpiryWatch {
    observed: HashMap<String, Observation>,
}

impl ExpiryWatch {
    /// Records one reading of the lease watched under `key`, `seen` then, and judges it by
    /// `ttl`: a new version counts from when its request returned, an unchanged one is
    /// judged at when its request was issued (see [`Seen`]).
    pub fn observe(
        &mut self,
        key: &str,
        lease: &ETag,
        heartbeat: Option<&ETag>,
        ttl: Duration,
        seen: Seen,
    ) -> Verdict {
        let entry = self
            .observed
            .entry(key.to_owned())
            .or_insert_with(|| Observation {
                lease: lease.clone(),
                heartbeat: heartbeat.cloned(),
                since: seen.returned,
                ttl,
            });
        if entry.lease != *lease || entry.heartbeat.as_ref() != heartbeat {
            *entry = Observation {
                lease: lease.clone(),
                heartbeat: heartbeat.cloned(),
                since: seen.returned,
                ttl,
            };
        }
        entry.ttl = ttl;
        if seen.issued.saturating_sub(entry.since) >= ttl {
            Verdict::Expired
        } else {
            Verdict::Alive
        }
    }

    /// Stops watching `key`, so its next reading starts a fresh TTL.
    pub fn forget(&mut self, key: &str) {
        self.observed.remove(key);
    }

    /// Forgets every key `keep` rejects (holders that are gone), so the watch holds only
    /// what is still observed.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.observed.retain(|key, _| keep(key));
    }

    /// How long `key` has been seen unchanged as of `now`, and the TTL it is judged by;
    /// `None` if it is not watched.
    pub fn silence(&self, key: &str, now: Duration) -> Option<(Duration, Duration)> {
        self.observed
            .get(key)
            .map(|o| (now.saturating_sub(o.since), o.ttl))
    }

    /// The earliest time after `now` (on the observer's clock) at which one of the keys `of`
    /// selects, still unchanged then, would be judged expired: when to look next to judge it
    /// without delay. Deadlines already past are not returned (looking again at once would
    /// only repeat the same judgement).
    pub fn next_expiry(&self, mut of: impl FnMut(&str) -> bool, now: Duration) -> Option<Duration> {
        self.observed
            .iter()
            .filter(|(key, _)| of(key))
            .map(|(_, o)| o.since + o.ttl)
            .filter(|due| *due > now)
            .min()
    }
}

/// One look at the heartbeat of a run's holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// The index entry names no holder.
    NoHolder,
    /// The holder's heartbeat object does not exist (it stopped and removed it, or its
    /// heartbeat was removed as a dead process's); judged by the TTL it declared elsewhere.
    Gone {
        /// The TTL its holder declared where it was named.
        ttl: Duration,
    },
    /// The heartbeat exists at this version; its holder declared this TTL.
    Beating {
        /// The heartbeat object's version.
        etag: ETag,
        /// The lease TTL its holder declared.
        ttl: Duration,
    },
}

/// The judgement of a running run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Its holder beats (or has not yet been watched for a whole TTL).
    Running,
    /// Nobody drives it: the fleet may recover it.
    Interrupted,
}

/// Judges sightings of holders over time. Pure: no I/O, no clock of its own.
#[derive(Debug, Default)]
pub struct Judge {
    watch: ExpiryWatch,
}

impl Judge {
    /// Forgets what was seen of `key`, so its next sighting starts a fresh TTL.
    pub fn forget(&mut self, key: &str) {
        self.watch.forget(key);
    }

    /// Forgets every key `keep` rejects; see [`ExpiryWatch::retain`].
    pub fn retain(&mut self, keep: impl FnMut(&str) -> bool) {
        self.watch.retain(keep);
    }

    /// When the next sighting could turn one of the holders `of` selects silent; see
    /// [`ExpiryWatch::next_expiry`].
    pub fn next_expiry(&self, of: impl FnMut(&str) -> bool, now: Duration) -> Option<Duration> {
        self.watch.next_expiry(of, now)
    }

    /// How long the heartbeat at `key` has been seen unchanged, and the TTL it is judged by
    /// (see [`ExpiryWatch::silence`]).
    pub fn silence(&self, key: &str, now: Duration) -> Option<(Duration, Duration)> {
        self.watch.silence(key, now)
    }

    /// Judges `sighting` of what `key` names (a run, or a heartbeat key shared by a holder's
    /// runs), `seen` then on this process's monotonic clock. A beating holder is interrupted
    /// only once this judge has seen its heartbeat at the same version for its whole TTL,
    /// measured from the return of the request that first saw it to the issue of the one that
    /// saw it again.
    pub fn judge(&mut self, key: &str, sighting: &Sighting, seen: Seen) -> Liveness {
        match sighting {
            Sighting::NoHolder => Liveness::Interrupted,
            // Absence is a version like any other: a heartbeat removed under a process that
            // came back (a restart under its ID, a pause) is written again within a third of
            // its TTL, so only one absent for a whole TTL is silence.
            Sighting::Gone { ttl } => match self.watch.observe(key, &absent(), None, *ttl, seen) {
                Verdict::Alive => Liveness::Running,
                Verdict::Expired => Liveness::Interrupted,
            },
            Sighting::Beating { etag, ttl } => {
                // The heartbeat is the one object watched here, so it stands in the lease slot.
                match self.watch.observe(key, etag, None, *ttl, seen) {
                    Verdict::Alive => Liveness::Running,
                    Verdict::Expired => Liveness::Interrupted,
                }
            }
        }
    }
}

/// The version a heartbeat that is not there is judged at (no store reports it for an object).
pub fn absent() -> ETag {
    ETag("(absent)".to_owned())
}

/// `listed` with every key of `named` that is not listed added at the [`absent`] version, so
/// a judge watches its absence for a TTL like any version: what the coordinator judges.
pub fn with_absent<'a>(
    mut listed: Vec<(String, ETag)>,
    named: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, ETag)> {
    let present: std::collections::BTreeSet<String> =
        listed.iter().map(|(key, _)| key.clone()).collect();
    let missing: std::collections::BTreeSet<&str> = named
        .into_iter()
        .filter(|key| !present.contains(*key))
        .collect();
    listed.extend(missing.into_iter().map(|key| (key.to_owned(), absent())));
    listed
}

/// Judges each listed heartbeat with `judge`: alive unless its listed ETag stayed the same for
/// its holder's TTL. The TTL is the longest of the observer's own and any the holder declared
/// (`declared`: heartbeat key, TTL in ms), so a host that beats every 10 s under a 30 s TTL is
/// never judged by a coordinator's 3 s TTL. A heartbeat that is not listed is not judged here:
/// callers that must judge one add it at the [`absent`] version ([`with_absent`]).
pub fn judge_heartbeats<'a>(
    judge: &mut Judge,
    own_ttl: Duration,
    declared: impl IntoIterator<Item = (&'a str, u64)>,
    heartbeats: Vec<(String, ETag)>,
    seen: Seen,
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
        let liveness = judge.judge(&key, &Sighting::Beating { etag, ttl }, seen);
        alive.insert(key, liveness == Liveness::Running);
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
                watch.observe(run, &lease, Some(&beat), ttl, Seen::at(at(second))),
                Verdict::Alive
            );
        }
        let last = ETag("b4".into());
        assert_eq!(
            watch.observe(run, &lease, Some(&last), ttl, Seen::at(at(25))),
            Verdict::Alive
        );
        assert_eq!(
            watch.observe(run, &lease, Some(&last), ttl, Seen::at(at(26))),
            Verdict::Expired
        );
        // A new lease version (a takeover or release by someone else) starts over.
        let moved = ETag("l2".into());
        assert_eq!(
            watch.observe(run, &moved, Some(&last), ttl, Seen::at(at(27))),
            Verdict::Alive
        );
        assert_eq!(
            watch.observe(run, &moved, None, ttl, Seen::at(at(36))),
            Verdict::Alive
        );
        assert_eq!(
            watch.observe(run, &moved, None, ttl, Seen::at(at(46))),
            Verdict::Expired
        );
    }

    // Regression (stale evidence): a reading was judged as if seen when its request returned,
    // so a slow response, or a tick whose other reads took a TTL after its listing, made a
    // holder that beats look silent. Silence now runs from the return of the request that
    // first saw a version to the issue of the one that saw it again.
    #[test]
    fn silence_runs_from_a_return_to_the_next_issue() {
        let at = Duration::from_secs;
        let ttl = Duration::from_secs(10);
        let mut watch = ExpiryWatch::default();
        let (lease, beat) = (ETag("l".into()), ETag("b1".into()));
        let seen = |issued, returned| Seen {
            issued: at(issued),
            returned: at(returned),
        };
        // First seen by a request issued at 0 that returned at 2: unchanged since 2.
        assert_eq!(
            watch.observe("r", &lease, Some(&beat), ttl, seen(0, 2)),
            Verdict::Alive
        );
        // Seen again by a request issued at 3 whose answer took 30 s: 1 s of known silence.
        assert_eq!(
            watch.observe("r", &lease, Some(&beat), ttl, seen(3, 33)),
            Verdict::Alive
        );
        // Issued 10 s after the first return: a whole TTL.
        assert_eq!(
            watch.observe("r", &lease, Some(&beat), ttl, seen(12, 13)),
            Verdict::Expired
        );
        let mut judge = Judge::default();
        let beating = beating("1");
        assert_eq!(judge.judge("h", &beating, seen(0, 1)), Liveness::Running);
        assert_eq!(judge.judge("h", &beating, seen(2, 40)), Liveness::Running);
    }

    fn beating(version: &str) -> Sighting {
        Sighting::Beating {
            etag: ETag(version.into()),
            ttl: Duration::from_secs(10),
        }
    }

    // Proves the judgement: no holder is interrupted at once, no heartbeat only once absent
    // for a whole TTL (absence is a version); a heartbeat is
    // running on one look and while it changes, and interrupted only after it stayed the
    // same for a whole TTL on the judge's clock.
    #[test]
    fn interrupted_only_when_silent_for_a_ttl() {
        let at = Duration::from_secs;
        let mut judge = Judge::default();
        assert_eq!(
            judge.judge("a", &Sighting::NoHolder, Seen::at(at(0))),
            Liveness::Interrupted
        );
        let gone = Sighting::Gone { ttl: at(10) };
        assert_eq!(judge.judge("b", &gone, Seen::at(at(0))), Liveness::Running);
        assert_eq!(judge.judge("b", &gone, Seen::at(at(9))), Liveness::Running);
        assert_eq!(
            judge.judge("b", &gone, Seen::at(at(10))),
            Liveness::Interrupted
        );
        assert_eq!(
            judge.judge("c", &beating("1"), Seen::at(at(0))),
            Liveness::Running
        );
        assert_eq!(
            judge.judge("c", &beating("2"), Seen::at(at(9))),
            Liveness::Running
        );
        assert_eq!(
            judge.judge("c", &beating("2"), Seen::at(at(18))),
            Liveness::Running
        );
        assert_eq!(
            judge.judge("c", &beating("2"), Seen::at(at(19))),
            Liveness::Interrupted
        );
        // A fresh judge (one look) never calls a beating holder silent.
        assert_eq!(
            Judge::default().judge("c", &beating("2"), Seen::at(at(1000))),
            Liveness::Running
        );
    }

    // Proves the watch says when to look next: the earliest unchanged observation's TTL end,
    // moved on by a change, and forgotten keys no longer count.
    #[test]
    fn next_expiry_is_the_earliest_silent_deadline() {
        let at = Duration::from_secs;
        let mut watch = ExpiryWatch::default();
        let all = |_: &str| true;
        assert_eq!(watch.next_expiry(all, at(0)), None);
        let e = |v: &str| ETag(v.into());
        watch.observe("a", &e("1"), None, at(10), Seen::at(at(0)));
        watch.observe("b", &e("1"), None, at(30), Seen::at(at(5)));
        assert_eq!(watch.next_expiry(all, at(0)), Some(at(10)));
        // "a" changed at 8: its deadline moves to 18.
        watch.observe("a", &e("2"), None, at(10), Seen::at(at(8)));
        assert_eq!(watch.next_expiry(all, at(8)), Some(at(18)));
        // Only the keys asked about, and only deadlines still ahead: a holder long silent
        // (a killed process's heartbeat left behind) does not make the watch spin.
        assert_eq!(watch.next_expiry(|key| key == "b", at(8)), Some(at(35)));
        assert_eq!(watch.next_expiry(all, at(20)), Some(at(35)));
        assert_eq!(watch.next_expiry(all, at(40)), None);
        watch.retain(|key| key == "b");
        assert_eq!(watch.next_expiry(all, at(8)), Some(at(35)));
    }
}
