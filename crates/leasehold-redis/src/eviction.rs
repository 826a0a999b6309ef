//! A warning for servers that may evict lock keys.
//!
//! A Redis with a `maxmemory` and any `maxmemory-policy` other than `noeviction` deletes keys
//! under memory pressure, lock keys included (they all carry a TTL, so the `volatile-*`
//! policies take them too): another client can then take a lock that is still held, and its
//! holder hears of it only at its next renewal. Managed services often ship such a policy by
//! default. Nothing a client does can prevent it, so each server is asked once, after the
//! first connect (`INFO memory`), and a server that may evict is named in a warning.

use redis::Value;

use crate::node::Conn;

/// The log target of the warning.
const TARGET: &str = "leasehold.redis.eviction";

/// Asks the server(s) behind `conn` (every node of a cluster) for their memory policy, and
/// warns for each that may evict lock keys. A server that does not answer (`INFO` refused by
/// an ACL, say) is only logged at debug level: this is advice, not a check that can fail.
pub(crate) async fn check(mut conn: Conn, node: String) {
    let answer: Result<Value, _> = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await;
    let texts = match answer {
        Ok(v) => texts(&v),
        Err(e) => {
            tracing::debug!(target: TARGET, node, error = %e, "INFO memory not answered");
            return;
        }
    };
    for (server, text) in texts {
        if let Some((maxmemory, policy)) = evicting(&text) {
            let server = server.unwrap_or_else(|| node.clone());
            tracing::warn!(
                target: TARGET,
                node = server,
                maxmemory,
                policy,
                "this Redis may evict lock keys under memory pressure (maxmemory-policy {policy}, \
                 maxmemory {maxmemory} bytes): another client could then take a lock that is \
                 still held; set maxmemory-policy noeviction for the servers that hold locks"
            );
        }
    }
}

/// The `INFO` text of each server in an answer: one text, or one per node of a cluster (a
/// map keyed by address).
fn texts(v: &Value) -> Vec<(Option<String>, String)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match v {
        Value::Map(nodes) => nodes
            .iter()
            .filter_map(|(addr, info)| Some((text(addr), text(info)?)))
            .collect(),
        other => text(other).map(|t| (None, t)).into_iter().collect(),
    }
}

/// `Some((maxmemory, policy))` if an `INFO memory` text says the server may evict keys: a
/// `maxmemory` set (0 means no limit) with a policy other than `noeviction`.
fn evicting(info: &str) -> Option<(u64, String)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let maxmemory: u64 = field("maxmemory")?.parse().ok()?;
    let policy = field("maxmemory_policy")?;
    (maxmemory > 0 && policy != "noeviction").then(|| (maxmemory, policy.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a limit with an evicting policy warns; a text without the fields says nothing.
    #[test]
    fn an_evicting_policy_needs_a_limit() {
        let info = |max: u64, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1000\r\nmaxmemory:{max}\r\nmaxmemory_human:1B\r\n\
                 maxmemory_policy:{policy}\r\nallocator_frag_ratio:1.0\r\n"
            )
        };
        assert_eq!(
            evicting(&info(1 << 30, "volatile-lru")),
            Some((1 << 30, "volatile-lru".to_owned()))
        );
        assert_eq!(
            evicting(&info(5, "allkeys-random")),
            Some((5, "allkeys-random".to_owned()))
        );
        assert_eq!(evicting(&info(1 << 30, "noeviction")), None);
        assert_eq!(
            evicting(&info(0, "allkeys-lru")),
            None,
            "no limit: never evicts"
        );
        assert_eq!(evicting("# Memory\r\nused_memory:1\r\n"), None);
    }

    /// A cluster's answer (a map of node address to text) gives one text per node.
    #[test]
    fn a_clusters_answer_has_a_text_per_node() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let map = Value::Map(vec![
            (
                bulk("a:1"),
                bulk("maxmemory:1\r\nmaxmemory_policy:allkeys-lru\r\n"),
            ),
            (
                bulk("b:2"),
                bulk("maxmemory:0\r\nmaxmemory_policy:noeviction\r\n"),
            ),
        ]);
        let got = texts(&map);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.as_deref(), Some("a:1"));
        assert!(evicting(&got[0].1).is_some());
        assert!(evicting(&got[1].1).is_none());
        assert_eq!(texts(&bulk("x")), vec![(None, "x".to_owned())]);
    }
}
