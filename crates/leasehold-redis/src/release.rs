//! Releases: a compare-and-delete first, the full release script only when the lock carries a
//! waiter's mark (or is not ours).
//!
//! A waiter that finds the lock held marks the holder's value ([`MARK_HOLDER`]), so a release
//! learns whether anybody waits from the value it reads anyway. The first call,
//! [`RELEASE_FAST`], is the bare compare-and-delete of a holder nobody waits for: one key and
//! one argument, the server work of a raw lock's release. Anything else (a marked value to hand
//! to a waiter, a lock that is not ours, a waiter's give-up that must leave the wait list) goes
//! on to [`RELEASE`], which checks everything again: a round trip more, only then.
//!
//! [`MARK_HOLDER`]: crate::scripts

use std::sync::OnceLock;
use std::time::Duration;

use leasehold_core::{Error, Owner};
use redis::Cmd;

use crate::keys::Names;
use crate::node::{Node, evalsha, ttl_ms};
use crate::scripts::{RELEASE, RELEASE_FAST};

/// Plain mode: how long a lock a release handed to a waiter stays reserved for it (see
/// [`RELEASE`]). A live waiter claims it within a round trip of the wake-up; a waiter that died
/// while listed costs the lock this long.
pub(crate) const HANDOFF: Duration = Duration::from_millis(250);

/// To whom a release hands the lock (see [`RELEASE`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Handoff {
    /// Plain mode: to the first live waiter on the wait list, if any.
    Plain,
    /// Fair mode, the grace period a woken waiter has to claim it: to the first live waiter
    /// in line; a release by a waiter also leaves the line.
    Fair(Duration),
    /// To nobody: a Redlock waiter's give-back after a round short of a quorum (the waiter
    /// goes on waiting and keeps its place).
    Nobody,
}

/// The calls of one release, handing the lock on as its `handoff` says. Built once for a
/// Redlock release and sent to every node: they are single servers, so the calls are the same
/// for each, and building them per node was a measured share of a Redlock cycle's client CPU.
/// The full call is built only if a node needs it.
pub(crate) struct ReleaseCall {
    fast: Cmd,
    names: Names,
    owner: Owner,
    handoff: Handoff,
    cluster: bool,
    full: OnceLock<Cmd>,
}

impl ReleaseCall {
    /// The release of `owner`'s grant of `names` (kept for the full call: taken, not copied, as
    /// every release builds one), on a node that is a Redis Cluster master if `cluster`.
    pub(crate) fn new(names: Names, owner: &Owner, handoff: Handoff, cluster: bool) -> Self {
        let mut fast = evalsha(&RELEASE_FAST, 1, 1);
        fast.arg(names.lock()).arg(owner.as_str());
        Self {
            fast,
            names,
            owner: owner.clone(),
            handoff,
            cluster,
            full: OnceLock::new(),
        }
    }

    /// The [`RELEASE`] script's call.
    fn full(&self) -> &Cmd {
        self.full.get_or_init(|| {
            let names = &self.names;
            let mut cmd = evalsha(&RELEASE, 4, 4);
            // The fair line's names only go along in fair mode (the script reads them only
            // then).
            if let Handoff::Fair(_) = self.handoff {
                cmd.arg(names.lock())
                    .arg(names.channel())
                    .arg(names.waiters())
                    .arg(names.queue());
            } else {
                cmd.arg(names.lock())
                    .arg(names.channel())
                    .arg(names.wait_list())
                    .arg(names.waiters());
            }
            let (mode, reserved) = match self.handoff {
                Handoff::Fair(grace) => ("F", grace),
                Handoff::Nobody => ("K", HANDOFF),
                Handoff::Plain => ("", HANDOFF),
            };
            cmd.arg(self.owner.as_str())
                .arg(if self.cluster { "S" } else { "" })
                .arg(mode)
                .arg(ttl_ms(reserved));
            cmd
        })
    }
}

impl Node {
    /// Compare-and-delete, or, if some waiter announced itself, hands the lock to one waiter
    /// (for [`HANDOFF`], in fair mode for `fair`, the grace period) and wakes it; in fair mode
    /// also leaves the line. True if our grant was there.
    pub(crate) async fn release(
        &self,
        names: Names,
        owner: &Owner,
        fair: Option<Duration>,
    ) -> Result<bool, Error> {
        let handoff = fair.map_or(Handoff::Plain, Handoff::Fair);
        let call = ReleaseCall::new(names, owner, handoff, self.is_cluster());
        self.run_release(&call).await
    }

    /// Runs a [`ReleaseCall`]: true if our grant was there.
    pub(crate) async fn run_release(&self, call: &ReleaseCall) -> Result<bool, Error> {
        if self
            .eval::<i64>(&RELEASE_FAST, &call.fast, "release")
            .await?
            == 1
        {
            return Ok(true);
        }
        self.eval::<i64>(&RELEASE, call.full(), "release")
            .await
            .map(|n| n == 1)
    }
}
