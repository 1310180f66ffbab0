//! Where a Read's bytes sit in the payload, said one way by every client
//! that shows a Read (the CLI and the MCP tools).

impl super::ReadResponse {
    /// `lines A-B of L, bytes S-E of T`.
    pub fn span(&self) -> String {
        format!(
            "lines {}-{} of {}, bytes {}-{} of {}",
            self.first_line,
            self.last_line,
            self.total_lines,
            self.start_offset,
            self.end_offset,
            self.total_bytes
        )
    }
}
