//! The exec ceiling a policy carries, as stored and configured. It is the
//! sandbox's own limits type, so a ceiling reaches the sandbox as it is.

use crate::sandbox::limits::ExecLimits;

/// The most an exec may ask for, as a policy level stores it; a zero field
/// sets no ceiling at that level, and [`ExecLimits::stricter`] merges two
/// levels. The same type as the sandbox's [`ExecLimits`]: the same fields,
/// serialized form and defaults (a field missing from a stored or
/// configured ceiling decodes as the sandbox's request default).
pub type ExecCeiling = ExecLimits;
