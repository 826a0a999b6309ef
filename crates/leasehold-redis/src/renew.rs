//! Batched renewal: many leases re-armed by one `EXTEND_MANY` script call per chunk.
//!
//! The renewal engine of `leasehold_core::Locker` hands a backend every lease due within a
//! window. Here they are cut into chunks of at most [`CHUNK`] keys of one TTL, one script call
//! each, all sent at once on the node's multiplexed connection. A chunk's call is encoded once
//! ([`Plan`]): Redlock sends the same bytes to every node.
//!
//! On a Redis Cluster the keys of one master span many slots. The leases are grouped by the
//! master of their slot (from `CLUSTER SLOTS`, read once per batch, looked up in a table
//! indexed by slot) and each group is renewed by the same script flagged
//! `allow-cross-slot-keys` (Redis 7), sent to that master: per master the same count as one
//! server, about 50 calls per renewal period for 10,000 leases on it. If the slot map cannot be
//! read, or a master refuses a group (a slot moved while resharding), that group falls back to
//! one call per slot.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{Error, ErrorKind, ExtendRequest};

use crate::keys::NameList;
use crate::node::{ExtendCall, Node};

/// The most keys in one script call.
///
/// Redisson renews by 100; with the engine's windows (about eight batches per renewal period,
/// each ending in a partly filled chunk), 10,000 leases then need ~110 calls per period, over
/// the target of 100. 250 keys make ~48 calls, and one such script runs in a few hundred
/// microseconds of Redis time, short enough not to hold up other clients noticeably.
pub(crate) const CHUNK: usize = 250;

/// The slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// One answer per lease of a batch, in order.
pub(crate) type Answers = Vec<Result<bool, Error>>;

/// The script calls of a batch on one server, each encoded once: chunks of at most [`CHUNK`]
/// leases of one TTL, with the indices of their leases in the batch.
pub(crate) struct Plan {
    calls: Vec<(Vec<usize>, ExtendCall)>,
    leases: usize,
}

