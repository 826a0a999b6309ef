//! Fault injection on whole servers: stop, start, restart, pause, resume or pin one node
//! through `scripts/services`.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;

use super::env::{SERVICES_DIR_VAR, SERVICES_SCRIPT_VAR, var, workspace_root};

/// What [`node_ctl`] does to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeAction {
    /// Stop the server process (`scripts/services stop NODE`).
    Stop,
    /// Start a stopped server (`scripts/services start NODE`).
    Start,
    /// Stop then start it (`scripts/services restart NODE`).
    Restart,
    /// Freeze it with SIGSTOP: connections stay open, nothing answers
    /// (`scripts/services pause NODE`).
    Pause,
    /// Unfreeze a paused server with SIGCONT (`scripts/services resume NODE`).
    Resume,
}

impl NodeAction {
    /// Every action, in declaration order.
    pub const ALL: [NodeAction; 5] = [
        NodeAction::Stop,
        NodeAction::Start,
        NodeAction::Restart,
        NodeAction::Pause,
        NodeAction::Resume,
    ];

    /// The script's subcommand of each action, in declaration order.
    const SUBCOMMANDS: [&'static str; 5] = ["stop", "start", "restart", "pause", "resume"];

    /// The script's subcommand for this action.
    pub fn as_str(self) -> &'static str {
        // A fieldless enum's discriminants count from 0 in declaration order.
        Self::SUBCOMMANDS[self as usize]
    }
}

impl fmt::Display for NodeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node names that [`node_ctl`] accepts.
pub const NODES: [&str; 17] = [
    "redis",
    "redlock1",
    "redlock2",
    "redlock3",
    "redlock4",
    "redlock5",
    "rcluster1",
    "rcluster2",
    "rcluster3",
    "postgres",
    "etcd",
    "etcd-c1",
    "etcd-c2",
    "etcd-c3",
    "redis-tls",
    "pgbouncer",
    "etcd-secure",
];

/// The path of `scripts/services`: `LEASEHOLD_SERVICES_SCRIPT` (process
/// environment or env file), else `<root>/scripts/services`.
pub fn services_script() -> PathBuf {
    var(SERVICES_SCRIPT_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("scripts").join("services"))
}

/// Runs `scripts/services ACTION NODE` (e.g. `node_ctl("redlock5",
/// NodeAction::Pause)`), waiting for it to finish.
///
/// `node` is one of [`NODES`]. The script runs under `bash`, with
/// `LEASEHOLD_SERVICES_DIR` passed on when it is known, and is killed if the
/// returned future is dropped (e.g. by a timeout). A non-zero exit is an
/// error whose message includes the script's stderr.
pub async fn node_ctl(node: &str, action: NodeAction) -> io::Result<()> {
    run_script(node, &[action.as_str(), node]).await
}

/// Runs `scripts/services pin NODE CPUS`: sets the CPU affinity of the node's process, its
/// threads and its children (for postgres the postmaster and every backend; backends forked
/// later inherit it). `cpus` is a `taskset` list (`"1"`, `"0-1"`) or `"all"`. Benchmarks use
/// it so that the scheduler's placement of server processes does not decide a comparison.
pub async fn pin_node(node: &str, cpus: &str) -> io::Result<()> {
    run_script(node, &["pin", node, cpus]).await
}

/// Runs the services script with `args` (the first naming the subcommand) for `node`.
async fn run_script(node: &str, args: &[&str]) -> io::Result<()> {
    if !NODES.contains(&node) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown node {node:?}; expected one of {NODES:?}"),
        ));
    }
    let script = services_script();
    let what = args.join(" ");
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = var(SERVICES_DIR_VAR) {
        cmd.env(SERVICES_DIR_VAR, dir);
    }
    let output = cmd.output().await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {} {what}: {e}", script.display()),
        )
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{} {what} failed ({}): {}{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim(),
        stdout_suffix(&output.stdout),
    )))
}

fn stdout_suffix(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(" (stdout: {text})")
    }
}

#[cfg(test)]
mod tests {
    use super::NodeAction;

    #[test]
    fn every_action_names_its_subcommand() {
        let names: Vec<String> = NodeAction::ALL
            .iter()
            .map(|a| format!("{a:?}").to_lowercase())
            .collect();
        let subcommands: Vec<&str> = NodeAction::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(names, subcommands);
    }
}
