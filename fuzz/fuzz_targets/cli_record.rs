//! The `leasehold` CLI's holder records: a state file reads back as written, and no value can
//! forge another field (a key, location or reason turning a held lock into a lost one); any
//! text reads as some record. The holder's socket answers read back as sent.
#![no_main]

use arbitrary::Arbitrary;
use leasehold_cli::record::{Answer, fuzzing};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    fields: [String; 5],
    token: Option<String>,
    pid: u32,
    acquired_at: u64,
    lost_reason: Option<String>,
    /// Any text, read as a state file and as a socket answer.
    text: String,
}

fuzz_target!(|input: Input| {
    let [state, key, backend, location, owner] = &input.fields;
    let record = fuzzing::record(
        [state, key, backend, location, owner].map(String::as_str),
        input.token.as_deref(),
        input.pid,
        input.acquired_at,
        input.lost_reason.as_deref(),
    );
    let back = fuzzing::parse(&fuzzing::render(&record));
    let line_breaks = input.fields.iter().any(|f| f.contains(['\n', '\r']))
        || [&input.token, &input.lost_reason]
            .iter()
            .any(|f| f.as_deref().is_some_and(|f| f.contains(['\n', '\r'])));
    if !line_breaks {
        assert_eq!(back, record);
    }
    // Whatever the values, the record keeps what it says of the hold.
    assert_eq!(
        back.is_lost(),
        record.is_lost(),
        "{record:?} reads back as {back:?}"
    );
    assert_eq!(
        back.pid(),
        record.pid(),
        "{record:?} reads back as {back:?}"
    );

    let read = fuzzing::parse(&input.text);
    let _ = (read.key(), read.is_lost(), read.end_notice());
    let again = fuzzing::parse(&fuzzing::render(&read));
    assert_eq!(again.key(), read.key());

    for answer in [
        Answer::Released,
        Answer::NotHeld,
        Answer::Failed(input.text.clone()),
    ] {
        let parsed = Answer::parse(&answer.line());
        match &answer {
            Answer::Failed(_) => assert!(matches!(parsed, Answer::Failed(_)), "{answer:?}"),
            _ => assert_eq!(parsed, answer),
        }
    }
    let _ = Answer::parse(&input.text);
});
