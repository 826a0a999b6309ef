//! Elections on the in-memory backend: a [`LockElection`] over a second, private
//! [`MemoryBackend`] (so an election never collides with the lock of the same key) and a map of
//! published values.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::election::Candidate;
use crate::error::Error;
use crate::key::LockKey;
use crate::lock_election::{LeaderStore, LockElection};
use crate::memory::MemoryBackend;
use crate::token::Owner;

/// How often an observer looks at the leader of a key (a memory read).
const POLL: Duration = Duration::from_millis(10);

/// The election state of one [`MemoryBackend`], shared by its election views.
#[derive(Debug, Default)]
pub(crate) struct Elections {
    locks: MemoryBackend,
    values: Arc<Values>,
}

impl Elections {
    pub(crate) fn view(&self, candidate: Candidate) -> LockElection {
        LockElection::new(
            Arc::new(self.locks.clone()),
            Arc::clone(&self.values) as Arc<dyn LeaderStore>,
            candidate,
            POLL,
        )
    }
}

#[derive(Debug, Default)]
struct Values(Mutex<HashMap<LockKey, (Owner, Candidate)>>);

impl Values {
    fn map(&self) -> MutexGuard<'_, HashMap<LockKey, (Owner, Candidate)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl LeaderStore for Values {
    async fn publish(&self, key: &LockKey, owner: &Owner, value: &Candidate) -> Result<(), Error> {
        self.map()
            .insert(key.clone(), (owner.clone(), value.clone()));
        Ok(())
    }

    async fn read(&self, key: &LockKey) -> Result<Option<(Owner, Candidate)>, Error> {
        Ok(self.map().get(key).cloned())
    }

    async fn clear(&self, key: &LockKey, owner: &Owner) -> Result<(), Error> {
        let mut map = self.map();
        if map.get(key).is_some_and(|(o, _)| o == owner) {
            map.remove(key);
        }
        Ok(())
    }
}
