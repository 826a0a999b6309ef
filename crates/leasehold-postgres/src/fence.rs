//! [`PostgresFenceStore`]: the highest accepted fencing tokens in a PostgreSQL table.

use leasehold_core::fence::{Admission, FenceStore};
use leasehold_core::{Error, ErrorKind, FencingToken, async_trait};
use tokio_postgres::Client;

use crate::NAME;
use crate::config::PostgresConfig;
use crate::error::pg_error;
use crate::session::connect;

/// A [`FenceStore`] in a PostgreSQL table, `(resource text PRIMARY KEY, token bigint)`, so
/// every replica of the resource's service shares the highest accepted tokens.
///
/// Admission is one statement, atomic per resource:
///
/// ```sql
/// INSERT INTO leasehold_fence_tokens AS f (resource, token) VALUES ($1, $2)
/// ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
///   WHERE f.token <= EXCLUDED.token
/// RETURNING token;   -- no row: a higher token was accepted before; the request is stale
/// ```
///
/// Tokens above `i64::MAX` cannot be stored and are refused with
/// [`ErrorKind::InvalidArgument`]. Errors are mapped as the backend's are.
pub struct PostgresFenceStore {
    client: Client,
    admit_sql: String,
    highest_sql: String,
}

impl std::fmt::Debug for PostgresFenceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresFenceStore")
            .field("admit_sql", &self.admit_sql)
            .finish_non_exhaustive()
    }
}

fn check_table(table: &str) -> Result<(), Error> {
    let ok = !table.is_empty()
        && table.split('.').count() <= 2
        && table.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidConfig,
            NAME,
            format!("table name {table:?} must be an identifier, optionally schema-qualified"),
        ))
    }
}

impl PostgresFenceStore {
    /// The default table name.
    pub const DEFAULT_TABLE: &'static str = "leasehold_fence_tokens";

    /// Connects from a `postgres://` URL or libpq string, as [`PostgresConfig::from_url`]
    /// reads it (TLS as its `sslmode` says), and creates `table` if it does not exist.
    pub async fn connect(url: &str, table: &str) -> Result<Self, Error> {
        Self::connect_with(&PostgresConfig::from_url(url)?, table).await
    }

    /// Connects with the settings of `config`, and creates `table` if it does not exist. The
    /// connection runs on a spawned Tokio task.
    pub async fn connect_with(config: &PostgresConfig, table: &str) -> Result<Self, Error> {
        check_table(table)?;
        let (client, _closed) = connect(config).await?;
        Self::new(client, table).await
    }

    /// Uses an existing client, creating `table` if it does not exist.
    pub async fn new(client: Client, table: &str) -> Result<Self, Error> {
        check_table(table)?;
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (resource text PRIMARY KEY, token bigint NOT NULL)"
        );
        crate::ddl::ensure(&client, table, &create).await?;
        Ok(Self {
            client,
            admit_sql: format!(
                "INSERT INTO {table} AS f (resource, token) VALUES ($1, $2) \
                 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token \
                 WHERE f.token <= EXCLUDED.token RETURNING token"
            ),
            highest_sql: format!("SELECT token FROM {table} WHERE resource = $1"),
        })
    }
}

#[async_trait]
impl FenceStore for PostgresFenceStore {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<Admission, Error> {
        let value = i64::try_from(token.get()).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                NAME,
                format!("fencing token {token} does not fit a bigint"),
            )
        })?;
        let rows = self
            .client
            .query(&self.admit_sql, &[&resource, &value])
            .await
            .map_err(|e| pg_error("fence admit", e))?;
        if !rows.is_empty() {
            return Ok(Admission::Accepted);
        }
        let row = self
            .client
            .query_opt(&self.highest_sql, &[&resource])
            .await
            .map_err(|e| pg_error("fence read", e))?;
        let highest: i64 = match row {
            Some(r) => r.try_get(0).map_err(|e| pg_error("fence read", e))?,
            None => value,
        };
        Ok(Admission::Stale {
            highest: FencingToken::new(u64::try_from(highest).unwrap_or(0)),
        })
    }
}
