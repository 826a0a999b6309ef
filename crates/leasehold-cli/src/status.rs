//! `leasehold status`: what the backend can tell about the holder of a lock.

use leasehold::{FencingKind, HolderInfo, SafetyClass};

use crate::code;
use crate::lock::{Target, build, config_of, failure, warn_if_password_in_url};

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The TTL to state the crash-release bound for (default: the configuration's): how long
    /// a lock of that TTL outlives a holder that crashed without releasing it.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<std::time::Duration>,
}

pub(crate) async fn status(args: StatusArgs) -> u8 {
    warn_if_password_in_url(&args.target);
    let config = match config_of(&args.target, args.ttl) {
        Ok(c) => c,
        Err(e) => return failure(&e),
    };
    let (locker, sem) = match build(&args.target, &config).await {
        Ok(built) => built,
        Err(e) => return failure(&e),
    };
    if let Some(sem) = sem {
        return permits(&args, &sem).await;
    }
    let holder = match locker.inspect(args.target.key.as_str()).await {
        Ok(h) => h,
        Err(e) => return failure(&e),
    };
    let backend = locker.backend().capabilities().name;
    let caps = locker.capabilities();
    let safety = safety_name(caps.safety);
    let fencing = fencing_name(caps.fencing);
    let ttl = locker.options().ttl;
    let crash = caps.crash_release;
    if args.json {
        let mut s = json(&args.target.key, backend, safety, fencing, holder.as_ref());
        s.pop();
        s.push_str(&format!(
            ",\"ttl_ms\":{},\"crash_release_ms\":{},\"crash_release\":{}}}",
            ttl.as_millis(),
            crash
                .bound(ttl)
                .map_or_else(|| "null".to_owned(), |b| b.as_millis().to_string()),
            string(&crash.describe(ttl)),
        ));
        out!("{s}");
    } else {
        let key = &args.target.key;
        match &holder {
            None => out!("{key:?} is free ({backend}: {safety}, fencing {fencing})"),
            Some(h) => {
                out!("{key:?} is held ({backend}: {safety}, fencing {fencing})");
                if let Some(t) = h.fencing {
                    out!("fencing token: {t}");
                }
                if let Some(o) = &h.owner {
                    out!("owner: {o}");
                }
                if let Some(r) = h.remaining {
                    out!("remaining: {}", humantime::format_duration(round_ms(r)));
                }
                if let Some(d) = &h.detail {
                    out!("detail: {d}");
                }
            }
        }
        out!(
            "crash release (ttl {}): {}",
            humantime::format_duration(round_ms(ttl)),
            crash.describe(ttl)
        );
    }
    if holder.is_some() { 0 } else { code::FREE }
}

/// `status --permits N`: every holder of a permit (text, or one JSON object with `holders`).
/// Exit 0 when at least one permit is held, 1 when none is.
async fn permits(args: &StatusArgs, sem: &leasehold::Semaphore) -> u8 {
    let key = &args.target.key;
    let holders = match sem.holders(key.as_str()).await {
        Ok(h) => h,
        Err(e) => return failure(&e),
    };
    let caps = sem.locker().capabilities();
    let (backend, limit) = (caps.name, sem.limit().get());
    let (safety, fencing) = (safety_name(caps.safety), fencing_name(caps.fencing));
    if args.json {
        let list: Vec<String> = holders
            .iter()
            .map(|h| json(key, backend, safety, fencing, Some(h)))
            .collect();
        out!(
            "{{\"key\":{},\"backend\":{},\"permits\":{limit},\"held\":{},\"holders\":[{}]}}",
            string(key),
            string(backend),
            holders.len(),
            list.join(",")
        );
    } else {
        out!(
            "{key:?}: {} of {limit} permits held ({backend}: {safety}, fencing {fencing})",
            holders.len()
        );
        for h in &holders {
            let owner = h.owner.as_ref().map_or("?", |o| o.as_str());
            let mut line = format!("owner: {owner}");
            if let Some(t) = h.fencing {
                line.push_str(&format!(", fencing token: {t}"));
            }
            if let Some(r) = h.remaining {
                line.push_str(&format!(
                    ", remaining: {}",
                    humantime::format_duration(round_ms(r))
                ));
            }
            if let Some(d) = &h.detail {
                line.push_str(&format!(", {d}"));
            }
            out!("{line}");
        }
    }
    if holders.is_empty() { code::FREE } else { 0 }
}

fn round_ms(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn safety_name(s: SafetyClass) -> &'static str {
    match s {
        SafetyClass::Process => "exact within one process",
        SafetyClass::Host => "exact on one host",
        SafetyClass::Efficiency => "efficiency lock",
        SafetyClass::Correctness => "correctness lock",
        _ => "unknown safety",
    }
}

fn fencing_name(f: FencingKind) -> &'static str {
    match f {
        FencingKind::None => "none",
        FencingKind::BestEffort => "best-effort",
        FencingKind::Monotonic => "monotonic",
        _ => "unknown",
    }
}

/// One JSON object: `key`, `backend`, `safety`, `fencing`, `held`, and when held `owner`,
/// `fencing_token`, `remaining_ms`, `detail` (each `null` when the backend cannot tell).
/// `status` adds `ttl_ms`, `crash_release_ms` (`null`: freed when the holder's process exits)
/// and `crash_release` (in words).
fn json(
    key: &str,
    backend: &str,
    safety: &str,
    fencing: &str,
    holder: Option<&HolderInfo>,
) -> String {
    let mut s = format!(
        "{{\"key\":{},\"backend\":{},\"safety\":{},\"fencing\":{},\"held\":{}",
        string(key),
        string(backend),
        string(safety),
        string(fencing),
        holder.is_some()
    );
    if let Some(h) = holder {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "null".to_owned());
        s.push_str(&format!(
            ",\"owner\":{},\"fencing_token\":{},\"remaining_ms\":{},\"detail\":{}",
            opt(h.owner.as_ref().map(|o| string(o.as_str()))),
            opt(h.fencing.map(|t| t.get().to_string())),
            opt(h.remaining.map(|r| r.as_millis().to_string())),
            opt(h.detail.as_deref().map(string)),
        ));
    }
    s.push('}');
    s
}

/// A JSON string literal.
pub(crate) fn string(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if u32::from(c) < 0x20 => s.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes() {
        assert_eq!(string("a\"b\\c\n\u{1}"), r#""a\"b\\c\n\u0001""#);
        let free = json("k", "redis", "efficiency lock", "best-effort", None);
        assert_eq!(
            free,
            r#"{"key":"k","backend":"redis","safety":"efficiency lock","fencing":"best-effort","held":false}"#
        );
    }
}
