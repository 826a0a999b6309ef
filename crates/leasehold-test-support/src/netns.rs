//! Real network partitions: servers in Linux network namespaces, joined by veth pairs to one
//! bridge in the root namespace, where the test's clients stay.
//!
//! A [`Net`] of `n` nodes is a bridge `lhp<tag>br` (address [`HOST`] on [`SUBNET`]) and, per
//! node `i` (1-based), a namespace `lhp<tag><i>` holding the veth end `lhp<tag><i>n` with
//! address [`Net::addr`]`(i)`, its peer `lhp<tag><i>h` a port of the bridge. Servers run inside
//! a node's namespace (`ip netns exec`), bound to its address. [`Net::cut`] takes a node's
//! bridge port down: no packet reaches it or leaves it, for its peers and for the clients alike
//! (no RST, no ICMP: a real partition, not a refused connection); [`Net::heal`] brings it back
//! without touching the servers. Everything here needs root and iproute2; the kernel's `netem`
//! is not used (delays stay with [`crate::proxy::FaultProxy`]).
//!
//! Every name starts with [`PREFIX`] (`lhp`), which nothing else on the machine uses. A `Net`
//! cleans up when dropped (its servers killed, its namespaces, links and scratch dir deleted);
//! since a killed test runs no cleanup, [`sweep`] deletes every `lhp*` namespace (killing the
//! processes inside) and link, and `scripts/test` runs the same sweep before and after the
//! tests. Only one `Net` exists at a time on a machine: [`Net::create`] takes an exclusive lock
//! (a file lock, so tests of several binaries and the benchmark wait for each other), then
//! sweeps.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::BoxError;

/// The prefix of every namespace and link made here.
pub const PREFIX: &str = "lhp";
/// The subnet of every `Net` (one at a time): `10.213.77.0/24`.
pub const SUBNET: [u8; 3] = [10, 213, 77];
/// The root namespace's address on the bridge.
pub const HOST: Ipv4Addr = Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], 1);
/// The root namespace's second address, the source of [`Net::add_path`]'s second path.
pub const PATH_HOST: Ipv4Addr = Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], 2);
/// The lock file that keeps `Net`s one at a time.
const LOCK_FILE: &str = "/tmp/lhp-netns.lock";

/// Runs `ip ARGS…`; an error with its stderr if it fails.
pub fn ip(args: &[&str]) -> Result<(), BoxError> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<(), BoxError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into())
    }
}

