//! What a [`LockLayer`](super::LockLayer) is configured with, and what each [`Lock`](super::Lock)
//! it makes keeps: one struct, so the two never disagree on a setting.

use std::sync::Arc;

use leasehold_core::Locker;

use super::hold::UntilResponse;
use super::{Mode, OnLost};

#[derive(Debug, Clone)]
pub(super) struct Settings<K, H = UntilResponse> {
    pub(super) locker: Locker,
    pub(super) extractor: K,
    pub(super) mode: Mode,
    pub(super) on_lost: OnLost,
    pub(super) hold: H,
    /// The `route` label of the metrics, unless the extractor derives one per request.
    pub(super) route: Option<Arc<str>>,
}

impl<K> Settings<K> {
    /// Leases from `locker` on the keys `extractor` picks, held until the response is ready.
    pub(super) fn new(locker: Locker, extractor: K, mode: Mode, on_lost: OnLost) -> Self {
        Self {
            locker,
            extractor,
            mode,
            on_lost,
            hold: UntilResponse,
            route: None,
        }
    }
}

impl<K, H> Settings<K, H> {
    /// The same settings with another [`Hold`](super::Hold) policy.
    pub(super) fn with_hold<H2>(self, hold: H2) -> Settings<K, H2> {
        Settings {
            locker: self.locker,
            extractor: self.extractor,
            mode: self.mode,
            on_lost: self.on_lost,
            hold,
            route: self.route,
        }
    }
}
