//! What the safety table is asked ([`Params`]), its rows and columns ([`BACKENDS`],
//! [`FAULTS`]), where a fault applies, and the invariants a run must keep.

use leasehold_core::Capabilities;

use super::check::Writes;

/// The backends, in table order.
pub(crate) const BACKENDS: [&str; 6] = ["memory", "file", "redis", "redlock", "postgres", "etcd"];

/// The faults, in table order, with their column titles.
pub(crate) const FAULTS: [(&str, &str); 11] = [
    ("pause", "client pause past the TTL"),
    ("delay", "response delayed past the TTL"),
    ("restart", "node restarted empty"),
    ("restart-delayed", "node restarted empty after the TTL"),
    ("clock-jump", "clock jump on one node"),
    ("pg-terminate", "pg_terminate_backend"),
    ("member-kill", "etcd leader killed"),
    ("lease-revoke", "etcd lease revoked"),
    ("partition", "network partition"),
    ("failover", "Redis failover"),
    ("failover-wait", "Redis failover, replica sync on"),
];

/// Options of one run.
pub(crate) struct Params {
    pub(crate) runs: usize,
    pub(crate) backends: Vec<String>,
    pub(crate) faults: Vec<String>,
}

/// Whether `fault` applies to `backend`.
pub(super) fn applies(backend: &str, fault: &str) -> bool {
    match fault {
        "pause" => true,
        "delay" => !matches!(backend, "memory" | "file"),
        "restart" | "restart-delayed" | "clock-jump" => matches!(backend, "redis" | "redlock"),
        "pg-terminate" => backend == "postgres",
        "member-kill" | "lease-revoke" => backend == "etcd",
        "partition" => matches!(backend, "redlock" | "postgres" | "etcd"),
        "failover" | "failover-wait" => backend == "redis",
        _ => false,
    }
}

/// Cells where an overlap breaks a promise the backend makes, whatever its safety class: the
/// invariants `--quick` enforces (with "stale writes accepted with fencing = 0" for every
/// backend whose fencing is monotonic). Each comes with the reason.
pub(super) fn must_not_overlap(backend: &str, fault: &str) -> Option<&'static str> {
    match (backend, fault) {
        (_, "delay") => Some(
            "validity counts from before the request, so a grant that arrives after its TTL \
             is never acted on",
        ),
        ("postgres", "pause") => {
            Some("a paused holder's session still holds the advisory lock on the server")
        }
        ("file", "pause") => Some("a paused holder's process still holds the OS file lock"),
        ("etcd", "member-kill") => Some("the cluster keeps quorum, so the lease lives on"),
        ("redis", "failover-wait") => {
            Some("a grant counts only once both replicas have it, so the promoted one has it too")
        }
        ("redlock" | "postgres" | "etcd", "partition") => Some(
            "the cut-off holder is told before its grant can end on the servers (validity \
             counted from before its last renewal or health check was sent)",
        ),
        ("redis" | "redlock", "restart-delayed") => Some(
            "the node returns only after every lease on it has run out (the documented mitigation)",
        ),
        _ => None,
    }
}

/// Cells where the fault must hand the lock to B within the trial (B took it in 10 of 10 runs
/// of the committed full table): a fault that silently did nothing (a proxy that added no
/// latency, a restart that never happened, a clock that did not move) shows as no takeover
/// there, and `--quick` fails. Each comes with what hands the lock over.
pub(super) fn must_take_over(backend: &str, fault: &str) -> Option<&'static str> {
    match (backend, fault) {
        ("memory" | "redis" | "redlock" | "etcd", "pause") => {
            Some("the paused holder's lease runs out on the server while it sleeps")
        }
        ("redis" | "redlock" | "postgres" | "etcd", "delay") => {
            Some("the late grant is refused and given back, or runs out")
        }
        ("redis" | "redlock", "restart" | "restart-delayed") => {
            Some("the restarted node comes back empty")
        }
        ("redis" | "redlock", "clock-jump") => {
            Some("the jumped clock expires every key on the node")
        }
        ("postgres", "pg-terminate") => Some("the terminated session's advisory lock is freed"),
        ("etcd", "lease-revoke") => Some("the revoked lease deletes the holder's key"),
        ("redis", "failover" | "failover-wait") => {
            Some("the promoted replica never saw A's grant (or A's grant never counted)")
        }
        ("redlock" | "postgres" | "etcd", "partition") => Some(
            "the cut-off holder's grant ends on the servers (TTL, session expiry on the \
             majority, the server's TCP keep-alives and user timeout)",
        ),
        _ => None,
    }
}

/// The tally of one (backend, fault) cell.
#[derive(Debug, Default, Clone)]
pub(super) struct Cell {
    /// Trials that ran, and why the others could not.
    pub(super) runs: u32,
    pub(super) errors: Vec<String>,
    /// The backend's capabilities (what it claims of its fencing tokens).
    pub(super) caps: Option<Capabilities>,
    /// Trials in which two holders overlapped, B took the lock, A's grant came back expired.
    pub(super) overlaps: u32,
    pub(super) takeovers: u32,
    pub(super) late_grants: u32,
    /// Stale writes the plain and the fenced store accepted, and writes of the newest holder
    /// the fenced store rejected, summed over the trials.
    pub(super) writes: Writes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_invariant_names_a_cell_that_runs_and_every_fault_applies_somewhere() {
        for (fault, _) in FAULTS {
            assert!(
                BACKENDS.iter().any(|b| applies(b, fault)),
                "{fault} applies to no backend"
            );
            for b in BACKENDS {
                if must_not_overlap(b, fault).is_some() && !matches!(fault, "delay") {
                    assert!(
                        applies(b, fault),
                        "invariant on {b}/{fault}, which never runs"
                    );
                }
                if must_take_over(b, fault).is_some() {
                    assert!(
                        applies(b, fault),
                        "takeover on {b}/{fault}, which never runs"
                    );
                    assert!(
                        !matches!((b, fault), ("file" | "postgres", "pause")),
                        "a session-held lock cannot be taken over under a pause"
                    );
                }
            }
        }
        assert!(!applies("memory", "delay") && !applies("file", "restart"));
    }
}
