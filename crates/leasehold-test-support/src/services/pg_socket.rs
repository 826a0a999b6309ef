//! PostgreSQL over its unix socket: a libpq connection string for the socket directory.

#[cfg(unix)]
use std::path::Path;

/// The parts of a `postgres://user:password@host:port/dbname` URL.
#[derive(Debug, Default)]
struct PgUrl {
    user: Option<String>,
    password: Option<String>,
    port: Option<u16>,
    dbname: Option<String>,
}

fn parse_pg_url(url: &str) -> PgUrl {
    let mut out = PgUrl::default();
    let Some((_, rest)) = url.split_once("://") else {
        return out;
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = authority
        .rsplit_once('@')
        .map_or((None, authority), |(u, h)| (Some(u), h));
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo
            .split_once(':')
            .map_or((userinfo, None), |(u, p)| (u, Some(p)));
        out.user = Some(user.to_owned()).filter(|u| !u.is_empty());
        out.password = password.map(str::to_owned);
    }
    out.port = hostport
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok());
    let dbname = path.split(['?', '#']).next().unwrap_or("");
    out.dbname = Some(dbname.to_owned()).filter(|d| !d.is_empty());
    out
}

#[cfg(unix)]
pub(super) fn lookup_pg_socket(dir: &str, tcp_url: Option<&str>) -> Result<String, String> {
    use std::os::unix::net::UnixStream;

    let pg = tcp_url.map(parse_pg_url).unwrap_or_default();
    let port = match pg.port {
        Some(port) => port,
        None => find_pg_socket_port(Path::new(dir))?,
    };
    let socket = Path::new(dir).join(format!(".s.PGSQL.{port}"));
    UnixStream::connect(&socket)
        .map_err(|e| format!("nothing accepts connections on {}: {e}", socket.display()))?;

    let mut conninfo = format!("host={} port={port}", quote_conninfo(dir));
    for (key, value) in [
        ("user", pg.user),
        ("password", pg.password),
        ("dbname", pg.dbname),
    ] {
        if let Some(value) = value {
            conninfo.push_str(&format!(" {key}={}", quote_conninfo(&value)));
        }
    }
    Ok(conninfo)
}

#[cfg(not(unix))]
pub(super) fn lookup_pg_socket(_dir: &str, _tcp_url: Option<&str>) -> Result<String, String> {
    Err("unix sockets are not supported on this platform".to_owned())
}

#[cfg(unix)]
fn find_pg_socket_port(dir: &Path) -> Result<u16, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            name.to_str()?.strip_prefix(".s.PGSQL.")?.parse().ok()
        })
        .next()
        .ok_or_else(|| format!("no .s.PGSQL.<port> socket in {}", dir.display()))
}

/// Quotes a libpq key=value value when needed.
fn quote_conninfo(value: &str) -> String {
    if !value.is_empty() && !value.contains([' ', '\'', '\\']) {
        return value.to_owned();
    }
    let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
    format!("'{escaped}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_postgres_urls() {
        let pg = parse_pg_url("postgres://leasehold:secret@127.0.0.1:17432/leasehold");
        assert_eq!(pg.user.as_deref(), Some("leasehold"));
        assert_eq!(pg.password.as_deref(), Some("secret"));
        assert_eq!(pg.port, Some(17432));
        assert_eq!(pg.dbname.as_deref(), Some("leasehold"));
    }

    #[test]
    fn quotes_conninfo_values() {
        assert_eq!(quote_conninfo("/tmp/x"), "/tmp/x");
        assert_eq!(quote_conninfo("a b"), "'a b'");
        assert_eq!(quote_conninfo("it's"), "'it\\'s'");
        assert_eq!(quote_conninfo(""), "''");
    }
}
