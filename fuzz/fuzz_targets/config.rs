//! `LockConfig` from TOML, then `LEASEHOLD_*` environment overrides. Nothing may panic, and a
//! backend password given through the environment never shows in `Debug`, `Display` or errors.
#![no_main]

use arbitrary::Arbitrary;
use leasehold::{ENV_VARS, LockConfig};
use libfuzzer_sys::fuzz_target;

/// The password set last through `LEASEHOLD_BACKEND_PASSWORD`; no output may contain it.
const SECRET: &str = "Hx7SECRETq";

#[derive(Arbitrary, Debug)]
struct Input {
    toml: String,
    /// Each variable named by its index in [`ENV_VARS`].
    vars: Vec<(u8, String)>,
    plant: bool,
}

fuzz_target!(|input: Input| {
    let parsed = LockConfig::from_toml_str(&input.toml);
    if let Ok(c) = &parsed {
        show(c);
    }
    let mut vars: Vec<(&str, &str)> = input
        .vars
        .iter()
        .map(|(i, v)| (ENV_VARS[usize::from(*i) % ENV_VARS.len()], v.as_str()))
        .collect();
    let planted = input.plant
        && !input.toml.to_ascii_uppercase().contains("SECRET")
        && !input
            .vars
            .iter()
            .any(|(_, v)| v.to_ascii_uppercase().contains("SECRET"));
    if planted {
        vars.push(("LEASEHOLD_BACKEND_PASSWORD", SECRET));
    }
    // As `LockConfig::load` does: the file's values unchecked, then the overrides, then the
    // checks. The defaults when the file is not a configuration at all.
    let base = toml::from_str::<LockConfig>(&input.toml).unwrap_or_default();
    let shown = match base.with_vars(vars) {
        Ok(c) => show(&c),
        Err(e) => format!("{e} {e:?}"),
    };
    if planted {
        assert!(!shown.contains(SECRET), "the password shows: {shown}");
    }
});

/// Everything a configuration shows, after using it the ways that need no I/O.
fn show(c: &LockConfig) -> String {
    let _ = (c.lock_options(), c.wait_budget(), c.validate());
    format!("{c:?} {c}")
}
