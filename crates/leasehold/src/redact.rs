//! Redaction of secrets in URLs and messages.

/// Replaces the password of every `scheme://user:password@host` in `text` with `***` (a bare
/// `scheme://secret@host` loses the whole user part, since Redis reads it as a password), and
/// the value of every `password=…` (URL query or libpq key=value) with `***`.
pub(crate) fn redact(text: &str) -> String {
    redact_params(&redact_userinfo(text))
}

fn is_stop(c: char) -> bool {
    c.is_whitespace() || matches!(c, '/' | '?' | '#' | '"' | '\'' | '`')
}

fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(is_stop).unwrap_or(tail.len());
        let (authority, after) = tail.split_at(end);
        match authority.rfind('@') {
            Some(at) => {
                let (userinfo, host) = authority.split_at(at);
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str("***"),
                }
                out.push_str(host);
            }
            None => out.push_str(authority),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

fn redact_params(text: &str) -> String {
    const KEY: &str = "password=";
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    while let Some(found) = lower[pos..].find(KEY) {
        let value_start = pos + found + KEY.len();
        out.push_str(&text[pos..value_start]);
        out.push_str("***");
        let value = &text[value_start..];
        let len = if let Some(quoted) = value.strip_prefix('\'') {
            quoted.find('\'').map_or(value.len(), |q| q + 2)
        } else {
            value
                .find(|c: char| c == '&' || c.is_whitespace() || c == '"' || c == '`')
                .unwrap_or(value.len())
        };
        pos = value_start + len;
    }
    out.push_str(&text[pos..]);
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_replaced_everywhere() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://pw@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redlock://u:p@ss@a:1,b:2/3 and `postgres://x:y@z/db`"),
            "redlock://u:***@a:1,b:2/3 and `postgres://x:***@z/db`"
        );
        assert_eq!(
            redact("host=/tmp password='a b' user=x"),
            "host=/tmp password=*** user=x"
        );
        assert_eq!(
            redact("etcd://h:1?Password=s&x=1"),
            "etcd://h:1?Password=***&x=1"
        );
    }
}
