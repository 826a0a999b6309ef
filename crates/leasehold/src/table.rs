//! `[backend]`: a backend in table form, turned into the driver's URL.

use std::collections::BTreeMap;
use std::fmt;

use leasehold_core::Redacted;
use leasehold_core::redact;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;

/// The table form of a backend (`[backend]`), for keeping the password out of the URL (set it
/// from `LEASEHOLD_BACKEND_PASSWORD`, for example).
///
/// It becomes `scheme://[user[:password]@]host1,host2…[/database][?option=value&…]`, with user
/// and password percent-encoded; see each driver for the options it takes.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BackendTable {
    /// The URL scheme: `redis`, `redlock`, `postgres`, `etcd`, … (see
    /// [`available_schemes`](crate::available_schemes)).
    pub scheme: String,
    /// `host:port` of each node (Redlock nodes, Redis Cluster seeds, etcd endpoints, PostgreSQL
    /// hosts); empty for `memory`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// User name.
    #[serde(default)]
    pub user: Option<String>,
    /// Password. Never printed.
    #[serde(default)]
    pub password: Option<String>,
    /// Database: a number for Redis, a name for PostgreSQL.
    #[serde(default)]
    pub database: Option<String>,
    /// Driver options, added as the URL's query string.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl fmt::Debug for BackendTable {
    /// The URL it stands for, through the one redaction rule ([`redact`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackendTable")
            .field(&Redacted(self.to_url()))
            .finish()
    }
}

impl BackendTable {
    /// The URL this table stands for (with the password: never print it; use
    /// [`redacted_url`](Self::redacted_url)).
    pub fn to_url(&self) -> String {
        let mut url = format!("{}://", self.scheme);
        if self.scheme == "memory" {
            return url;
        }
        if let Some(user) = &self.user {
            url.push_str(&percent_encode(user));
            if let Some(pw) = &self.password {
                url.push(':');
                url.push_str(&percent_encode(pw));
            }
            url.push('@');
        } else if let Some(pw) = &self.password {
            // Redis reads a bare userinfo as the password; give it an empty user.
            url.push(':');
            url.push_str(&percent_encode(pw));
            url.push('@');
        }
        url.push_str(&self.hosts.join(","));
        if let Some(db) = &self.database {
            url.push('/');
            url.push_str(&percent_encode(db));
        }
        if !self.options.is_empty() {
            let query: Vec<String> = self
                .options
                .iter()
                .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
                .collect();
            url.push('?');
            url.push_str(&query.join("&"));
        }
        url
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.to_url())
    }
}

/// The bytes a URL part keeps as they are: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}
