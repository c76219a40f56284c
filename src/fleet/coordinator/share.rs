//! This coordinator's share of the partitions: which it should own (rendezvous hashing over
//! the live members), taking and handing over their leases, and what a share covers.
//!
//! A bucket's index shards are split into a fixed number of partitions (`store::partitions`,
//! in the format marker). Each partition is owned through a lease of its own
//! ([`layout::partition_lease`]), held while the owner's heartbeat beats, like any lease. A
//! coordinator of a bucket of several partitions writes a membership object beside the
//! heartbeats ([`layout::coordinator_member`]); every tick's heartbeat listing shows the
//! members, and a member is live while its heartbeat is. Each partition's rightful owner is the
//! live member with the highest rendezvous hash for it: every member computes the same answer
//! from the same listing, a member that joins takes about 1/N of the partitions from the
//! others, and one that dies leaves each of its partitions to one survivor.
//!
//! Ownership is an economy, never a safety condition: every lifecycle step is a
//! compare-and-swap on its own record or lease, so two coordinators working one partition at
//! once (a handover, a member judged dead too soon) cost duplicate requests and nothing else.
//!
//! A bucket of one partition writes no membership and keeps the one leadership lease it always
//! had: one coordinator leads, the others stand by.
//!
//! It never decides what a tick does with its share.

use super::*;

/// The partitions this coordinator holds, each with its lease.
#[derive(Debug)]
pub(super) struct Shares {
    /// How many partitions the bucket has.
    pub(super) partitions: u32,
    /// The partitions held, each by its lease.
    pub(super) held: BTreeMap<u32, Held>,
    /// The coordinator this one last logged it stands by for (a bucket of one partition).
    standing_by: Option<String>,
}

