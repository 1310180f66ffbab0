//! `println!` and friends for the client commands, shadowing std's: every
//! line goes through [`emit`](super::output::emit), which escapes control
//! characters and ends the process quietly on a closed pipe. Declared first
//! in `cli/mod.rs`, so every client module uses them.

macro_rules! println {
    () => { $crate::cli::output::emit(std::io::stdout(), "\n") };
    ($($t:tt)*) => { $crate::cli::output::emit(std::io::stdout(), &format!("{}\n", format_args!($($t)*))) };
}
macro_rules! eprintln {
    () => { $crate::cli::output::emit(std::io::stderr(), "\n") };
    ($($t:tt)*) => { $crate::cli::output::emit(std::io::stderr(), &format!("{}\n", format_args!($($t)*))) };
}
macro_rules! eprint {
    ($($t:tt)*) => { $crate::cli::output::emit(std::io::stderr(), &format!($($t)*)) };
}
