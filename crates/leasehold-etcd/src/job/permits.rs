//! The semaphore's side of the queue: permit keys, the stored limit, and the two ways in
//! (`try_acquire` and the queue).
//!
//! A permit request puts `{range}{lease hex}_{owner}` on its lease; the `limit` keys with the
//! lowest create revisions under the range hold. The limit lives in `{prefix}%sem/{key}` (no
//! lease): written by a client that finds the range empty, compared by every other one.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use leasehold_core::semaphore::limit_mismatch;
use leasehold_core::{Error, ErrorKind, LockKey};

use super::{Answer, Job};
use crate::NAME;
use crate::client::{all_kvs, checked_revision, revision, waiter_key};

/// How often a request starts over when the range changed under it (`try_acquire`) or the
/// limit key was missing: after that it answers "all taken" (try) or an error (queue).
const ROUNDS: usize = 4;

/// The limit of a semaphore key, and where it is stored.
#[derive(Debug, Clone)]
pub(crate) struct Limit {
    /// The semaphore's key (for error messages).
    pub(crate) key: LockKey,
    /// The permit count this client asks for.
    pub(crate) permits: u32,
    /// The etcd key of the stored limit: `{prefix}%sem/{escaped key}`.
    pub(crate) stored_at: Vec<u8>,
}

impl Limit {
    fn value(&self) -> String {
        self.permits.to_string()
    }

    /// Writes our limit (no lease: it outlives every permit, and the next client that finds
    /// the range empty overwrites it).
    fn put(&self) -> TxnOp {
        TxnOp::put(self.stored_at.clone(), self.value(), None)
    }

    /// `Ok` when the stored limit `stored` is ours; the mismatch error otherwise.
    fn check(&self, stored: &[u8]) -> Result<(), Error> {
        let n = std::str::from_utf8(stored)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    NAME,
                    format!(
                        "the limit key of semaphore {:?} holds {:?}, not a permit count",
                        self.key,
                        String::from_utf8_lossy(stored)
                    ),
                )
            })?;
        if n == self.permits {
            Ok(())
        } else {
            Err(limit_mismatch(NAME, &self.key, n, self.permits))
        }
    }
}

/// A permit request's key: `{range}{lease hex}_{owner}` (the owner value is unique per
/// acquisition, so one session lease can carry many permits of a key).
pub(crate) fn permit_key(range: &[u8], lease: i64, owner: &str) -> Vec<u8> {
    let mut key = waiter_key(range, lease);
    key.push(b'_');
    key.extend_from_slice(owner.as_bytes());
    key
}

/// The `n` oldest keys under a range: its holders.
pub(crate) fn oldest(n: u32) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(i64::from(n))
}

/// Our key's create revision, from the get of it at `op`, and whether it is among the
/// holders the get at `op + 1` listed.
fn placed(resp: &TxnResponse, key: &[u8], op: usize) -> Result<(i64, bool), Error> {
    let ours = all_kvs(resp, op).into_iter().next().ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            NAME,
            "etcd did not answer the permit key just written",
        )
    })?;
    let holds = all_kvs(resp, op + 1).iter().any(|kv| kv.key() == key);
    Ok((checked_revision(ours.create_revision())?, holds))
}

fn count(resp: &TxnResponse, op: usize) -> i64 {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(g)) => g.count(),
        _ => 0,
    }
}

fn nested(resp: &TxnResponse) -> Option<TxnResponse> {
    match resp.op_responses().into_iter().next() {
        Some(TxnOpResponse::Txn(t)) => Some(t),
        _ => None,
    }
}

