//! What a Redlock round carries and leaves behind: a waiter's ticket, and the give-back of a
//! round that did not keep its grant.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use leasehold_core::Owner;
use tokio::sync::Notify;

use crate::keys::Names;
use crate::node::Node;
use crate::release::{Handoff, ReleaseCall};

/// A waiter's announcement on the nodes (for `redlock::ANNOUNCE`): its ticket, the client's clock in
/// ms when the wait began, the same on every node and for every round of the wait. The nodes
/// then order their wait lists alike, and a release on each hands the lock to the same waiter
/// (server clocks, or the order in which concurrent rounds reach each node, differ from node
/// to node, and waiters handed different nodes split the vote). Across processes the order
/// follows their clocks: a clock S behind moves a waiter S ahead.
#[derive(Clone, Copy)]
pub(crate) struct Announce {
    pub(crate) ticket: u64,
}

impl Announce {
    pub(crate) fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            ticket: u64::try_from(since.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// Compare-and-delete on one node (`call`), bounded; failures are logged
/// (the key expires by TTL).
async fn give_back(node: &Node, call: &ReleaseCall, bound: Duration) {
    match tokio::time::timeout(bound, node.run_release(call)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(node = %node.name, error = %e, "redlock: give-back failed"),
        Err(_) => tracing::debug!(node = %node.name, "redlock: give-back timed out"),
    }
}

/// Per node, whether the give-back of a failed round is settled there (answered, failed, or
/// timed out): the next round of the same owner value sends its request to a node only after
/// it, or the give-back could delete what that round takes. One allocation for every node.
pub(crate) struct Settled {
    done: Box<[AtomicBool]>,
    changed: Notify,
}

impl Settled {
    fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            done: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            changed: Notify::new(),
        })
    }

    /// Waits until node `i` is settled.
    pub(crate) async fn settled(&self, i: usize) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: a `settle` after it wakes this one.
            changed.as_mut().enable();
            if self.done.get(i).is_none_or(|f| f.load(Ordering::Acquire)) {
                return;
            }
            changed.await;
        }
    }

    fn settle(&self, i: usize) {
        if let Some(f) = self.done.get(i) {
            f.store(true, Ordering::Release);
        }
        self.changed.notify_waiters();
    }
}

/// Marks node `i` settled when dropped: after its give-back, or with the give-back's future
/// if that is dropped first.
struct Settle(Arc<Settled>, usize);

impl Drop for Settle {
    fn drop(&mut self) {
        self.0.settle(self.1);
    }
}

/// What a round that did not keep its grant must give back: every node that did not say "held
/// by another owner" (a node that granted, failed, timed out or has not answered yet may hold
/// our key, or get it from a request still on its way). Armed until the round keeps a grant;
/// dropped armed (a failed round, or the caller's future dropped mid-round), it gives back in a
/// task.
///
/// The round's requests are dropped before the give-back is sent: a request already written to
/// its node's connection still runs there, and before the give-back, which goes after it on the
/// same connection; one not written yet is never sent.
pub(crate) struct GiveBack<'a> {
    pub(crate) nodes: &'a [Arc<Node>],
    pub(crate) names: &'a Names,
    pub(crate) owner: &'a Owner,
    pub(crate) bound: Duration,
    /// Per node, whether it may hold our key.
    pub(crate) may_hold: Vec<bool>,
    pub(crate) armed: bool,
    /// [`Handoff::Nobody`] for a waiter's round short of a quorum: the waiter goes on
    /// waiting, so its give-back hands the lock to no other waiter. Otherwise (a try, a
    /// cancelled round) [`Handoff::Plain`]: a node the waiter was handed goes on to the next
    /// waiter.
    pub(crate) handoff: Handoff,
}

impl GiveBack<'_> {
    /// Gives back where needed, in a task; per node, when that is settled (`None`: nothing to
    /// give back anywhere).
    pub(crate) fn send(&mut self) -> Option<Arc<Settled>> {
        if !std::mem::take(&mut self.armed) || !self.may_hold.contains(&true) {
            return None;
        }
        // Without a runtime nothing can be sent: the grants expire by their TTL.
        tokio::runtime::Handle::try_current().ok()?;
        let settled = Settled::new(self.may_hold.len());
        // One call for every node (Redlock nodes are single servers).
        let call = Arc::new(ReleaseCall::new(
            self.names.clone(),
            self.owner,
            self.handoff,
            false,
        ));
        let bound = self.bound;
        let all: FuturesUnordered<_> = self
            .nodes
            .iter()
            .zip(&self.may_hold)
            .enumerate()
            .filter_map(|(i, (node, may_hold))| {
                if !may_hold {
                    settled.settle(i);
                    return None;
                }
                let done = Settle(Arc::clone(&settled), i);
                let (node, call) = (Arc::clone(node), Arc::clone(&call));
                Some(async move {
                    give_back(&node, &call, bound).await;
                    drop(done);
                })
            })
            .collect();
        // Counted by `settle`, so a process that exits right after does not cut it off.
        leasehold_core::spawn_detached(all.for_each(|()| std::future::ready(())));
        Some(settled)
    }
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        self.send();
    }
}