impl Plan {
    /// The calls renewing the leases `groups` (indices into `all` and `reqs`), each group cut
    /// by TTL and into chunks; `cross_slot`: flagged for one master of a Redis Cluster.
    fn new(
        all: &NameList,
        reqs: &[ExtendRequest<'_>],
        groups: Vec<Vec<usize>>,
        cross_slot: bool,
    ) -> Self {
        let mut calls = Vec::new();
        let mut locks = Vec::with_capacity(CHUNK);
        for group in groups.into_iter().flat_map(|g| by_ttl(reqs, g)) {
            for chunk in group.chunks(CHUNK) {
                locks.clear();
                locks.extend(
                    chunk
                        .iter()
                        .map(|&i| (all.get(i), reqs[i].held.owner.as_str())),
                );
                let call = ExtendCall::new(&locks, reqs[chunk[0]].ttl, cross_slot);
                calls.push((chunk.to_vec(), call));
            }
        }
        Self {
            calls,
            leases: reqs.len(),
        }
    }

    /// Every lease of a batch on one server (not a cluster); `all` holds their names.
    pub(crate) fn single(all: &NameList, reqs: &[ExtendRequest<'_>]) -> Self {
        Self::new(all, reqs, vec![(0..reqs.len()).collect()], false)
    }

    /// Sends every call to `node` at once, each bounded by `bound` if given: one answer per
    /// lease, in order.
    pub(crate) async fn send(&self, node: &Node, bound: Option<Duration>) -> Answers {
        let mut out = empty(self.leases);
        for (idx, answer) in self.run(node, bound).await {
            scatter(&mut out, idx, answer);
        }
        finish(node, out)
    }

    /// Sends every call to `node` at once: each call's leases and answer.
    async fn run(
        &self,
        node: &Node,
        bound: Option<Duration>,
    ) -> Vec<(&[usize], Result<Vec<bool>, Error>)> {
        let answers = join_all(
            self.calls
                .iter()
                .map(|(_, call)| bounded(node, bound, node.extend_many(call))),
        )
        .await;
        self.calls
            .iter()
            .map(|(idx, _)| idx.as_slice())
            .zip(answers)
            .collect()
    }
}

/// Re-arms every lease of `reqs` on `node`, each chunk's call bounded by `bound` if given: one
/// answer per lease, in order. `all` holds the Redis names of each lease's key, in the same
/// order (a lock's, or an election's).
pub(crate) async fn extend_on(
    node: &Node,
    all: &NameList,
    reqs: &[ExtendRequest<'_>],
    bound: Option<Duration>,
) -> Answers {
    if !node.is_cluster() {
        return Plan::single(all, reqs).send(node, bound).await;
    }
    let slots: Vec<u16> = (0..all.len()).map(|i| slot_of(all.get(i))).collect();
    let by_master = node.slot_masters().await.ok();
    let (groups, cross_slot) = match &by_master {
        Some(ranges) => (group_by_master(ranges, &slots), true),
        None => (group_by_slot(&slots, 0..all.len()), false),
    };
    let plan = Plan::new(all, reqs, groups, cross_slot);
    let mut out = empty(reqs.len());
    let mut refused = Vec::new();
    for (idx, answer) in plan.run(node, bound).await {
        match answer {
            // A master that refused a cross-slot call: those leases again, one call per slot.
            Err(e) if cross_slot && e.kind() == ErrorKind::Backend => {
                refused.extend_from_slice(idx);
            }
            answer => scatter(&mut out, idx, answer),
        }
    }
    if !refused.is_empty() {
        let retry = Plan::new(all, reqs, group_by_slot(&slots, refused), false);
        for (idx, answer) in retry.run(node, bound).await {
            scatter(&mut out, idx, answer);
        }
    }
    finish(node, out)
}

fn empty(n: usize) -> Vec<Option<Result<bool, Error>>> {
    (0..n).map(|_| None).collect()
}

/// Every answer, a lease no call answered for (cannot happen: every index is in one call)
/// getting an error.
fn finish(node: &Node, out: Vec<Option<Result<bool, Error>>>) -> Answers {
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(left_out(node))))
        .collect()
}

/// The leases `idx` cut by TTL (one group, the usual case, when they share one).
fn by_ttl(reqs: &[ExtendRequest<'_>], idx: Vec<usize>) -> Vec<Vec<usize>> {
    let Some(&first) = idx.first() else {
        return Vec::new();
    };
    let ttl = reqs[first].ttl;
    if idx.iter().all(|&i| reqs[i].ttl == ttl) {
        return vec![idx];
    }
    let mut groups: Vec<(Duration, Vec<usize>)> = Vec::new();
    for i in idx {
        match groups.iter_mut().find(|(t, _)| *t == reqs[i].ttl) {
            Some((_, g)) => g.push(i),
            None => groups.push((reqs[i].ttl, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// `call`, bounded by `bound` if given.
async fn bounded<T>(
    node: &Node,
    bound: Option<Duration>,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(t) = bound else {
        return call.await;
    };
    tokio::time::timeout(t, call).await.unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Unavailable,
            node.backend(),
            format!("extend on {}: no answer within {t:?}", node.name),
        ))
    })
}

/// Each lease of one call gets the call's answer.
fn scatter(
    out: &mut [Option<Result<bool, Error>>],
    idx: &[usize],
    answer: Result<Vec<bool>, Error>,
) {
    match answer {
        Ok(held) => {
            for (&i, h) in idx.iter().zip(held) {
                out[i] = Some(Ok(h));
            }
        }
        Err(e) => {
            for &i in idx {
                out[i] = Some(Err(copy(&e)));
            }
        }
    }
}

/// The indices `idx` of the leases whose slots are `slots`, grouped by slot.
fn group_by_slot(slots: &[u16], idx: impl IntoIterator<Item = usize>) -> Vec<Vec<usize>> {
    let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
    for i in idx {
        by_slot.entry(slots[i]).or_default().push(i);
    }
    by_slot.into_values().collect()
}

/// The leases whose slots are `slots`, grouped by the master serving their slot (`ranges`
/// from `CLUSTER SLOTS`); a slot no range covers goes alone.
fn group_by_master(ranges: &[(u16, u16, String)], slots: &[u16]) -> Vec<Vec<usize>> {
    // Slot → index of its master in `masters` (`u16::MAX`: none), a table of 32 KiB rebuilt
    // per batch (a hash map of 16,384 slots cost more than the rest of a batch).
    let mut masters: Vec<&str> = Vec::new();
    let mut master_of = vec![u16::MAX; SLOTS];
    for (lo, hi, master) in ranges {
        let m = match masters.iter().position(|m| *m == master.as_str()) {
            Some(m) => m,
            None => {
                masters.push(master.as_str());
                masters.len() - 1
            }
        };
        let m = u16::try_from(m).unwrap_or(u16::MAX);
        let hi = usize::from(*hi).min(SLOTS - 1);
        if let Some(served) = master_of.get_mut(usize::from(*lo)..=hi) {
            served.fill(m);
        }
    }
    let mut groups: Vec<Vec<usize>> = masters.iter().map(|_| Vec::new()).collect();
    let mut orphans = Vec::new();
    for (i, &slot) in slots.iter().enumerate() {
        match groups.get_mut(usize::from(master_of[usize::from(slot)])) {
            Some(group) => group.push(i),
            None => orphans.push(i),
        }
    }
    groups.retain(|g| !g.is_empty());
    groups.extend(group_by_slot(slots, orphans));
    groups
}

/// The Redis Cluster slot of a key name: CRC16 (XMODEM) of its hash tag (the text between the
/// first `{` and the first `}` after it, if not empty; else the whole name), modulo 16,384.
pub(crate) fn slot_of(name: &str) -> u16 {
    let key = name.as_bytes();
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let len = key[open + 1..].iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &key[open + 1..open + 1 + len])
        })
        .unwrap_or(key);
    let crc = tag.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ b)]
    });
    crc % SLOTS as u16
}

