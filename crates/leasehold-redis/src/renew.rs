//! Batched renewal: many leases re-armed by one `EXTEND_MANY` script call per chunk.
//!
//! The renewal engine of `leasehold_core::Locker` hands a backend every lease due within a
//! window. Here they are cut into chunks of at most [`CHUNK`] keys, one script call each, all
//! sent at once on the node's multiplexed connection.
//!
//! On a Redis Cluster the keys of one master span many slots. The leases are grouped by the
//! master of their slot (from `CLUSTER SLOTS`, read once per batch) and each group is renewed by
//! the same script flagged `allow-cross-slot-keys` (Redis 7), sent to that master: per master
//! the same count as one server, about 50 calls per renewal period for 10,000 leases on it. If
//! the slot map cannot be read, or a master refuses a group (a slot moved while resharding),
//! that group falls back to one call per slot.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{Error, ErrorKind, ExtendRequest};
use redis::cluster_routing::Slot;

use crate::keys::Names;
use crate::node::Node;

/// The most keys in one script call.
///
/// Redisson renews by 100; with the engine's windows (about eight batches per renewal period,
/// each ending in a partly filled chunk), 10,000 leases then need ~110 calls per period, over
/// the target of 100. 250 keys make ~48 calls, and one such script runs in a few hundred
/// microseconds of Redis time, short enough not to hold up other clients noticeably.
pub(crate) const CHUNK: usize = 250;

/// Re-arms every lease of `reqs` on `node` (`reset` is ignored by the script now), each
/// chunk's call bounded by `bound` if given: one answer per lease, in order. `all` holds the
/// Redis names of each lease's key, in the same order (a lock's, or an election's).
pub(crate) async fn extend_on(
    node: &Node,
    all: &[Names],
    reqs: &[ExtendRequest<'_>],
    reset: bool,
    bound: Option<Duration>,
) -> Vec<Result<bool, Error>> {
    let mut out: Vec<Option<Result<bool, Error>>> = (0..reqs.len()).map(|_| None).collect();
    let by_master = if node.is_cluster() {
        node.slot_masters().await.ok()
    } else {
        None
    };
    let (groups, cross_slot) = match &by_master {
        Some(ranges) => (group_by_master(ranges, all), true),
        None if node.is_cluster() => (group_by_slot(all, 0..all.len()), false),
        None => (vec![(0..all.len()).collect()], false),
    };
    let call = |idx: Vec<usize>, cross_slot: bool| async move {
        let locks: Vec<_> = idx
            .iter()
            .map(|&i| (&all[i], reqs[i].held.owner, reqs[i].ttl))
            .collect();
        let answer = bounded(node, bound, node.extend_many(&locks, reset, cross_slot)).await;
        (idx, answer)
    };
    let chunked = |groups: Vec<Vec<usize>>| -> Vec<Vec<usize>> {
        groups
            .into_iter()
            .flat_map(|g| g.chunks(CHUNK).map(<[usize]>::to_vec).collect::<Vec<_>>())
            .collect()
    };
    let answers = join_all(chunked(groups).into_iter().map(|g| call(g, cross_slot))).await;
    let mut refused = Vec::new();
    for (idx, answer) in answers {
        match answer {
            // A master that refused a cross-slot call: those leases again, one call per slot.
            Err(e) if cross_slot && e.kind() == ErrorKind::Backend => refused.extend(idx),
            answer => scatter(&mut out, &idx, answer),
        }
    }
    if !refused.is_empty() {
        let groups = chunked(group_by_slot(all, refused));
        for (idx, answer) in join_all(groups.into_iter().map(|g| call(g, false))).await {
            scatter(&mut out, &idx, answer);
        }
    }
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(left_out(node))))
        .collect()
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

/// The indices `idx` of `all`, grouped by slot.
fn group_by_slot(all: &[Names], idx: impl IntoIterator<Item = usize>) -> Vec<Vec<usize>> {
    let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
    for i in idx {
        by_slot
            .entry(Slot::for_key(all[i].lock()))
            .or_default()
            .push(i);
    }
    by_slot.into_values().collect()
}

/// The indices of `all`, grouped by the master serving their slot (`ranges` from
/// `CLUSTER SLOTS`); a slot no range covers goes alone.
fn group_by_master(ranges: &[(u16, u16, String)], all: &[Names]) -> Vec<Vec<usize>> {
    let master_of: HashMap<Slot, &str> = ranges
        .iter()
        .flat_map(|(lo, hi, master)| (*lo..=*hi).map(move |s| (Slot::new(s), master.as_str())))
        .filter_map(|(slot, master)| Some((slot?, master)))
        .collect();
    let mut by_master: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut orphans = Vec::new();
    for (i, n) in all.iter().enumerate() {
        match master_of.get(&Slot::for_key(n.lock())) {
            Some(master) => by_master.entry(master).or_default().push(i),
            None => orphans.push(i),
        }
    }
    let mut groups: Vec<Vec<usize>> = by_master.into_values().collect();
    groups.extend(group_by_slot(all, orphans));
    groups
}

/// One lease's copy of a chunk's error.
fn copy(e: &Error) -> Error {
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
