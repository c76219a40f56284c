//! The bucket layout: every key Rekindle writes, in one place, under a format version.
//!
//! ```text
//! <prefix>/rekindle-format                         format marker {"format":1,"partitions":P}
//! runs/<shard>/<run>/gen/<n:020>                   run generations (immutable, create-if-absent)
//! runs/<shard>/<run>/head                          hint: newest snapshot generation (CAS, monotonic)
//! runs/<shard>/<run>/lease                         the run's lease: holder, epoch, TTL (CAS)
//! runs/<shard>/<run>/recovered-by                  which recovery ID claimed this source run (create-if-absent)
//! runs/<shard>/<run>/loop/gen/<n:020>              loop checkpoints (immutable)
//! heartbeats/<shard>/<holder>                      one liveness object per process (overwritten)
//! heartbeats/workers/<shard>/<worker>              worker registration: capacity, fingerprint
//! heartbeats/coordinators/<shard>/<coordinator>    coordinator membership (shares the partitions)
//! inbox/<shard>/<worker>                           a worker's assigned recoveries (written by the coordinator)
//! recoveries/<shard>/<recovery>                    recovery records (create-if-absent, then CAS)
//! index/<shard>/<run>                              active-run index entry (one per run not yet done)
//! sessions/<shard>/<session>/gen/<n:020>           session snapshot envelopes (immutable)
//! workflows/<shard>/<workflow>/gen/<n:020>         workflow checkpoints (immutable)
//! probe/<nonce>/...                                capability probe scratch keys (deleted after)
//! gc/clock                                         rewritten by each gc pass to read the store's clock
//! ```
//!
//! `<shard>` is the first two hex digits of the SHA-256 of the ID, so a large fleet's writes
//! spread over 256 key prefixes. IDs are encoded with [`encode_id`] so that any ID — with `/`,
//! `..`, NUL, newlines or 10 000 characters — maps to exactly one safe key segment. Never does
//! I/O.

use crate::core::digest::sha256_hex;

/// The version tag of an object as the store reports it (an S3 ETag, or the local backend's
/// equivalent). Compared only for equality.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ETag(pub String);

/// The version of this layout and of every object's envelope. Readers refuse newer ones.
pub const FORMAT_VERSION: u32 = 1;

/// Longest ID used as a key or file name as-is.
const MAX_PLAIN_ID: usize = 128;

/// A safe path segment for an ID: the ID itself when it is 1–128 ASCII letters, digits and
/// `_ . : -` not starting with `.` or `s-`; otherwise `s-` plus the full SHA-256 hex of its
/// bytes, which no two different IDs share (a truncated hex encoding of the ID itself would
/// make two long IDs with a common prefix collide).
pub fn encode_id(id: &str) -> String {
    let plain = (1..=MAX_PLAIN_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
        && !id.starts_with('.')
        && !id.starts_with("s-");
    if plain {
        id.to_owned()
    } else {
        format!("s-{}", sha256_hex(id.as_bytes()))
    }
}

fn shard(id: &str) -> String {
    sha256_hex(id.as_bytes())[..2].to_owned()
}

fn spread(kind: &str, id: &str) -> String {
    format!("{kind}/{}/{}", shard(id), encode_id(id))
}

/// The key of the format marker, which says the bucket's layout version.
pub fn format_marker() -> &'static str {
    "rekindle-format"
}

/// The object each gc pass rewrites to read the store's own clock (see `gc::StoreClock`).
pub fn gc_clock() -> &'static str {
    "gc/clock"
}

/// The base of everything a run owns; its generation chain lives here.
pub fn run_base(run_id: &str) -> String {
    spread("runs", run_id)
}

/// The key of the run's lease.
pub fn lease(run_id: &str) -> String {
    format!("{}/lease", run_base(run_id))
}

/// The key of the claim naming the recovery that continues the run.
pub fn recovered_by(run_id: &str) -> String {
    format!("{}/recovered-by", run_base(run_id))
}

/// The terminal marker of a retired run (see `tombstone.rs`); kept forever.
pub fn tombstone(run_id: &str) -> String {
    format!("{}/tombstone", run_base(run_id))
}

/// The base of the run's loop checkpoint chain.
pub fn loop_base(run_id: &str) -> String {
    format!("{}/loop", run_base(run_id))
}

/// The key of a holder's heartbeat object.
pub fn heartbeat(holder: &str) -> String {
    spread("heartbeats", holder)
}

/// The key of a worker's registration. It lives under the heartbeats' prefix (where no
/// heartbeat can be: a shard is two hex digits), so the one LIST that shows every process's
/// heartbeat version shows every registration's too, and a registration that changed is seen
/// at the next listing, never through a proxy signal.
pub fn worker(worker_id: &str) -> String {
    format!("heartbeats/{}", spread("workers", worker_id))
}

