//! Redaction of secrets in URLs, option strings and messages: the one place every crate of
//! leasehold hides passwords before text reaches a log, an error or `Debug` output.
//!
//! [`redact`] takes any text (one URL, a comma-separated list of URLs, a libpq
//! `key=value` string, a TOML line, an error message quoting any of these, or garbage) and
//! replaces every secret it finds with [`MASK`]:
//!
//! - **URL userinfo**: in `scheme://user:SECRET@host`, the password (the user stays readable);
//!   a bare `scheme://SECRET@host` loses the whole userinfo, since Redis reads it as a
//!   password. A password may hold `/ ? # @ :`: the userinfo ends at the **last** `@` that is
//!   followed by something host-like (no `=` or `&` before the next `/ ? #`), so
//!   `redis://u:a/b?c@d@h:1/0` shows `redis://u:***@h:1/0`. The multi-host forms
//!   (`redlock://…@a:1,b:2`, `etcd://…@h1,h2`) and lists of URLs separated by commas are read
//!   the same way, each URL on its own; userinfo written before several hosts of one URL is
//!   hidden from the first userinfo to the last `@`.
//! - **Options**: the value of every `name=value` (URL query, libpq string, TOML
//!   `name = value`, JSON-like `"name": value`) whose name, compared without case, is `pass`,
//!   `token`, or ends in `password` (`password`, `sslpassword`, `backend_password`…). A value in
//!   quotes is hidden up to its closing quote (backslash escapes honoured), any other up to
//!   whitespace, `&`, a quote, or a comma that starts the next URL of a list.
//! - **Anything else**: text that is not a URL is still scanned for those options, and a word
//!   without a scheme that looks like `user:SECRET@host` loses what lies between its first `:`
//!   and its last `@`.
//!
//! Where text is ambiguous the rules hide too much rather than too little: an `@` inside a
//! URL's path or query (`etcd://h:1?x=a@b`) is read as the end of a userinfo, so what comes
//! before it is hidden too, unless it sits in the value of an option hidden anyway.
//! What no rule can see stays visible: a secret written with no name (a TOML error quoting a
//! bare value), or a password with whitespace in an unquoted value.

use std::fmt;

/// What every hidden secret is replaced with.
pub const MASK: &str = "***";

/// Hides every secret in `text` (see the [module docs](self) for the rules); the rest of the
/// text is kept as it was.
///
/// ```
/// use leasehold_core::redact;
///
/// assert_eq!(redact("redis://app:s3cret@h:6379/0"), "redis://app:***@h:6379/0");
/// assert_eq!(
///     redact("postgres://h/db?sslmode=require&password=s3cret"),
///     "postgres://h/db?sslmode=require&password=***"
/// );
/// assert_eq!(redact("host=/tmp password='a b' user=x"), "host=/tmp password=*** user=x");
/// ```
pub fn redact(text: &str) -> String {
    redact_options(&redact_userinfo(text))
}

/// Whether a URL in `text` has a userinfo that reaches past its authority: an `@` after a
/// `/ ? #` ends what the redaction rules read as a password (`redis://u:a/b@h`). Such a URL
/// means something else to a URL parser (here the host `u`, with the password's start as its
/// port or path), so a driver would connect to, and report, a piece of the password: refuse
/// it and ask for the password percent-encoded (`%2F %3F %23 %40`).
pub fn has_unencoded_userinfo(text: &str) -> bool {
    text.split_whitespace().any(|word| {
        url_starts(word).into_iter().any(|start| {
            let url = &word[start..];
            let Some(rest) = url.find("://").map(|p| &url[p + 3..]) else {
                return false;
            };
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            userinfo_end(rest).is_some_and(|at| at > authority_end)
        })
    })
}