impl Shares {
    pub(super) fn new(partitions: u32) -> Self {
        Shares {
            partitions: partitions.max(1),
            held: BTreeMap::new(),
            standing_by: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether this share holds every partition (it sees the whole index).
    pub(super) fn whole(&self) -> bool {
        self.held.len() as u32 == self.partitions
    }

    /// Whether `run`'s index entry (and so its recovery) is in this share.
    pub(super) fn owns_run(&self, run: &str) -> bool {
        self.partitions == 1
            || self
                .held
                .contains_key(&layout::partition_of_run(run, self.partitions))
    }

    /// Whether the heartbeat cleanup is this share's: partition 0's owner's (one coordinator
    /// does it, on what it sees).
    pub(super) fn cleans_up(&self) -> bool {
        self.held.contains_key(&0)
    }

    /// The index shards this share covers, as runs of contiguous shards (one listing each).
    pub(super) fn ranges(&self) -> Vec<(u8, u8)> {
        let mut ranges: Vec<(u8, u8)> = Vec::new();
        for &partition in self.held.keys() {
            let (first, last) = layout::shards_of(partition, self.partitions);
            match ranges.last_mut() {
                Some(range) if u32::from(range.1) + 1 == u32::from(first) => range.1 = last,
                _ => ranges.push((first, last)),
            }
        }
        ranges
    }

    /// Checks every lease of this share (side by side); the first one lost is the error, and
    /// nothing of the tick is acted on.
    pub(super) async fn check(&self, holder: &Holder) -> Result<(), LeaseError> {
        let checks = self.held.values().map(|held| holder.check(held));
        futures::future::try_join_all(checks).await.map(|_| ())
    }

    /// Forgets a partition whose lease was found lost.
    pub(super) fn drop_lost(&mut self, error: &LeaseError) {
        if let LeaseError::Lost { run, .. } | LeaseError::HeldByOther { run, .. } = error {
            self.held.retain(|_, held| held.run != *run);
        } else {
            self.held.clear();
        }
    }
}

/// The partitions `own` (a membership key) should own among `members` (the other live
/// members' keys), by rendezvous hashing: each partition goes to the member with the highest
/// hash of (member, partition). Pure, and the same in every process.
pub(super) fn rightful(
    own: &str,
    members: &std::collections::BTreeSet<String>,
    partitions: u32,
) -> std::collections::BTreeSet<u32> {
    use std::hash::{Hash, Hasher};
    let score = |member: &str, partition: u32| {
        // SipHash with fixed keys: the same in every process and every run.
        let mut hasher = std::hash::DefaultHasher::new();
        member.hash(&mut hasher);
        partition.hash(&mut hasher);
        hasher.finish()
    };
    (0..partitions.max(1))
        .filter(|&partition| {
            let mine = score(own, partition);
            members
                .iter()
                .filter(|member| member.as_str() != own)
                .all(|member| (score(member, partition), member.as_str()) < (mine, own))
        })
        .collect()
}

/// Moves this coordinator's share toward its rightful partitions: hands over the ones another
/// live member should own (released, so the new owner takes them at once), and tries to take
/// each one it should own and does not hold. A partition whose lease another coordinator holds
/// is taken over once its holder's heartbeat is judged gone (by this coordinator's judge of
/// the members, or by `standby`'s TTL of silence on the lease), never before.
pub(super) async fn rebalance(
    store: &Store,
    holder: &Arc<Holder>,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    shares: &mut Shares,
    standby: &mut ExpiryWatch,
) {
    // Live members that hold a partition this coordinator should own: woken, so that they
    // hand it over at once rather than at their next scan.
    let mut holding_mine: Vec<String> = Vec::new();
    let own = layout::coordinator_member(&options.id);
    let rightful = rightful(&own, &observer.members, shares.partitions);
    let handed: Vec<u32> = shares
        .held
        .keys()
        .copied()
        .filter(|partition| !rightful.contains(partition))
        .collect();
    if !handed.is_empty() {
        // Their new owners are woken to take them.
        holding_mine.extend(observer.members.iter().cloned());
    }
    for partition in handed {
        let Some(held) = shares.held.get(&partition) else {
            continue;
        };
        tracing::info!(coordinator = %options.id, partition, "handing the partition over to its rightful owner");
        match holder.release(held).await {
            Ok(()) => {
                shares.held.remove(&partition);
            }
            // Kept, and released again at the next turn: a lease forgotten unreleased would
            // name this live coordinator, and its rightful owner would wait on it for as long
            // as this one beats.
            Err(error) => {
                tracing::warn!(%error, partition, "cannot release the partition's lease; trying again at the next turn")
            }
        }
    }
    for partition in rightful {
        if shares.held.contains_key(&partition) {
            continue;
        }
        let run = RunId::new(layout::partition_lease(partition));
        match holder.try_acquire(&run, Epoch::ZERO, standby).await {
            Ok(Attempt::Held(held)) => {
                if shares.partitions == 1 {
                    tracing::info!(coordinator = %options.id, epoch = %held.epoch, "leading");
                    shares.standing_by = None;
                } else {
                    tracing::info!(coordinator = %options.id, partition, epoch = %held.epoch, "owning the partition");
                }
                shares.held.insert(partition, held);
            }
            Ok(Attempt::Alive { holder: other })
                if observer
                    .gone_members
                    .contains(&layout::coordinator_member(&other)) =>
            {
                // Its holder is a member this coordinator judged gone: a TTL of silence on
                // its heartbeat was watched already, so there is no second TTL to wait.
                match take_from_the_gone(store, holder, &run, &other).await {
                    Ok(Some(held)) => {
                        tracing::info!(coordinator = %options.id, partition, from = %other, epoch = %held.epoch, "took the partition over from a coordinator judged gone");
                        standby.forget(run.as_str());
                        shares.held.insert(partition, held);
                    }
                    Ok(None) => {}
                    Err(error) => {
                        tracing::debug!(%error, partition, "cannot take the partition over")
                    }
                }
            }
            Ok(Attempt::Alive { holder: leader }) => {
                if shares.partitions == 1 && shares.standing_by.as_ref() != Some(&leader) {
                    tracing::info!(coordinator = %options.id, leader = %leader, "standing by: another coordinator leads");
                    shares.standing_by = Some(leader);
                } else if shares.partitions > 1 {
                    let member = layout::coordinator_member(&leader);
                    if observer.members.contains(&member) {
                        holding_mine.push(member);
                    }
                }
            }
            Err(error) if shares.partitions == 1 => {
                tracing::warn!(%error, "cannot take the coordinator lease")
            }
            Err(error) => tracing::warn!(%error, partition, "cannot take the partition's lease"),
        }
    }
    holding_mine.sort();
    holding_mine.dedup();
    nudge_members(observer, holding_mine);
}

/// Takes `run`'s lease from `other` if `other` still holds it (one read, one swap).
async fn take_from_the_gone(
    store: &Store,
    holder: &Holder,
    run: &RunId,
    other: &str,
) -> Result<Option<Held>, LeaseError> {
    match crate::store::lease::read_lease(store, run).await? {
        Some(view) if view.lease.holder == other && !view.lease.released => {
            holder.take_over(&view).await.map(Some)
        }
        _ => Ok(None),
    }
}

/// The shortest time between two nudges this coordinator sends the other members.
const RELAY_GAP: Duration = Duration::from_millis(100);

/// Passes a wake-up on to the other members, from partition 0's owner only: hosts, workers
/// and operators wake the coordinator partition 0's lease names, and a new run or a freed slot
/// (a plain wake-up), or a recovery just admitted (a named one), may be another owner's to act
/// on. Every one is passed on, names and all (one dropped would be a lost wake-up, a name
/// dropped a scan's wait); a relayed one is not relayed again, since its receiver does not own
/// partition 0 (two owners of it at once, until one's next tick checks its lease, pass one
/// back and forth at most that long).
pub(super) fn relay_wakeup(
    observer: &Observer,
    shares: &Shares,
    plain: bool,
    named: &[RecoveryId],
) {
    if !shares.cleans_up() {
        return;
    }
    let members: Vec<String> = observer.members.iter().cloned().collect();
    if plain {
        wake_members(observer, &members, &[]);
    }
    if !named.is_empty() {
        wake_members(observer, &members, named);
    }
}

/// Wakes the members holding what this coordinator should own, or taking what it handed over,
/// at most once per [`RELAY_GAP`] (it asks again at its next turn).
fn nudge_members(observer: &mut Observer, members: Vec<String>) {
    if members.is_empty()
        || observer
            .relayed_at
            .as_ref()
            .is_some_and(|at| at.elapsed() < RELAY_GAP)
    {
        return;
    }
    observer.relayed_at = Some(crate::clock::Stopwatch::start());
    wake_members(observer, &members, &[]);
}

/// Wakes `members` (naming `named`, or plain; side by side, not awaited; best effort), at the
/// addresses their heartbeats gave when their memberships were listed.
fn wake_members(observer: &Observer, members: &[String], named: &[RecoveryId]) {
    let urls: Vec<String> = members
        .iter()
        .filter_map(|member| observer.member_info.get(member)?.wake.clone())
        .collect();
    if !urls.is_empty() {
        let named = named.to_vec();
        tokio::spawn(async move {
            if let Err(error) = crate::fleet::wake::poke_all(&urls, &named).await {
                tracing::debug!(%error, "cannot wake another coordinator");
            }
        });
    }
}

/// A coordinator of a bucket of one partition looks at the format marker once per scan
/// interval: a coordinator started with `--partitions` may have split the bucket since. It
/// then shares the partitions from its next turn on (the leadership lease it may hold is
/// partition 0's), so it neither works the others' partitions as its own nor holds partition
/// 0 outside the membership (a live holder the members do not count would keep it forever).
pub(super) async fn follow_a_split(
    store: &Store,
    options: &CoordinatorOptions,
    observer: &mut Observer,
    shares: &mut Shares,
) {
    let due = observer
        .marker_read_at
        .as_ref()
        .is_none_or(|at| at.elapsed() >= options.scan_interval);
    if shares.partitions > 1 || !due {
        return;
    }
    observer.marker_read_at = Some(crate::clock::Stopwatch::start());
    match crate::store::partitions::read(store).await {
        Ok(partitions) if partitions > 1 => {
            tracing::info!(coordinator = %options.id, partitions, "the bucket was split; sharing its partitions");
            shares.partitions = partitions;
            observer.partitions = partitions;
            if let Err(error) = join(store, options).await {
                tracing::warn!(%error, "cannot write the coordinator's membership");
            }
        }
        Ok(_) => {}
        Err(error) => tracing::debug!(%error, "cannot read the bucket's format marker"),
    }
}

/// A coordinator's membership of a split bucket: who it is, the TTL it declares and where it
/// is woken. Its heartbeat, written first, says whether it lives. The TTL and the address are
/// in the body, so a coordinator restarted under its ID with another TTL or address writes
/// another body, and so another version on every store (S3's ETag of a plain PUT is the MD5
/// of its body: an unchanged body would keep its version).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Member {
    pub(super) format: u32,
    pub(super) kind: String,
    pub(super) coordinator: String,
    /// Absent in memberships written by older builds: their heartbeat says it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) wake: Option<String>,
}

/// Writes this coordinator's membership (a bucket of several partitions).
pub(super) async fn join(store: &Store, options: &CoordinatorOptions) -> Result<(), StoreError> {
    let member = Member {
        format: FORMAT_VERSION,
        kind: "coordinator".into(),
        coordinator: options.id.clone(),
        ttl_ms: Some(options.ttl.as_millis() as u64),
        wake: options.wake_url(),
    };
    store
        .put(
            &layout::coordinator_member(&options.id),
            layout::encode_object(&member),
        )
        .await
        .map(|_| ())
}

/// Removes this coordinator's membership as it stops (its partitions were released).
pub(super) async fn leave(store: &Store, options: &CoordinatorOptions) {
    let _ = store.delete(&layout::coordinator_member(&options.id)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every partition has exactly one rightful owner among any set of members, computed the
    // same by each; a member joining takes only partitions (moves nothing between the others),
    // and one leaving leaves only its own.
    #[test]
    fn rendezvous_gives_each_partition_one_owner() {
        let members: Vec<String> = (0..5)
            .map(|i| layout::coordinator_member(&format!("c{i}")))
            .collect();
        for partitions in [1, 2, 16, 256] {
            for n in 1..=members.len() {
                let set: std::collections::BTreeSet<String> =
                    members[..n].iter().cloned().collect();
                let mut owned = vec![0u32; partitions as usize];
                let shares: Vec<_> = members[..n]
                    .iter()
                    .map(|own| rightful(own, &set, partitions))
                    .collect();
                for share in &shares {
                    for &p in share {
                        owned[p as usize] += 1;
                    }
                }
                assert!(owned.iter().all(|&count| count == 1), "{partitions}/{n}");
                if n > 1 {
                    let before: std::collections::BTreeSet<String> =
                        members[..n - 1].iter().cloned().collect();
                    for (i, own) in members[..n - 1].iter().enumerate() {
                        let was = rightful(own, &before, partitions);
                        assert!(shares[i].is_subset(&was), "a joiner only takes");
                    }
                }
            }
        }
        // With 256 partitions, 4 members get roughly a quarter each.
        let set: std::collections::BTreeSet<String> = members[..4].iter().cloned().collect();
        for own in &members[..4] {
            let share = rightful(own, &set, 256).len();
            assert!((32..=96).contains(&share), "{share} of 256");
        }
    }

    #[test]
    fn a_share_lists_contiguous_shard_runs() {
        let mut shares = Shares::new(4);
        assert!(shares.ranges().is_empty());
        let held = |p: u32| Held {
            run: RunId::new(layout::partition_lease(p)),
            epoch: Epoch(1),
            etag: ETag(String::new()),
        };
        for p in [0, 1, 3] {
            shares.held.insert(p, held(p));
        }
        assert_eq!(shares.ranges(), vec![(0, 127), (192, 255)]);
        assert!(!shares.whole() && shares.cleans_up());
        shares.held.insert(2, held(2));
        assert_eq!(shares.ranges(), vec![(0, 255)]);
        assert!(shares.whole());
    }
}