/// CRC16-XMODEM (polynomial 0x1021), one entry per byte value.
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// One lease's copy of a chunk's error.
pub(crate) fn copy(e: &Error) -> Error {
    Error::new(e.kind(), e.backend().to_owned(), e.message().to_owned())
}

/// The error of a lease no call answered for (cannot happen: every index is in one call).
fn left_out(node: &Node) -> Error {
    Error::new(
        ErrorKind::Backend,
        node.backend(),
        format!("extend on {}: a lease was left out of the batch", node.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    /// Our slot is Redis Cluster's (as redis-rs computes it) for every shape of name.
    #[test]
    fn slots_match_redis_cluster() {
        let names = [
            "",
            "a",
            "leasehold:{jobs/nightly}",
            "p:~{~}}a}",
            "p:{a}}",
            "{}",
            "{}a",
            "a{b",
            "a{}b{c}",
            "foo{bar}{zap}",
            "{user1000}.following",
            "123456789",
        ];
        for n in names {
            assert_eq!(Slot::new(slot_of(n)), Some(Slot::for_key(n)), "{n:?}");
        }
        for i in 0..5_000 {
            let n = format!("fleet-{i}:{{lease-{i}}}");
            assert_eq!(Slot::new(slot_of(&n)), Some(Slot::for_key(&n)), "{n:?}");
        }
        // The reference value of the CRC16 in the Redis Cluster specification.
        assert_eq!(slot_of("123456789"), 0x31c3);
    }

    /// Leases go to the master serving their slot, a master serving several ranges gets one
    /// group, and a slot no range covers goes alone.
    #[test]
    fn leases_are_grouped_by_master() {
        let ranges = vec![
            (0, 99, "a:1".to_owned()),
            (100, 199, "b:2".to_owned()),
            (200, 299, "a:1".to_owned()),
        ];
        let slots = [5, 150, 250, 99, 16_000, 16_000, 100];
        let mut groups = group_by_master(&ranges, &slots);
        groups.sort();
        assert_eq!(groups, vec![vec![0, 2, 3], vec![1, 6], vec![4, 5]]);
    }
}
