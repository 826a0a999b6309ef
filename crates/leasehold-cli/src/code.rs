//! The exit codes of leasehold itself, and what each one means.
//!
//! The table below the constants (compiled for the tests) is the one description of them: the
//! user guide's "Exit codes" table is rendered from it, and a test fails, printing the table to
//! paste, when the guide's copy drifts from it. `--help` points to the guide.

/// `status`: the lock is free; `release`: no holder found; `leader`: no leader.
pub(crate) const FREE: u8 = 1;
/// Bad command line; `release --key`: several live holders.
pub(crate) const USAGE: u8 = 2;
/// The backend (or a quorum of it) could not be reached; `release`: the holder does not answer
/// or its release failed.
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock is held by someone else (`--no-wait`).
pub(crate) const CONTENDED: u8 = 75;
/// Configuration error, or any other error of the backend.
pub(crate) const CONFIG: u8 = 78;
/// The lease was lost (`elect --once`: the leadership).
pub(crate) const LOST: u8 = 79;
/// Timed out waiting for the lock.
pub(crate) const TIMEOUT: u8 = 124;
/// The command, or the holder process, could not be started.
pub(crate) const CANNOT_RUN: u8 = 126;
/// 128 + SIGINT: interrupted while acquiring or campaigning (as shells report it).
pub(crate) const INTERRUPTED: u8 = 130;
/// 128 + SIGTERM: terminated while acquiring or campaigning.
pub(crate) const TERMINATED: u8 = 143;

/// One row of the exit-code table: the codes, and what they mean.
#[cfg(test)]
struct Row {
    /// The codes the row explains.
    codes: &'static [u8],
    /// What they mean, in Markdown.
    meaning: &'static str,
}

/// Every exit code of leasehold itself, in the order the guide lists them.
#[cfg(test)]
const TABLE: [Row; 10] = [
    Row {
        codes: &[0],
        meaning: "success; `status`: the lock is held",
    },
    Row {
        codes: &[FREE],
        meaning: "`status`: the lock is free; `release`: no holder found; `leader`: no leader",
    },
    Row {
        codes: &[USAGE],
        meaning: "bad command line (usage); `release --key`: several live holders (use `--handle`)",
    },
    Row {
        codes: &[UNAVAILABLE],
        meaning: "the backend could not be reached (or a Redlock quorum not reached); `release`: \
                  the holder does not answer, or its release failed",
    },
    Row {
        codes: &[CONTENDED],
        meaning: "the lock is held by someone else (`--no-wait`)",
    },
    Row {
        codes: &[CONFIG],
        meaning: "configuration error: bad URL or config file, bad key, `require` not met, \
                  unusable runtime dir, a `release` handle that is not a holder's state file, \
                  a backend that gives no elections (`elect`, `leader` on Redlock); also any \
                  other error the backend reports",
    },
    Row {
        codes: &[LOST],
        meaning: "the lease was lost (`run`: the command was terminated; `release`: lost before \
                  or at release, or the holder died; `elect --once`: the leadership was lost and \
                  the command terminated)",
    },
    Row {
        codes: &[TIMEOUT],
        meaning: "timed out waiting (`--wait`)",
    },
    Row {
        codes: &[CANNOT_RUN],
        meaning: "the command, or the holder process, could not be started; `acquire` could not \
                  print its output (the lock is given back)",
    },
    Row {
        codes: &[INTERRUPTED, TERMINATED],
        meaning: "`acquire`, `run`: SIGINT or SIGTERM while waiting for the lock (128 + N; the \
                  lock is not taken); `elect`: the same while campaigning",
    },
];

/// The last row: the status of `run`'s and `elect`'s command, which is not a code of leasehold's.
#[cfg(test)]
const COMMAND_ROW: &str =
    "| other | `run`, `elect`: the command's own status (128 + N for signal N) |";

/// The exit-code table in Markdown, as the guide shows it.
#[cfg(test)]
fn markdown() -> String {
    let mut out = String::from("| code | meaning |\n|---|---|\n");
    for row in &TABLE {
        let codes: Vec<String> = row.codes.iter().map(u8::to_string).collect();
        out.push_str(&format!("| {} | {} |\n", codes.join(", "), row.meaning));
    }
    out.push_str(COMMAND_ROW);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guide's table is this crate's, to the byte: edit [`TABLE`], then paste what this test
    /// prints into docs/guide.md.
    #[test]
    fn the_guide_shows_this_table() {
        let guide = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/guide.md");
        let text = std::fs::read_to_string(guide).unwrap_or_default();
        let table = markdown();
        assert!(
            text.contains(&format!("\n\n{table}\n")),
            "docs/guide.md's exit-code table is not the CLI's; paste this under \
             \"### Exit codes\":\n\n{table}"
        );
    }

    #[test]
    fn every_code_is_listed_once() {
        let mut seen: Vec<u8> = TABLE.iter().flat_map(|r| r.codes.iter().copied()).collect();
        let listed = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), listed, "a code appears in two rows");
        for c in [
            FREE,
            USAGE,
            UNAVAILABLE,
            CONTENDED,
            CONFIG,
            LOST,
            TIMEOUT,
            CANNOT_RUN,
            INTERRUPTED,
            TERMINATED,
        ] {
            assert!(seen.contains(&c), "exit code {c} has no row");
        }
    }
}
