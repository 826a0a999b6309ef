//! This process's CPU time (`getrusage`), shared by the load examples.

use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};

/// User + system CPU time of this process so far.
pub(crate) fn cpu() -> Duration {
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
    };
    tv(u.user_time()) + tv(u.system_time())
}
