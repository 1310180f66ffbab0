//! Ranged reads: a byte range or a 1-based line range of a payload, bounded
//! by `max_bytes`, found through the sparse line index without reading the
//! file from the start, and never splitting a UTF-8 character of text.

use std::io::{self, Read, Seek, SeekFrom};

use super::lines::{LineIndex, STRIDE};

/// Which part of the payload to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSpec {
    /// `length` bytes from `offset`; `length == 0` means up to the limit.
    Bytes {
        /// First byte.
        offset: u64,
        /// Bytes wanted.
        length: u64,
    },
    /// Lines `start..=end`, 1-based; `end == 0` means to the end.
    Lines {
        /// First line.
        start: u64,
        /// Last line.
        end: u64,
    },
}

/// What a read returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadOut {
    /// The bytes.
    pub data: Vec<u8>,
    /// Offset of the first byte.
    pub start_offset: u64,
    /// Offset just past the last byte.
    pub end_offset: u64,
    /// First line touched, 0 when `data` is empty.
    pub first_line: u64,
    /// Last line touched, 0 when `data` is empty.
    pub last_line: u64,
    /// Whether `end_offset` is the end of the payload.
    pub eof: bool,
}

/// The payload's facts a read needs.
#[derive(Debug, Clone, Copy)]
pub struct Extent<'a> {
    /// Size in bytes.
    pub size: u64,
    /// Line count.
    pub lines: u64,
    /// Whether the content is UTF-8 text.
    pub utf8: bool,
    /// The line index.
    pub index: &'a LineIndex,
}

/// Why a read could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The request makes no sense on its own.
    #[error("{0}")]
    Invalid(String),
    /// The range starts past the end of the payload.
    #[error("{0}")]
    OutOfRange(String),
    /// The file could not be read.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Serves one read. `max_bytes` has already been defaulted and clamped.
pub fn read_range<F: Read + Seek>(
    file: &mut F,
    extent: Extent<'_>,
    spec: ReadSpec,
    max_bytes: u64,
) -> Result<ReadOut, ReadError> {
    debug_assert!(max_bytes > 0);
    let source = Source {
        file,
        extent,
        max_bytes,
    };
    match spec {
        ReadSpec::Bytes { offset, length } => source.bytes(offset, length),
        ReadSpec::Lines { start, end } => source.lines(start, end),
    }
}

/// What one read reads from, and how much it may return.
struct Source<'a, F> {
    file: &'a mut F,
    extent: Extent<'a>,
    max_bytes: u64,
}

impl<F: Read + Seek> Source<'_, F> {
    fn bytes(self, offset: u64, length: u64) -> Result<ReadOut, ReadError> {
        if offset > self.extent.size {
            return Err(ReadError::OutOfRange(format!(
                "byte offset {offset} is past the end of the payload ({} bytes); use an offset below {}",
                self.extent.size, self.extent.size
            )));
        }
        let want = if length == 0 {
            self.max_bytes
        } else {
            length.min(self.max_bytes)
        };
        let want = want.min(self.extent.size - offset);
        let mut data = read_at(self.file, offset, want)?;
        let mut start = offset;
        if self.extent.utf8 {
            // Start on a character boundary: skip continuation bytes.
            let skip = data
                .iter()
                .take(3)
                .take_while(|&&b| is_continuation(b))
                .count();
            data.drain(..skip);
            start += skip as u64;
            trim_partial_char(&mut data);
        }
        let end = start + data.len() as u64;
        let (first_line, last_line) = if data.is_empty() {
            (0, 0)
        } else {
            let first = line_of_offset(self.file, self.extent.index, start)?;
            (first, first + interior_newlines(&data))
        };
        Ok(ReadOut {
            data,
            start_offset: start,
            end_offset: end,
            first_line,
            last_line,
            eof: end == self.extent.size,
        })
    }

    fn lines(self, start: u64, end: u64) -> Result<ReadOut, ReadError> {
        if start == 0 {
            return Err(ReadError::Invalid(
                "line_range.start_line is 1-based; use 1 for the first line".into(),
            ));
        }
        if end != 0 && end < start {
            return Err(ReadError::Invalid(format!(
                "line_range.end_line ({end}) is before start_line ({start}); end_line is inclusive, or 0 for \"to the end\""
            )));
        }
        if start > self.extent.lines {
            return Err(ReadError::OutOfRange(format!(
                "line range starts at line {start}, but the payload has {} lines; ask for lines 1 to {}",
                self.extent.lines, self.extent.lines
            )));
        }
        let begin = line_start(self.file, self.extent.index, start)?;
        let want = self.max_bytes.min(self.extent.size - begin);
        let mut data = read_at(self.file, begin, want)?;
        let reached_eof = begin + data.len() as u64 == self.extent.size;
        let wanted_lines = if end == 0 { u64::MAX } else { end - start + 1 };
        let mut cut = None;
        for (n, pos) in memchr::memchr_iter(b'\n', &data).enumerate() {
            if n as u64 + 1 == wanted_lines {
                cut = Some(pos + 1);
                break;
            }
        }
        let cut = match cut {
            Some(c) => c,
            None if reached_eof => data.len(),
            // self.max_bytes stopped us inside the range: keep whole lines if any fit.
            None => match memchr::memrchr(b'\n', &data) {
                Some(pos) => pos + 1,
                None => {
                    if self.extent.utf8 {
                        trim_partial_char(&mut data);
                    }
                    data.len()
                }
            },
        };
        data.truncate(cut);
        let end_offset = begin + data.len() as u64;
        let last_line = if data.is_empty() {
            0
        } else {
            start + interior_newlines(&data)
        };
        Ok(ReadOut {
            first_line: if data.is_empty() { 0 } else { start },
            last_line,
            start_offset: begin,
            end_offset,
            eof: end_offset == self.extent.size,
            data,
        })
    }
}

