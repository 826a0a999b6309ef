//! `leasehold leader`: who leads a key's election now.

use std::time::Duration;

use leasehold::{Backoff, Candidate, Elector, Leader};
use tokio::time::Instant;

use crate::code;
use crate::lock::{Target, config_of, failure, warn_if_password_in_url};
use crate::status::string;

/// How long `leader` asks again after an error that may pass.
const PATIENCE: Duration = Duration::from_secs(3);

/// The pauses between those attempts.
const BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(20),
    max: Duration::from_millis(500),
};

#[derive(clap::Args)]
pub(crate) struct LeaderArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints the leader's value and term (exit 0), or that there is none (exit 1).
pub(crate) async fn leader(args: LeaderArgs) -> u8 {
    warn_if_password_in_url(&args.target);
    let config = match config_of(&args.target, None) {
        Ok(c) => c,
        Err(e) => return failure(&e),
    };
    // An observer: this value is never published (it does not campaign).
    let observer = match Candidate::new("leasehold leader") {
        Ok(c) => c,
        Err(e) => return failure(&e),
    };
    let elector = match config
        .build_elector(args.target.key.as_str(), observer)
        .await
    {
        Ok(e) => e,
        Err(e) => return failure(&e),
    };
    let now = match current(&elector).await {
        Ok(now) => now,
        Err(e) => return failure(&e),
    };
    let backend = elector.locker().capabilities().name;
    let key = &args.target.key;
    if args.json {
        out!("{}", json(key, backend, now.as_ref()));
    } else {
        match &now {
            Some(l) => {
                out!("leader: {}", l.value.as_str().escape_debug());
                out!("term: {}", l.term);
            }
            None => out!("{key:?} has no leader ({backend})"),
        }
    }
    if now.is_some() { 0 } else { code::FREE }
}

/// [`Elector::leader`], asked again for up to [`PATIENCE`] while it fails in a way that may pass:
/// a leader caught between taking the leadership and publishing its value, a server that
/// does not answer for a moment.
async fn current(elector: &Elector) -> Result<Option<Leader>, leasehold::Error> {
    let t0 = Instant::now();
    let mut attempt = 0u32;
    loop {
        match elector.leader().await {
            Err(e) if e.is_retryable() && t0.elapsed() < PATIENCE => {
                attempt += 1;
                tokio::time::sleep(BACKOFF.delay(attempt)).await;
            }
            answer => return answer,
        }
    }
}

/// One JSON object: `key`, `backend`, `leader` (whether there is one), and when there is,
/// `value` and `term`.
fn json(key: &str, backend: &str, leader: Option<&Leader>) -> String {
    let mut s = format!(
        "{{\"key\":{},\"backend\":{},\"leader\":{}",
        string(key),
        string(backend),
        leader.is_some()
    );
    if let Some(l) = leader {
        s.push_str(&format!(
            ",\"value\":{},\"term\":{}",
            string(l.value.as_str()),
            l.term
        ));
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_value_and_term_when_there_is_a_leader() {
        let term = leasehold::FencingToken::new(7);
        let value = Candidate::new("10.0.0.7:80 \"a\"").unwrap();
        assert_eq!(
            json("k", "etcd", Some(&Leader::new(value, term))),
            r#"{"key":"k","backend":"etcd","leader":true,"value":"10.0.0.7:80 \"a\"","term":7}"#
        );
        assert_eq!(
            json("k", "redis", None),
            r#"{"key":"k","backend":"redis","leader":false}"#
        );
    }
}
