//! The parts of the `leasehold` binary that other crates reach: the records of `acquire`'s
//! holders and their socket protocol, for the fuzz targets in `fuzz/`. Not an API: the
//! command line is (see the binary's documentation and `docs/guide.md`).

#[doc(hidden)]
pub mod record;
