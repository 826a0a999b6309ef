//! The tally of a Redlock fan-out: what each node said, whether a quorum is reached or out of
//! reach, and the error that names every node's answer.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, ErrorKind, NodeError};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::REDLOCK as NAME;
use crate::node::Node;

/// What one node said.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Granted / extended / released.
    Yes,
    /// Held by another owner / not ours.
    No,
    /// No answer within the per-node timeout.
    TimedOut(Duration),
    /// An error.
    Failed(Error),
}

impl Outcome {
    pub(crate) fn from_result(
        r: Result<Result<bool, Error>, tokio::time::error::Elapsed>,
        t: Duration,
    ) -> Self {
        match r {
            Ok(Ok(true)) => Self::Yes,
            Ok(Ok(false)) => Self::No,
            Ok(Err(e)) => Self::Failed(e),
            Err(_) => Self::TimedOut(t),
        }
    }

    fn is_fault(&self) -> bool {
        matches!(self, Self::TimedOut(_) | Self::Failed(_))
    }
}

/// The tally of a fan-out, and how to report it.
pub(crate) struct Tally {
    what: &'static str,
    yes_word: &'static str,
    no_word: &'static str,
    pub(crate) outcomes: Vec<Option<Outcome>>,
    quorum: usize,
}

impl Tally {
    pub(crate) fn new(
        what: &'static str,
        yes: &'static str,
        no: &'static str,
        n: usize,
        quorum: usize,
    ) -> Self {
        Self {
            what,
            yes_word: yes,
            no_word: no,
            outcomes: (0..n).map(|_| None).collect(),
            quorum,
        }
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.outcomes.iter().flatten().filter(|o| f(o)).count()
    }

    pub(crate) fn yes(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Yes))
    }

    fn failed(&self) -> usize {
        self.count(|o| !matches!(o, Outcome::Yes))
    }

    fn faults(&self) -> usize {
        self.count(Outcome::is_fault)
    }

    /// Whether a quorum of "yes" is no longer possible.
    fn hopeless(&self) -> bool {
        self.outcomes.len() - self.failed() < self.quorum
    }

    /// Whether faults alone rule out a quorum (then it is an error, not contention).
    fn faults_decide(&self) -> bool {
        self.outcomes.len() - self.faults() < self.quorum
    }

    /// Records the outcomes of a fan-out as they arrive, until a quorum said yes (`true`) or
    /// can no longer say it (`false`).
    pub(crate) async fn until_decided(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<(usize, Outcome)>,
    ) -> bool {
        while let Some((i, outcome)) = rx.recv().await {
            if let Some(decided) = self.record(i, outcome) {
                return decided;
            }
        }
        false
    }

    /// Records node `i`'s outcome: `Some(true)` once a quorum said yes, `Some(false)` once it
    /// no longer can, `None` while undecided.
    pub(crate) fn record(&mut self, i: usize, outcome: Outcome) -> Option<bool> {
        if let Some(slot) = self.outcomes.get_mut(i) {
            *slot = Some(outcome);
        }
        if self.yes() >= self.quorum {
            return Some(true);
        }
        self.hopeless().then_some(false)
    }

    /// After [`until_decided`](Self::until_decided) found no quorum: while the nodes that
    /// timed out could still make one, waits (until `deadline`) for their late answers (the
    /// fan-out sends them: a timed-out request goes on in the background), each replacing the
    /// timeout. `true` once a quorum said yes. Without it a grant held on a bare majority, one
    /// of whose nodes answers late, would be reported as not ours although it was (and is
    /// released by the late request).
    pub(crate) async fn late_quorum(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<(usize, Outcome)>,
        deadline: Instant,
    ) -> bool {
        let late = |t: &Self| t.count(|o| matches!(o, Outcome::TimedOut(_)));
        while self.yes() < self.quorum && self.yes() + late(self) >= self.quorum {
            let Ok(Some((i, outcome))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            if let Some(slot) = self.outcomes.get_mut(i) {
                *slot = Some(outcome);
            }
        }
        self.yes() >= self.quorum
    }

    /// The answer without a quorum: an error if faults alone ruled it out, else `no`
    /// (contention, not a fault).
    pub(crate) fn no_quorum<T>(self, nodes: &[Arc<Node>], no: T) -> Result<T, Error> {
        if self.faults_decide() {
            Err(self.error(nodes))
        } else {
            Ok(no)
        }
    }

    fn error(self, nodes: &[Arc<Node>]) -> Error {
        let mut summary = Vec::new();
        let mut causes = Vec::new();
        for (node, outcome) in nodes.iter().zip(self.outcomes) {
            let said = match outcome {
                Some(Outcome::Yes) => self.yes_word.to_owned(),
                Some(Outcome::No) => self.no_word.to_owned(),
                Some(Outcome::TimedOut(t)) => {
                    causes.push(NodeError {
                        node: node.name.clone(),
                        error: Error::new(
                            ErrorKind::Unavailable,
                            NAME,
                            format!("no answer within {t:?}"),
                        ),
                    });
                    "timed out".to_owned()
                }
                Some(Outcome::Failed(e)) => {
                    causes.push(NodeError {
                        node: node.name.clone(),
                        error: e,
                    });
                    "failed".to_owned()
                }
                None => "no answer yet".to_owned(),
            };
            summary.push(format!("{} {said}", node.name));
        }
        Error::new(
            ErrorKind::QuorumNotReached,
            NAME,
            format!(
                "{}: quorum {} of {} not reached ({})",
                self.what,
                self.quorum,
                nodes.len(),
                summary.join(", ")
            ),
        )
        .with_node_errors(causes)
    }
}
