//! The safety table as Markdown and CSV, and the invariants a run broke.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use leasehold_core::FencingKind;

use super::model::{BACKENDS, Cell, FAULTS, Params, must_not_overlap, must_take_over};
use crate::report::Table;

/// The cell's stale writes the fenced store accepted: the count, `?` when the backend's
/// capabilities are unknown, `–` when it mints no token.
fn fenced(c: &Cell) -> String {
    match c.caps.map(|k| k.fencing) {
        Some(f) if f.mints_tokens() => c.writes.stale_fenced.to_string(),
        None => "?".to_owned(),
        Some(_) => "–".to_owned(),
    }
}

/// What one cell breaks of the promises its backend makes.
fn violations(backend: &str, fault: &str, c: &Cell) -> Vec<String> {
    let mut v: Vec<String> = c
        .errors
        .iter()
        .map(|e| format!("{backend} / {fault}: a trial failed: {e}"))
        .collect();
    let monotonic = c.caps.map(|k| k.fencing) == Some(FencingKind::Monotonic);
    if monotonic && c.writes.stale_fenced > 0 {
        v.push(format!(
            "{backend} / {fault}: claims monotonic fencing, yet the fenced store accepted {} \
             stale write(s)",
            c.writes.stale_fenced
        ));
    }
    if monotonic && c.writes.rightful_rejected > 0 {
        v.push(format!(
            "{backend} / {fault}: claims monotonic fencing, yet the fenced store rejected {} \
             write(s) of the newest holder (its token went back)",
            c.writes.rightful_rejected
        ));
    }
    if let Some(why) = must_take_over(backend, fault)
        && c.runs > 0
        && c.takeovers == 0
    {
        v.push(format!(
            "{backend} / {fault}: B never took the lock in {} run(s), though {why}: did the \
             fault strike?",
            c.runs
        ));
    }
    if let Some(why) = must_not_overlap(backend, fault)
        && c.overlaps > 0
    {
        v.push(format!(
            "{backend} / {fault}: {} overlapping holder(s), impossible because {why}",
            c.overlaps
        ));
    }
    v
}

/// The CSV line of a cell that ran.
fn csv_line(backend: &str, fault: &str, c: &Cell) -> String {
    let fencing = match c.caps.map(|k| k.fencing) {
        Some(FencingKind::Monotonic) => "monotonic",
        Some(FencingKind::BestEffort) => "best-effort",
        Some(FencingKind::None) => "none",
        _ => "unknown",
    };
    let stale_fenced = if fenced(c) == "–" {
        String::new()
    } else {
        c.writes.stale_fenced.to_string()
    };
    format!(
        "{backend},{fault},true,{},{},{},{},{},{stale_fenced},{},{},{fencing}",
        c.runs,
        c.takeovers,
        c.late_grants,
        c.overlaps,
        c.writes.stale_plain,
        c.writes.rightful_rejected,
        c.errors.len(),
    )
}

/// The per-cell table's row of a cell that ran.
fn detail_row(backend: &str, fault: &str, c: &Cell) -> Vec<String> {
    let fenced = match fenced(c) {
        dash if dash == "–" => "n/a (no token)".to_owned(),
        n => n,
    };
    let counts = [
        c.runs,
        c.takeovers,
        c.late_grants,
        c.overlaps,
        c.writes.stale_plain,
    ];
    let mut row = vec![backend.to_owned(), fault.to_owned()];
    row.extend(counts.iter().map(u32::to_string));
    row.push(fenced);
    row.push(c.writes.rightful_rejected.to_string());
    row.push(c.errors.len().to_string());
    row
}

/// The two tables, empty, for the chosen faults.
fn tables(params: &Params, faults: &[&(&str, &str)]) -> (Table, Table) {
    let mut header = vec!["backend"];
    header.extend(faults.iter().map(|(_, title)| *title));
    let mut matrix = Table::new(
        &format!(
            "Overlapping holders / stale writes accepted without fencing / with fencing ({} run{} per cell)",
            params.runs,
            if params.runs == 1 { "" } else { "s" }
        ),
        &header,
    );
    matrix.note(
        "Each cell: trials in which two holders overlapped / stale writes the plain store \
         accepted / stale writes the fenced store accepted (– where the backend mints no token). \
         n/a: the fault does not apply."
            .to_owned(),
    );
    let detail = Table::new(
        "Per cell",
        &[
            "backend",
            "fault",
            "runs",
            "B took the lock",
            "A's grant came back expired",
            "overlapping holders",
            "stale writes accepted, no fencing",
            "stale writes accepted, fenced",
            "newest holder's writes rejected",
            "errors",
        ],
    );
    (matrix, detail)
}