/// [`has_unencoded_userinfo`] as a driver's parse check: an [`ErrorKind::InvalidConfig`]
/// error of `backend` that quotes nothing of the URL.
///
/// [`ErrorKind::InvalidConfig`]: crate::ErrorKind::InvalidConfig
pub fn refuse_unencoded_userinfo(backend: &'static str, url: &str) -> Result<(), crate::Error> {
    if has_unencoded_userinfo(url) {
        return Err(crate::Error::new(
            crate::ErrorKind::InvalidConfig,
            backend,
            "the password in the URL holds `/`, `?`, `#` or `@` unencoded: percent-encode it \
             (%2F, %3F, %23, %40)",
        ));
    }
    Ok(())
}

/// Whether an option of this name holds a secret: `pass`, `token`, or a name ending in
/// `password`, compared without case. For `Debug` impls of option tables.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "pass" || lower == "token" || lower.ends_with("password")
}

/// Text shown through [`redact`]: `Display` writes the redacted text, `Debug` writes it as a
/// quoted string, so a `Debug` impl can write `.field("url", &Redacted(&self.url))`.
#[derive(Clone, Copy)]
pub struct Redacted<T>(pub T);

impl<T: AsRef<str>> fmt::Display for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(self.0.as_ref()))
    }
}

impl<T: AsRef<str>> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact(self.0.as_ref()), f)
    }
}

// --- URL userinfo -------------------------------------------------------------------------

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
}

/// The length of the URL scheme that ends where `before` ends (letters first), if any.
fn scheme_len(before: &str) -> Option<usize> {
    let run = before
        .chars()
        .rev()
        .take_while(|&c| is_scheme_char(c))
        .count();
    let scheme = &before[before.len() - run..];
    let trimmed = scheme.trim_start_matches(|c: char| !c.is_ascii_alphabetic());
    (!trimmed.is_empty()).then_some(trimmed.len())
}

/// Whether `text` starts with `scheme://`.
fn starts_with_url(text: &str) -> bool {
    text.find("://")
        .is_some_and(|p| scheme_len(&text[..p]) == Some(p))
}

/// Byte offsets in `word` where a `scheme://` begins. One right after `: @ / ? # %` is taken
/// for part of the URL before it (a password may hold `x://`), not for a URL of its own.
fn url_starts(word: &str) -> Vec<usize> {
    word.match_indices("://")
        .filter_map(|(p, _)| scheme_len(&word[..p]).map(|n| p - n))
        .filter(|&start| start == 0 || !word[..start].ends_with([':', '@', '/', '?', '#', '%']))
        .collect()
}

fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let space = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..space]);
        rest = &rest[space..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        redact_word(&rest[..end], &mut out);
        rest = &rest[end..];
    }
    out
}

/// One whitespace-free word: the text before its first URL, then each URL up to the next.
fn redact_word(word: &str, out: &mut String) {
    let starts = url_starts(word);
    let first = starts.first().copied().unwrap_or(word.len());
    redact_schemeless(&word[..first], out);
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(word.len());
        redact_url(&word[start..end], out);
    }
}

/// `user:SECRET@host` without a scheme loses what lies between its first `:` and last `@`.
fn redact_schemeless(text: &str, out: &mut String) {
    if let Some(at) = text.rfind('@')
        && let Some(colon) = text[..at].find(':')
    {
        out.push_str(&text[..=colon]);
        out.push_str(MASK);
        out.push_str(&text[at..]);
    } else {
        out.push_str(text);
    }
}

/// `url` starts with `scheme://`.
fn redact_url(url: &str, out: &mut String) {
    let Some(sep) = url.find("://").map(|p| p + 3) else {
        out.push_str(url);
        return;
    };
    let (head, rest) = url.split_at(sep);
    out.push_str(head);
    match userinfo_end(rest) {
        Some(at) => {
            mask_userinfo(&rest[..at], out);
            out.push_str(&rest[at..]);
        }
        None => out.push_str(rest),
    }
}

/// The offset of the `@` that ends the userinfo of `rest` (a URL after its `://`), if any.
fn userinfo_end(rest: &str) -> Option<usize> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host_like = |at: usize| {
        let host = &rest[at + 1..];
        let host = &host[..host.find(['/', '?', '#']).unwrap_or(host.len())];
        !host.contains(['=', '&'])
    };
    // Past the plain authority, an `@` inside the value of an option that is hidden anyway
    // reads better as part of that value than as the end of a userinfo.
    let in_secret_option = |at: usize| at > authority_end && has_secret_option(&rest[..at]);
    rest.match_indices('@')
        .map(|(at, _)| at)
        .rev()
        .find(|&at| host_like(at) && !in_secret_option(at))
        .or_else(|| rest[..authority_end].rfind('@'))
}

