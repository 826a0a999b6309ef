//! `leasehold acquire`: start a holder process (see [`crate::holder`]), wait for its report, and
//! print the lease as shell assignments for `eval`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::time::Duration;

use crate::code;
use crate::lock::{AcquireArgs, wait_notice, warn_if_password_in_url};
use crate::record::{
    HANDLE_VAR, RELEASE, RUNTIME_DIR_VAR, ask, prepare_runtime_dir, runtime_dir, shell_quote,
    socket_of,
};

/// How `acquire` hands the URL to the holder: not on its command line, where `ps` shows it.
pub(crate) const HOLDER_URL_VAR: &str = "LEASEHOLD_HOLDER_URL";

pub(crate) fn acquire(args: AcquireArgs) -> u8 {
    warn_if_password_in_url(&args.target);
    let dir = runtime_dir();
    if let Err(e) = prepare_runtime_dir(&dir) {
        eprintln!(
            "leasehold: runtime folder {}: {e} (set {RUNTIME_DIR_VAR})",
            dir.display()
        );
        return code::CONFIG;
    }
    let mut child = match spawn_holder(&args, &dir) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (Some(stdout), Some(confirm)) = (child.stdout.take(), child.stdin.take()) else {
        return code::CANNOT_RUN;
    };
    let key = &args.target.key;
    // Blocking reads: nothing else needs this thread meanwhile.
    let mut lines = BufReader::new(stdout).lines();
    while let Some(Ok(line)) = lines.next() {
        let mut f = line.splitn(5, '\t');
        match f.next() {
            Some("waiting") if !args.how.quiet => {
                let wait = f
                    .next()
                    .and_then(|w| humantime::parse_duration(w).ok())
                    .unwrap_or_default();
                eprintln!("{}", wait_notice(key, wait));
            }
            Some("held") => return print_lease(key, f, confirm),
            Some("error") => {
                let c = f
                    .next()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(code::CANNOT_RUN);
                eprintln!("leasehold: {}", f.collect::<Vec<_>>().join("\t"));
                let _ = child.wait();
                return c;
            }
            _ => {}
        }
    }
    let status = child.wait();
    eprintln!("leasehold: the holder process ended without a word ({status:?})");
    code::CANNOT_RUN
}

/// Starts `leasehold __hold` with the same flags, in a process group of its own, with pipes to
/// its stdin and stdout; the exit code when it cannot.
fn spawn_holder(args: &AcquireArgs, dir: &Path) -> Result<Child, u8> {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("leasehold: cannot find my own executable: {e}");
            return Err(code::CANNOT_RUN);
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__hold").arg("--key").arg(&args.target.key);
    if let Some(c) = &args.target.config {
        // The holder runs in the same folder, but make the path absolute anyway.
        cmd.arg("--config")
            .arg(std::path::absolute(c).unwrap_or_else(|_| c.clone()));
    }
    if let Some(t) = args.how.ttl {
        cmd.arg("--ttl")
            .arg(humantime::format_duration(t).to_string());
    }
    if let Some(w) = args.how.wait {
        cmd.arg("--wait")
            .arg(humantime::format_duration(w).to_string());
    }
    if args.how.no_wait {
        cmd.arg("--no-wait");
    }
    if let Some(n) = args.target.permits {
        cmd.arg("--permits").arg(n.to_string());
    }
    match &args.target.url {
        Some(url) => cmd.env(HOLDER_URL_VAR, url),
        None => cmd.env_remove(HOLDER_URL_VAR),
    };
    cmd.env(RUNTIME_DIR_VAR, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C meant for the script does not reach it.
        .process_group(0);
    cmd.spawn().map_err(|e| {
        eprintln!("leasehold: cannot start the holder process: {e}");
        code::CANNOT_RUN
    })
}

/// Prints the assignments of the holder's `held` report (`<backend>`, `<token or ->`, `<pid>`,
/// `<handle>`), then confirms with `ok` on its stdin; releases the lease if it cannot print.
fn print_lease<'a>(key: &str, mut f: impl Iterator<Item = &'a str>, mut confirm: ChildStdin) -> u8 {
    let backend = f.next().unwrap_or_default();
    let token = f.next().unwrap_or("-");
    let pid = f.next().unwrap_or_default();
    let handle = f.next().unwrap_or_default();
    let export = |k: &str, v: &str| format!("export {k}={}\n", shell_quote(v));
    let mut out = export("LEASEHOLD_KEY", key);
    out += &export("LEASEHOLD_BACKEND", backend);
    if token == "-" {
        out += "unset LEASEHOLD_FENCING_TOKEN\n";
    } else {
        out += &export("LEASEHOLD_FENCING_TOKEN", token);
    }
    out += &export("LEASEHOLD_HOLDER_PID", pid);
    out += &export(HANDLE_VAR, handle);
    let mut stdout = io::stdout();
    if let Err(e) = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // Nobody will learn the handle: do not leave the lock held.
        eprintln!("leasehold: cannot print the lease ({e}): releasing it");
        let _ = ask(
            &socket_of(Path::new(handle)),
            RELEASE,
            Duration::from_secs(30),
        );
        return code::CANNOT_RUN;
    }
    // The handshake: printed, so the holder may keep the lock. Had we died before this line, it
    // would see its stdin closed without `ok` and release.
    if let Err(e) = confirm.write_all(b"ok\n").and_then(|()| confirm.flush()) {
        eprintln!("leasehold: the holder process is gone ({e})");
        return code::CANNOT_RUN;
    }
    0
}
