//! etcd cluster administration for tests and the safety bench: which member leads.

use std::time::Duration;

use crate::BoxError;

/// The index in `endpoints` of the member that leads, once every member that answers agrees
/// on one (members that do not answer — stopped, or cut off — are left out). Asks each member
/// its status on a connection of its own, every 200 ms for up to 20 s.
pub async fn leader_index(endpoints: &[String]) -> Result<usize, BoxError> {
    for _ in 0..100 {
        let mut ids = Vec::with_capacity(endpoints.len());
        let mut leaders = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            let status = match etcd_client::Client::connect([ep.as_str()], None).await {
                Ok(mut c) => c.status().await.ok(),
                Err(_) => None,
            };
            ids.push(
                status
                    .as_ref()
                    .and_then(|s| s.header())
                    .map(|h| h.member_id()),
            );
            if let Some(s) = status {
                leaders.push(s.leader());
            }
        }
        let agreed = leaders
            .first()
            .filter(|l| **l != 0 && leaders.iter().all(|x| x == *l));
        if let Some(l) = agreed
            && let Some(i) = ids.iter().position(|id| *id == Some(*l))
        {
            return Ok(i);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err("the etcd members elected no leader they agree on".into())
}
