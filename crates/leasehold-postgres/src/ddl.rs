//! The one way the driver creates what it stores in the database (the fencing sequence, the
//! election and semaphore tables, the fence store's table).

use leasehold_core::Error;
use tokio_postgres::Client;

use crate::error::pg_error;

/// Makes sure the relation `name` (as SQL names it: quoted, perhaps schema-qualified) exists,
/// running `create` (a `CREATE … IF NOT EXISTS` of it) only if it does not.
///
/// Looked up first (`to_regclass`, which needs no privilege): since PostgreSQL 15 only the
/// schema's owner may create in `public` by default, and PostgreSQL checks that privilege
/// before `IF NOT EXISTS`, so an application role could not use a sequence or table an
/// administrator created for it. Looked up again after a failed `CREATE`: a concurrent creator
/// makes it fail too (a duplicate, even with `IF NOT EXISTS`). Otherwise the error names what
/// to create, for an administrator to run.
pub(crate) async fn ensure(client: &Client, name: &str, create: &str) -> Result<(), Error> {
    if exists(client, name).await? {
        return Ok(());
    }
    let Err(e) = client.batch_execute(create).await else {
        return Ok(());
    };
    if exists(client, name).await? {
        return Ok(());
    }
    let what = format!(
        "{name} is missing and could not be created (an administrator can run `{create}` \
         and grant its use)"
    );
    Err(pg_error(&what, e))
}

async fn exists(client: &Client, name: &str) -> Result<bool, Error> {
    client
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&name])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| pg_error(&format!("looking up {name}"), e))
}