/// Hides the password of a userinfo, keeping a plain user name.
fn mask_userinfo(userinfo: &str, out: &mut String) {
    match userinfo.split_once(':') {
        Some((user, _)) if !user.contains(['/', '?', '#', '=', '&', '@']) => {
            out.push_str(user);
            out.push(':');
        }
        _ => {}
    }
    out.push_str(MASK);
}

// --- options ------------------------------------------------------------------------------

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Whether the text before a `=` (or `:`) ends with a secret option name: `Some(quoted)`, where
/// `quoted` says the name was in quotes (`"password": …`).
fn secret_name_before(before: &str) -> Option<bool> {
    let trimmed = before.trim_end_matches([' ', '\t']);
    let (name_end, quoted) = match trimmed.strip_suffix(['"', '\'']) {
        Some(t) => (t, true),
        None => (trimmed, false),
    };
    let len: usize = name_end
        .chars()
        .rev()
        .take_while(|&c| is_name_char(c))
        .map(char::len_utf8)
        .sum();
    let name = &name_end[name_end.len() - len..];
    is_secret_name(name).then_some(quoted)
}

/// Whether `text` assigns a value to a secret option somewhere.
fn has_secret_option(text: &str) -> bool {
    text.match_indices('=')
        .any(|(p, _)| secret_name_before(&text[..p]).is_some())
}

/// The end of the option value that starts at `start`.
fn value_end(text: &str, start: usize) -> usize {
    let rest = &text[start..];
    let mut chars = rest.char_indices();
    match chars.next() {
        Some((_, quote @ ('\'' | '"'))) => {
            let mut escaped = false;
            for (i, c) in chars {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == quote {
                    return start + i + 1;
                }
            }
            text.len()
        }
        _ => {
            let end = rest.char_indices().find(|&(i, c)| {
                c.is_whitespace()
                    || matches!(c, '&' | '"' | '\'' | '`')
                    || (c == ',' && starts_with_url(&rest[i + 1..]))
            });
            start + end.map_or(rest.len(), |(i, _)| i)
        }
    }
}

