//! The sparse line index: for every 64 KiB boundary of a payload, the number
//! of the line that contains that byte. Finding where a line starts, or which
//! line a byte is on, then costs a binary search plus a scan of at most one
//! stride, however large the payload.

/// Bytes between index entries.
pub const STRIDE: u64 = 64 * 1024;
/// Format byte of an encoded index.
const FORMAT: u8 = 1;

/// Builds the index from the content stream.
#[derive(Debug, Default)]
pub struct LineIndexBuilder {
    /// Newlines seen before the current position.
    newlines: u64,
    /// `lines[k]` is the line containing byte `(k + 1) * STRIDE`.
    lines: Vec<u64>,
}

impl LineIndexBuilder {
    /// Takes the chunk that starts at byte `offset`.
    pub fn update(&mut self, offset: u64, chunk: &[u8]) {
        let end = offset + chunk.len() as u64;
        let mut pos = offset;
        loop {
            let boundary = (self.lines.len() as u64 + 1) * STRIDE;
            if boundary >= end {
                break;
            }
            let upto = (boundary - offset) as usize;
            let from = (pos - offset) as usize;
            self.newlines += memchr::memchr_iter(b'\n', &chunk[from..upto]).count() as u64;
            self.lines.push(self.newlines + 1);
            pos = boundary;
        }
        let from = (pos - offset) as usize;
        self.newlines += memchr::memchr_iter(b'\n', &chunk[from..]).count() as u64;
    }

    /// Newlines seen so far.
    pub fn newlines(&self) -> u64 {
        self.newlines
    }

    /// Encodes the index.
    pub fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.lines.len() * 8);
        out.push(FORMAT);
        for l in self.lines {
            out.extend_from_slice(&l.to_le_bytes());
        }
        out
    }
}

/// A decoded index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LineIndex {
    lines: Vec<u64>,
}

/// Where to start scanning: a byte offset and the line it lies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// Byte offset (a multiple of [`STRIDE`]).
    pub offset: u64,
    /// Line containing that byte, 1-based.
    pub line: u64,
    /// Whether `offset` is known to be the first byte of `line`.
    pub at_line_start: bool,
}

impl LineIndex {
    /// Decodes an encoded index; `None` when the bytes are not one.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (&format, rest) = bytes.split_first()?;
        if format != FORMAT || rest.len() % 8 != 0 {
            return None;
        }
        let lines = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Some(Self { lines })
    }

    /// The anchor to scan forward from to reach the start of `line`: the
    /// last boundary that lies on an earlier line. The start of `line` is at
    /// most one stride past it.
    pub fn anchor_for_line(&self, line: u64) -> Anchor {
        let k = self.lines.partition_point(|&l| l < line);
        self.anchor_at(k)
    }

    /// The `k`th anchor: the start of the content, then the boundary after
    /// each stride.
    fn anchor_at(&self, k: usize) -> Anchor {
        if k == 0 {
            return Anchor {
                offset: 0,
                line: 1,
                at_line_start: true,
            };
        }
        Anchor {
            offset: k as u64 * STRIDE,
            line: self.lines[k - 1],
            at_line_start: false,
        }
    }

    /// The anchor at or before byte `offset`, at most one stride before it.
    pub fn anchor_for_offset(&self, offset: u64) -> Anchor {
        let k = ((offset / STRIDE) as usize).min(self.lines.len());
        self.anchor_at(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(data: &[u8], chunk: usize) -> LineIndex {
        let mut b = LineIndexBuilder::default();
        let mut off = 0u64;
        for c in data.chunks(chunk) {
            b.update(off, c);
            off += c.len() as u64;
        }
        LineIndex::decode(&b.finish()).unwrap()
    }

    fn line_at(data: &[u8], offset: usize) -> u64 {
        1 + memchr::memchr_iter(b'\n', &data[..offset]).count() as u64
    }

    #[test]
    fn records_the_line_of_every_stride_boundary_whatever_the_chunking() {
        let data: Vec<u8> = (0..400_000u32)
            .map(|i| if i % 97 == 0 { b'\n' } else { b'x' })
            .collect();
        for chunk in [1000, 65_536, 70_001, 400_000] {
            let idx = index_of(&data, chunk);
            assert_eq!(idx.lines.len(), 400_000 / STRIDE as usize);
            for (k, &l) in idx.lines.iter().enumerate() {
                assert_eq!(
                    l,
                    line_at(&data, (k + 1) * STRIDE as usize),
                    "chunk {chunk}"
                );
            }
        }
    }

    #[test]
    fn anchors_lie_before_the_target_and_within_one_stride() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| if i % 1000 == 999 { b'\n' } else { b'y' })
            .collect();
        let idx = index_of(&data, 8192);
        for line in [1u64, 2, 65, 66, 150, 300] {
            let a = idx.anchor_for_line(line);
            let start = (line - 1) * 1000;
            assert!(
                a.offset <= start && start - a.offset <= STRIDE + 1000,
                "line {line}"
            );
            assert_eq!(a.line, line_at(&data, a.offset as usize));
        }
        let a = idx.anchor_for_offset(200_000);
        assert!(a.offset <= 200_000 && 200_000 - a.offset < STRIDE);
    }

    #[test]
    fn refuses_garbage() {
        assert!(LineIndex::decode(&[]).is_none());
        assert!(LineIndex::decode(&[2]).is_none());
        assert!(LineIndex::decode(&[1, 0, 0]).is_none());
    }
}