impl Job {
    /// `try_acquire` of a permit: reads the holders and the limit at a revision, then creates
    /// our key only if no key was created under the range since then (so fewer than `limit`
    /// keys are older than ours). Our key's create revision if granted.
    pub(super) async fn try_permit(
        &mut self,
        tx: &Answer,
        key: &[u8],
        put: TxnOp,
        limit: &Limit,
    ) -> Result<Option<i64>, Error> {
        for _ in 0..ROUNDS {
            let read = Txn::new().and_then([
                TxnOp::get(
                    self.prefix.clone(),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                ),
                TxnOp::get(limit.stored_at.clone(), None),
            ]);
            let resp = self
                .inner
                .txn("try permit", read)
                .await
                .map_err(|e| e.into_core("try permit"))?;
            let at = revision(&resp)?;
            let held = count(&resp, 0);
            let stored: Option<KeyValue> = all_kvs(&resp, 1).into_iter().next();
            if held > 0
                && let Some(kv) = &stored
            {
                limit.check(kv.value())?;
            }
            if held >= i64::from(limit.permits) {
                return Ok(None);
            }
            // Nothing created under the range since `at`: still fewer than `limit` keys.
            let unchanged = Compare::create_revision(self.prefix.clone(), CompareOp::Less, at + 1)
                .with_prefix();
            let mut ops = vec![put.clone(), TxnOp::get(key.to_vec(), None)];
            // Store our limit unless it is there already (with permits held, `check` passed).
            if stored.is_none_or(|kv| kv.value() != limit.value().as_bytes()) {
                ops.insert(0, limit.put());
            }
            let ours = ops.len() - 1;
            let txn = Txn::new().when([unchanged]).and_then(ops);
            let Some(resp) = self.create(tx, "try permit", txn).await? else {
                return Ok(None);
            };
            if resp.succeeded() {
                let kv = all_kvs(&resp, ours).into_iter().next();
                let rev = kv.map_or(0, |kv| kv.create_revision());
                return checked_revision(rev).map(Some);
            }
            self.created = false;
        }
        Ok(None)
    }

    /// The queue of a permit: our key joins the range if the stored limit is ours (or the
    /// range is empty, and then ours is stored). Our key's create revision and whether it
    /// holds a permit already; `None` if our caller is gone.
    pub(super) async fn enqueue_permit(
        &mut self,
        tx: &Answer,
        key: &[u8],
        put: TxnOp,
        limit: &Limit,
    ) -> Result<Option<(i64, bool)>, Error> {
        let join = [
            put,
            TxnOp::get(key.to_vec(), None),
            TxnOp::get(self.prefix.clone(), Some(oldest(limit.permits))),
        ];
        let empty =
            Compare::create_revision(self.prefix.clone(), CompareOp::Equal, 0).with_prefix();
        let mut first = vec![limit.put()];
        first.extend(join.iter().cloned());
        let txn = Txn::new()
            .when([Compare::value(
                limit.stored_at.clone(),
                CompareOp::Equal,
                limit.value(),
            )])
            .and_then(join)
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([empty])
                    .and_then(first)
                    .or_else([TxnOp::get(limit.stored_at.clone(), None)]),
            )]);
        for _ in 0..ROUNDS {
            let Some(resp) = self.create(tx, "permit", txn.clone()).await? else {
                return Ok(None);
            };
            if resp.succeeded() {
                return placed(&resp, key, 1).map(Some);
            }
            let Some(inner) = nested(&resp) else { break };
            if inner.succeeded() {
                return placed(&inner, key, 2).map(Some);
            }
            self.created = false;
            match all_kvs(&inner, 0).into_iter().next() {
                Some(kv) => limit.check(kv.value())?,
                None => {
                    // Permits without a stored limit (deleted by hand): store ours if still
                    // absent, then join again (a client with another limit is refused by it).
                    let txn = Txn::new()
                        .when([Compare::create_revision(
                            limit.stored_at.clone(),
                            CompareOp::Equal,
                            0,
                        )])
                        .and_then([limit.put()]);
                    self.inner
                        .txn("store permit limit", txn)
                        .await
                        .map_err(|e| e.into_core("store permit limit"))?;
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            NAME,
            format!(
                "the limit of semaphore {:?} kept changing while joining its queue; retry",
                limit.key
            ),
        ))
    }
}
