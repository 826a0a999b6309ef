//! Release wake-ups: the RESP3 pushes of a node's shared connection routed to the tasks that
//! wait on a key's channel, and one subscription per channel for as long as some local task
//! waits on it. The single-node backend keeps one hub; Redlock one per node.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::Error;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;

use crate::node::Node;

/// Routes release messages (RESP3 pushes on the shared connection) to waiting tasks, and keeps
/// one subscription per channel for as long as some local task waits on it.
#[derive(Default)]
pub(crate) struct WakeHub {
    channels: Mutex<HashMap<String, Arc<Channel>>>,
}

/// One wake-up channel: its waiters, how many hold it, and whether we are subscribed.
#[derive(Default)]
pub(crate) struct Channel {
    pub(crate) notify: Notify,
    /// The last message (its payload), set before its waiters are woken; `None` after a
    /// disconnection (a message may have been missed: it concerns everyone).
    last: Mutex<Option<Vec<u8>>>,
    /// Guarded by the hub's map lock.
    refs: std::sync::atomic::AtomicUsize,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE of this channel, so an unsubscribe left over from
    /// the previous waiter can never overtake the next waiter's subscribe.
    subscribed: tokio::sync::Mutex<bool>,
}

impl Channel {
    fn last(&self) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the last message may concern the waiter `owner`: it named `owner`, or named
    /// nobody in particular (a disconnection).
    pub(crate) fn last_names(&self, owner: &str) -> bool {
        self.last().as_deref().is_none_or(|p| p == owner.as_bytes())
    }
}

impl WakeHub {
    pub(crate) fn on_push(&self, push: PushInfo) {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = push.data.first()
                    && let Ok(channel) = std::str::from_utf8(channel)
                    && let Some(c) = self.lock().get(channel)
                {
                    let payload = match push.data.get(1) {
                        Some(Value::BulkString(p)) => Some(p.clone()),
                        _ => None,
                    };
                    *c.last() = payload;
                    c.notify.notify_waiters();
                }
            }
            // The connection dropped: a release may have been missed; let everyone look again.
            PushKind::Disconnection => {
                for c in self.lock().values() {
                    *c.last() = None;
                    c.notify.notify_waiters();
                }
            }
            _ => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A hold on one key's wake-up channel, taken by the local contender.
pub(crate) struct Subscription {
    node: Arc<Node>,
    hub: Arc<WakeHub>,
    name: String,
    pub(crate) channel: Arc<Channel>,
}

impl Subscription {
    pub(crate) async fn new(
        node: &Arc<Node>,
        hub: &Arc<WakeHub>,
        name: &str,
    ) -> Result<Self, Error> {
        let channel = {
            let mut map = hub.lock();
            let c = Arc::clone(map.entry(name.to_owned()).or_default());
            c.refs.fetch_add(1, Ordering::SeqCst);
            c
        };
        // From here on, dropping `sub` gives the hold back, even if subscribing fails.
        let sub = Self {
            node: Arc::clone(node),
            hub: Arc::clone(hub),
            name: name.to_owned(),
            channel,
        };
        let mut subscribed = sub.channel.subscribed.lock().await;
        if !*subscribed {
            sub.node.subscribe(name).await?;
            *subscribed = true;
        }
        drop(subscribed);
        Ok(sub)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let _map = self.hub.lock();
            self.channel.refs.fetch_sub(1, Ordering::SeqCst) == 1
        };
        if !last {
            return;
        }
        let (node, hub, name, channel) = (
            Arc::clone(&self.node),
            Arc::clone(&self.hub),
            std::mem::take(&mut self.name),
            Arc::clone(&self.channel),
        );
        // Driven to completion in a task: a dropped redis-rs future never sends its request.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(async move {
                let mut subscribed = channel.subscribed.lock().await;
                if channel.refs.load(Ordering::SeqCst) > 0 {
                    return; // a new waiter took the channel over meanwhile
                }
                if *subscribed {
                    match node.unsubscribe(&name).await {
                        Ok(()) => *subscribed = false,
                        Err(e) => {
                            tracing::debug!(error = %e, "leasehold-redis: unsubscribe failed")
                        }
                    }
                }
                drop(subscribed);
                let mut map = hub.lock();
                if channel.refs.load(Ordering::SeqCst) == 0
                    && map.get(&name).is_some_and(|c| Arc::ptr_eq(c, &channel))
                {
                    map.remove(&name);
                }
            }));
        }
    }
}

/// `config` with the connection's pushes (release messages, disconnections) routed to `hub`,
/// and its subscriptions made again after a reconnect.
pub(crate) fn pushes_to(
    config: redis::aio::ConnectionManagerConfig,
    hub: &Arc<WakeHub>,
) -> redis::aio::ConnectionManagerConfig {
    let hub = Arc::clone(hub);
    config
        .set_automatic_resubscription()
        .set_push_sender(move |push: PushInfo| {
            hub.on_push(push);
            Ok::<(), redis::aio::SendError>(())
        })
}
