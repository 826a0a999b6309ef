//! `leasehold elect`: campaign for the leadership of a key and run a command while leader.
//!
//! Built on `run`'s pieces: the command starts the same way (its own process group, the
//! parent-death signal, no credentials), with `LEASEHOLD_TERM` added, and is stopped the same
//! way (SIGTERM to its group, SIGKILL after `--grace`) when the leadership is lost. Then the
//! candidate campaigns again, unless `--once`. The command ending on its own ends `elect`:
//! it resigns and exits with the command's status.

use std::time::Duration;

use leasehold::{Backoff, Candidate, Elector, Error, LockConfig};

use crate::code;
use crate::lock::{Target, WAIT_NOTICE, config_of, failure, warn_if_password_in_url};
use crate::run::{Outcome, Signals, exit_code_of, start, supervise};

/// The pause between attempts to reach a backend that did not answer at start-up grows up to
/// this.
const OPEN_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(2),
};

#[derive(clap::Args)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    target: Target,
    /// What this candidate publishes while leader (its address, say): what `leasehold leader`
    /// prints.
    #[arg(long, value_parser = candidate)]
    value: Candidate,
    /// Leadership lease (e.g. 30s), renewed while leader: on Redis and etcd a leader that
    /// crashed or froze is replaced after about this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// After SIGTERM on a lost leadership, wait this long for the command (and its process
    /// group) to end before SIGKILL.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    grace: Duration,
    /// Lead once: exit 79 when the leadership is lost, instead of campaigning again.
    #[arg(long)]
    once: bool,
    /// Say nothing on stderr about campaigning and leading (errors still print).
    #[arg(long)]
    quiet: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Parses `--value`.
fn candidate(value: &str) -> Result<Candidate, String> {
    Candidate::new(value).map_err(|e| e.message().to_owned())
}

pub(crate) async fn elect(args: ElectArgs) -> u8 {
    let key = args.target.key.clone();
    // SIGTERM and SIGINT: while campaigning they give up (143, 130); while the command runs
    // they are passed on to it, and `elect` resigns and exits once it has ended.
    let Some(mut signals) = Signals::install() else {
        return code::CANNOT_RUN;
    };
    warn_if_password_in_url(&args.target);
    let config = match config_of(&args.target, args.ttl) {
        Ok(c) => c,
        Err(e) => return failure(&e),
    };
    let campaigning = format!("campaigning for {key:?}");
    let elector = tokio::select! {
        opened = open(&config, &key, &args.value, args.quiet) => match opened {
            Ok(elector) => elector,
            Err(e) => return failure(&e),
        },
        code = signals.give_up(&campaigning) => return code,
    };
    loop {
        let leadership = tokio::select! {
            won = campaign(&elector, args.quiet) => match won {
                Ok(leadership) => leadership,
                Err(e) => return failure(&e),
            },
            code = signals.give_up(&campaigning) => return code,
        };
        let term = leadership.term();
        if !args.quiet {
            eprintln!("leasehold: leader of {key:?} (term {term})");
        }
        let lease = leadership.lease();
        let started = start(
            &args.target,
            &args.command,
            lease,
            &[("LEASEHOLD_TERM", term.get().to_string())],
        );
        let (mut child, job) = match started {
            Ok(started) => started,
            Err(code) => {
                let _ = leadership.resign().await;
                return code;
            }
        };
        match supervise(&mut child, &job, lease, &mut signals).await {
            Outcome::Ended(status) => {
                if let Err(e) = leadership.resign().await {
                    eprintln!(
                        "leasehold: resigning failed ({e}); the leadership ends by its TTL or \
                         session"
                    );
                }
                return exit_code_of(status);
            }
            Outcome::Lost(reason) => {
                eprintln!(
                    "leasehold: leadership of {key:?} (term {term}) lost ({reason}): stopping \
                     the command"
                );
                job.stop(&mut child, args.grace).await;
                let _ = leadership.resign().await;
                if args.once || signals.forwarded {
                    return code::LOST;
                }
                if !args.quiet {
                    eprintln!("leasehold: campaigning again for {key:?}");
                }
            }
        }
    }
}

/// Opens the backend and builds the elector, trying again while the backend does not answer
/// (a candidate started before its backend waits for it); other errors are returned.
async fn open(
    config: &LockConfig,
    key: &str,
    value: &Candidate,
    quiet: bool,
) -> Result<Elector, Error> {
    let mut attempt = 0u32;
    loop {
        match config.build_elector(key, value.clone()).await {
            Err(e) if e.is_retryable() => {
                attempt += 1;
                if attempt == 1 && !quiet {
                    eprintln!("leasehold: {e}; trying again until the backend answers");
                }
                tokio::time::sleep(OPEN_BACKOFF.delay(attempt)).await;
            }
            opened => return opened,
        }
    }
}

/// [`Elector::campaign`], saying on stderr (unless `quiet`) when it is not won at once.
async fn campaign(elector: &Elector, quiet: bool) -> Result<leasehold::Leadership, Error> {
    let campaign = elector.campaign();
    tokio::pin!(campaign);
    if !quiet {
        tokio::select! {
            won = &mut campaign => return won,
            () = tokio::time::sleep(WAIT_NOTICE) => eprintln!(
                "leasehold: waiting to lead {:?} as {:?}…",
                elector.key().as_str(),
                elector.candidate().as_str()
            ),
        }
    }
    campaign.await
}
