//! Batched renewal: many leases re-armed by one `EXTEND_MANY` script call per chunk.
//!
//! The renewal engine of `leasehold_core::Locker` hands a backend every lease due within a
//! window. Here they are cut into chunks of at most [`CHUNK`] keys, one script call each, all
//! sent at once on the node's multiplexed connection. On a Redis Cluster a script may only
//! touch keys of one slot, so the chunks are per slot (keys sharing a hash tag renew together;
//! leases on distinct keys mostly land on distinct slots, so a cluster sees about one call per
//! lease per renewal period, spread over its masters).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{Error, ExtendRequest};
use redis::cluster_routing::Slot;

use crate::keys::Names;
use crate::node::{Node, names};

/// The most keys in one script call.
///
/// Redisson renews by 100; with the engine's windows (about eight batches per renewal period,
/// each ending in a partly filled chunk), 10,000 leases then need ~110 calls per period, over
/// the target of 100. 250 keys make ~48 calls, and one such script runs in a few hundred
/// microseconds of Redis time, short enough not to hold up other clients noticeably.
pub(crate) const CHUNK: usize = 250;

/// Re-arms every lease of `reqs` on `node` (with `reset`, sets a missing key again), each
/// chunk's call bounded by `bound` if given: one answer per lease, in order.
pub(crate) async fn extend_on(
    node: &Node,
    prefix: &str,
    reqs: &[ExtendRequest<'_>],
    reset: bool,
    bound: Option<Duration>,
) -> Vec<Result<bool, Error>> {
    let all: Vec<Names> = reqs.iter().map(|r| names(prefix, r.held.key)).collect();
    let groups = chunks(node, &all);
    let calls = groups.iter().map(|idx| {
        let locks: Vec<_> = idx
            .iter()
            .map(|&i| (&all[i], reqs[i].held.owner, reqs[i].ttl))
            .collect();
        async move {
            let call = node.extend_many(&locks, reset);
            match bound {
                None => call.await,
                Some(t) => tokio::time::timeout(t, call).await.unwrap_or_else(|_| {
                    Err(Error::new(
                        leasehold_core::ErrorKind::Unavailable,
                        node.backend(),
                        format!("extend on {}: no answer within {t:?}", node.name),
                    ))
                }),
            }
        }
    });
    let answers = join_all(calls).await;
    let mut out: Vec<Option<Result<bool, Error>>> = (0..reqs.len()).map(|_| None).collect();
    for (idx, answer) in groups.iter().zip(answers) {
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
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(copy_missing(node))))
        .collect()
}

/// The indices of `all` cut into script calls: by slot on a cluster, then at most [`CHUNK`].
fn chunks(node: &Node, all: &[Names]) -> Vec<Vec<usize>> {
    let groups: Vec<Vec<usize>> = if node.is_cluster() {
        let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, n) in all.iter().enumerate() {
            by_slot.entry(Slot::for_key(n.lock())).or_default().push(i);
        }
        by_slot.into_values().collect()
    } else {
        vec![(0..all.len()).collect()]
    };
    groups
        .into_iter()
        .flat_map(|g| g.chunks(CHUNK).map(<[usize]>::to_vec).collect::<Vec<_>>())
        .collect()
}

/// One lease's copy of a chunk's error.
fn copy(e: &Error) -> Error {
    Error::new(e.kind(), e.backend().to_owned(), e.message().to_owned())
}

/// The error of a lease no chunk answered for (cannot happen: every index is in one chunk).
fn copy_missing(node: &Node) -> Error {
    Error::new(
        leasehold_core::ErrorKind::Backend,
        node.backend(),
        format!("extend on {}: a lease was left out of the batch", node.name),
    )
}
