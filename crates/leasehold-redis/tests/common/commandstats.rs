//! Reading a Redis server's `INFO commandstats` (shared by the tests and the `renewal_load`
//! example, which includes this file).

/// Top-level script calls (`evalsha` + `eval`) the server at `url` has counted so far; commands
/// run inside scripts count under their own names and are left out.
pub(crate) async fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("INFO commandstats: {e}"));
    info.lines()
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
