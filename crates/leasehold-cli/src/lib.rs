//! The library side of the `leasehold` command line tool (the binary comes with the CLI
//! issue). The local file backend it uses by default lives in `leasehold-core`
//! ([`leasehold_core::FileBackend`]), so that every crate can use it.