/// The Markdown tables (without a heading), the CSV, and the invariant violations.
pub(super) fn render(
    params: &Params,
    cells: &BTreeMap<(usize, usize), Cell>,
    elapsed: Duration,
) -> (String, String, Vec<String>) {
    let chosen = |name: &str, list: &[String]| list.iter().any(|x| x == name);
    let faults: Vec<(usize, &(&str, &str))> = FAULTS
        .iter()
        .enumerate()
        .filter(|(_, (f, _))| chosen(f, &params.faults))
        .collect();
    let (mut matrix, mut detail) =
        tables(params, &faults.iter().map(|(_, f)| *f).collect::<Vec<_>>());
    let mut csv = String::from(
        "backend,fault,applies,runs,takeovers,late_grants,overlaps,stale_plain,stale_fenced,rightful_rejected,errors,fencing\n",
    );
    let mut all = Vec::new();
    for (bi, backend) in BACKENDS.iter().enumerate() {
        if !chosen(backend, &params.backends) {
            continue;
        }
        let mut row = vec![format!("**{backend}**")];
        for (fi, (fault, _)) in &faults {
            let Some(c) = cells.get(&(bi, *fi)) else {
                row.push("n/a".to_owned());
                let _ = writeln!(csv, "{backend},{fault},false,0,,,,,,,,");
                continue;
            };
            let failed = match c.errors.len() {
                0 => String::new(),
                n => format!(" ({n} failed)"),
            };
            row.push(format!(
                "{} / {} / {}{failed}",
                c.overlaps,
                c.writes.stale_plain,
                fenced(c)
            ));
            detail.row(detail_row(backend, fault, c));
            let _ = writeln!(csv, "{}", csv_line(backend, fault, c));
            all.extend(violations(backend, fault, c));
        }
        matrix.row(row);
    }
    let mut md = matrix.markdown();
    md.push('\n');
    md.push_str(&detail.markdown());
    let _ = write!(
        md,
        "\n{} invariant(s) failed; {} s in all.\n",
        all.len(),
        elapsed.as_secs()
    );
    for v in &all {
        let _ = writeln!(md, "- FAILED: {v}");
    }
    (md, csv, all)
}

#[cfg(test)]
mod tests {
    use leasehold_core::{Capabilities, SafetyClass};

    use super::*;
    use crate::safety::check::Writes;

    /// A cell of one run in which B took over, with these counts.
    fn cell(fencing: FencingKind, overlaps: u32, stale_fenced: u32) -> Cell {
        Cell {
            runs: 1,
            takeovers: 1,
            overlaps,
            writes: Writes {
                stale_plain: overlaps,
                stale_fenced,
                rightful_rejected: 0,
            },
            caps: Some(Capabilities::new("test", SafetyClass::Correctness, fencing)),
            ..Cell::default()
        }
    }

    /// `c`, in which the fenced store also rejected a write of the newest holder.
    fn rejecting(mut c: Cell) -> Cell {
        c.writes.rightful_rejected = 1;
        c
    }

    /// The whole table over these cells (backend, fault, cell).
    fn render_cells(cells: Vec<(&str, &str, Cell)>) -> (String, String, Vec<String>) {
        let params = Params {
            runs: 1,
            backends: BACKENDS.iter().map(|b| (*b).to_owned()).collect(),
            faults: FAULTS.iter().map(|(f, _)| (*f).to_owned()).collect(),
        };
        let at = |b: &str, f: &str| {
            let bi = BACKENDS.iter().position(|x| *x == b).unwrap_or(usize::MAX);
            let fi = FAULTS.iter().position(|(x, _)| *x == f);
            (bi, fi.unwrap_or(usize::MAX))
        };
        let cells = cells.into_iter().map(|(b, f, c)| (at(b, f), c)).collect();
        render(&params, &cells, Duration::ZERO)
    }

    #[test]
    fn quick_mode_fails_on_a_fenced_stale_write_a_forbidden_overlap_or_a_fault_that_did_nothing() {
        use FencingKind::{BestEffort, Monotonic};
        let no_takeover = Cell {
            takeovers: 0,
            ..cell(Monotonic, 0, 0)
        };
        // Expected: an overlap under a pause; best-effort tokens that went back, whose rightful
        // holder's writes the fenced store then rejects; a session-held lock nobody took over
        // under a pause.
        let went_back = rejecting(cell(BestEffort, 1, 1));
        let fine = vec![
            ("etcd", "pause", cell(Monotonic, 1, 0)),
            ("redis", "restart", went_back),
            ("file", "pause", no_takeover.clone()),
        ];
        let (md, csv, violations) = render_cells(fine.clone());
        assert!(violations.is_empty(), "{violations:?}");
        assert!(
            md.contains("| 1 / 1 / 0 |") && csv.contains("etcd,pause,true,1,"),
            "{md}"
        );
        // Violations: a monotonic token that let a stale write through; a forbidden overlap.
        let mut broken = fine;
        broken.push(("postgres", "pg-terminate", cell(Monotonic, 1, 1)));
        broken.push(("postgres", "pause", cell(Monotonic, 1, 0)));
        let (_, _, violations) = render_cells(broken);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("postgres / pause"), "{violations:?}");
        assert!(
            violations[1].contains("monotonic fencing"),
            "{violations:?}"
        );
        // A fault that did nothing: nobody took the lock where the fault must hand it over.
        // A monotonic token that went back: the newest holder's write was rejected.
        let rejected = rejecting(cell(Monotonic, 1, 0));
        let (_, _, violations) = render_cells(vec![
            ("etcd", "lease-revoke", no_takeover),
            ("memory", "pause", rejected),
        ]);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(
            violations[0].contains("memory / pause") && violations[0].contains("went back"),
            "{violations:?}"
        );
        assert!(
            violations[1].contains("etcd / lease-revoke")
                && violations[1].contains("never took the lock"),
            "{violations:?}"
        );
    }
}