/// Newlines in `data`, not counting one that ends it: how many lines past
/// the first one the data reaches.
fn interior_newlines(data: &[u8]) -> u64 {
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    memchr::memchr_iter(b'\n', body).count() as u64
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Drops an incomplete character at the end of otherwise valid UTF-8.
fn trim_partial_char(data: &mut Vec<u8>) {
    if let Err(e) = std::str::from_utf8(data)
        && e.error_len().is_none()
    {
        data.truncate(e.valid_up_to());
    }
}

fn read_at<F: Read + Seek>(file: &mut F, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut data = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut data)?;
    Ok(data)
}

/// The byte offset where 1-based `line` starts.
fn line_start<F: Read + Seek>(file: &mut F, index: &LineIndex, line: u64) -> io::Result<u64> {
    let anchor = index.anchor_for_line(line);
    if anchor.line == line && anchor.at_line_start {
        return Ok(anchor.offset);
    }
    // Skip (line - anchor.line) newlines from the anchor; at most one stride
    // plus a line away.
    let mut to_skip = line - anchor.line;
    let mut pos = anchor.offset;
    file.seek(SeekFrom::Start(pos))?;
    let mut buf = vec![0u8; STRIDE as usize];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "line index points past the end of the file",
            ));
        }
        for p in memchr::memchr_iter(b'\n', &buf[..n]) {
            to_skip -= 1;
            if to_skip == 0 {
                return Ok(pos + p as u64 + 1);
            }
        }
        pos += n as u64;
    }
}