fn stdout(program: &str, args: &[&str]) -> Result<String, BoxError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Namespaces whose name starts with `prefix`.
fn namespaces(prefix: &str) -> Result<Vec<String>, BoxError> {
    Ok(stdout("ip", &["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect())
}

/// Links of the root namespace whose name starts with `prefix`.
fn links(prefix: &str) -> Result<Vec<String>, BoxError> {
    Ok(stdout("ip", &["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n))
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect())
}

/// Kills (SIGKILL) every process in namespace `ns` and waits up to 5 s until they are gone.
fn kill_inside(ns: &str) -> Result<(), BoxError> {
    let pids: Vec<String> = stdout("ip", &["netns", "pids", ns])?
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    for pid in &pids {
        let _ = run("kill", &["-KILL", pid]);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// Deletes every namespace and root-namespace link named `lhp*` (and kills the processes in
/// those namespaces first: a namespace lives on while a process is in it). Returns how many
/// namespaces and links it deleted. For leftovers of a test that was killed; `scripts/test`
/// runs the same sweep in shell.
pub fn sweep() -> Result<usize, BoxError> {
    sweep_prefix(PREFIX)
}

fn sweep_prefix(prefix: &str) -> Result<usize, BoxError> {
    let mut n = 0;
    for ns in namespaces(prefix)? {
        kill_inside(&ns)?;
        ip(&["netns", "del", &ns])?;
        n += 1;
    }
    for link in links(prefix)? {
        // Deleting one end of a veth pair deletes its peer: ignore links already gone.
        if ip(&["link", "del", &link]).is_ok() {
            n += 1;
        }
    }
    // A cut second path's blackhole route outlives the bridge.
    let subnet = format!("blackhole {}.{}.{}.", SUBNET[0], SUBNET[1], SUBNET[2]);
    for route in stdout("ip", &["route", "show", "type", "blackhole"])?.lines() {
        if route.starts_with(&subnet)
            && let Some(dst) = route.split_whitespace().nth(1)
        {
            ip(&["route", "del", "blackhole", dst])?;
            n += 1;
        }
    }
    Ok(n)
}

/// Waits until something accepts TCP connections on `addr`, for up to `within`.
pub async fn wait_listening(addr: SocketAddr, within: Duration) -> Result<(), BoxError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(addr),
        );
        if let Ok(Ok(_)) = attempt.await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("nothing listens on {addr} after {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Nodes in network namespaces on one bridge; see the [module docs](self).
#[derive(Debug)]
pub struct Net {
    name: String,
    nodes: usize,
    dir: PathBuf,
    children: Mutex<Vec<Child>>,
    _lock: File,
}

impl Net {
    /// Makes `nodes` namespaces (1 to 9) for `tag` (1 to 8 lowercase letters or digits), after
    /// waiting for any other `Net` to go and sweeping leftovers. Blocks while another `Net`
    /// exists.
    pub fn create(tag: &str, nodes: usize) -> Result<Net, BoxError> {
        if tag.is_empty()
            || tag.len() > 8
            || !tag
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(format!("bad netns tag {tag:?}: 1 to 8 of [a-z0-9]").into());
        }
        if !(1..=9).contains(&nodes) {
            return Err(format!("a Net has 1 to 9 nodes, not {nodes}").into());
        }
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)?;
        lock.lock()?;
        sweep()?;
        let name = format!("{PREFIX}{tag}");
        // Readable by the `postgres` user, who runs PostgreSQL nodes.
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let net = Net {
            name,
            nodes,
            dir,
            children: Mutex::new(Vec::new()),
            _lock: lock,
        };
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> Result<(), BoxError> {
        let br = self.bridge();
        let host = format!("{HOST}/24");
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["addr", "add", &host, "dev", &br])?;
        ip(&["addr", "add", &format!("{PATH_HOST}/32"), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 1..=self.nodes {
            let ns = self.namespace(i);
            let (h, n) = (self.host_link(i), format!("{}{i}n", self.name));
            let addr = format!("{}/24", self.addr(i));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &h, "type", "veth", "peer", "name", &n])?;
            ip(&["link", "set", &n, "netns", &ns])?;
            ip(&["link", "set", &h, "master", &br, "up"])?;
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &n])?;
            ip(&["-n", &ns, "link", "set", &n, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn bridge(&self) -> String {
        format!("{}br", self.name)
    }

    fn host_link(&self, node: usize) -> String {
        format!("{}{node}h", self.name)
    }

    /// The namespace of node `node` (1-based).
    pub fn namespace(&self, node: usize) -> String {
        format!("{}{node}", self.name)
    }

    /// How many nodes the net has.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The address of node `node` (1-based) inside its namespace.
    pub fn addr(&self, node: usize) -> Ipv4Addr {
        let last = u8::try_from(10 + node).unwrap_or(u8::MAX);
        Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], last)
    }

    /// The scratch dir of this net (servers' data and logs), deleted on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Partitions node `node` from everything: its bridge port goes down.
    pub fn cut(&self, node: usize) -> Result<(), BoxError> {
        ip(&["link", "set", &self.host_link(node), "down"])
    }

    /// Joins node `node` again (its servers kept running meanwhile).
    pub fn heal(&self, node: usize) -> Result<(), BoxError> {
        ip(&["link", "set", &self.host_link(node), "up"])
    }

    /// A second path to node `node`, for cutting one client off while others still reach the
    /// node: a second address of the node ([`Net::path_addr`]), reached from a second address
    /// of the root namespace ([`PATH_HOST`]). Returns the node's second address.
    pub fn add_path(&self, node: usize) -> Result<Ipv4Addr, BoxError> {
        let (alias, ns) = (self.path_addr(node), self.namespace(node));
        let dev = format!("{}{node}n", self.name);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{alias}/32"),
            "dev",
            &dev,
        ])?;
        self.heal_path(node)?;
        Ok(alias)
    }

    /// Node `node`'s second address (see [`Net::add_path`]).
    pub fn path_addr(&self, node: usize) -> Ipv4Addr {
        let last = u8::try_from(30 + node).unwrap_or(u8::MAX);
        Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], last)
    }

    /// Makes the second path to node `node` unreachable both ways (blackhole routes: packets
    /// dropped, nobody told), the first path untouched.
    pub fn cut_path(&self, node: usize) -> Result<(), BoxError> {
        let alias = format!("{}/32", self.path_addr(node));
        ip(&["route", "replace", "blackhole", &alias])?;
        ip(&[
            "-n",
            &self.namespace(node),
            "route",
            "replace",
            "blackhole",
            &format!("{PATH_HOST}/32"),
        ])
    }

    /// Restores the second path to node `node`.
    pub fn heal_path(&self, node: usize) -> Result<(), BoxError> {
        let alias = format!("{}/32", self.path_addr(node));
        let host = PATH_HOST.to_string();
        ip(&[
            "route",
            "replace",
            &alias,
            "dev",
            &self.bridge(),
            "src",
            &host,
        ])?;
        let ns = self.namespace(node);
        let _ = ip(&[
            "-n",
            &ns,
            "route",
            "del",
            "blackhole",
            &format!("{host}/32"),
        ]);
        Ok(())
    }

    /// Whether node `node`'s bridge port is down (cut).
    pub fn is_cut(&self, node: usize) -> bool {
        stdout("ip", &["-o", "link", "show", &self.host_link(node)])
            .is_ok_and(|s| !s.contains(",UP") && !s.contains("<UP"))
    }

    /// Packets the bridge sent to node `node` so far: a cut node's count stands still.
    pub fn tx_packets(&self, node: usize) -> Result<u64, BoxError> {
        let path = format!(
            "/sys/class/net/{}/statistics/tx_packets",
            self.host_link(node)
        );
        Ok(std::fs::read_to_string(path)?.trim().parse()?)
    }

    /// Starts `argv` in node `node`'s namespace (stdout and stderr to `<dir>/<log>.log`); it is
    /// killed when the net is dropped. Returns its pid (`ip netns exec` execs the program).
    pub fn spawn(&self, node: usize, log: &str, argv: &[&str]) -> Result<u32, BoxError> {
        let (program, args) = argv.split_first().ok_or("spawn: empty argv")?;
        let out = File::create(self.log_path(log))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.namespace(node), program])
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| format!("ip netns exec {program}: {e}"))?;
        let pid = child.id();
        self.children
            .lock()
            .map_err(|_| "netns children lock poisoned")?
            .push(child);
        Ok(pid)
    }

    fn log_path(&self, log: &str) -> PathBuf {
        self.dir.join(format!("{log}.log"))
    }

    /// The last `lines` lines of a log written by [`Net::spawn`], for error messages.
    pub fn log_tail(&self, log: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(log)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A 3-member (or `nodes()`-member) etcd cluster, one member per namespace on ports 2379
    /// (clients) and 2380 (peers), the timing of `scripts/services` (heartbeat 100 ms, election
    /// 1 s). Returns the client endpoints (`host:port`) once every member listens.
    pub async fn etcd_cluster(&self) -> Result<Vec<String>, BoxError> {
        let peers: Vec<String> = (1..=self.nodes)
            .map(|i| format!("m{i}=http://{}:2380", self.addr(i)))
            .collect();
        let initial = peers.join(",");
        let mut endpoints = Vec::new();
        for i in 1..=self.nodes {
            let a = self.addr(i);
            let data = self.dir.join(format!("etcd{i}"));
            let (client, peer) = (format!("http://{a}:2379"), format!("http://{a}:2380"));
            let argv = [
                "etcd",
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &data.to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &initial,
                "--initial-cluster-token",
                &self.name,
                "--initial-cluster-state",
                "new",
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ]
            .map(String::from);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            self.spawn(i, &format!("etcd{i}"), &argv)?;
            endpoints.push(format!("{a}:2379"));
        }
        for (i, e) in endpoints.iter().enumerate() {
            wait_listening(e.parse()?, Duration::from_secs(30))
                .await
                .map_err(|err| {
                    format!("{err}\n{}", self.log_tail(&format!("etcd{}", i + 1), 20))
                })?;
        }
        Ok(endpoints)
    }

    /// A Redis server (no persistence) in node `node`'s namespace on port 6379; its URL once it
    /// listens.
    pub async fn redis(&self, node: usize) -> Result<String, BoxError> {
        let a = self.addr(node).to_string();
        let dir = self.dir.join(format!("redis{node}"));
        std::fs::create_dir_all(&dir)?;
        let dir = dir.to_string_lossy().into_owned();
        let argv = [
            "redis-server",
            // Every address of the node's namespace (a second path's too), none elsewhere.
            "--bind",
            "0.0.0.0",
            "--port",
            "6379",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir,
        ];
        let log = format!("redis{node}");
        self.spawn(node, &log, &argv)?;
        wait_listening(SocketAddr::new(a.parse()?, 6379), Duration::from_secs(20))
            .await
            .map_err(|e| format!("{e}\n{}", self.log_tail(&log, 20)))?;
        Ok(format!("redis://{a}:6379"))
    }

    /// A throwaway PostgreSQL (its own `initdb`, run as the `postgres` user, trust auth for the
    /// net's subnet, `fsync=off`) in node `node`'s namespace on port 5432, with the extra
    /// server `settings` (`name`, `value`); its URL (user `postgres`) once it listens.
    pub async fn postgres(
        &self,
        node: usize,
        settings: &[(&str, &str)],
    ) -> Result<String, BoxError> {
        let bin = pg_bin()?;
        let pg = self.dir.join(format!("pg{node}"));
        std::fs::create_dir_all(&pg)?;
        let pg = pg.to_string_lossy().into_owned();
        run("chown", &["postgres:postgres", &pg])?;
        let data = format!("{pg}/data");
        let initdb = format!("{bin}/initdb");
        let out = Command::new("setpriv")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .args([
                &initdb,
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ])
            .args(["--locale=C", "--no-sync", "--no-instructions"])
            .current_dir(&pg)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(format!("initdb: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let hba = format!(
            "host all all {}.{}.{}.0/24 trust\n",
            SUBNET[0], SUBNET[1], SUBNET[2]
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(format!("{data}/pg_hba.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, hba.as_bytes()))?;
        let a = self.addr(node).to_string();
        let postgres = format!("{bin}/postgres");
        let mut argv: Vec<String> = [
            "setpriv",
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
            &postgres,
            "-D",
            &data,
            "-c",
            // Every address of the node's namespace (a second path's too), none elsewhere.
            "listen_addresses=*",
            "-c",
            "port=5432",
            "-c",
            &format!("unix_socket_directories={pg}"),
            "-c",
            "fsync=off",
        ]
        .map(String::from)
        .into();
        for (k, v) in settings {
            argv.push("-c".into());
            argv.push(format!("{k}={v}"));
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let log = format!("pg{node}");
        self.spawn(node, &log, &argv)?;
        let url = format!("postgres://postgres@{a}:5432/postgres");
        // Listening is not answering: wait until it has finished starting up.
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = crate::postgres::connect(&url).await {
            if Instant::now() >= deadline {
                return Err(format!("{url}: {e}\n{}", self.log_tail(&log, 20)).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(url)
    }
}

/// The newest `/usr/lib/postgresql/<major>/bin` (or `$LEASEHOLD_PG_BIN`, as in
/// `scripts/services`).
fn pg_bin() -> Result<String, BoxError> {
    if let Ok(b) = std::env::var("LEASEHOLD_PG_BIN") {
        return Ok(b);
    }
    let mut majors: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    majors.sort_unstable();
    let major = majors
        .last()
        .ok_or("no PostgreSQL under /usr/lib/postgresql")?;
    Ok(format!("/usr/lib/postgresql/{major}/bin"))
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Ok(mut children) = self.children.lock() {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // Whatever they forked (PostgreSQL backends), then the namespaces and links.
        if let Err(e) = sweep_prefix(&self.name) {
            eprintln!("netns: cleaning up {}: {e}", self.name);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked_before_anything_is_made() {
        assert!(Net::create("", 3).is_err());
        assert!(Net::create("UPPER", 3).is_err());
        assert!(Net::create("waytoolong", 3).is_err());
        assert!(Net::create("ok", 0).is_err());
    }
}
