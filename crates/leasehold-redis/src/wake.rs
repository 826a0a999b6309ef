//! Release wake-ups: the RESP3 pushes of a node's shared connection routed to the tasks that
//! wait on a channel, and one subscription per channel for as long as some local task waits on
//! it. A lock's (or election's) waiter listens on a channel of its own (`…:released:<owner>`),
//! on which a release that chose it as the one waiter to wake publishes; a semaphore's waiters
//! share their key's channel. The single-node backend keeps one hub; Redlock one per node.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use leasehold_core::{Error, ErrorKind, Grant, Waited};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use crate::node::Node;

/// Routes release messages (RESP3 pushes on the shared connection) to waiting tasks, and keeps
/// one subscription per channel for as long as some local task waits on it.
#[derive(Default)]
pub(crate) struct WakeHub {
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// A subscription was refused (an ACL): warned once.
    refused: std::sync::atomic::AtomicBool,
}

/// One wake-up channel: its waiters, how many hold it, and whether we are subscribed.
#[derive(Default)]
pub(crate) struct Channel {
    notify: Notify,
    /// Guarded by the hub's map lock.
    refs: std::sync::atomic::AtomicUsize,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE of this channel, so an unsubscribe left over from
    /// the previous waiter can never overtake the next waiter's subscribe.
    subscribed: tokio::sync::Mutex<bool>,
}

impl WakeHub {
    /// The push handler of a connection whose pushes go to `hub`.
    pub(crate) fn sender(
        hub: &Arc<Self>,
    ) -> impl Fn(PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync + 'static {
        let hub = Arc::clone(hub);
        move |push: PushInfo| {
            hub.on_push(push);
            Ok(())
        }
    }

    fn on_push(&self, push: PushInfo) {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = push.data.first()
                    && let Ok(channel) = std::str::from_utf8(channel)
                    && let Some(c) = self.lock().get(channel)
                {
                    c.notify.notify_waiters();
                }
            }
            // The connection dropped: a release may have been missed; let everyone look again.
            PushKind::Disconnection => {
                for c in self.lock().values() {
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
    channel: Arc<Channel>,
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
            match sub.node.subscribe(name).await {
                Ok(()) => *subscribed = true,
                // An ACL without the channel: the waiter polls (`wait_on`'s backoff) instead.
                Err(e) if e.kind() == ErrorKind::InvalidConfig => {
                    if !hub.refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(target: "leasehold.redis.wake", channel = name, error = %e,
                            "this Redis user may not subscribe to the wake-up channels: waiters \
                             poll with backoff instead of being woken by releases; grant the \
                             user the channels of the key prefix (&<prefix>*)");
                    }
                }
                Err(e) => return Err(e),
            }
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

/// Runs `attempt` (given the instant it starts) until it grants or `deadline` passes, and
/// between attempts waits for a release message on any of `subs` or `pause(attempts)`,
/// whichever comes first: a message can be lost across a reconnect, and a holder that expires
/// instead of releasing sends none. At the deadline: no grant, with the attempts.
pub(crate) async fn wait_on<F, Fut>(
    subs: &[Subscription],
    deadline: Instant,
    pause: impl Fn(u32) -> Duration,
    mut attempt: F,
) -> Result<Waited, Error>
where
    F: FnMut(Instant) -> Fut,
    Fut: Future<Output = Result<Option<Grant>, Error>>,
{
    let mut attempts = 0u32;
    loop {
        // Armed before the attempt, so a release in between is not missed.
        let mut woken = armed(subs);
        attempts += 1;
        if let Some(grant) = attempt(Instant::now()).await? {
            return Ok(Waited::new(Some(grant), attempts));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Waited::new(None, attempts));
        }
        let until = (now + pause(attempts).max(Duration::from_millis(1))).min(deadline);
        tokio::select! {
            () = any(&mut woken) => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

/// A wake-up future per subscription, each enabled (registered with its channel) at once.
fn armed(subs: &[Subscription]) -> Vec<Pin<Box<Notified<'_>>>> {
    subs.iter()
        .map(|s| {
            let mut n = Box::pin(s.channel.notify.notified());
            n.as_mut().enable();
            n
        })
        .collect()
}

/// Ready when any of `woken` is (never, for none).
async fn any(woken: &mut [Pin<Box<Notified<'_>>>]) {
    std::future::poll_fn(|cx| {
        if woken.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// `config` with the connection's pushes (release messages, disconnections) routed to `hub`,
/// and its subscriptions made again after a reconnect.
pub(crate) fn pushes_to(
    config: redis::aio::ConnectionManagerConfig,
    hub: &Arc<WakeHub>,
) -> redis::aio::ConnectionManagerConfig {
    config
        .set_automatic_resubscription()
        .set_push_sender(WakeHub::sender(hub))
}