/// The key of a worker's inbox.
pub fn inbox(worker_id: &str) -> String {
    spread("inbox", worker_id)
}

/// The prefix under which every worker registration lives (inside [`heartbeats_prefix`]).
pub fn workers_prefix() -> &'static str {
    "heartbeats/workers/"
}

/// Where registrations lived before they moved beside the heartbeats; gc deletes what is left
/// there (a worker registers at [`worker`] when it starts).
pub fn legacy_workers_prefix() -> &'static str {
    "workers/"
}

/// Whether a key listed under [`heartbeats_prefix`] is a worker's registration rather than a
/// heartbeat.
pub fn is_registration(key: &str) -> bool {
    key.starts_with(workers_prefix())
}

/// The prefix under which every worker's inbox lives.
pub fn inbox_prefix() -> &'static str {
    "inbox/"
}

/// The prefix under which every heartbeat object lives.
pub fn heartbeats_prefix() -> &'static str {
    "heartbeats/"
}

/// The lease the owner of partition 0 holds (a reserved run ID); in a bucket of one partition,
/// the leading coordinator's.
pub const COORDINATOR_LEASE_RUN: &str = "_rekindle-coordinator";

/// The most partitions a bucket may be split into: one per index shard.
pub const MAX_PARTITIONS: u32 = 256;

/// The lease (a reserved run ID) the owner of `partition` holds: partition 0's is
/// [`COORDINATOR_LEASE_RUN`], so a bucket of one partition keeps the lease it always had.
pub fn partition_lease(partition: u32) -> String {
    if partition == 0 {
        COORDINATOR_LEASE_RUN.to_owned()
    } else {
        format!("{COORDINATOR_LEASE_RUN}-{partition}")
    }
}

/// Whether `run` is one of the coordinators' partition leases, not a run.
pub fn is_coordinator_lease(run: &str) -> bool {
    match run.strip_prefix(COORDINATOR_LEASE_RUN) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('-')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// The partition (of `partitions`) an index shard belongs to: the shards are split into
/// `partitions` contiguous ranges, so a partition is listed from one start key to one end key.
pub fn partition_of_shard(shard: u8, partitions: u32) -> u32 {
    u32::from(shard) * partitions.clamp(1, MAX_PARTITIONS) / 256
}

/// The partition a run's index entry (and so its recovery) belongs to.
pub fn partition_of_run(run_id: &str, partitions: u32) -> u32 {
    let shard = u8::from_str_radix(&shard(run_id), 16).unwrap_or(0);
    partition_of_shard(shard, partitions)
}

/// The index shards of `partition` (of `partitions`), first and last: never empty, since
/// there are at most as many partitions as shards.
pub fn shards_of(partition: u32, partitions: u32) -> (u8, u8) {
    let partitions = partitions.clamp(1, MAX_PARTITIONS);
    // The first shard s with s * partitions / 256 == p is ceil(p * 256 / partitions).
    let first = |p: u32| (p * 256).div_ceil(partitions);
    let lo = first(partition);
    let hi = first(partition + 1) - 1;
    (lo.min(255) as u8, hi.min(255) as u8)
}

/// The key of a coordinator's membership: it says a coordinator under this ID takes a share of
/// the partitions while its heartbeat beats. It lives under the heartbeats' prefix, like a
/// worker's registration, so the heartbeat listing shows every member.
pub fn coordinator_member(coordinator_id: &str) -> String {
    format!("heartbeats/{}", spread("coordinators", coordinator_id))
}

/// The prefix under which every coordinator membership lives (inside [`heartbeats_prefix`]).
pub fn coordinators_prefix() -> &'static str {
    "heartbeats/coordinators/"
}

/// Whether a key listed under [`heartbeats_prefix`] is a coordinator's membership.
pub fn is_member(key: &str) -> bool {
    key.starts_with(coordinators_prefix())
}

/// The heartbeat key of the coordinator a membership key names (both are laid out from the
/// same ID, so no read is needed).
pub fn member_heartbeat(member_key: &str) -> Option<String> {
    member_key
        .strip_prefix(coordinators_prefix())
        .map(|rest| format!("{}{rest}", heartbeats_prefix()))
}

/// Whether a key listed under [`heartbeats_prefix`] is a process's heartbeat (not a worker's
/// registration or a coordinator's membership).
pub fn is_heartbeat(key: &str) -> bool {
    !is_registration(key) && !is_member(key)
}

/// The key of a recovery record.
pub fn recovery(recovery_id: &str) -> String {
    spread("recoveries", recovery_id)
}

/// The key of a run's index entry.
pub fn index_entry(run_id: &str) -> String {
    spread("index", run_id)
}

/// The prefix under which the index of runs not yet done lives.
pub fn index_prefix() -> &'static str {
    "index/"
}

/// The prefix under which every recovery record lives.
pub fn recoveries_prefix() -> &'static str {
    "recoveries/"
}

