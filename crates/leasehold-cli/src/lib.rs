//! The `leasehold` command line tool's library: for now, the local file backend that the tool
//! uses when no URL is given.
//!
//! See [`file::FileBackend`].

pub mod file;
