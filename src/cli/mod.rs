//! The `rekindle` binary's own modules, compiled into the binary and never into the library
//! (so clap types stay out of the library's API): the subcommands, what they print, and the
//! plumbing all three binaries share (`shared.rs`, which `worker/main.rs` and
//! `coordinator/main.rs` include by path).

pub(crate) mod bench;
pub(crate) mod commands;
pub(crate) mod recover;
pub(crate) mod render;
pub(crate) mod runs;
// Shared with the fleet binaries, which use parts this one does not (and the other way round).
#[allow(dead_code)]
pub(crate) mod shared;