/// The prefix under which every run's objects live.
pub fn runs_prefix() -> &'static str {
    "runs/"
}

/// The base of a session's snapshot chain.
pub fn session_base(session_id: &str) -> String {
    spread("sessions", session_id)
}

/// The base of a workflow's checkpoint chain.
pub fn workflow_base(workflow_id: &str) -> String {
    spread("workflows", workflow_id)
}

/// The key of generation `n` in the chain at `base`. Zero-padded so keys sort by number.
pub fn generation(base: &str, n: u64) -> String {
    format!("{base}/gen/{n:020}")
}

/// The hint object of the chain at `base`.
pub fn head(base: &str) -> String {
    format!("{base}/head")
}

/// Parses the generation number from a generation key.
pub fn generation_number(key: &str) -> Option<u64> {
    let (_, last) = key.rsplit_once("/gen/")?;
    if last.len() == 20 {
        last.parse().ok()
    } else {
        None
    }
}

/// Why a stored object could not be read as the kind expected at its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("object '{key}' is corrupt: {reason}")]
    /// The object is not a Rekindle object of the expected kind, or its body does not parse.
    Corrupt {
        /// The object's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    #[error("object '{key}' has format {found}, this build reads up to {supported}")]
    /// The object was written in a newer format than this build reads.
    FutureFormat {
        /// The object's key.
        key: String,
        /// The format version the object was written with.
        found: u32,
        /// The newest format version this build reads.
        supported: u32,
    },
}

/// Encodes an object for the bucket: the JSON of one of Rekindle's own record types, which
/// are plain structs with string keys, so serialising them cannot fail. A failure would be a
/// bug in a type's `Serialize`, never bad input, so it panics naming the type instead of
/// writing an empty object.
pub fn encode_object<T: serde::Serialize>(value: &T) -> bytes::Bytes {
    match serde_json::to_vec(value) {
        Ok(bytes) => bytes::Bytes::from(bytes),
        Err(error) => panic!(
            "encoding a {} cannot fail: {error}",
            std::any::type_name::<T>()
        ),
    }
}

/// Decodes an object written by Rekindle: checks the envelope's `format` (older accepted,
/// newer refused naming both) and `kind` (an unknown or foreign object is refused naming its
/// key), then the body.
pub fn decode_object<T: serde::de::DeserializeOwned>(
    key: &str,
    kind: &str,
    bytes: &[u8],
) -> Result<T, ObjectError> {
    #[derive(serde::Deserialize)]
    struct Header {
        format: Option<u32>,
        kind: Option<String>,
    }
    let corrupt = |reason: String| ObjectError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let header: Header = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(format!("not a Rekindle object ({e})")))?;
    match header.format {
        Some(found) if found > FORMAT_VERSION => {
            return Err(ObjectError::FutureFormat {
                key: key.to_owned(),
                found,
                supported: FORMAT_VERSION,
            });
        }
        Some(_) => {}
        None => return Err(corrupt("no format field: not written by Rekindle".into())),
    }
    if header.kind.as_deref() != Some(kind) {
        return Err(corrupt(format!(
            "expected a {kind} object, found kind {:?}",
            header.kind
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every shard is in exactly one partition, each partition's shards are the contiguous
    // range `shards_of` names, and none is empty, for every count a bucket may have.
    #[test]
    fn partitions_cover_the_shards_once() {
        for partitions in 1..=MAX_PARTITIONS {
            let mut next = 0u32;
            for partition in 0..partitions {
                let (lo, hi) = shards_of(partition, partitions);
                assert_eq!(u32::from(lo), next, "{partition}/{partitions}");
                assert!(lo <= hi, "{partition}/{partitions}");
                for shard in lo..=hi {
                    assert_eq!(partition_of_shard(shard, partitions), partition);
                }
                next = u32::from(hi) + 1;
            }
            assert_eq!(next, 256, "{partitions}");
        }
        assert_eq!(partition_of_run("any", 1), 0);
    }

    #[test]
    fn partition_leases_are_told_from_runs() {
        assert_eq!(partition_lease(0), COORDINATOR_LEASE_RUN);
        for partition in [0, 1, 17, 255] {
            assert!(is_coordinator_lease(&partition_lease(partition)));
        }
        for run in [
            "_rekindle-coordinator-",
            "_rekindle-coordinator-x",
            "_rekindle-coordinatorx",
            "run-1",
        ] {
            assert!(!is_coordinator_lease(run), "{run}");
        }
        for id in ["c1", "a/b", &"x".repeat(300)] {
            let member = coordinator_member(id);
            assert!(is_member(&member) && !is_heartbeat(&member));
            assert_eq!(
                member_heartbeat(&member).as_deref(),
                Some(heartbeat(id).as_str())
            );
            assert!(is_heartbeat(&heartbeat(id)));
        }
    }
}
