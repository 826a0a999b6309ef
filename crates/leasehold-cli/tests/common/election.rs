//! Helpers of the `elect` / `leader` tests: candidates as `leasehold elect` processes whose
//! command records its term, and `leasehold leader --json` read back.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;

use super::{alive, lh, on_key, stdout};

/// The leadership TTL of the process tests: short, so failovers are quick.
pub(crate) const TTL: &str = "2s";

/// Added to a backend's crash-release bound: two loaded cores, a process spawned per probe.
pub(crate) const SLACK: Duration = Duration::from_secs(6);

/// What the candidates' command runs after recording its term: nothing but waiting.
pub(crate) const IDLE: &str = "exec sleep 600";

/// One `leasehold elect` process. Its command appends `TERM TOKEN PID` (its
/// `LEASEHOLD_TERM`, `LEASEHOLD_FENCING_TOKEN` and process id) to [`terms`](Self::terms) when it
/// starts, then runs the shell code it was given.
pub(crate) struct Candidate {
    pub(crate) value: String,
    pub(crate) child: Child,
    terms: PathBuf,
    log: PathBuf,
}

/// One line the command wrote: a leadership it ran under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ran {
    pub(crate) term: u64,
    pub(crate) pid: u32,
}

impl Candidate {
    /// Starts `leasehold elect --key KEY --url URL --value VALUE --ttl 2s --grace 1s EXTRA --
    /// bash -c '<record the term>; BODY'`, with `env` in its environment (which the command
    /// inherits), its stderr in a file of `dir`.
    pub(crate) fn start(
        rt: &Path,
        dir: &Path,
        (key, url): (&str, &str),
        value: &str,
        extra: &[&str],
        body: &str,
        env: &[(&str, String)],
    ) -> Self {
        let terms = dir.join(format!("{value}.terms"));
        let log = dir.join(format!("{value}.stderr"));
        let script = format!(
            "printf '%s %s %s\\n' \"$LEASEHOLD_TERM\" \"$LEASEHOLD_FENCING_TOKEN\" \"$$\" \
             >> \"$ELECT_TERMS\"; {body}"
        );
        let mut args = vec![
            "elect", "--key", key, "--url", url, "--value", value, "--ttl", TTL, "--grace", "1s",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "bash", "-c", &script]);
        let child = lh(rt, &args)
            .env("ELECT_TERMS", &terms)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("stderr file"))
            .spawn()
            .expect("spawn leasehold elect");
        Self {
            value: value.to_owned(),
            child,
            terms,
            log,
        }
    }

    /// The `leasehold elect` process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Sends `sig` to the `leasehold elect` process (not to its command).
    pub(crate) fn signal(&self, sig: Signal) {
        let pid = i32::try_from(self.pid()).expect("a pid");
        kill(Pid::from_raw(pid), sig).expect("kill");
    }

    /// What it wrote on stderr so far.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every leadership its command ran under, in order. Each line's token must equal its term.
    pub(crate) fn ran(&self) -> Vec<Ran> {
        let text = std::fs::read_to_string(&self.terms).unwrap_or_default();
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                assert_eq!(f.len(), 3, "{}: line {line:?}", self.value);
                assert_eq!(
                    f[0], f[1],
                    "{}: LEASEHOLD_TERM and LEASEHOLD_FENCING_TOKEN differ",
                    self.value
                );
                Ran {
                    term: f[0].parse().expect("a term"),
                    pid: f[2].parse().expect("a pid"),
                }
            })
            .collect()
    }

    /// Waits (at most `limit`) until its command has run under `term`; that run.
    pub(crate) async fn ran_under(&self, term: u64, limit: Duration) -> Ran {
        let t0 = Instant::now();
        loop {
            if let Some(r) = self.ran().into_iter().find(|r| r.term == term) {
                return r;
            }
            assert!(
                t0.elapsed() < limit,
                "{}'s command never ran under term {term}: {:?}\n{}",
                self.value,
                self.ran(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (at most `limit`) for `leasehold elect` to exit; its exit code.
    pub(crate) async fn exit(&mut self, limit: Duration) -> Option<i32> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} did not exit within {limit:?}:\n{}",
                    self.value,
                    self.stderr()
                )
            })
            .expect("wait");
        status.code()
    }
}

/// Whether the process of a command's run is gone.
pub(crate) fn gone(run: Ran) -> bool {
    !alive(run.pid)
}

/// The leader as `leasehold leader --json` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) value: String,
    pub(crate) term: u64,
}

/// `leasehold leader --json`: the leader (exit 0) or none (exit 1); any other exit fails.
pub(crate) async fn leader(rt: &Path, key: &str, url: &str) -> Option<Seen> {
    let out = on_key(rt, "leader", key, url, &["--json"]).await;
    let json = stdout(&out);
    let field = |name: &str| {
        let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
        Some(json[at..].to_owned())
    };
    match out.status.code() {
        Some(0) => {
            assert!(json.contains("\"leader\":true"), "{json}");
            let value = field("value").expect("a value");
            let value = value.strip_prefix('"').expect("a string");
            let value = value[..value.find('"').expect("closed")].to_owned();
            let term = field("term").expect("a term");
            let digits: String = term.chars().take_while(char::is_ascii_digit).collect();
            Some(Seen {
                value,
                term: digits.parse().expect("a number"),
            })
        }
        Some(1) => {
            assert!(json.contains("\"leader\":false"), "{json}");
            None
        }
        other => panic!("leader: exit {other:?}: {out:?}"),
    }
}

/// Polls `leader --json` until `wanted` holds for its answer (at most `limit`); the answer and
/// how long it took.
pub(crate) async fn until_leader(
    rt: &Path,
    (key, url): (&str, &str),
    limit: Duration,
    wanted: impl Fn(&Seen) -> bool,
) -> (Seen, Duration) {
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < limit {
        last = leader(rt, key, url).await;
        if let Some(seen) = last.as_ref().filter(|s| wanted(s)) {
            return (seen.clone(), t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no wanted leader within {limit:?}; last seen {last:?}");
}
