//! Reading a Redis server's `INFO` counters (shared by the tests and the `renewal_load`
//! example, which includes this file).

/// Top-level script calls (`evalsha` + `eval`) the server at `url` has counted so far; commands
/// run inside scripts count under their own names and are left out.
pub(crate) async fn script_calls(url: &str) -> u64 {
    info(url, "commandstats")
        .await
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Commands the server at `url` has refused as out of memory (`OOM`) so far (the example has
/// no use for it).
#[allow(dead_code)]
pub(crate) async fn refused_out_of_memory(url: &str) -> u64 {
    info(url, "errorstats")
        .await
        .lines()
        .find_map(|l| l.strip_prefix("errorstat_OOM:count="))
        .map_or(0, |n| {
            n.trim()
                .parse()
                .unwrap_or_else(|e| panic!("errorstat_OOM {n:?}: {e}"))
        })
}

/// The `INFO` section `section` of the server at `url`.
async fn info(url: &str, section: &str) -> String {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
}