/// The 1-based line that byte `offset` lies on.
fn line_of_offset<F: Read + Seek>(file: &mut F, index: &LineIndex, offset: u64) -> io::Result<u64> {
    let anchor = index.anchor_for_offset(offset);
    let gap = read_at(file, anchor.offset, offset - anchor.offset)?;
    Ok(anchor.line + memchr::memchr_iter(b'\n', &gap).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::content::ContentScanner;
    use std::io::Cursor;

    struct Fixture {
        data: Vec<u8>,
        index: LineIndex,
        lines: u64,
        utf8: bool,
    }

    fn fixture(data: Vec<u8>) -> Fixture {
        let mut s = ContentScanner::new();
        for c in data.chunks(10_000) {
            s.update(c);
        }
        let f = s.finish();
        Fixture {
            index: LineIndex::decode(&f.line_index).unwrap(),
            lines: f.line_count,
            utf8: f.utf8,
            data,
        }
    }

    fn read(f: &Fixture, spec: ReadSpec, max: u64) -> Result<ReadOut, ReadError> {
        let extent = Extent {
            size: f.data.len() as u64,
            lines: f.lines,
            utf8: f.utf8,
            index: &f.index,
        };
        read_range(&mut Cursor::new(&f.data), extent, spec, max)
    }

    fn numbered(n: u64) -> Vec<u8> {
        (1..=n)
            .map(|i| format!("line {i}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn line_range_returns_exactly_those_lines_far_into_a_large_payload() {
        let f = fixture(numbered(200_000));
        let out = read(
            &f,
            ReadSpec::Lines {
                start: 150_000,
                end: 150_002,
            },
            65_536,
        )
        .unwrap();
        assert_eq!(out.data, b"line 150000\nline 150001\nline 150002\n");
        assert_eq!(
            (out.first_line, out.last_line, out.eof),
            (150_000, 150_002, false)
        );
        assert_eq!(
            &f.data[out.start_offset as usize..out.end_offset as usize],
            out.data.as_slice()
        );
    }

    #[test]
    fn line_range_to_the_end_and_last_line_without_newline() {
        let f = fixture(b"a\nb\nc".to_vec());
        let out = read(&f, ReadSpec::Lines { start: 2, end: 0 }, 100).unwrap();
        assert_eq!(out.data, b"b\nc");
        assert_eq!((out.first_line, out.last_line, out.eof), (2, 3, true));
        let out = read(&f, ReadSpec::Lines { start: 3, end: 9 }, 100).unwrap();
        assert_eq!(out.data, b"c");
    }

    #[test]
    fn line_range_past_the_end_is_out_of_range_and_names_the_count() {
        let f = fixture(numbered(10));
        let err = read(&f, ReadSpec::Lines { start: 11, end: 12 }, 100).unwrap_err();
        assert!(
            matches!(&err, ReadError::OutOfRange(m) if m.contains("has 10 lines")),
            "{err}"
        );
        assert!(matches!(
            read(&f, ReadSpec::Lines { start: 0, end: 1 }, 100),
            Err(ReadError::Invalid(_))
        ));
        assert!(matches!(
            read(&f, ReadSpec::Lines { start: 5, end: 4 }, 100),
            Err(ReadError::Invalid(_))
        ));
    }

    #[test]
    fn max_bytes_keeps_whole_lines_when_any_fit() {
        let f = fixture(numbered(100));
        let out = read(&f, ReadSpec::Lines { start: 1, end: 100 }, 20).unwrap();
        assert_eq!(out.data, b"line 1\nline 2\n");
        assert_eq!(out.last_line, 2);
        assert!(!out.eof);
    }

    #[test]
    fn a_line_longer_than_max_bytes_is_cut_on_a_char_boundary() {
        let f = fixture("🌍🌍🌍🌍\nx\n".as_bytes().to_vec());
        for max in 1..=17u64 {
            let out = read(&f, ReadSpec::Lines { start: 1, end: 1 }, max).unwrap();
            assert!(std::str::from_utf8(&out.data).is_ok(), "max {max}");
            assert!(out.data.len() as u64 <= max);
            assert_eq!(
                out.data.len() % 4,
                if out.data.ends_with(b"\n") { 1 } else { 0 }
            );
        }
    }

    #[test]
    fn byte_ranges_never_split_characters_at_either_end() {
        let text = "é世🌍".repeat(50);
        let f = fixture(text.as_bytes().to_vec());
        for offset in 0..20u64 {
            for max in 1..12u64 {
                let out = read(&f, ReadSpec::Bytes { offset, length: 0 }, max).unwrap();
                assert!(
                    std::str::from_utf8(&out.data).is_ok(),
                    "offset {offset} max {max}"
                );
                assert!(out.data.len() as u64 <= max);
                assert_eq!(
                    &f.data[out.start_offset as usize..out.end_offset as usize],
                    out.data.as_slice()
                );
            }
        }
    }

    #[test]
    fn byte_ranges_report_their_lines_and_binary_is_returned_raw() {
        let f = fixture(numbered(100_000));
        let offset = f.data.len() as u64 - 24;
        let out = read(&f, ReadSpec::Bytes { offset, length: 12 }, 100).unwrap();
        let expected_line =
            1 + memchr::memchr_iter(b'\n', &f.data[..offset as usize]).count() as u64;
        assert_eq!(out.first_line, expected_line);
        let bin = fixture(vec![0xff, 0x80, 0x80, 0x41]);
        let out = read(
            &bin,
            ReadSpec::Bytes {
                offset: 1,
                length: 2,
            },
            100,
        )
        .unwrap();
        assert_eq!(out.data, vec![0x80, 0x80]);
    }

    #[test]
    fn byte_offset_past_the_end_is_out_of_range_but_at_the_end_is_empty() {
        let f = fixture(b"abc".to_vec());
        assert!(matches!(
            read(
                &f,
                ReadSpec::Bytes {
                    offset: 4,
                    length: 1
                },
                10
            ),
            Err(ReadError::OutOfRange(_))
        ));
        let out = read(
            &f,
            ReadSpec::Bytes {
                offset: 3,
                length: 1,
            },
            10,
        )
        .unwrap();
        assert!(out.data.is_empty() && out.eof);
    }
}