fn redact_options(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while let Some(found) = text[i..].find(['=', ':']) {
        let sep = i + found;
        i = sep + 1;
        let is_equals = text.as_bytes()[sep] == b'=';
        match secret_name_before(&text[copied..sep]) {
            Some(quoted) if is_equals || quoted => {}
            _ => continue,
        }
        let after = &text[sep + 1..];
        let start = sep + 1 + (after.len() - after.trim_start_matches([' ', '\t']).len());
        let end = value_end(text, start);
        if end > start {
            out.push_str(&text[copied..start]);
            out.push_str(MASK);
            copied = end;
            i = end;
        }
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::{MASK, Redacted, is_secret_name, redact};

    /// Every secret in `secrets` is gone from `redact(text)`, and every piece of `kept` is
    /// still there.
    #[track_caller]
    fn hides(text: &str, secrets: &[&str], kept: &[&str]) {
        let shown = redact(text);
        for s in secrets {
            assert!(
                !shown.contains(s),
                "{s:?} leaks in {shown:?} (from {text:?})"
            );
        }
        for k in kept {
            assert!(
                shown.contains(k),
                "{k:?} is missing in {shown:?} (from {text:?})"
            );
        }
    }

    #[test]
    fn userinfo_passwords_are_replaced() {
        for (text, shown) in [
            ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
            ("redis://pw@h:1", "redis://***@h:1"),
            ("redis://:s3cret@h:1", "redis://:***@h:1"),
            ("redis://h:1", "redis://h:1"),
            ("file:///tmp/x", "file:///tmp/x"),
            (
                "redlock://u:p@ss@a:1,b:2/3 and `postgres://x:y@z/db`",
                "redlock://u:***@a:1,b:2/3 and `postgres://x:***@z/db`",
            ),
        ] {
            assert_eq!(redact(text), shown, "{text}");
        }
    }

    #[test]
    fn passwords_with_delimiters_inside_are_hidden() {
        for secret in ["a/b", "a?b", "a#b", "a@b", "a:b", "p/q?r#s@t:u", "x@y/z@w"] {
            let url = format!("redis://user:{secret}@h:6379/0?db=1");
            assert_eq!(redact(&url), "redis://user:***@h:6379/0?db=1", "{url}");
            // Bare, a secret with a `:` reads as `user:password`: the part after it is hidden.
            hides(
                &format!("rediss://{secret}@h:6379"),
                &[secret],
                &["@h:6379"],
            );
            for name in ["password", "pass", "token", "sslpassword"] {
                let q = format!("postgres://h:5432/db?sslmode=require&{name}={secret}&x=1");
                assert_eq!(
                    redact(&q),
                    format!("postgres://h:5432/db?sslmode=require&{name}=***&x=1"),
                    "{q}"
                );
            }
        }
    }

    #[test]
    fn every_option_name_is_hidden() {
        for name in [
            "password",
            "Password",
            "PASSWORD",
            "pass",
            "token",
            "sslpassword",
            "backend_password",
            "tls.password",
        ] {
            assert_eq!(
                redact(&format!("etcd://h:1?{name}=s3cret&x=1")),
                format!("etcd://h:1?{name}=***&x=1")
            );
            assert_eq!(
                redact(&format!("{name} = \"s3 cret\" # toml")),
                format!("{name} = *** # toml")
            );
        }
        assert!(is_secret_name("Backend_Password"));
        assert!(!is_secret_name("passphrase_hint"));
        assert!(!is_secret_name("user"));
        // Names that merely contain a secret name are not secret.
        assert_eq!(redact("bypass=1 tokens=2"), "bypass=1 tokens=2");
    }

    #[test]
    fn libpq_and_quoted_values() {
        assert_eq!(
            redact("host=/tmp password='a b' user=x"),
            "host=/tmp password=*** user=x"
        );
        assert_eq!(
            redact(r"host=h password='it\'s here' dbname=d"),
            "host=h password=*** dbname=d"
        );
        assert_eq!(
            redact(r#"{"password": "s3\"cret", "user": "u"}"#),
            r#"{"password": ***, "user": "u"}"#
        );
        hides(
            "password='never closed",
            &["never", "closed"],
            &["password="],
        );
    }

    #[test]
    fn multi_host_and_lists_of_urls() {
        assert_eq!(
            redact("redlock://u:p@a:1,b:2,c:3/0"),
            "redlock://u:***@a:1,b:2,c:3/0"
        );
        assert_eq!(redact("etcd://u:p@h1:1,h2:2"), "etcd://u:***@h1:1,h2:2");
        assert_eq!(
            redact("redis://u:p@a:1,redis://:q@b:2/0,redis://c:3"),
            "redis://u:***@a:1,redis://:***@b:2/0,redis://c:3"
        );
        assert_eq!(
            redact("redis://a:1/?password=p,redis://b:2"),
            "redis://a:1/?password=***,redis://b:2"
        );
        // Userinfo before several hosts of one URL: nothing of it leaks.
        hides(
            "redlock://u:p1@a:1,v:p2@b:2,c:3",
            &["p1", "p2"],
            &["redlock://", "b:2,c:3"],
        );
        hides("etcd://h1:1,v:p2@h2:2", &["p2"], &["h2:2"]);
    }

    #[test]
    fn unix_sockets_and_other_schemes() {
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            redact("unix:///run/redis.sock?pass=s3cret"),
            "unix:///run/redis.sock?pass=***"
        );
        assert_eq!(
            redact("postgres://u:a@h/db?sslmode=require&PASSWORD=b&x=1#f"),
            "postgres://u:***@h/db?sslmode=require&PASSWORD=***&x=1#f"
        );
        // An `@` inside a hidden option's value is not mistaken for a userinfo end.
        assert_eq!(
            redact("postgres://h/db?sslpassword=a/b?c#d@e"),
            "postgres://h/db?sslpassword=***"
        );
    }

    #[test]
    fn secrets_in_messages_and_garbage() {
        hides(
            "invalid URL \"redis://u:s3cret@h:1/0\": bad port",
            &["s3cret"],
            &["invalid URL", "u:", "@h:1/0", "bad port"],
        );
        hides(
            "cannot parse u:s3cret@h:1",
            &["s3cret"],
            &["cannot parse u:", "@h:1"],
        );
        hides(
            "LEASEHOLD_URL=u:s3cret@h:1",
            &["s3cret"],
            &["LEASEHOLD_URL="],
        );
        hides("(redis://u:s3cret@h)", &["s3cret"], &["@h)"]);
        hides("redis:/u:s3cret@h", &["s3cret"], &["@h"]);
        hides("://u:s3cret@h", &["s3cret"], &["@h"]);
        hides("x&token=s3cret@@@", &["s3cret"], &["x&token="]);
        hides("étcd://ü:s3cret@hôst/é?pässword=x", &["s3cret"], &["hôst"]);
        for garbage in [
            "",
            "@",
            ":",
            "=",
            "password=",
            "://",
            "a://",
            "@@::==",
            "ü=ö",
        ] {
            let _ = redact(garbage);
        }
        assert_eq!(redact("password= x"), format!("password= {MASK}"));
        assert_eq!(redact("password=&x=1"), "password=&x=1");
        assert_eq!(
            redact("plain text, no secret: 1 = 1"),
            "plain text, no secret: 1 = 1"
        );
    }

    #[test]
    fn ambiguous_at_signs_hide_too_much_rather_than_too_little() {
        hides("etcd://h:1?x=a@b", &[], &["etcd://", "@b"]);
        hides("redis://u:pass=word@h", &["word"], &["@h"]);
    }

    #[test]
    fn any_mix_of_delimiters_is_handled() {
        // Every string of up to four pieces: no panic on any boundary, and a password placed
        // as userinfo or as an option value never shows.
        const PIECES: &[&str] = &["@", ":", "/", "?", "#", "=", "&", ",", "'", "\"", " ", "é"];
        let mut secrets = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = secrets
                .iter()
                .flat_map(|s| PIECES.iter().map(move |p| format!("{s}{p}")))
                .collect();
            secrets.extend(longer.into_iter().filter(|s| s.len() <= 8));
        }
        for piece in &secrets {
            let _ = redact(piece);
            if piece.contains([' ', '\'', '"', '&']) {
                continue;
            }
            let secret = format!("S3{piece}CRET");
            hides(
                &format!("redis://u:{secret}@h:1/0"),
                &[&secret, "S3"],
                &["@h:1/0"],
            );
            hides(
                &format!("redis://h:1/0?a=1&password={secret}"),
                &["S3"],
                &["redis://h"],
            );
        }
    }

    #[test]
    fn unencoded_passwords_are_detected() {
        use super::has_unencoded_userinfo as unencoded;
        for url in [
            "redis://u:a/b@h:1",
            "etcd://a?b@h:1",
            "postgres://u:x#y@h/db",
            "x redis://:p/q@h",
        ] {
            assert!(unencoded(url), "{url}");
        }
        for url in [
            "redis://u:a%2Fb@h:1/0",
            "redis://h:1/0",
            "redis+unix:///run/r.sock?pass=a@b/c",
            "postgres://h/db?password=a/b@c",
            "file:///tmp/x",
            "not a url",
        ] {
            assert!(!unencoded(url), "{url}");
        }
    }

    #[test]
    fn redacted_wrapper_formats() {
        let url = "redis://u:s3cret@h";
        assert_eq!(Redacted(url).to_string(), "redis://u:***@h");
        assert_eq!(format!("{:?}", Redacted(url)), "\"redis://u:***@h\"");
        assert_eq!(
            format!("{:?}", Redacted(String::from(url))),
            "\"redis://u:***@h\""
        );
    }
}
